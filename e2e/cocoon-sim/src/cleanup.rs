//! `sim cleanup`: take back every host resource this root created (guests, netns, veths, the
//! shared bridge once unused, cgroup scopes, address claims). With `--all-leftovers` also
//! whatever a killed earlier run left behind, but never what another live root still owns.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use crate::cgroup;
use crate::config::Env;
use crate::error::Result;
use crate::guest;
use crate::ipam;
use crate::lock;
use crate::netns;
use crate::output::log;
use crate::store::Store;
use crate::vmnet;

struct GuestProc {
    pid: i32,
    id: String,
    control: PathBuf,
}

impl GuestProc {
    /// `<root>/vms/<ID>/guest.json` → `<root>`.
    fn root(&self) -> Option<PathBuf> {
        Some(self.control.parent()?.parent()?.parent()?.to_path_buf())
    }
}

fn guest_procs() -> Vec<GuestProc> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let raw = fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let at = args.iter().position(|a| a == "guest")?;
            if at == 0 || args[at - 1] != "sim" {
                return None;
            }
            let val = |flag: &str| {
                let i = args.iter().position(|a| a == flag)?;
                args.get(i + 1).cloned()
            };
            Some(GuestProc {
                pid,
                id: val("--id")?,
                control: PathBuf::from(val("--control")?),
            })
        })
        .collect()
}

/// `cocoon sim hub --root R` processes: (pid, R).
fn hubs() -> Vec<(i32, PathBuf)> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let raw = fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
            let at = args.iter().position(|a| *a == b"hub")?;
            if at == 0 || args[at - 1] != b"sim" || args.get(at + 1) != Some(&&b"--root"[..]) {
                return None;
            }
            let root = String::from_utf8_lossy(args.get(at + 2)?).into_owned();
            Some((pid, PathBuf::from(root)))
        })
        .collect()
}

/// SIGKILL, then wait until the process is gone, so its guests' ports are closed.
fn kill_hub(pid: i32) {
    // SAFETY: plain kill(2) of a hub process found in /proc just before.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.trim_start().chars().next())
            });
        if matches!(state, None | Some('Z') | Some('X')) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub fn cleanup(env: &Env, all_leftovers: bool) -> Result<()> {
    for (pid, root) in hubs() {
        if root == env.root || all_leftovers && !root.is_dir() {
            kill_hub(pid);
        }
    }
    let store = Store::new(&env.root);
    let vms = store.vms().unwrap_or_default();
    let mut ids: BTreeSet<String> = vms.iter().map(|v| v.id.clone()).collect();
    for p in guest_procs() {
        let ours = p.root().is_some_and(|r| r == env.root);
        let orphan = all_leftovers && !p.root().is_some_and(|r| r.join("vms").join(&p.id).is_dir());
        if ours || orphan {
            guest::kill(p.pid, &p.id, true);
            if ours {
                ids.insert(p.id.clone());
            }
        }
    }
    for vm in &vms {
        guest::kill(vm.sim.pid, &vm.id, true);
        cgroup::remove_scope(&vm.sim.cgroup);
    }
    if let Some(parent) = cgroup::parent_dir(env) {
        for id in &ids {
            cgroup::remove_scope(&parent.join(format!("vm-{id}.scope")).display().to_string());
        }
    }
    let _l = lock::exclusive(&ipam::net_lock(env))?;
    for c in ipam::claims(env) {
        if c.root == env.root {
            ids.insert(c.id.clone());
            ipam::release(env, &c.ip, &c.id);
        } else if all_leftovers && !c.owner_alive() {
            teardown_vm_net(&c.id);
            ipam::release(env, &c.ip, &c.id);
        }
    }
    for id in &ids {
        if id.len() >= 8 {
            teardown_vm_net(id);
        }
    }
    if all_leftovers {
        remove_unowned_links(env);
        remove_unowned_scopes(env);
    }
    vmnet::maybe_drop_bridge(env);
    cgroup::remove_parent_if_empty(env);
    log(
        "sim.cleanup",
        format!("cleaned {} VM(s) under {}", ids.len(), env.root.display()),
    );
    Ok(())
}

fn teardown_vm_net(id: &str) {
    for veth in netns::veth_names(id) {
        netns::teardown("", &veth);
    }
    netns::teardown(&netns::netns_name(id), "");
}

/// vksim- namespaces, and ports of the simulator's bridge, whose VM no live root claims.
fn remove_unowned_links(env: &Env) {
    let live: BTreeSet<String> = ipam::claims(env)
        .into_iter()
        .filter(|c| c.owner_alive())
        .map(|c| c.id)
        .collect();
    for ns in netns::list_netns() {
        if let Some(id) = ns.strip_prefix(netns::NETNS_PREFIX) {
            if !live.contains(id) {
                netns::teardown(&ns, "");
            }
        }
    }
    let live_veths: BTreeSet<String> = live
        .iter()
        .filter(|i| i.len() >= 8)
        .flat_map(|i| netns::veth_names(i))
        .collect();
    for link in netns::list_links() {
        if link != netns::BRIDGE && netns::on_bridge(&link) && !live_veths.contains(&link) {
            netns::teardown("", &link);
        }
    }
}

/// Empty `vm-<ID>.scope`s whose VM no live root knows; a busy scope refuses rmdir anyway.
fn remove_unowned_scopes(env: &Env) {
    let Some(parent) = cgroup::parent_dir(env) else {
        return;
    };
    let mut live: BTreeSet<String> = ipam::claims(env)
        .into_iter()
        .filter(|c| c.owner_alive())
        .map(|c| c.id)
        .collect();
    for p in guest_procs() {
        if p.root().is_some_and(|r| r.join("vms").join(&p.id).is_dir()) {
            live.insert(p.id);
        }
    }
    let Ok(rd) = fs::read_dir(&parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let id = name
            .strip_prefix("vm-")
            .and_then(|n| n.strip_suffix(".scope"));
        if id.is_some_and(|id| !live.contains(id)) {
            let _ = fs::remove_dir(e.path());
        }
    }
}
