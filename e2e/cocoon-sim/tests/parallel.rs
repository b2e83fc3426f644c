//! Calls on distinct VMs do not wait for each other: a VM whose record lock is held (`sim
//! fault hold`) delays only changes to that VM, while other VMs are stopped, started,
//! created and removed, and every VM is still read and listed. Nor does a VM's removal wait on
//! the other VMs of the host: it frees its own address as cocoon's CNI teardown does.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

#[test]
fn a_held_vm_blocks_only_its_own_changes() {
    let sim = Sim::new();
    sim.run_vm("held", &[]);
    sim.run_vm("free", &[]);
    let mut hold = sim
        .cmd(&["sim", "fault", "hold", "held"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hold.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n");
    let mut stop_held = sim.spawn(&["vm", "stop", "held"]);

    sim.run(&["vm", "stop", "free"]).ok();
    assert_eq!(sim.inspect("free")["state"], "stopped");
    sim.run(&["vm", "start", "free"]).ok();
    assert_eq!(sim.inspect("free")["state"], "running");
    sim.run_vm("fresh", &[]);
    sim.run(&["vm", "run", "--name", "fresh", IMAGE])
        .err("vm name \"fresh\" already exists");
    let listed: Vec<Value> =
        serde_json::from_str(&sim.run(&["vm", "list", "--format", "json"]).ok().stdout).unwrap();
    let mut names: Vec<&str> = listed
        .iter()
        .map(|v| v["config"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["free", "fresh", "held"]);
    sim.run(&["vm", "rm", "--force", "fresh"]).ok();

    assert!(
        stop_held.try_wait().unwrap().is_none(),
        "vm stop of the held VM finished while its lock was held"
    );
    assert_eq!(sim.inspect("held")["state"], "running");
    assert_eq!(sim.info("held")["alive"], true);

    drop(hold.stdin.take());
    assert!(hold.wait().unwrap().success());
    let out = stop_held.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sim.inspect("held")["state"], "stopped");
}

#[test]
fn parallel_creates_get_distinct_ids_and_addresses() {
    let sim = Sim::new();
    sim.pull(IMAGE);
    let kids: Vec<_> = (0..8)
        .map(|i| {
            let name = format!("p{i}");
            sim.spawn(&["vm", "run", "--output", "json", "--name", &name, IMAGE])
        })
        .collect();
    for k in kids {
        let out = k.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed: Vec<Value> =
        serde_json::from_str(&sim.run(&["vm", "list", "--format", "json"]).ok().stdout).unwrap();
    assert_eq!(listed.len(), 8);
    let mut ids: Vec<&str> = listed.iter().map(|v| v["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 8);
    let mut ips: Vec<String> = (0..8)
        .map(|i| {
            sim.info(&format!("p{i}"))["ip"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    ips.sort_unstable();
    ips.dedup();
    assert_eq!(ips.len(), 8);
}

/// `vm rm` of a loopback VM reads no address claim but its own, however many VMs the host's
/// other roots hold, so a mass delete costs per VM what a mass create does. Another claim that
/// cannot be read (a FIFO without a writer blocks its reader) shows it: were it read, the rm
/// would never return.
#[test]
fn vm_rm_reads_no_other_address_claim() {
    let ipam = std::env::temp_dir().join(format!("cocoon-sim-ipam-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ipam);
    std::fs::create_dir_all(ipam.join("ips")).unwrap();
    let sim = Sim::with_env(&[
        ("COCOON_SIM_NET", "loopback"),
        ("COCOON_SIM_IPAM_DIR", ipam.to_str().unwrap()),
    ]);
    let vm = sim.run_vm("mine", &[]);
    let id = vm["id"].as_str().unwrap().to_string();
    let ip = sim.info("mine")["ip"].as_str().unwrap().to_string();
    assert!(ip.starts_with("127.213."), "a loopback address: {ip}");
    // Another root's claims, in the netns range and in the loopback one.
    let unreadable = ["10.213.7.7", "127.213.255.254"].map(|a| ipam.join("ips").join(a));
    for f in &unreadable {
        let made = std::process::Command::new("mkfifo")
            .arg(f)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}", f.display());
    }

    let mut rm = sim.spawn(&["vm", "rm", "--force", "--", &id]);
    let done = (0..400).find_map(|_| {
        let st = rm.try_wait().unwrap();
        if st.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        st
    });
    if done.is_none() {
        let _ = rm.kill();
    }
    // Gone before anything else (cleanup included) could read them.
    for f in &unreadable {
        std::fs::remove_file(f).unwrap();
    }
    let out = rm.wait_with_output().unwrap();
    assert!(done.is_some(), "vm rm read another VM's address claim");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !ipam.join("ips").join(&ip).exists(),
        "vm rm frees its own address"
    );
    drop(sim);
    let _ = std::fs::remove_dir_all(&ipam);
}
