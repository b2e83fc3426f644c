//! Peer snapshot restore (hibernation spec §7): every node serves the raw files of its local
//! cocoon snapshots to the other nodes (mutual TLS with node certificates, K7.1), each only to
//! the node waking a pod it belongs to (K7.4), and a waking node copies them straight into a
//! staging directory for `cocoon vm clone --from-dir`, which beats a registry pull whenever the
//! node that hibernated the VM is still up. The registry stays the identity anchor: the copy must
//! carry the snapshot id the registry's config names, and `snapshot.json` is written from that
//! config, never from anything the peer says, and every file must hash to the digest the
//! registry records for it.

mod client;
mod counters;
mod credential;
mod grant;
mod plan;
mod schedule;
mod server;
mod source;
mod staging;
mod tls;
mod verify;

#[cfg(test)]
mod protocol_tests;
#[cfg(test)]
mod tls_tests;

pub use client::{restore, Limiter, PeerError, RestorePermit, RestoreRequest, Timeouts, Transport};
pub use counters::{PeerCounters, Refusal};
pub use grant::{acts_as, BoundPod, PodLookup, WakingPod};
pub use plan::{plan_dir, Plan, PlanFile, Slice};
pub use server::{spawn, Counting, LocalSnapshot, LocalSnapshots, Server, Sources, MAX_PLANS};
pub use source::{hibernate_source, HibernateSource, HIBERNATE_TAG};
pub use staging::sweep_staging;
pub use tls::{node_of, NodeTls};
pub use verify::{Expected, FileDigest};

const PLAN_PATH: &str = "/v1/snapshot-plan";
const SLICE_PATH: &str = "/v1/snapshot-slice";
/// A slice body ends in the CRC-32C of the range's bytes, big-endian.
const CRC_LEN: usize = 4;

/// A single path component that cannot leave the directory it is joined to. Both ends apply
/// it: the server to what a request names, the client to what a plan names.
pub fn plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_names_are_single_components() {
        for ok in [
            "memory-ranges",
            "overlay.qcow2",
            "..x",
            "a..b",
            "Q3ZK7M2XW4JH5N6P7R8S9T2UVA",
        ] {
            assert!(super::plain_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/etc", "../x", "a\0b"] {
            assert!(!super::plain_name(bad), "{bad:?}");
        }
    }
}
