//! The probe pinger against the kernel's own echo replies on loopback, through the raw socket
//! and through the unprivileged datagram socket. The tests run as root, which opens the raw
//! socket and admits our group to unprivileged ICMP for as long as the datagram socket takes
//! to open; elsewhere they are skipped with the reason printed, and under CI they fail.

use std::net::Ipv4Addr;
use std::time::Duration;

use vk_cocoon::effects::icmp::{Icmp, Kind};

const DEADLINE: Duration = Duration::from_secs(3);
const PING_GROUP_RANGE: &str = "/proc/sys/net/ipv4/ping_group_range";

fn open_or_skip(kind: Kind) -> Option<Icmp> {
    match Icmp::open(kind) {
        Ok(icmp) => Some(icmp),
        Err(e) => {
            e2e::skip::unless_ci(format!("no {kind:?} ICMP socket here ({e})"));
            None
        }
    }
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
    if let Some(icmp) = open_or_skip(Kind::Raw) {
        pings_loopback(&icmp).await;
    }
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
            e2e::skip::unless_ci(format!("unprivileged ICMP not permitted here ({e})"));
            return;
        }
    };
    // The socket keeps working once open, so the setting goes back at once.
    let icmp = open_or_skip(Kind::Datagram);
    drop(range);
    if let Some(icmp) = icmp {
        pings_loopback(&icmp).await;
    }
}
