//! Network namespaces with a TAP, as cocoon prepares them for a VM, for the root tests.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

/// The rule of `e2e::skip::required`, copied to keep this crate's dependencies lean: a test
/// lacking something fails, naming it.
#[track_caller]
pub fn required(reason: &str) -> ! {
    panic!("this test needs what the machine lacks: {reason}");
}

/// A namespace the test created; deleted (with its TAP) however the test ends.
pub struct Netns(pub String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

pub fn ip(ns: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ip"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace `chsi-<tag>-<pid>` holding TAP `tap` (multi-queue or not, always vnet_hdr, as
/// cocoon creates it) with the host side on 10.215.0.1/24.
pub fn setup(tag: &str, tap: &str, multi_queue: bool) -> Option<Netns> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        required("network namespaces and TAPs need root");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        required("iproute2 (`ip`) is not installed");
    }
    let ns = Netns(format!("chsi-{tag}-{}", std::process::id()));
    let out = Command::new("ip")
        .args(["netns", "add", &ns.0])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "netns add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ip(&ns.0, &["link", "set", "lo", "up"]);
    let mut add = vec!["tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr"];
    if multi_queue {
        add.push("multi_queue");
    }
    ip(&ns.0, &add);
    ip(&ns.0, &["addr", "add", "10.215.0.1/24", "dev", tap]);
    ip(&ns.0, &["link", "set", tap, "up"]);
    Some(ns)
}

/// Runs `f` on a thread that has entered the namespace, so its sockets live there.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let fd = std::fs::File::open(&path).unwrap();
            // SAFETY: setns on this thread only, with a namespace fd we hold open.
            assert_eq!(
                unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
                0,
                "setns {path}"
            );
            f()
        })
        .join()
        .unwrap()
    })
}

pub fn connect(guest: &str, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = format!("{guest}:{port}").parse().unwrap();
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(s)
}

pub fn ping(ns: &str, guest: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "1", "-W", "1", guest])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
