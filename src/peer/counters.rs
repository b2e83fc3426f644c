//! `cocoon_vk_peer_refusals_total{reason}`: what the peer boundary (K7.1, K7.3, K7.4) turned away,
//! on both sides: callers and requests the server refused, and peers whose bytes the restore
//! refused.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A request over a connection that presented no client certificate.
    NoCertificate,
    /// A handshake whose certificate the cluster CA did not sign, or whose key did not match.
    UntrustedCertificate,
    /// A verified certificate that names no node.
    NotANode,
    /// A restore whose peer served bytes the registry's digests do not match.
    AlteredBytes,
    /// K7.4: a request that names no waking pod, or a slice no plan granted (or whose grant
    /// went idle or was revoked).
    NoGrant,
    /// K7.4: the pod named is absent, has another UID, or is bound to a Node the caller does
    /// not act as.
    NotTheWakingNode,
    /// K7.4: the snapshot's owner record is not of the pod's namespace, or it has none.
    ForeignSnapshot,
}

impl Refusal {
    pub const ALL: &'static [Refusal] = &[
        Refusal::NoCertificate,
        Refusal::UntrustedCertificate,
        Refusal::NotANode,
        Refusal::AlteredBytes,
        Refusal::NoGrant,
        Refusal::NotTheWakingNode,
        Refusal::ForeignSnapshot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_certificate",
            Refusal::UntrustedCertificate => "untrusted_certificate",
            Refusal::NotANode => "not_a_node",
            Refusal::AlteredBytes => "altered_bytes",
            Refusal::NoGrant => "no_grant",
            Refusal::NotTheWakingNode => "not_the_waking_node",
            Refusal::ForeignSnapshot => "foreign_snapshot",
        }
    }
}

/// Shared by the server and the restores; registered with the daemon's metrics once.
#[derive(Clone)]
pub struct PeerCounters {
    refusals: IntCounterVec,
}

impl Default for PeerCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerCounters {
    pub fn new() -> PeerCounters {
        let refusals = IntCounterVec::new(
            Opts::new(
                "cocoon_vk_peer_refusals_total",
                "Peer API callers refused (no certificate, one the cluster CA did not sign, not a node), snapshot requests refused for want of a grant to the waking node, and peer restores refused for altered bytes, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for r in Refusal::ALL {
            refusals.with_label_values(&[r.as_str()]);
        }
        PeerCounters { refusals }
    }

    pub fn refused(&self, why: Refusal) {
        self.refusals.with_label_values(&[why.as_str()]).inc();
    }

    pub fn count(&self, why: Refusal) -> u64 {
        self.refusals.with_label_values(&[why.as_str()]).get()
    }

    /// The collector to register with the daemon's metrics.
    pub fn collector(&self) -> Box<dyn Collector> {
        Box::new(Family(self.refusals.clone()))
    }
}

struct Family(IntCounterVec);

impl Collector for Family {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}
