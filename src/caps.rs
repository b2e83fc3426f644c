//! The caps on what a tenant or a caller can make the root daemon spend, as the `cap` label of
//! `cocoon_vk_cap_refusals_total` (M7), and the handle that counts a refusal. It sits below
//! every module that enforces a cap (the cocoon client, the registry, the kubelet API, the
//! peer API) so none of them needs the metrics module to count one.

use prometheus::IntCounterVec;

/// Which cap refused or cut something. The strings are a contract with dashboards and alerts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cap {
    TlsHandshake,
    PortForwardStreams,
    TokenReviews,
    GuestOutput,
    RegistryChunk,
    PeerRequests,
    NamespaceSessions,
}

impl Cap {
    pub const ALL: &'static [Cap] = &[
        Cap::TlsHandshake,
        Cap::PortForwardStreams,
        Cap::TokenReviews,
        Cap::GuestOutput,
        Cap::RegistryChunk,
        Cap::PeerRequests,
        Cap::NamespaceSessions,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cap::TlsHandshake => "tls_handshake",
            Cap::PortForwardStreams => "port_forward_streams",
            Cap::TokenReviews => "token_reviews",
            Cap::GuestOutput => "guest_output",
            Cap::RegistryChunk => "registry_chunk",
            Cap::PeerRequests => "peer_requests",
            Cap::NamespaceSessions => "namespace_sessions",
        }
    }
}

/// Counts a cap's refusals once the daemon's metrics are wired in (tests and tools run
/// without them): the `cocoon_vk_cap_refusals_total` family itself.
#[derive(Clone, Default)]
pub struct CapCount(Option<IntCounterVec>);

impl CapCount {
    pub fn new(refusals: IntCounterVec) -> Self {
        CapCount(Some(refusals))
    }

    pub fn refused(&self, cap: Cap) {
        if let Some(family) = &self.0 {
            family.with_label_values(&[cap.as_str()]).inc();
        }
    }
}

impl std::fmt::Debug for CapCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "CapCount(counted)"
        } else {
            "CapCount"
        })
    }
}
