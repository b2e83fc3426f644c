//! The probe pinger against the kernel's own echo replies on loopback, through the raw socket
//! and through the unprivileged datagram socket. The tests run as root, which opens the raw
//! socket and admits our group to unprivileged ICMP for as long as the datagram socket takes
//! to open; anywhere else they fail, naming what is missing.

use std::net::Ipv4Addr;
use std::time::Duration;

use vk_cocoon::effects::icmp::{Icmp, Kind};

const DEADLINE: Duration = Duration::from_secs(3);
const PING_GROUP_RANGE: &str = "/proc/sys/net/ipv4/ping_group_range";

fn open(kind: Kind) -> Icmp {
    Icmp::open(kind).unwrap_or_else(|e| {
        e2e::skip::required(format!(
            "a {kind:?} ICMP socket ({e}): run the tests as root (sudo make test)"
        ))
    })
}

async fn pings_loopback(icmp: &Icmp) {
    for _ in 0..3 {
        let rtt = icmp
            .ping(Ipv4Addr::LOCALHOST, DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("{:?} ping 127.0.0.1: {e}", icmp.kind()));
        assert!(rtt < DEADLINE, "{rtt:?}");
    }
    // Many targets at once through the one socket: every reply reaches its own probe.
    let targets: Vec<Ipv4Addr> = (1..=200).map(|i| Ipv4Addr::new(127, 3, 0, i)).collect();
    let all = futures::future::join_all(targets.iter().map(|ip| icmp.ping(*ip, DEADLINE))).await;
    for (ip, r) in targets.iter().zip(all) {
        r.unwrap_or_else(|e| panic!("{:?} ping {ip}: {e}", icmp.kind()));
    }
}

#[tokio::test]
async fn raw_socket_pings_loopback() {
    pings_loopback(&open(Kind::Raw)).await;
}

/// Opens net.ipv4.ping_group_range to our group for as long as it lives, then puts the old
/// value back.
struct PingGroupRange {
    saved: Option<String>,
}

impl PingGroupRange {
    fn admit_our_group() -> Result<Self, String> {
        let saved = std::fs::read_to_string(PING_GROUP_RANGE)
            .map_err(|e| format!("reading {PING_GROUP_RANGE}: {e}"))?;
        let bounds: Vec<u32> = saved
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // SAFETY: getegid has no preconditions and cannot fail.
        let gid = unsafe { libc::getegid() };
        if let [lo, hi] = bounds[..] {
            if (lo..=hi).contains(&gid) {
                return Ok(Self { saved: None });
            }
        }
        std::fs::write(PING_GROUP_RANGE, "0 2147483647")
            .map_err(|e| format!("opening {PING_GROUP_RANGE}: {e}"))?;
        Ok(Self { saved: Some(saved) })
    }
}

impl Drop for PingGroupRange {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            if let Err(e) = std::fs::write(PING_GROUP_RANGE, saved.trim()) {
                eprintln!("could not restore {PING_GROUP_RANGE} to {saved:?}: {e}");
            }
        }
    }
}

#[tokio::test]
async fn datagram_socket_pings_loopback() {
    let range = match PingGroupRange::admit_our_group() {
        Ok(r) => r,
        Err(e) => {
            e2e::skip::required(format!("unprivileged ICMP not permitted here ({e})"));
        }
    };
    // The socket keeps working once open, so the setting goes back at once.
    let icmp = open(Kind::Datagram);
    drop(range);
    pings_loopback(&icmp).await;
}
