//! `COCOON_SIM_GUEST_FIXUP`: a clone is a copied machine. Until the daemon's post-clone fixup
//! has run through `vm exec`, a clone that needs one keeps its source's identity: no DHCP
//! lease, no answer on its pod address, and a Firecracker guest still uses the source's MAC.
//!
//! Which clones need one: Windows guests, Firecracker guests, and guests with a static NIC.
//! A cloud-hypervisor Linux clone with DHCP NICs only gets fresh MACs hot-plugged and re-runs
//! DHCP by itself, so it comes up at once.
//!
//! What the guest accepts:
//! - Linux: `sh -c <script>` that writes the VM name into `/etc/hostname`; on Firecracker sets
//!   every `ethN` to its record MAC (`ip link set ethN address <mac>`); and configures every NIC,
//!   either with a systemd-networkd file `10-<mac without colons>.network` matching the MAC
//!   (`Address=<ip>/<prefix>` for a static NIC) or by re-running cloud-init
//!   (`cloud-init clean` … `cloud-init init`); then restarts systemd-networkd.
//! - Windows: `powershell … -c <script>` that disables, then re-enables, the PnP devices of
//!   class Net.
//!
//! A script that looks like a fixup but misses a part exits 1 with the missing parts on
//! stderr and changes nothing. Every attempt is appended to `<root>/vms/<ID>/fixup.log`.

use serde::Serialize;
use std::io::Write;

use crate::config::Env;
use crate::error::Result;
use crate::faults;
use crate::model::{FixupState, StoredVm, FC};
use crate::timefmt::{now_ns, rfc3339_nano};

pub const LINUX: &str = "linux";
pub const LINUX_FC: &str = "linux_fc";
pub const WINDOWS: &str = "windows";

/// The kind of fixup a fresh clone owes, or `None` when it heals itself.
pub fn needed(env: &Env, vm: &StoredVm) -> Option<&'static str> {
    if !env.guest_fixup {
        return None;
    }
    let static_nic = vm.network_configs.iter().any(|n| n.network.is_some())
        || crate::vmnet::is_static(&vm.config.network) && !vm.network_configs.is_empty();
    if vm.config.windows {
        Some(WINDOWS)
    } else if vm.hypervisor == FC {
        Some(LINUX_FC)
    } else if static_nic {
        Some(LINUX)
    } else {
        None
    }
}

pub fn mark(env: &Env, vm: &mut StoredVm) {
    vm.sim.fixup = needed(env, vm).map(|k| FixupState {
        kind: k.to_string(),
        done: false,
    });
}

