//! The guest on a real TAP, as cocoon sets it up: a network namespace, a multi-queue
//! vnet_hdr TAP inside it with the host side on 10.215.0.1/24, the stand-in launched inside
//! that namespace. From inside it: ping, the SSH banner, HTTP, SET/GET; then snapshot,
//! SIGKILL, a fresh stand-in restores (with cocoon's NIC hot-swap) and GET still answers the
//! value. Needs root and iproute2: fails under CI without them, skips elsewhere.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Command;
use std::time::Duration;

use common::netns::{connect, in_netns, ip, ping, setup};
use common::{until, Payload, Vmm};

const GUEST: &str = "10.215.0.2";
const TAP: &str = "tapchsi0";
const MAC1: &str = "02:c5:00:00:00:01";
const MAC2: &str = "02:c5:00:00:00:02";

fn value(cmd: &str) -> String {
    let mut s = connect(GUEST, 7777, Duration::from_secs(5)).unwrap();
    s.write_all(cmd.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

fn banner() -> String {
    let s = connect(GUEST, 22, Duration::from_secs(5)).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

#[test]
fn guest_serves_and_its_value_survives_snapshot_kill_restore() {
    let Some(ns) = setup("net", TAP, true) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = Payload::write(dir.path(), r#"{"tcp_ports":[22,8080],"value_port":7777}"#);
    let sock = dir.path().join("api.sock");
    let net = format!("tap={TAP},mac={MAC1},num_queues=4,queue_size=256,offload_tso=on,offload_ufo=on,offload_csum=on");
    let cmdline = format!("console=hvc0 net.ifnames=0 cocoon.hostname=net-0 ip={GUEST}::10.215.0.1:255.255.255.0:net-0:eth0:off");
    let prefix = ["ip", "netns", "exec", ns.0.as_str()];
    let mut first = Vmm::launch(
        &prefix,
        &p.args(&sock, &cmdline, Some(&net)),
        &sock,
        &dir.path().join("ch1.log"),
    );

    until("the guest answers ping", Duration::from_secs(20), || {
        ping(&ns.0, GUEST)
    });
    in_netns(&ns.0, || {
        assert_eq!(banner(), "SSH-2.0-cocoon-standin\r\n");
        let mut s = connect(GUEST, 8080, Duration::from_secs(5)).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: guest\r\n\r\n")
            .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.ends_with("cocoon-standin net-0\n"), "{resp}");
        assert_eq!(value("GET\n"), "\n", "never set");
        assert_eq!(value("SET before-snapshot\n"), "OK\n");
        assert_eq!(value("GET\n"), "before-snapshot\n");
    });

    // Paused, the guest answers nothing.
    assert_eq!(first.call("PUT", "vm.pause", None).0, 204);
    in_netns(&ns.0, || {
        assert!(
            connect(GUEST, 22, Duration::from_millis(500)).is_err(),
            "a paused guest accepted a connection"
        );
    });
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let req = format!(r#"{{"destination_url":"file://{}"}}"#, snap.display());
    assert_eq!(first.call("PUT", "vm.snapshot", Some(&req)).0, 204);
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    // cocoon's restore: an empty VMM in the netns, vm.restore, the NIC hot-swap, vm.resume.
    let sock2 = dir.path().join("api2.sock");
    let second = Vmm::launch(
        &prefix,
        &["--api-socket".into(), sock2.display().to_string()],
        &sock2,
        &dir.path().join("ch2.log"),
    );
    let req = format!(r#"{{"source_url":"file://{}"}}"#, snap.display());
    assert_eq!(second.call("PUT", "vm.restore", Some(&req)).0, 204);
    let info: serde_json::Value =
        serde_json::from_str(&second.call("GET", "vm.info", None).1).unwrap();
    assert_eq!(info["state"], "Paused");
    let old_id = info["config"]["net"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        second
            .call(
                "PUT",
                "vm.remove-device",
                Some(&format!(r#"{{"id":"{old_id}"}}"#))
            )
            .0,
        204
    );
    let add = format!(
        r#"{{"tap":"{TAP}","mac":"{MAC2}","num_queues":4,"queue_size":256,"offload_tso":true,"offload_ufo":true,"offload_csum":true}}"#
    );
    assert_eq!(second.call("PUT", "vm.add-net", Some(&add)).0, 200);
    assert_eq!(second.call("PUT", "vm.resume", None).0, 204);

    // The host still has the old MAC for the guest's address; a real guest's new NIC is
    // learnt the same way, by asking again.
    ip(&ns.0, &["neigh", "flush", "dev", TAP]);
    until(
        "the restored guest answers ping",
        Duration::from_secs(20),
        || ping(&ns.0, GUEST),
    );
    in_netns(&ns.0, || {
        assert_eq!(value("GET\n"), "before-snapshot\n");
        assert_eq!(banner(), "SSH-2.0-cocoon-standin\r\n");
    });
    let neigh = Command::new("ip")
        .args(["netns", "exec", &ns.0, "ip", "neigh", "show", GUEST])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&neigh.stdout).contains(MAC2),
        "the guest answers with the hot-swapped MAC"
    );
    assert!(second.log().contains("restored from"), "{}", second.log());
}
