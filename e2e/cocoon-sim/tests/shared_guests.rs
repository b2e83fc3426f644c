//! `COCOON_SIM_GUESTS=shared`: every guest of a root is a thread of one hub process, and
//! still behaves per the contract: its ports close when it stops, `vm rm` frees its address,
//! its lease is written, and a killed hub leaves every guest not running.
//! `COCOON_SIM_ZERO_BOOT=1`: ports and lease are there as soon as `vm run` returns.

mod common;

use common::*;
use serde_json::Value;
use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SHARED: (&str, &str) = ("COCOON_SIM_GUESTS", "shared");

fn banner(ip: &str) -> Option<String> {
    let addr = format!("{ip}:22").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn ip(sim: &Sim, vm: &str) -> String {
    sim.info(vm)["ip"].as_str().unwrap().to_string()
}

fn pid(sim: &Sim, vm: &str) -> i64 {
    sim.inspect(vm)["pid"].as_i64().unwrap()
}

/// The process a task belongs to.
fn tgid(pid: i64) -> i64 {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no /proc/{pid}/status"))
}

fn lease_ip(sim: &Sim, mac: &str) -> Option<String> {
    let rows: Vec<Value> = serde_json::from_str::<Option<Vec<Value>>>(&read(&sim.leases_path()))
        .ok()
        .flatten()
        .unwrap_or_default();
    rows.iter()
        .find(|r| r["mac"] == mac)
        .map(|r| r["ip"].as_str().unwrap_or_default().to_string())
}

fn mac(vm: &Value) -> String {
    vm["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string()
}

fn address_claim(ip: &str) -> PathBuf {
    let run = Path::new("/run/vksim");
    let dir = if run.is_dir() {
        run.to_path_buf()
    } else {
        std::env::temp_dir().join("vksim")
    };
    dir.join("ips").join(ip)
}

#[test]
fn guests_are_threads_of_one_hub_and_keep_the_contract() {
    let sim = Sim::with_env(&[SHARED]);
    let a = sim.run_vm("a", &[]);
    let b = sim.run_vm("b", &[]);
    let (pa, pb) = (pid(&sim, "a"), pid(&sim, "b"));
    assert_ne!(pa, pb);
    assert_eq!(tgid(pa), tgid(pb), "both guests live in one process");
    assert_ne!(tgid(pa), pa, "a guest is a thread, not the hub's main task");
    let (ia, ib) = (ip(&sim, "a"), ip(&sim, "b"));
    assert_eq!(banner(&ia).as_deref(), Some("SSH-2.0-cocoon-sim\r\n"));
    assert_eq!(banner(&ib).as_deref(), Some("SSH-2.0-cocoon-sim\r\n"));
    wait_for("a's lease", || {
        lease_ip(&sim, &mac(&a)).filter(|l| *l == ia)
    });
    wait_for("b's lease", || {
        lease_ip(&sim, &mac(&b)).filter(|l| *l == ib)
    });

    sim.run(&["vm", "stop", "a"]).ok();
    assert_eq!(banner(&ia), None, "a stopped guest's port is closed");
    assert_eq!(sim.info("a")["alive"], false);
    assert_eq!(banner(&ib).as_deref(), Some("SSH-2.0-cocoon-sim\r\n"));
    sim.run(&["vm", "start", "a"]).ok();
    assert_eq!(sim.inspect("a")["state"], "running");
    assert_eq!(banner(&ia).as_deref(), Some("SSH-2.0-cocoon-sim\r\n"));

    sim.run(&["sim", "fault", "close-port", "b", "22"]).ok();
    assert_eq!(banner(&ib), None, "a port the control drops is closed");
    let logs = sim.run(&["vm", "logs", "b"]).ok().stdout;
    assert!(logs.contains("closed port 22"), "{logs}");

    assert!(address_claim(&ib).exists());
    sim.run(&["vm", "rm", "--force", "b"]).ok();
    assert!(!address_claim(&ib).exists(), "vm rm frees the address");
    assert_eq!(
        lease_ip(&sim, &mac(&b)).as_deref(),
        Some(ib.as_str()),
        "the lease stays"
    );
}

#[test]
fn a_killed_hub_leaves_every_guest_dead() {
    let sim = Sim::with_env(&[SHARED]);
    sim.run_vm("a", &[]);
    sim.run_vm("b", &[]);
    let hub = tgid(pid(&sim, "a"));
    // SAFETY: SIGKILL to the hub this test's simulator started.
    assert_eq!(unsafe { libc::kill(hub as i32, libc::SIGKILL) }, 0);
    for vm in ["a", "b"] {
        wait_for("the guest to be seen dead", || {
            (sim.inspect(vm)["state"] == "stopped (stale)").then_some(())
        });
        assert_eq!(sim.info(vm)["alive"], false);
    }
    let listed: Vec<Value> =
        serde_json::from_str(&sim.run(&["vm", "list", "--format", "json"]).ok().stdout).unwrap();
    assert!(
        listed.iter().all(|v| v["state"] == "running"),
        "list shows the stored state"
    );
    sim.run(&["vm", "start", "a"]).ok();
    assert_ne!(
        tgid(pid(&sim, "a")),
        hub,
        "a new hub runs the restarted guest"
    );
    assert_eq!(
        banner(&ip(&sim, "a")).as_deref(),
        Some("SSH-2.0-cocoon-sim\r\n")
    );
    assert_eq!(sim.info("b")["alive"], false);
}

#[test]
fn zero_boot_ignores_boot_and_lease_delays() {
    for guests in ["shared", "process"] {
        let sim = Sim::with_env(&[
            ("COCOON_SIM_GUESTS", guests),
            ("COCOON_SIM_ZERO_BOOT", "1"),
            ("COCOON_SIM_BOOT_MS", "600000"),
            ("COCOON_SIM_LEASE_DELAY_MS", "600000"),
        ]);
        let vm = sim.run_vm("z", &[]);
        let ip = ip(&sim, "z");
        if guests == "shared" {
            // The hub answers `vm run` once the guest has opened its ports and taken its lease.
            assert_eq!(banner(&ip).as_deref(), Some("SSH-2.0-cocoon-sim\r\n"));
            assert_eq!(lease_ip(&sim, &mac(&vm)), Some(ip.clone()));
        }
        wait_for("the banner", || banner(&ip));
        wait_for("the lease", || lease_ip(&sim, &mac(&vm)));
    }
}
