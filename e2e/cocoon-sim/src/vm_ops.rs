//! The newer VM verbs: exec, logs, net, reconcile-stale-create (CLI-6.11–CLI-6.14).

use serde::Serialize;
use std::fs;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

use crate::config::{Env, ExecMode};
use crate::error::{fail, Error, Result};
use crate::faults;
use crate::guest;
use crate::lock;
use crate::model::{StaticNet, StoredVm, FC};
use crate::output::{self, log};
use crate::store::{self, Store};
use crate::timefmt::{now_ns, rfc3339_nano};
use crate::vm::{self, create_lock_path};
use crate::{exact_args, min_args};

fn lookup(env: &Env, reference: &str) -> Result<StoredVm> {
    Store::new(&env.root).lookup_vm(reference)
}

/// Persists a change to the VM's guest-facing settings and tells the guest.
pub fn update_vm(env: &Env, id: &str, f: impl FnOnce(&mut StoredVm)) -> Result<StoredVm> {
    let vm = Store::new(&env.root).update_vm(id, |vm| {
        f(vm);
        Ok(vm.clone())
    })?;
    let Some(vm) = vm else {
        return fail(format!("vm {id}: VM not found"));
    };
    if env.vm_state_dir(id).is_dir() {
        guest::write_control(env, &vm)?;
    }
    Ok(vm)
}

const RENEW_COMMANDS: [&str; 5] = ["ipconfig", "dhclient", "networkctl", "udhcpc", "dhcpcd"];

