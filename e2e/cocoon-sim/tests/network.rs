//! Real guests: ping, TCP, SSH banner, DHCP leases (LEASE-2–LEASE-6), ports, cgroups.
//! Runs in netns mode when root with iproute2, otherwise in loopback mode; a check that needs
//! what the host lacks (root, iputils-ping, a writable cgroup v2) is skipped with the reason
//! printed, and fails under CI, which provides all of them.

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

fn connect(ip: &str, port: u16) -> Option<TcpStream> {
    let addr = format!("{ip}:{port}").parse().ok()?;
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()
}

fn banner(ip: &str) -> Option<String> {
    let mut s = connect(ip, 22)?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn ping_binary() -> Option<&'static str> {
    ["/usr/bin/ping", "/bin/ping", "/usr/sbin/ping"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn leases(sim: &Sim) -> Vec<Value> {
    serde_json::from_str::<Option<Vec<Value>>>(&read(&sim.leases_path()))
        .ok()
        .flatten()
        .unwrap_or_default()
}

fn lease_for(sim: &Sim, mac: &str) -> Option<Value> {
    leases(sim).into_iter().find(|l| l["mac"] == mac)
}

#[test]
fn guest_answers_ping_tcp_ssh_and_http() {
    let sim = Sim::new();
    sim.run_vm("net", &[]);
    let info = sim.info("net");
    let ip = info["ip"].as_str().unwrap().to_string();
    println!("net mode: {}", info["net_mode"]);
    let b = wait_for("ssh banner", || banner(&ip));
    assert_eq!(b, "SSH-2.0-cocoon-sim\r\n");
    let mut s = wait_for("port 8080", || connect(&ip, 8080));
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    match ping_binary() {
        None => required("ping: iputils-ping not installed (apt-get install -y iputils-ping)"),
        Some(ping) => {
            let ok = std::process::Command::new(ping)
                .args(["-c1", "-W1", &ip])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(ok, "guest {ip} answers ping");
        }
    }
}

#[test]
fn netns_mode_builds_and_removes_plumbing_when_privileged() {
    let sim = Sim::new();
    let vm = sim.run_vm("ns", &[]);
    let info = sim.info("ns");
    if info["net_mode"] != "netns" {
        required(&format!(
            "netns checks: not root or no iproute2 (mode {})",
            info["net_mode"]
        ));
    }
    let ns = info["netns"].as_str().unwrap().to_string();
    assert_eq!(
        vm["network_configs"][0]["netns_path"],
        format!("/var/run/netns/{ns}")
    );
    assert!(Path::new(&format!("/var/run/netns/{ns}")).exists());
    let veth = info["veth"].as_str().unwrap().to_string();
    assert!(Path::new("/sys/class/net").join(&veth).exists());
    sim.run(&["vm", "rm", "--force", "ns"]).ok();
    assert!(!Path::new(&format!("/var/run/netns/{ns}")).exists());
    assert!(!Path::new("/sys/class/net").join(&veth).exists());
}

#[test]
fn loopback_mode_serves_on_a_private_127_address() {
    let sim = Sim::with_env(&[("COCOON_SIM_NET", "loopback")]);
    let vm = sim.run_vm("lo", &[]);
    let info = sim.info("lo");
    assert_eq!(info["net_mode"], "loopback");
    let ip = info["ip"].as_str().unwrap().to_string();
    assert!(ip.starts_with("127.213."));
    assert!(vm["network_configs"][0].get("netns_path").is_none());
    assert_eq!(
        wait_for("ssh banner", || banner(&ip)),
        "SSH-2.0-cocoon-sim\r\n"
    );
}

#[test]
fn dhcp_lease_appears_and_survives_rm() {
    let sim = Sim::new();
    let vm = sim.run_vm("dhcp", &[]);
    let mac = vm["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    let ip = sim.info("dhcp")["ip"].as_str().unwrap().to_string();
    let lease = wait_for("lease row", || lease_for(&sim, &mac));
    assert_eq!(lease["ip"], ip);
    let expiry = lease["expiry"].as_str().unwrap();
    assert!(!expiry.contains('.'), "second precision: {expiry}");
    assert!(expiry.ends_with('Z') || expiry[expiry.len() - 6..].starts_with(['+', '-']));
    let text = read(&sim.leases_path());
    assert!(
        text.starts_with("[\n  {\n    \"mac\": "),
        "pretty array: {text}"
    );
    assert!(!text.ends_with('\n'), "no trailing newline");
    sim.run(&["vm", "rm", "--force", "dhcp"]).ok();
    assert!(
        lease_for(&sim, &mac).is_some(),
        "rm does not release the lease"
    );
    sim.run(&["sim", "lease", "del", "--mac", &mac]).ok();
    assert_eq!(
        read(&sim.leases_path()),
        "null",
        "empty set is literal null"
    );
}

#[test]
fn static_network_vm_gets_no_lease() {
    let sim = Sim::with_env(&[("COCOON_SIM_LEASE_DELAY_MS", "0")]);
    let st = sim.run_vm("st", &["--network", "cocoon-static"]);
    let dh = sim.run_vm("dh", &[]);
    let dmac = dh["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("dhcp lease", || lease_for(&sim, &dmac));
    let smac = st["network_configs"][0]["mac"].as_str().unwrap();
    assert!(lease_for(&sim, smac).is_none());
}

#[test]
fn lease_faults_withhold_renew_and_foreign_mac() {
    let sim = Sim::with_env(&[("COCOON_SIM_LEASE_DELAY_MS", "60000")]);
    let vm = sim.run_vm("lf", &[]);
    let mac = vm["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    sim.run(&[
        "sim",
        "fault",
        "lease",
        "lf",
        "--until-renew",
        "--delay-ms",
        "0",
    ])
    .ok();
    sim.run(&["vm", "exec", "lf", "--", "true"]).ok();
    assert!(lease_for(&sim, &mac).is_none(), "withheld until a renew");
    sim.run(&["vm", "exec", "lf", "--", "ipconfig", "/renew"])
        .ok();
    wait_for("lease after renew", || lease_for(&sim, &mac));
    sim.run(&["sim", "fault", "lease", "lf", "--mac", "7A:10:C4:88:02:FE"])
        .ok();
    let other = wait_for("lease under the unexpected MAC", || {
        lease_for(&sim, "7a:10:c4:88:02:fe")
    });
    assert_eq!(other["ip"], sim.info("lf")["ip"]);
    assert!(
        lease_for(&sim, &mac).is_none(),
        "same IP moved to the other MAC"
    );
}

#[test]
fn firecracker_clone_leases_under_source_mac_until_fixed() {
    let sim = Sim::with_env(&[("COCOON_SIM_LEASE_DELAY_MS", "0")]);
    let src = "02:aa:bb:cc:dd:01";
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "fc",
        "--hypervisor",
        "firecracker",
        "--source-mac",
        src,
    ])
    .ok();
    let vm = sim
        .run(&["vm", "clone", "--output", "json", "--name", "fcc", "fc"])
        .ok()
        .json();
    let mac = vm["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(mac, src);
    wait_for("lease under the source MAC", || lease_for(&sim, src));
    assert!(lease_for(&sim, &mac).is_none());
    sim.run(&[
        "vm", "exec", "fcc", "--", "ip", "link", "set", "dev", "eth0", "address", &mac,
    ])
    .ok();
    wait_for("lease under the recorded MAC", || lease_for(&sim, &mac));
}

#[test]
fn ports_open_and_close_by_fault() {
    let sim = Sim::with_env(&[("COCOON_SIM_GUEST_PORTS", "22")]);
    sim.run_vm("ports", &[]);
    let ip = sim.info("ports")["ip"].as_str().unwrap().to_string();
    wait_for("ssh", || banner(&ip));
    assert!(connect(&ip, 8080).is_none());
    sim.run(&["sim", "fault", "open-port", "ports", "8080"])
        .ok();
    wait_for("8080 opened", || connect(&ip, 8080));
    sim.run(&["sim", "fault", "close-port", "ports", "22"]).ok();
    wait_for("22 closed", || connect(&ip, 22).is_none().then_some(()));
}

#[test]
fn guest_runs_in_its_cgroup_scope_when_v2_is_writable() {
    let sim = Sim::new();
    let vm = sim.run_vm("cg", &[]);
    let info = sim.info("cg");
    let scope = info["cgroup"].as_str().unwrap();
    if std::env::var("COCOON_SIM_GUESTS").as_deref() == Ok("shared") {
        assert_eq!(
            scope, "",
            "a hub guest is a thread of the hub: no scope of its own"
        );
        return;
    }
    if scope.is_empty() {
        required("cgroup checks: no writable cgroup v2");
    }
    assert!(scope.ends_with(&format!(
        "/cocoon.slice/vm-{}.scope",
        vm["id"].as_str().unwrap()
    )));
    let procs = read(&Path::new(scope).join("cgroup.procs"));
    assert!(
        procs.lines().any(|l| l == vm["pid"].to_string().as_str()),
        "guest pid in scope: {procs}"
    );
    assert!(read(&Path::new(scope).join("cpu.stat")).contains("usage_usec"));
    sim.run(&["vm", "rm", "--force", "cg"]).ok();
    assert!(!Path::new(scope).exists());
}

#[test]
fn cleanup_removes_guests_and_plumbing() {
    let sim = Sim::new();
    sim.run_vm("c1", &[]);
    sim.run_vm("c2", &[]);
    let infos: Vec<Value> = ["c1", "c2"].iter().map(|n| sim.info(n)).collect();
    sim.run(&["sim", "cleanup"]).ok();
    for i in &infos {
        assert_eq!(sim.info(i["id"].as_str().unwrap())["alive"], false);
        if let Some(ns) = i["netns"].as_str().filter(|s| !s.is_empty()) {
            assert!(!Path::new(&format!("/var/run/netns/{ns}")).exists());
        }
        if let Some(cg) = i["cgroup"].as_str().filter(|s| !s.is_empty()) {
            assert!(!Path::new(cg).exists());
        }
    }
    assert_eq!(sim.inspect("c1")["state"], "stopped (stale)");
}

#[test]
fn boot_delay_keeps_ports_closed_while_running() {
    let sim = Sim::with_env(&[("COCOON_SIM_BOOT_MS", "600000")]);
    let vm = sim.run_vm("slowboot", &[]);
    assert_eq!(vm["state"], "running");
    let ip = sim.info("slowboot")["ip"].as_str().unwrap().to_string();
    wait_for("guest booting", || {
        let r = sim.run(&["vm", "logs", "slowboot"]);
        r.stdout.contains("booting slowboot").then_some(())
    });
    assert!(
        connect(&ip, 22).is_none(),
        "services are not up before the boot delay"
    );
}

#[test]
fn all_leftovers_sweeps_resources_of_a_vanished_root() {
    let crashed = Sim::new();
    crashed.run_vm("orphan", &[]);
    let info = crashed.info("orphan");
    // A killed harness: its root disappears without `sim cleanup`.
    std::fs::remove_dir_all(&crashed.root).unwrap();
    let sweeper = Sim::new();
    sweeper.run(&["sim", "cleanup", "--all-leftovers"]).ok();
    let pid = info["pid"].as_i64().unwrap();
    let cmdline = read(Path::new(&format!("/proc/{pid}/cmdline")));
    assert!(
        !cmdline.contains(info["id"].as_str().unwrap()),
        "orphan guest gone"
    );
    if let Some(ns) = info["netns"].as_str().filter(|s| !s.is_empty()) {
        assert!(!Path::new(&format!("/var/run/netns/{ns}")).exists());
        assert!(!Path::new("/sys/class/net")
            .join(info["veth"].as_str().unwrap())
            .exists());
    }
}