pub fn pending(vm: &StoredVm) -> bool {
    vm.sim.fixup.as_ref().is_some_and(|f| !f.done)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Shell {
    Sh,
    PowerShell,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Attempt {
    pub shell: Shell,
    pub script: String,
}

fn base(arg: &str) -> String {
    let b = arg.rsplit(['/', '\\']).next().unwrap_or(arg);
    b.to_ascii_lowercase().trim_end_matches(".exe").to_string()
}

/// An exec that looks like a post-clone fixup; anything else runs as an ordinary command.
pub fn classify(argv: &[String]) -> Option<Attempt> {
    let first = base(argv.first()?);
    if matches!(first.as_str(), "sh" | "bash" | "dash") {
        if argv.get(1).map(String::as_str) != Some("-c") {
            return None;
        }
        let script = argv[2..].join(" ");
        let looks = writes_hostname(&script)
            || ["systemd/network", "cloud-init", "ip link set"]
                .iter()
                .any(|k| script.contains(k));
        return looks.then_some(Attempt {
            shell: Shell::Sh,
            script,
        });
    }
    if matches!(first.as_str(), "powershell" | "pwsh") {
        let at = argv.iter().position(|a| {
            let a = a.to_ascii_lowercase();
            a == "-c" || a == "-command"
        })?;
        let script = argv[at + 1..].join(" ");
        return script
            .to_ascii_lowercase()
            .contains("pnpdevice")
            .then_some(Attempt {
                shell: Shell::PowerShell,
                script,
            });
    }
    None
}

/// Reading the hostname is no fixup; writing it is.
fn writes_hostname(script: &str) -> bool {
    ["> /etc/hostname", ">/etc/hostname", "tee /etc/hostname"]
        .iter()
        .any(|k| script.contains(k))
}

fn words(script: &str) -> Vec<String> {
    script
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '"' | '\'' | '(' | ')'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// `ip link set [dev] <dev> address <mac>` somewhere in the script.
fn sets_mac(w: &[String], dev: &str, mac: &str) -> bool {
    (0..w.len()).any(|p| {
        if w.len() < p + 3 || w[p] != "ip" || w[p + 1] != "link" || w[p + 2] != "set" {
            return false;
        }
        let mut q = p + 3;
        if w.get(q).map(String::as_str) == Some("dev") {
            q += 1;
        }
        w.get(q).map(String::as_str) == Some(dev)
            && w.get(q + 1).map(String::as_str) == Some("address")
            && w.get(q + 2).is_some_and(|m| m.eq_ignore_ascii_case(mac))
    })
}

/// What the attempt lacks for this guest; empty = it does the whole job.
pub fn problems(vm: &StoredVm, a: &Attempt) -> Vec<String> {
    let mut p = Vec::new();
    match (vm.config.windows, &a.shell) {
        (true, Shell::Sh) => {
            p.push("this is a Windows guest: want powershell -nop -c <script>".into());
            return p;
        }
        (false, Shell::PowerShell) => {
            p.push("this is a Linux guest: powershell: not found".into());
            return p;
        }
        (true, Shell::PowerShell) => {
            let s = a.script.to_ascii_lowercase().replace(['\'', '"'], "");
            if !s.contains("get-pnpdevice") || !s.contains("-class net") {
                p.push(
                    "does not select the PnP devices of class Net (Get-PnpDevice -Class Net)"
                        .into(),
                );
            }
            match (s.find("disable-pnpdevice"), s.rfind("enable-pnpdevice")) {
                (Some(d), Some(e)) if d < e => {}
                (None, _) => p.push("does not disable the Net devices (Disable-PnpDevice)".into()),
                _ => p.push(
                    "does not re-enable the Net devices after disabling them (Enable-PnpDevice)"
                        .into(),
                ),
            }
            return p;
        }
        (false, Shell::Sh) => {}
    }
    let s = &a.script;
    let name = &vm.config.name;
    if !writes_hostname(s) {
        p.push("does not write /etc/hostname".into());
    }
    if !s.contains(name.as_str()) {
        p.push(format!("does not mention the VM name {name:?}"));
    }
    let w = words(s);
    if vm.hypervisor == FC {
        for (i, n) in vm.network_configs.iter().enumerate() {
            if !sets_mac(&w, &format!("eth{i}"), &n.mac) {
                p.push(format!(
                    "does not set eth{i} to its MAC (ip link set eth{i} address {})",
                    n.mac
                ));
            }
        }
    }
    let cloud_init = s.contains("cloud-init clean") && s.contains("cloud-init init");
    if !cloud_init {
        let lower = s.to_ascii_lowercase();
        for (i, n) in vm.network_configs.iter().enumerate() {
            let file = format!("10-{}.network", n.mac.replace(':', ""));
            if !s.contains(&file) {
                p.push(format!("NIC {i}: no systemd-networkd file {file}"));
            } else if !lower.contains(&n.mac.to_ascii_lowercase()) {
                p.push(format!("NIC {i}: {file} does not match MAC {}", n.mac));
            }
            if let Some(net) = &n.network {
                let addr = format!("Address={}/{}", net.ip, net.prefix);
                if !s.contains(&addr) {
                    p.push(format!("NIC {i}: static address missing ({addr})"));
                }
            }
        }
    }
    if !s.contains("restart systemd-networkd") {
        p.push("does not restart systemd-networkd".into());
    }
    p
}

#[derive(Serialize)]
struct LogLine<'a> {
    at: String,
    kind: &'a str,
    ok: bool,
    problems: &'a [String],
    script: &'a str,
}

fn log_attempt(env: &Env, vm: &StoredVm, ok: bool, problems: &[String], a: &Attempt) {
    let line = LogLine {
        at: rfc3339_nano(now_ns()),
        kind: vm.sim.fixup.as_ref().map(|f| f.kind.as_str()).unwrap_or(""),
        ok,
        problems,
        script: &a.script,
    };
    if let Ok(l) = serde_json::to_string(&line) {
        let path = env.vm_state_dir(&vm.id).join("fixup.log");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{l}");
        }
    }
}

/// Runs a fixup attempt in the guest and returns its exit status. Success marks the clone
/// fixed: its guest MAC becomes the record's and the guest brings its network up.
pub fn attempt(env: &Env, vm: &StoredVm, a: &Attempt) -> Result<i32> {
    if let Some(msg) = faults::take_fixup_failure(env, &vm.id)? {
        let p = vec![msg.clone()];
        log_attempt(env, vm, false, &p, a);
        eprintln!("cocoon-sim: post-clone fixup failed in the guest: {msg}");
        return Ok(1);
    }
    let p = problems(vm, a);
    log_attempt(env, vm, p.is_empty(), &p, a);
    if !p.is_empty() {
        eprintln!("cocoon-sim: post-clone fixup rejected: {}", p.join("; "));
        return Ok(1);
    }
    if pending(vm) {
        let fc = vm.hypervisor == FC;
        crate::vm_ops::update_vm(env, &vm.id, |v| {
            if let Some(f) = v.sim.fixup.as_mut() {
                f.done = true;
            }
            if fc {
                if let Some(n) = v.network_configs.first() {
                    v.sim.guest_mac = n.mac.clone();
                }
            }
        })?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Nic, SimInfo, StaticNet, VmConfig, CH};

    fn vm(hypervisor: &str, windows: bool, static_ip: bool) -> StoredVm {
        let nic = |mac: &str, st: bool| Nic {
            tap: "tapX-0".into(),
            mac: mac.into(),
            num_queues: 2,
            queue_size: 512,
            network: st.then(|| StaticNet {
                ip: "10.213.0.7".into(),
                gateway: "10.213.0.1".into(),
                prefix: 16,
            }),
            ..Default::default()
        };
        StoredVm {
            id: "ID".into(),
            hypervisor: hypervisor.into(),
            state: "running".into(),
            config: VmConfig {
                name: "vk-ns-web-0".into(),
                windows,
                ..Default::default()
            },
            network_configs: vec![
                nic("02:aa:bb:cc:dd:01", static_ip),
                nic("02:aa:bb:cc:dd:02", false),
            ],
            storage_configs: vec![],
            first_booted: true,
            snapshot_ids: Default::default(),
            created_ns: 0,
            updated_ns: 0,
            started_ns: None,
            stopped_ns: None,
            transition_generation: 0,
            last_transition_reason: String::new(),
            last_transition_at: None,
            sim: SimInfo::default(),
        }
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn networkd(vm: &StoredVm) -> String {
        let mut s = String::from("sync; echo 3 > /proc/sys/vm/drop_caches\n");
        s += &format!("echo {} > /etc/hostname\n", vm.config.name);
        if vm.hypervisor == FC {
            for (i, n) in vm.network_configs.iter().enumerate() {
                s += &format!(
                    "ip link set eth{i} down; ip link set eth{i} address {}; ip link set eth{i} up\n",
                    n.mac
                );
            }
        }
        s += "rm -f /etc/systemd/network/10-*.network\n";
        for n in &vm.network_configs {
            let hex = n.mac.replace(':', "");
            let body = match &n.network {
                Some(st) => format!("Address={}/{}\nGateway={}", st.ip, st.prefix, st.gateway),
                None => "DHCP=ipv4\n[DHCPv4]\nClientIdentifier=mac".into(),
            };
            s += &format!(
                "cat > /etc/systemd/network/10-{hex}.network <<'EOF'\n[Match]\nMACAddress={}\n[Network]\n{body}\nEOF\n",
                n.mac
            );
        }
        s + "systemctl restart systemd-networkd"
    }

    #[test]
    fn which_clones_need_a_fixup() {
        let mut env = crate::config::Env::load(&crate::config::DirFlags {
            root_dir: Some("/nonexistent-sim-root".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(needed(&env, &vm(FC, false, false)), None);
        env.guest_fixup = true;
        assert_eq!(needed(&env, &vm(CH, false, false)), None);
        assert_eq!(needed(&env, &vm(CH, false, true)), Some(LINUX));
        assert_eq!(needed(&env, &vm(FC, false, false)), Some(LINUX_FC));
        assert_eq!(needed(&env, &vm(CH, true, false)), Some(WINDOWS));
    }

    #[test]
    fn the_full_linux_scripts_pass() {
        for v in [
            vm(CH, false, true),
            vm(FC, false, false),
            vm(FC, false, true),
        ] {
            let a = classify(&sh(&networkd(&v))).expect("a fixup");
            assert_eq!(problems(&v, &a), Vec::<String>::new(), "{}", a.script);
        }
    }

    /// One line per step, `ip link set dev`, and networkd files written with printf escapes.
    #[test]
    fn the_printf_form_passes() {
        let v = vm(FC, false, true);
        let mut lines = vec![
            "echo 3 > /proc/sys/vm/drop_caches".to_string(),
            "echo vk-ns-web-0 > /etc/hostname".to_string(),
        ];
        for (i, n) in v.network_configs.iter().enumerate() {
            lines.push(format!(
                "ip link set dev eth{i} down && ip link set dev eth{i} address {} && ip link set dev eth{i} up",
                n.mac
            ));
        }
        lines.push("rm -f /etc/systemd/network/10-*.network".into());
        for n in &v.network_configs {
            let cfg = match &n.network {
                Some(st) => format!(
                    "[Match]\\nMACAddress={}\\n\\n[Network]\\nAddress={}/{}\\nGateway={}\\n",
                    n.mac, st.ip, st.prefix, st.gateway
                ),
                None => format!(
                    "[Match]\\nMACAddress={}\\n\\n[Network]\\nDHCP=ipv4\\n",
                    n.mac
                ),
            };
            lines.push(format!(
                "printf '{cfg}' > /etc/systemd/network/10-{}.network",
                n.mac.replace(':', "")
            ));
        }
        lines.push("systemctl restart systemd-networkd".into());
        let a = classify(&sh(&lines.join("\n"))).unwrap();
        assert_eq!(problems(&v, &a), Vec::<String>::new(), "{}", a.script);
    }

    #[test]
    fn the_cloud_init_variant_passes() {
        let v = vm(CH, false, true);
        let s = "echo vk-ns-web-0 > /etc/hostname\nrm -f /etc/systemd/network/10-*.network\n\
                 cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init\n\
                 cloud-init modules --mode=config && systemctl restart systemd-networkd";
        assert!(problems(&v, &classify(&sh(s)).unwrap()).is_empty());
    }

    #[test]
    fn partial_linux_scripts_name_what_is_missing() {
        let v = vm(FC, false, true);
        let full = networkd(&v);
        let cases = [
            (
                full.replace("/etc/hostname", "/etc/hosts"),
                "does not write /etc/hostname",
            ),
            (
                full.replace("vk-ns-web-0", "other"),
                "does not mention the VM name",
            ),
            (
                full.replace("eth1 address", "eth1 addr"),
                "does not set eth1 to its MAC",
            ),
            (
                full.replace("10-02aabbccdd02", "10-02AABBCCDD02"),
                "NIC 1: no systemd-networkd file 10-02aabbccdd02.network",
            ),
            (
                full.replace("Address=10.213.0.7/16", "Address=10.213.0.8/16"),
                "NIC 0: static address missing (Address=10.213.0.7/16)",
            ),
            (
                full.replace("systemctl restart systemd-networkd", ""),
                "does not restart systemd-networkd",
            ),
        ];
        for (script, want) in cases {
            let p = problems(&v, &classify(&sh(&script)).unwrap());
            assert!(p.iter().any(|x| x.contains(want)), "{want:?} not in {p:?}");
        }
    }

    #[test]
    fn windows_wants_the_pnp_reset() {
        let v = vm(CH, true, true);
        let ps = |s: &str| {
            vec![
                "powershell".into(),
                "-nop".into(),
                "-c".into(),
                s.to_string(),
            ]
        };
        let good = "Get-PnpDevice -Class Net -PresentOnly | ForEach-Object { Disable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false; Enable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false }";
        assert!(problems(&v, &classify(&ps(good)).unwrap()).is_empty());
        let piped = "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";
        assert!(problems(&v, &classify(&ps(piped)).unwrap()).is_empty());
        let only_disable = "Get-PnpDevice -Class Net | Disable-PnpDevice -Confirm:$false";
        assert!(problems(&v, &classify(&ps(only_disable)).unwrap())
            .iter()
            .any(|p| p.contains("re-enable")));
        assert!(!problems(&v, &classify(&sh("echo x > /etc/hostname")).unwrap()).is_empty());
        assert!(!problems(&vm(CH, false, true), &classify(&ps(good)).unwrap()).is_empty());
    }

    #[test]
    fn ordinary_commands_are_not_fixups() {
        assert_eq!(classify(&sh("echo hello > marker")), None);
        assert_eq!(classify(&["ipconfig".into(), "/renew".into()]), None);
        assert_eq!(classify(&["hostname".into()]), None);
        assert_eq!(classify(&sh("cat /etc/hostname")), None);
        assert!(classify(&[
            "/bin/sh".into(),
            "-c".into(),
            "echo a >/etc/hostname".into()
        ])
        .is_some());
    }
}