/// The guest-side effects the simulator understands: a DHCP renew releases a lease held back
/// with `--until-renew`; `… address <mac>` fixes a Firecracker clone's guest MAC.
fn guest_side_effects(env: &Env, vm: &StoredVm, argv: &[String]) -> Result<()> {
    let joined = argv.join(" ");
    let words: Vec<&str> = joined.split_whitespace().collect();
    let renew = words.iter().any(|w| {
        let base = w.rsplit(['/', '\\']).next().unwrap_or(w);
        let base = base.trim_end_matches(".exe");
        RENEW_COMMANDS.contains(&base.to_ascii_lowercase().as_str())
    });
    let new_mac = words
        .windows(2)
        .find(|w| w[0] == "address")
        .and_then(|w| crate::ids::normalize_mac(w[1]));
    if renew && vm.sim.lease.until_renew && !vm.sim.lease.renewed {
        update_vm(env, &vm.id, |v| v.sim.lease.renewed = true)?;
    }
    if let Some(mac) = new_mac {
        if !vm.sim.guest_mac.is_empty() && vm.sim.guest_mac != mac {
            update_vm(env, &vm.id, |v| v.sim.guest_mac = mac)?;
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct ExecRecord<'a> {
    at: String,
    argv: &'a [String],
    env: &'a [String],
    interactive: bool,
}

fn record_exec(env: &Env, vm: &StoredVm, argv: &[String], vars: &[String], interactive: bool) {
    let rec = ExecRecord {
        at: rfc3339_nano(now_ns()),
        argv,
        env: vars,
        interactive,
    };
    if let Ok(line) = serde_json::to_string(&rec) {
        let path = env.vm_state_dir(&vm.id).join("exec.log");
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn drain_stdin(interactive: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    if interactive {
        let _ = std::io::stdin().read_to_end(&mut buf);
    }
    buf
}

/// Record mode: a handful of commands behave like in a guest; anything else succeeds silently.
fn builtin(vm: &StoredVm, argv: &[String], interactive: bool) -> i32 {
    let stdin = drain_stdin(interactive);
    let mut out = std::io::stdout().lock();
    let base = argv[0].rsplit('/').next().unwrap_or(&argv[0]);
    match base {
        "false" => 1,
        "echo" => {
            let _ = writeln!(out, "{}", argv[1..].join(" "));
            0
        }
        "cat" => {
            let _ = out.write_all(&stdin);
            0
        }
        "hostname" => {
            let _ = writeln!(out, "{}", vm.config.name);
            0
        }
        "exit" => argv.get(1).and_then(|c| c.parse().ok()).unwrap_or(0),
        _ => 0,
    }
}

/// The guest's filesystem is its working directory, so relative paths land where snapshots
/// capture them.
fn host_exec(vm: &StoredVm, argv: &[String], vars: &[String], interactive: bool) -> i32 {
    let guestfs = crate::disk::guestfs_dir(vm);
    let _ = fs::create_dir_all(&guestfs);
    let mut cmd = if vm.sim.netns.is_empty() {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    } else {
        let mut c = Command::new(crate::netns::ip_binary().unwrap_or_else(|| "ip".into()));
        c.args(["netns", "exec", &vm.sim.netns]).args(argv);
        c
    };
    for kv in vars {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    cmd.current_dir(&guestfs)
        .env("COCOON_SIM_VM_ID", &vm.id)
        .env("COCOON_SIM_VM_IP", &vm.sim.ip)
        .env("COCOON_SIM_GUESTFS", &guestfs)
        .stdin(if interactive {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    match cmd.status() {
        Ok(st) => st.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)
        }),
        Err(e) => {
            eprintln!("exec: {}: {}", argv[0], crate::error::go_io_text(&e));
            127
        }
    }
}

pub fn exec(env: &Env, interactive: bool, vars: &[String], args: &[String]) -> Result<()> {
    // clap keeps the `--` once the trailing list has started; cobra would have dropped it.
    let args: Vec<String> = match args.get(1) {
        Some(dash) if dash == "--" => [&args[..1], &args[2..]].concat(),
        _ => args.to_vec(),
    };
    min_args(&args, 2)?;
    let (reference, argv) = (&args[0], &args[1..]);
    let fx = faults::on_verb(env, "vm exec").map_err(|e| e.wrap("exec"))?;
    fx.sleep();
    let vm = lookup(env, reference).map_err(|e| e.wrap("exec"))?;
    if !guest::is_alive(vm.sim.pid, &vm.id) {
        return fail("exec: VM not running");
    }
    record_exec(env, &vm, argv, vars, interactive);
    // A fixup never runs on the host, whatever the exec mode: it would rewrite the host's
    // hostname and network configuration.
    let fixup = env
        .guest_fixup
        .then(|| crate::fixup::classify(argv))
        .flatten();
    // Whatever fails on the host side is cocoon's error, not the guest command's status.
    let setup = |e: Error| e.wrap("exec");
    if fixup.is_none() {
        guest_side_effects(env, &vm, argv).map_err(setup)?;
    }
    let code = match faults::take_exec(env, &vm.id).map_err(setup)? {
        Some(s) if s.flood => {
            let _ = drain_stdin(interactive);
            flood(&s.stdout)
        }
        Some(s) => {
            let _ = drain_stdin(interactive);
            print!("{}", s.stdout);
            eprint!("{}", s.stderr);
            let _ = std::io::stdout().flush();
            s.exit_code
        }
        None => match &fixup {
            Some(a) => {
                let _ = drain_stdin(interactive);
                crate::fixup::attempt(env, &vm, a).map_err(setup)?
            }
            None if env.exec == ExecMode::Host => host_exec(&vm, argv, vars, interactive),
            None => builtin(&vm, argv, interactive),
        },
    };
    let _ = std::io::stdout().flush();
    if code != 0 {
        return Err(Error::Exit(code));
    }
    Ok(())
}

/// A guest that never stops printing: `text` again and again until stdout is closed.
fn flood(text: &str) -> i32 {
    let line = format!("{text}\n").repeat(64);
    let mut out = std::io::stdout().lock();
    while out.write_all(line.as_bytes()).is_ok() {}
    141
}

pub fn logs(env: &Env, tail: Option<i64>, follow: bool, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "vm logs")?;
    fx.sleep();
    let vm = lookup(env, &args[0]).map_err(|e| e.wrap("logs"))?;
    let path = vm.log_file();
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(_) => return fail(format!("open log {path}: VM may not have been started yet")),
    };
    let end = bytes.len() as u64;
    let text = match tail {
        Some(n) if n >= 0 => {
            let lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
            let skip = lines.len().saturating_sub(n as usize);
            lines[skip..].concat()
        }
        _ => bytes,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&text)?;
    out.flush()?;
    if follow {
        follow_from(&path, end, &mut out)?;
    }
    Ok(())
}

/// `-f`: what is appended to the log from `offset` on, as it comes, until the reader goes
/// away (a write fails) or the log does (the VM was removed).
fn follow_from(path: &str, mut offset: u64, out: &mut impl Write) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let Ok(mut f) = fs::File::open(path) else {
            return Ok(());
        };
        let len = f.metadata()?.len();
        if len < offset {
            // Truncated under us: start over from its beginning, as tail -F does.
            offset = 0;
        }
        f.seek(SeekFrom::Start(offset))?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            offset += n as u64;
        }
        out.flush()?;
    }
}

