//! The API over a real unix socket, against the built binary: cloud-hypervisor's state
//! machine and status codes as cocoon meets them. No root needed (no NIC).

mod common;

use std::io::Read;
use std::time::Duration;

use common::{call, until, Payload, Vmm};
use serde_json::Value;

const CMDLINE: &str = "console=hvc0 net.ifnames=0 cocoon.hostname=api-0 ip=10.215.0.2::10.215.0.1:255.255.255.0:api-0:eth0:off";

fn boot(dir: &std::path::Path) -> (Vmm, Payload) {
    let p = Payload::write(dir, r#"{"tcp_ports":[22]}"#);
    let sock = dir.join("api.sock");
    let vmm = Vmm::launch(
        &[],
        &p.args(&sock, CMDLINE, None),
        &sock,
        &dir.join("ch.log"),
    );
    (vmm, p)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn lifecycle_and_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, p) = boot(dir.path());
    let (s, body) = vmm.call("GET", "vmm.ping", None);
    assert_eq!(s, 200);
    assert_eq!(json(&body)["pid"], vmm.child.id());
    let (s, body) = vmm.call("GET", "vm.info", None);
    assert_eq!(s, 200);
    let info = json(&body);
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["disks"][0]["id"], "_disk0");
    assert_eq!(
        info["config"]["disks"][0]["path"],
        p.disk.display().to_string()
    );
    let pty = info["config"]["console"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(pty.starts_with("/dev/pts/"), "{pty}");

    // Wrong method, unknown path, wrong state.
    assert_eq!(vmm.call("GET", "vm.pause", None).0, 400);
    assert_eq!(vmm.call("PUT", "vm.info", None).0, 400);
    assert_eq!(vmm.call("PUT", "vm.bogus", None).0, 404);
    assert_eq!(vmm.call("PUT", "vm.resume", None).0, 500);
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let req = format!(r#"{{"destination_url":"file://{}"}}"#, snap.display());
    let (s, body) = vmm.call("PUT", "vm.snapshot", Some(&req));
    assert_eq!(s, 500, "a running VM is not snapshotted");
    assert!(
        body.contains("Trying to snapshot while VM is running"),
        "{body}"
    );
    assert_eq!(vmm.call("PUT", "vm.snapshot", None).0, 400, "no body");
    assert_eq!(vmm.call("PUT", "vm.snapshot", Some("{not json")).0, 400);

    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 204);
    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 500);
    assert_eq!(json(&vmm.call("GET", "vm.info", None).1)["state"], "Paused");
    assert_eq!(vmm.call("PUT", "vm.snapshot", Some(&req)).0, 204);
    for f in ["config.json", "state.json", "memory-ranges"] {
        assert!(snap.join(f).exists(), "{f}");
    }
    assert_eq!(
        vmm.call("PUT", "vm.snapshot", Some(&req)).0,
        500,
        "files are created new"
    );
    let missing = r#"{"destination_url":"file:///nonexistent/dir"}"#;
    assert_eq!(vmm.call("PUT", "vm.snapshot", Some(missing)).0, 500);
    assert_eq!(vmm.call("PUT", "vm.resume", None).0, 204);
    assert_eq!(vmm.call("PUT", "vm.resume", None).0, 500);

    // Hot-plug: unknown ids are 404, taken ids 409, a plugged disk answers its PCI id.
    assert_eq!(
        vmm.call("PUT", "vm.remove-device", Some(r#"{"id":"_net9"}"#))
            .0,
        404
    );
    let extra = dir.path().join("data.raw");
    std::fs::write(&extra, b"").unwrap();
    let disk = format!(r#"{{"path":"{}","id":"_disk0"}}"#, extra.display());
    assert_eq!(vmm.call("PUT", "vm.add-disk", Some(&disk)).0, 409);
    let disk = format!(r#"{{"path":"{}"}}"#, extra.display());
    let (s, body) = vmm.call("PUT", "vm.add-disk", Some(&disk));
    assert_eq!(s, 200);
    let id = json(&body)["id"].as_str().unwrap().to_string();
    assert_eq!(id, "_disk1");
    assert_eq!(
        vmm.call(
            "PUT",
            "vm.remove-device",
            Some(&format!(r#"{{"id":"{id}"}}"#))
        )
        .0,
        204
    );
    assert_eq!(
        vmm.call("PUT", "vm.add-disk", Some(r#"{"path":"/nonexistent.raw"}"#))
            .0,
        500
    );

    // vm.shutdown drops the VM, keeps the config and the process.
    assert_eq!(vmm.call("PUT", "vm.shutdown", None).0, 204);
    assert_eq!(
        json(&vmm.call("GET", "vm.info", None).1)["state"],
        "Created"
    );
    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 500);
    assert_eq!(vmm.call("PUT", "vm.shutdown", None).0, 500);
    assert_eq!(vmm.call("PUT", "vm.boot", None).0, 204);
    assert_eq!(
        json(&vmm.call("GET", "vm.info", None).1)["state"],
        "Running"
    );

    assert_eq!(vmm.call("PUT", "vmm.shutdown", None).0, 204);
    assert!(vmm.wait_exit(Duration::from_secs(10)).success());
    assert!(!vmm.socket.exists(), "the API socket is removed on exit");
}

#[test]
fn restore_into_an_empty_vmm_comes_up_paused() {
    let dir = tempfile::tempdir().unwrap();
    let (vmm, p) = boot(dir.path());
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 204);
    let req = format!(r#"{{"destination_url":"file://{}"}}"#, snap.display());
    assert_eq!(vmm.call("PUT", "vm.snapshot", Some(&req)).0, 204);
    drop(vmm);

    // cocoon's clone/restore: a VMM with only the API socket, then vm.restore.
    let sock = dir.path().join("api2.sock");
    let fresh = Vmm::launch(
        &[],
        &["--api-socket".into(), sock.display().to_string()],
        &sock,
        &dir.path().join("ch2.log"),
    );
    assert_eq!(fresh.call("GET", "vm.info", None).0, 404);
    assert_eq!(fresh.call("PUT", "vm.pause", None).0, 500);
    let bad = r#"{"source_url":"file:///nonexistent"}"#;
    assert_eq!(fresh.call("PUT", "vm.restore", Some(bad)).0, 500);
    let req = format!(
        r#"{{"source_url":"file://{}","memory_restore_mode":"OnDemand"}}"#,
        snap.display()
    );
    assert_eq!(fresh.call("PUT", "vm.restore", Some(&req)).0, 204);
    let info = json(&fresh.call("GET", "vm.info", None).1);
    assert_eq!(info["state"], "Paused");
    assert_eq!(
        info["config"]["disks"][0]["path"],
        p.disk.display().to_string()
    );
    assert!(info["config"]["console"]["file"]
        .as_str()
        .unwrap()
        .starts_with("/dev/pts/"));
    assert_eq!(
        fresh.call("PUT", "vm.restore", Some(&req)).0,
        500,
        "already created"
    );
    assert_eq!(fresh.call("PUT", "vm.resume", None).0, 204);
    assert_eq!(
        json(&fresh.call("GET", "vm.info", None).1)["state"],
        "Running"
    );
    assert!(fresh.log().contains("restored from"), "{}", fresh.log());
}

#[test]
fn console_pty_carries_guest_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (vmm, _) = boot(dir.path());
    let info = json(&vmm.call("GET", "vm.info", None).1);
    let pty = info["config"]["console"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    let mut f = std::fs::File::open(&pty).unwrap();
    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 204);
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let req = format!(r#"{{"destination_url":"file://{}"}}"#, snap.display());
    assert_eq!(vmm.call("PUT", "vm.snapshot", Some(&req)).0, 204);
    let mut seen = String::new();
    until(
        "the snapshot line on the PTY",
        Duration::from_secs(10),
        || {
            let mut buf = [0u8; 4096];
            let n = f.read(&mut buf).unwrap_or(0);
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            seen.contains("snapshot written to")
        },
    );
    assert!(
        vmm.log()
            .contains("guest: cocoon-standin guest api-0 booted"),
        "{}",
        vmm.log()
    );
}

#[test]
fn power_button_powers_off_and_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, _) = boot(dir.path());
    assert_eq!(vmm.call("PUT", "vm.pause", None).0, 204);
    assert_eq!(vmm.call("PUT", "vm.power-button", None).0, 204);
    assert!(
        vmm.child.try_wait().unwrap().is_none(),
        "a paused guest acts on the button only once resumed"
    );
    assert_eq!(vmm.call("PUT", "vm.resume", None).0, 204);
    assert!(vmm.wait_exit(Duration::from_secs(10)).success());
}

#[test]
fn sigterm_ends_the_process_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (mut vmm, _) = boot(dir.path());
    // SAFETY: signals the child this test started.
    unsafe { libc::kill(vmm.child.id() as i32, libc::SIGTERM) };
    assert!(vmm.wait_exit(Duration::from_secs(10)).success());
    assert!(!vmm.socket.exists());
}

#[test]
fn unknown_arguments_fail_as_clap_does() {
    let out = std::process::Command::new(common::BIN)
        .args(["--api-socket", "/tmp/x.sock", "--frobnicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--frobnicate'"));
    let out = std::process::Command::new(common::BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("cloud-hypervisor v"));
    // A boot that cannot open its kernel exits non-zero, as cloud-hypervisor does.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::BIN)
        .args([
            "--api-socket",
            &dir.path().join("a.sock").display().to_string(),
            "--kernel",
            "/nonexistent/vmlinuz",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Error booting VM"));
    let _ = call;
}
