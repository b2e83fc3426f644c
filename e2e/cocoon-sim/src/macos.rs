//! The `cocoon-macos` personality: the same binary invoked as `cocoon-macos` (argv[0], e.g. a
//! symlink) or as `cocoon --personality macos …`. cocoon-macos runs macOS guests under QEMU;
//! the simulator gives each one a real guest process like cocoon's: a DHCP lease on the CNI
//! network (the same lease file) and an SSH banner on port 22.
//!
//! Its argv is the simulator's assumption, shaped like cocoon's own verbs:
//! - `image pull IMAGE`, `image inspect IMAGE`, `image list`
//! - `vm run --name N [--cpus C] [--memory MiB] [--storage SIZE] [--vnc D --vnc-password P]
//!   [--exit-on-reboot] [--random-smbios] [--net cni] IMAGE` (prints nothing on stdout)
//! - `vm start [--vnc D --vnc-password P] NAME` (a start without `--vnc` turns VNC off)
//! - `vm stop NAME`, `vm rm [--force] NAME`
//! - `vm inspect NAME`: one flat JSON object `{name, state, pid, mac, tap, disk, vnc, cpus,
//!   memory_mb, image}`; `pid` is 0 unless the guest lives, `vnc` is the display number or -1
//! - `vm list`: a JSON array of those objects (`[]` when empty)
//!
//! There is no clone, exec, hibernate or snapshot verb. State lives under `<root>/macos`, apart
//! from the Linux cocoon's; `sim …` verbs work on it too.

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::cli::{ImageCmd, RunArgs, SimCmd, VmCmd, VmShapeArgs};
use crate::config::Env;
use crate::error::{fail, Result};
use crate::model::StoredVm;
use crate::output;
use crate::store::Store;

pub const NAME: &str = "cocoon-macos";

#[derive(Parser, Debug)]
#[command(
    name = "cocoon-macos",
    about = "cocoon-macos - macOS VMs on QEMU (simulator)"
)]
pub struct MacCli {
    #[arg(long = "root-dir", global = true)]
    pub root_dir: Option<String>,
    #[command(subcommand)]
    pub cmd: Option<MacCmd>,
}

#[derive(Subcommand, Debug)]
pub enum MacCmd {
    #[command(subcommand)]
    Vm(MacVmCmd),
    #[command(subcommand)]
    Image(MacImageCmd),
    /// Simulator controls on the macOS state
    #[command(subcommand)]
    Sim(SimCmd),
}

#[derive(Args, Debug, Default)]
pub struct Vnc {
    #[arg(long)]
    pub vnc: Option<i64>,
    #[arg(long = "vnc-password")]
    pub vnc_password: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum MacVmCmd {
    Run {
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value_t = 4)]
        cpus: i64,
        /// MiB
        #[arg(long, default_value_t = 8192)]
        memory: i64,
        #[arg(long)]
        storage: Option<String>,
        #[command(flatten)]
        vnc: Vnc,
        #[arg(long = "exit-on-reboot")]
        exit_on_reboot: bool,
        #[arg(long = "random-smbios")]
        random_smbios: bool,
        #[arg(long, default_value = "cni")]
        net: String,
        args: Vec<String>,
    },
    Start {
        #[command(flatten)]
        vnc: Vnc,
        args: Vec<String>,
    },
    Stop {
        args: Vec<String>,
    },
    Rm {
        #[arg(long)]
        force: bool,
        args: Vec<String>,
    },
    Inspect {
        args: Vec<String>,
    },
    #[command(alias = "ls")]
    List {
        #[arg(short = 'o', long)]
        format: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum MacImageCmd {
    Pull {
        args: Vec<String>,
    },
    Inspect {
        args: Vec<String>,
    },
    #[command(alias = "ls")]
    List,
}

/// Strips `--personality macos` (or `=macos`) from argv; true when this run is cocoon-macos.
pub fn personality(argv: &mut Vec<String>) -> bool {
    let by_name = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == NAME);
    // Only right after the binary, so a guest command's own arguments are never taken for it.
    let flag = match argv.get(1).map(String::as_str) {
        Some("--personality") if argv.get(2).map(String::as_str) == Some("macos") => {
            argv.drain(1..3);
            true
        }
        Some("--personality=macos") => {
            argv.remove(1);
            true
        }
        _ => false,
    };
    by_name || flag
}

/// The Linux root's environment moved to `<root>/macos`; the lease file stays the host's.
pub fn env_for(linux: &Env) -> Env {
    let root = linux.root.join("macos");
    Env {
        run_dir: root.join("run"),
        log_dir: root.join("log"),
        guest_fixup: false,
        sac: false,
        root,
        ..linux.clone()
    }
}

#[derive(Serialize)]
struct Record {
    name: String,
    state: String,
    pid: i32,
    mac: String,
    tap: String,
    disk: String,
    vnc: i64,
    cpus: i64,
    memory_mb: i64,
    image: String,
}