#[derive(Serialize)]
struct NicChange {
    index: usize,
    tap: String,
    mac: String,
}

#[derive(Serialize)]
struct NetResult {
    before: usize,
    after: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    added: Vec<NicChange>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    removed: Vec<NicChange>,
}

/// Record-level resize: NIC 0's plumbing stays; a re-added NIC 0 brings a new MAC, and so a
/// new DHCP lease, as a real hot-swap would.
pub fn net(env: &Env, nics: Option<i64>, output: Option<&str>, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let Some(want) = nics else {
        return fail("required flag(s) \"nics\" not set");
    };
    if want < 0 {
        return fail(format!("--nics must be >= 0, got {want}"));
    }
    let fx = faults::on_verb(env, "vm net")?;
    fx.sleep();
    let vm = lookup(env, &args[0]).map_err(|e| e.wrap("net"))?;
    if vm.hypervisor == FC {
        return fail("net: firecracker does not support NIC hot-resize (cloud-hypervisor only)");
    }
    if !guest::is_alive(vm.sim.pid, &vm.id) {
        return fail("net: VM not running");
    }
    let want = want as usize;
    let before = vm.network_configs.len();
    let mut added = Vec::new();
    let mut removed = Vec::new();
    update_vm(env, &vm.id, |v| {
        while v.network_configs.len() > want {
            let n = v.network_configs.pop().expect("non-empty");
            removed.push(NicChange {
                index: v.network_configs.len(),
                tap: n.tap,
                mac: n.mac,
            });
        }
        let bridge = v
            .network_configs
            .first()
            .map(|n| n.bridge_dev.clone())
            .unwrap_or_default();
        while v.network_configs.len() < want {
            let i = v.network_configs.len();
            let mut n = vm::nic(
                &v.id,
                i as i64,
                v.config.cpu,
                false,
                v.config.queue_size,
                &bridge,
            );
            if i == 0 {
                n.netns_path = if v.sim.netns.is_empty() {
                    String::new()
                } else {
                    crate::netns::netns_path(&v.sim.netns)
                };
                n.network = crate::vmnet::is_static(&v.config.network).then(|| StaticNet {
                    ip: v.sim.ip.clone(),
                    gateway: format!("{}.0.1", v.sim.ip.rsplitn(3, '.').nth(2).unwrap_or("0.0")),
                    prefix: 16,
                });
            }
            added.push(NicChange {
                index: i,
                tap: n.tap.clone(),
                mac: n.mac.clone(),
            });
            v.network_configs.push(n);
        }
        v.updated_ns = now_ns();
    })?;
    log("cmd.vm.net", format!("{}: nics {before} -> {want}", vm.id));
    if output == Some("json") {
        return output::print_pretty(&NetResult {
            before,
            after: want,
            added,
            removed,
        });
    }
    Ok(())
}

#[derive(Serialize)]
struct Outcome<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    outcome: &'a str,
}

pub fn reconcile_stale_create(env: &Env, args: &[String], output: Option<&str>) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "vm reconcile-stale-create")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let found = match store.resolve_vm(&args[0])? {
        Ok(id) => store.vm(&id)?,
        Err(store::Resolve::NotFound) => None,
        Err(store::Resolve::Ambiguous) => return fail(store::Resolve::ambiguous_text(&args[0])),
    };
    let (id, outcome) = match found {
        None => (String::new(), "not-found"),
        Some(vm) if vm.state != "creating" => (vm.id, "not-creating"),
        Some(vm) => match lock::try_exclusive(&create_lock_path(env, &vm.id))? {
            None => (vm.id, "busy"),
            Some(_owner) => {
                vm::destroy(env, &store, &vm)?;
                (vm.id, "collected")
            }
        },
    };
    if fx.garbage {
        return output::emit(faults::GARBAGE);
    }
    if output == Some("json") {
        return output::print_pretty(&Outcome { id: &id, outcome });
    }
    log(
        "cmd.vm.reconcile-stale-create",
        format!("{} {outcome}", args[0]),
    );
    Ok(())
}
