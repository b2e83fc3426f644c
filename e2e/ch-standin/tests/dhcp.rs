//! A guest whose command line has no `ip=` (a DHCP NIC) takes a lease on boot — here from
//! dnsmasq on the host side of a single-queue TAP — and keeps that address in its memory:
//! restored with no DHCP server left, it answers on it at once. Needs root, iproute2 and
//! dnsmasq: fails under CI without them, skips elsewhere.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::netns::{connect, in_netns, ping, required, setup};
use common::{until, Payload, Vmm};

const TAP: &str = "tapchsd0";
const LEASED: &str = "10.215.0.50";

/// dnsmasq serving one address on the TAP; killed when dropped.
struct Dhcp(Child);

impl Drop for Dhcp {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn dhcp_server(ns: &str, dir: &std::path::Path) -> Dhcp {
    let range = format!("--dhcp-range={LEASED},{LEASED},1h");
    let leases = format!("--dhcp-leasefile={}", dir.join("leases").display());
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=0",
            "--no-ping",
        ])
        .args([
            "--bind-interfaces",
            &format!("--interface={TAP}"),
            &range,
            &leases,
            "--pid-file=",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Dhcp(child)
}

fn value(cmd: &str) -> String {
    let mut s = connect(LEASED, 7777, Duration::from_secs(5)).unwrap();
    s.write_all(cmd.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

#[test]
fn dhcp_lease_is_kept_in_guest_memory_across_restore() {
    if Command::new("dnsmasq").arg("--version").output().is_err() {
        required("dnsmasq is not installed (Debian package dnsmasq-base)");
    }
    let Some(ns) = setup("dhcp", TAP, false) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = dhcp_server(&ns.0, dir.path());
    let p = Payload::write(dir.path(), "{}");
    let sock = dir.path().join("api.sock");
    let net = format!("tap={TAP},mac=02:c5:00:00:0d:01,num_queues=2,queue_size=256");
    let prefix = ["ip", "netns", "exec", ns.0.as_str()];
    let args = p.args(
        &sock,
        "console=hvc0 net.ifnames=0 cocoon.hostname=dhcp-0",
        Some(&net),
    );
    let mut first = Vmm::launch(&prefix, &args, &sock, &dir.path().join("ch1.log"));
    until(
        "the guest answers ping on its lease",
        Duration::from_secs(30),
        || ping(&ns.0, LEASED),
    );
    assert!(
        first.log().contains(&format!("dhcp: eth0 {LEASED}/24")),
        "{}",
        first.log()
    );
    in_netns(&ns.0, || assert_eq!(value("SET leased\n"), "OK\n"));

    assert_eq!(first.call("PUT", "vm.pause", None).0, 204);
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let req = format!(r#"{{"destination_url":"file://{}"}}"#, snap.display());
    assert_eq!(first.call("PUT", "vm.snapshot", Some(&req)).0, 204);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(server);

    let sock2 = dir.path().join("api2.sock");
    let second = Vmm::launch(
        &prefix,
        &["--api-socket".into(), sock2.display().to_string()],
        &sock2,
        &dir.path().join("ch2.log"),
    );
    let req = format!(
        r#"{{"source_url":"file://{}","resume":true}}"#,
        snap.display()
    );
    assert_eq!(second.call("PUT", "vm.restore", Some(&req)).0, 204);
    until(
        "the restored guest answers ping",
        Duration::from_secs(20),
        || ping(&ns.0, LEASED),
    );
    in_netns(&ns.0, || assert_eq!(value("GET\n"), "leased\n"));
}