fn record(vm: &StoredVm) -> Record {
    let nic = vm.network_configs.first();
    let alive = crate::guest::is_alive(vm.sim.pid, &vm.id);
    Record {
        name: vm.config.name.clone(),
        state: if vm.state == "running" && !alive {
            "stopped".into()
        } else {
            vm.state.clone()
        },
        pid: if alive { vm.sim.pid } else { 0 },
        mac: nic.map(|n| n.mac.clone()).unwrap_or_default(),
        tap: nic.map(|n| n.tap.clone()).unwrap_or_default(),
        disk: vm
            .storage_configs
            .iter()
            .find(|d| d.role == "cow")
            .map(|d| d.path.clone())
            .unwrap_or_default(),
        vnc: vm.sim.vnc.unwrap_or(-1),
        cpus: vm.config.cpu,
        memory_mb: vm.config.memory >> 20,
        image: vm.config.image.clone(),
    }
}

fn one(args: &[String]) -> Result<&str> {
    crate::exact_args(args, 1)?;
    Ok(&args[0])
}

fn lookup(env: &Env, name: &str) -> Result<StoredVm> {
    Store::new(&env.root).lookup_vm(name)
}

fn set_vnc(env: &Env, id: &str, vnc: &Vnc) -> Result<()> {
    if vnc.vnc.is_some() && vnc.vnc_password.as_deref().unwrap_or("").is_empty() {
        return fail("--vnc requires --vnc-password");
    }
    let display = vnc.vnc.unwrap_or(-1);
    crate::vm_ops::update_vm(env, id, |v| v.sim.vnc = Some(display)).map(|_| ())
}

pub fn dispatch(linux: &Env, cli: MacCli) -> Result<()> {
    let env = env_for(linux);
    std::fs::create_dir_all(&env.root)?;
    let Some(cmd) = cli.cmd else {
        return fail("no command: want vm, image or sim");
    };
    match cmd {
        MacCmd::Sim(SimCmd::Cleanup { all_leftovers }) => {
            crate::cleanup::cleanup(&env, all_leftovers)
        }
        MacCmd::Sim(c) => crate::sim::dispatch(&env, c),
        MacCmd::Image(MacImageCmd::Pull { args }) => {
            crate::images::dispatch(&env, ImageCmd::Pull { force: false, args })
        }
        MacCmd::Image(MacImageCmd::Inspect { args }) => {
            crate::images::dispatch(&env, ImageCmd::Inspect { args })
        }
        MacCmd::Image(MacImageCmd::List) => crate::images::dispatch(
            &env,
            ImageCmd::List {
                format: "json".into(),
            },
        ),
        MacCmd::Vm(v) => vm(&env, v),
    }
}

fn vm(env: &Env, cmd: MacVmCmd) -> Result<()> {
    match cmd {
        MacVmCmd::Run {
            name,
            cpus,
            memory,
            storage,
            vnc,
            net,
            args,
            ..
        } => {
            let image = one(&args)?.to_string();
            if net != "cni" {
                return fail(format!("--net {net:?}: only cni is supported"));
            }
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                return fail("--name is required");
            };
            if vnc.vnc.is_some() && vnc.vnc_password.as_deref().unwrap_or("").is_empty() {
                return fail("--vnc requires --vnc-password");
            }
            let run = RunArgs {
                vm: VmShapeArgs {
                    name: Some(name.clone()),
                    cpu: Some(cpus),
                    memory: Some(format!("{memory}M")),
                    storage: storage.or_else(|| Some("10G".into())),
                    network: Some("cni".into()),
                    ..Default::default()
                },
                args: vec![image],
                ..Default::default()
            };
            crate::vm::run_for_macos(env, run)?;
            let id = lookup(env, &name)?.id;
            set_vnc(env, &id, &vnc)
        }
        MacVmCmd::Start { vnc, args } => {
            let vm = lookup(env, one(&args)?)?;
            crate::vm::start_one(env, &Store::new(&env.root), &vm.id)?;
            set_vnc(env, &vm.id, &vnc)
        }
        MacVmCmd::Stop { args } => {
            let vm = lookup(env, one(&args)?)?;
            crate::vm::dispatch(
                env,
                VmCmd::Stop {
                    output: None,
                    force: true,
                    timeout: None,
                    args: vec![vm.id],
                },
            )
        }
        MacVmCmd::Rm { args, .. } => {
            let vm = lookup(env, one(&args)?)?;
            crate::vm::destroy(env, &Store::new(&env.root), &vm)
        }
        MacVmCmd::Inspect { args } => output::print_pretty(&record(&lookup(env, one(&args)?)?)),
        MacVmCmd::List { .. } => {
            let mut vms: Vec<StoredVm> = Store::new(&env.root).vms()?;
            vms.sort_by_key(|v| v.created_ns);
            output::print_pretty(&vms.iter().map(record).collect::<Vec<_>>())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::personality;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn personality_from_argv0_or_flag() {
        let mut a = argv(&["/opt/bin/cocoon-macos", "vm", "list"]);
        assert!(personality(&mut a));
        assert_eq!(a.len(), 3);
        let mut b = argv(&["cocoon", "--personality", "macos", "vm", "list"]);
        assert!(personality(&mut b));
        assert_eq!(b, argv(&["cocoon", "vm", "list"]));
        let mut c = argv(&["cocoon", "vm", "list"]);
        assert!(!personality(&mut c));
        let mut d = argv(&["cocoon", "vm", "exec", "X", "--", "--personality", "macos"]);
        assert!(!personality(&mut d));
        assert_eq!(d.len(), 7);
    }
}
