//! The cocoon-macos personality through the real binary: a DHCP lease on the shared lease
//! file, an SSH banner on port 22, state apart from the Linux root, no snapshot verbs.

mod common;

use common::*;
use serde_json::Value;
use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const MAC_IMAGE: &str = "ghcr.io/cocoonstack/macos:sequoia";

fn macos_bin(sim: &Sim) -> PathBuf {
    let dir = sim.root.join("bin");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("cocoon-macos");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).unwrap();
    }
    link
}

fn macos(sim: &Sim, args: &[&str]) -> Run {
    let o = Command::new(macos_bin(sim))
        .args(args)
        .env_remove("COCOON_ROOT_DIR")
        .env("COCOON_SIM_ROOT", &sim.root)
        .env("COCOON_SIM_LEASE_DELAY_MS", "100")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn macos_guest_leases_and_serves_ssh() {
    let sim = Sim::new();
    macos(&sim, &["image", "inspect", MAC_IMAGE]).err("not found");
    macos(&sim, &["image", "pull", MAC_IMAGE]).ok();
    macos(&sim, &["image", "inspect", MAC_IMAGE]).ok();
    let run = macos(
        &sim,
        &[
            "vm",
            "run",
            "--name",
            "mac-0",
            "--cpus",
            "4",
            "--memory",
            "8192",
            "--vnc",
            "2",
            "--vnc-password",
            "secret",
            "--exit-on-reboot",
            "--random-smbios",
            "--net",
            "cni",
            MAC_IMAGE,
        ],
    )
    .ok();
    assert_eq!(run.stdout, "");
    let rec: Value = macos(&sim, &["vm", "inspect", "mac-0"]).ok().json();
    assert_eq!(rec["name"], "mac-0");
    assert_eq!(rec["vnc"], 2);
    assert_eq!(rec["cpus"], 4);
    assert_eq!(rec["memory_mb"], 8192);
    assert!(rec["pid"].as_i64().unwrap() > 0);
    let mac = rec["mac"].as_str().unwrap().to_string();

    let ip = wait_for("the macOS guest's lease", || {
        let rows: Vec<Value> = serde_json::from_str(&read(&sim.leases_path())).ok()?;
        rows.iter()
            .find(|r| r["mac"].as_str() == Some(mac.as_str()))
            .map(|r| r["ip"].as_str().unwrap().to_string())
    });
    let banner = wait_for("the SSH banner", || {
        let addr = format!("{ip}:22").parse().ok()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut b = [0u8; 8];
        s.read_exact(&mut b).ok()?;
        Some(b)
    });
    assert!(banner.starts_with(b"SSH-2.0-"));

    // Separate from the Linux cocoon: its list stays empty; the flag form sees the guest.
    assert_eq!(
        sim.run(&["vm", "list", "-o", "json"]).ok().stdout,
        "No VMs found.\n"
    );
    let list: Value = sim
        .run(&["--personality", "macos", "vm", "list"])
        .ok()
        .json();
    assert_eq!(list[0]["name"], "mac-0");

    macos(&sim, &["snapshot", "save", "mac-0"])
        .err("unknown command \"snapshot\" for \"cocoon-macos\"");
    macos(&sim, &["vm", "clone", "x"]).err("unknown command");

    // A bare start of a stopped guest turns VNC off.
    macos(&sim, &["vm", "stop", "mac-0"]).ok();
    let stopped: Value = macos(&sim, &["vm", "inspect", "mac-0"]).ok().json();
    assert_eq!(stopped["pid"], 0);
    macos(&sim, &["vm", "start", "mac-0"]).ok();
    let started: Value = macos(&sim, &["vm", "inspect", "mac-0"]).ok().json();
    assert!(started["pid"].as_i64().unwrap() > 0);
    assert_eq!(started["vnc"], -1);

    macos(&sim, &["vm", "rm", "mac-0"]).ok();
    macos(&sim, &["vm", "inspect", "mac-0"]).err("not found");
    macos(&sim, &["vm", "rm", "mac-0"]).err("not found");
    assert!(
        read(&sim.leases_path()).contains(&mac),
        "rm keeps the lease"
    );
}

/// vk-cocoon writes every positional after `--`, as cobra accepts it: image pull, run, start,
/// inspect and rm take NAME or IMAGE there.
#[test]
fn positionals_after_the_dash_dash() {
    let sim = Sim::new();
    macos(&sim, &["image", "pull", "--", MAC_IMAGE]).ok();
    let run = [
        "vm",
        "run",
        "--name",
        "mac-d",
        "--cpus",
        "2",
        "--memory",
        "4096",
        "--vnc",
        "1",
        "--vnc-password",
        "pw",
        "--net",
        "cni",
        "--",
        MAC_IMAGE,
    ];
    macos(&sim, &run).ok();
    let rec: Value = macos(&sim, &["vm", "inspect", "--", "mac-d"]).ok().json();
    assert_eq!(rec["vnc"], 1);
    macos(
        &sim,
        &[
            "vm",
            "start",
            "--vnc",
            "1",
            "--vnc-password",
            "pw",
            "--",
            "mac-d",
        ],
    )
    .ok();
    macos(&sim, &["vm", "rm", "--force", "--", "mac-d"]).ok();
    macos(&sim, &["vm", "inspect", "--", "mac-d"]).err("VM not found");
    let list: Value = macos(&sim, &["vm", "list"]).ok().json();
    assert_eq!(list, serde_json::json!([]));
}
