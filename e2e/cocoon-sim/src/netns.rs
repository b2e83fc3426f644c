//! Real guest networking: one netns per VM (`vksim-<ID>`), a veth into the shared `vksim0`
//! bridge that owns 10.213.0.1/16. Nothing routes beyond the bridge, so the only reachable
//! addresses are the namespaces we made. Every `ip` call is an argv, never a shell line.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::{fail, Result};

pub const BRIDGE: &str = "vksim0";
pub const NETNS_PREFIX: &str = "vksim-";

pub fn netns_name(id: &str) -> String {
    format!("{NETNS_PREFIX}{id}")
}

pub fn netns_path(name: &str) -> String {
    format!("/var/run/netns/{name}")
}

/// The names the host end of NIC 0 can have: the TAP name cocoon gives the record (CNI
/// `tap<id8>-0`, bridge mode `bt<id8>-0`), so a reader of per-VM network counters finds the
/// device the record names, with a tap's direction (its rx is what the guest sent).
pub fn veth_names(id: &str) -> [String; 2] {
    [format!("tap{}-0", &id[..8]), format!("bt{}-0", &id[..8])]
}

/// The link is a port of the simulator's bridge: ours, whatever its name.
pub fn on_bridge(link: &str) -> bool {
    std::fs::read_link(Path::new("/sys/class/net").join(link).join("master"))
        .is_ok_and(|m| m.file_name().is_some_and(|n| n == BRIDGE))
}

pub fn ip_binary() -> Option<String> {
    for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        let p = format!("{dir}/ip");
        if Path::new(&p).exists() {
            return Some(p);
        }
    }
    None
}

pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && ip_binary().is_some()
}

pub fn ip(args: &[&str]) -> Result<()> {
    let Some(bin) = ip_binary() else {
        return fail("ip: executable file not found in $PATH");
    };
    let out = Command::new(bin).args(args).stdin(Stdio::null()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        fail(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Several `ip` commands in one process (`ip [-n NS] -batch -`), stopping at the first that
/// fails: setting up a guest's network costs three execs instead of ten.
fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<()> {
    use std::io::Write;
    let Some(bin) = ip_binary() else {
        return fail("ip: executable file not found in $PATH");
    };
    let mut cmd = Command::new(bin);
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let script = lines.join("\n") + "\n";
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        fail(format!(
            "ip {}-batch [{}]: {}",
            netns.map(|n| format!("-n {n} ")).unwrap_or_default(),
            lines.join("; "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip_ok(args: &[&str]) -> bool {
    ip(args).is_ok()
}

pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

pub fn netns_exists(name: &str) -> bool {
    Path::new(&netns_path(name)).exists()
}

/// The bridge's own MAC, fixed. A Linux bridge left to itself takes the lowest MAC among its
/// ports, so every veth that joins or leaves (any root's VM created or removed) may change it;
/// a guest that had already resolved the gateway then answers to the old MAC, and its replies
/// are lost until it resolves the gateway again: a connection to it fails just after a VM of
/// another test comes or goes. A MAC set by hand never follows the ports.
/// Locally administered and unicast (`02:`), the rest "vksim" in ASCII.
pub const BRIDGE_MAC: &str = "02:76:6b:73:69:6d";

/// `addr_assign_type` 3 (NET_ADDR_SET): the address was set by hand, so it stays.
fn bridge_mac_is_fixed() -> bool {
    let sys = Path::new("/sys/class/net").join(BRIDGE);
    std::fs::read_to_string(sys.join("addr_assign_type")).is_ok_and(|t| t.trim() == "3")
        && std::fs::read_to_string(sys.join("address")).is_ok_and(|a| a.trim() == BRIDGE_MAC)
}

pub fn ensure_bridge(gateway: &str) -> Result<()> {
    if !link_exists(BRIDGE) {
        ip(&[
            "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge",
        ])?;
    } else if !bridge_mac_is_fixed() {
        // A bridge whose MAC was not set by hand, whoever made it, gets the fixed one.
        ip(&["link", "set", BRIDGE, "address", BRIDGE_MAC])?;
    }
    let cidr = format!("{gateway}/16");
    // `replace` is idempotent, so a half-built bridge from a killed run is repaired.
    ip(&["addr", "replace", &cidr, "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])
}

/// Netns + veth pair with the guest end named eth0, carrying the VM's MAC and address.
pub fn plumb(ns: &str, veth: &str, mac: &str, addr: Option<(&String, i64)>) -> Result<()> {
    if netns_exists(ns) {
        // Left over from an earlier life of this VM: its old eth0 goes first.
        let _ = ip(&["-n", ns, "link", "del", "eth0"]);
    } else {
        ip(&["netns", "add", ns])?;
    }
    if link_exists(veth) {
        let _ = ip(&["link", "del", veth]);
    }
    ip_batch(
        None,
        &[
            format!("link add {veth} type veth peer name eth0 netns {ns}"),
            format!("link set {veth} master {BRIDGE}"),
            format!("link set {veth} up"),
        ],
    )?;
    let mut inside = Vec::new();
    if !mac.is_empty() {
        inside.push(format!("link set eth0 address {mac}"));
    }
    if let Some((ip_addr, prefix)) = addr {
        inside.push(format!("addr replace {ip_addr}/{prefix} dev eth0"));
    }
    inside.push("link set eth0 up".into());
    inside.push("link set lo up".into());
    ip_batch(Some(ns), &inside)?;
    if let Some((ip_addr, _)) = addr {
        // The host may still hold this address's neighbour entry from the guest that had it
        // before (another VM, maybe of another root): until that entry is probed again
        // (seconds), the host would send this guest's traffic to a MAC no port has.
        let _ = ip_ok(&["neigh", "flush", "to", ip_addr, "dev", BRIDGE]);
    }
    Ok(())
}

pub fn teardown(ns: &str, veth: &str) {
    if !veth.is_empty() && link_exists(veth) {
        let _ = ip_ok(&["link", "del", veth]);
    }
    if !ns.is_empty() && netns_exists(ns) {
        let _ = ip_ok(&["netns", "del", ns]);
    }
}

pub fn delete_bridge() {
    if link_exists(BRIDGE) {
        let _ = ip_ok(&["link", "del", BRIDGE]);
    }
}

pub fn list_netns() -> Vec<String> {
    std::fs::read_dir("/var/run/netns")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn list_links() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Enters a named netns; the guest calls this before opening any socket.
pub fn enter(ns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(netns_path(ns))?;
    // SAFETY: setns on a descriptor we own; the process is still single-threaded here.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
