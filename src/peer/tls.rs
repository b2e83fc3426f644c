//! K7.1: the peer API speaks mutual TLS between nodes only. Both ends present the node's own
//! certificate (`VK_PEER_CERT`, the kubelet's client certificate on a kubeadm node), chained to
//! the cluster CA (`VK_PEER_CA_FILE`) and naming a node: O=`system:nodes`,
//! CN=`system:node:<name>`. The server refuses a handshake without a certificate the CA signed
//! and answers 401 to a verified certificate that names no node; the client accepts only a
//! node's certificate too. Which node is not pinned: the daemon's Node (`VK_NODE_NAME`, a
//! virtual node such as `<host>-cocoon`) is not the host whose kubelet credential it presents,
//! and what the bytes are is settled by the registry's digests, not by who sent them.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

use super::counters::{PeerCounters, Refusal};
use super::credential::Credential;
use crate::config::PeerTls;
use crate::kubelet::auth::{user_of_certificate, User};

/// The group every node's credential carries (the Node authorizer's).
pub const NODES_GROUP: &str = "system:nodes";
/// A node's user name is this prefix and its name.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The node a certificate's subject names, or why it names none. The decision of who may call
/// the peer API, given a certificate the CA already verified.
pub fn node_of(user: &User) -> Result<String, String> {
    let node = user
        .name
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            format!(
                "{:?} is not a node: the peer API serves only CN={NODE_USER_PREFIX}<name>",
                user.name
            )
        })?;
    if !user.groups.iter().any(|g| g == NODES_GROUP) {
        return Err(format!(
            "{:?} is not in the {NODES_GROUP} group (O={NODES_GROUP})",
            user.name
        ));
    }
    Ok(node.to_string())
}

/// [`node_of`] a DER certificate.
pub fn node_of_certificate(der: &[u8]) -> Result<String, String> {
    node_of(&user_of_certificate(der)?)
}

/// This node's peer credentials: the cluster CA, loaded at startup, and the node certificate,
/// read again whenever its files change.
#[derive(Clone)]
pub struct NodeTls {
    provider: Arc<rustls::crypto::CryptoProvider>,
    roots: Arc<rustls::RootCertStore>,
    credential: Arc<Credential>,
    /// The node the certificate names at startup.
    pub node: String,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeTls(***)")
    }
}

impl NodeTls {
    /// Reads the CA, the certificate and its key; a certificate that names no node or does
    /// not chain to the CA stops the start rather than failing every restore.
    pub fn load(t: &PeerTls) -> Result<NodeTls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = roots(&t.ca_file)?;
        let (credential, node) = Credential::load(&t.cert, &t.key, provider.clone())?;
        let tls = NodeTls {
            provider,
            roots: Arc::new(roots),
            credential: Arc::new(credential),
            node,
        };
        // The certificate must chain to the CA the other nodes check it against.
        let chain = tls.credential.chain();
        tls.client_verifier()?
            .verify_client_cert(&tls.credential.end_entity(), &chain[1..], UnixTime::now())
            .map_err(|e| {
                anyhow::anyhow!(
                    "VK_PEER_CERT {} does not verify against VK_PEER_CA_FILE {}: {e}",
                    t.cert.display(),
                    t.ca_file.display()
                )
            })?;
        Ok(tls)
    }

    fn client_verifier(&self) -> Result<Arc<dyn ClientCertVerifier>> {
        rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            self.provider.clone(),
        )
        .build()
        .context("VK_PEER_CA_FILE")
    }

    /// The serving side: a client certificate the CA did not sign fails the handshake
    /// (counted); a connection without one completes it, so that its requests are answered
    /// 401 and counted rather than dropped unseen.
    pub fn server_config_counting(&self, counters: PeerCounters) -> Result<ServerConfig> {
        let verifier = CountingVerifier {
            inner: self.client_verifier()?,
            counters,
        };
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_cert_resolver(self.credential.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The dialing side: the peer's certificate must chain to the CA and name a node.
    pub fn client_config(&self) -> Result<ClientConfig> {
        let verifier = PeerVerifier {
            chain: self.client_verifier()?,
        };
        let mut config = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_cert_resolver(self.credential.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

fn roots(ca: &Path) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading VK_PEER_CA_FILE {}", ca.display()))?
    {
        let cert = cert.with_context(|| format!("parsing VK_PEER_CA_FILE {}", ca.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("VK_PEER_CA_FILE {}: not a CA certificate", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("VK_PEER_CA_FILE {} holds no certificate", ca.display());
    }
    Ok(roots)
}

/// The CA's verdict on a client certificate, refusals counted.
#[derive(Debug)]
struct CountingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    counters: PeerCounters,
}

impl std::fmt::Debug for PeerCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerCounters")
    }
}

impl CountingVerifier {
    fn counted<T>(&self, r: Result<T, rustls::Error>) -> Result<T, rustls::Error> {
        if r.is_err() {
            self.counters.refused(Refusal::UntrustedCertificate);
        }
        r
    }
}

impl ClientCertVerifier for CountingVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.counted(
            self.inner
                .verify_client_cert(end_entity, intermediates, now),
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.counted(self.inner.verify_tls12_signature(message, cert, dss))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.counted(self.inner.verify_tls13_signature(message, cert, dss))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A dialing config that checks the server as a restore does, presenting `identity` (chain
/// and key) or no certificate: for tests that call as strangers.
#[cfg(test)]
pub(super) fn client_config_as(
    ca: &Path,
    identity: Option<(
        Vec<CertificateDer<'static>>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca).unwrap()),
        provider.clone(),
    )
    .build()
    .unwrap();
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PeerVerifier { chain }));
    match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// A peer's certificate is a node credential, which is a client certificate (kubeadm issues
/// nodes no other the cluster CA signs): the chain is checked as a client certificate's, and
/// what must hold of its subject is that it is a node, not a DNS name or address.
#[derive(Debug)]
struct PeerVerifier {
    chain: Arc<dyn ClientCertVerifier>,
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        match node_of_certificate(end_entity) {
            Ok(_) => Ok(ServerCertVerified::assertion()),
            Err(e) => Err(rustls::Error::General(format!("the peer is {e}"))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn only_a_node_identity_may_call() {
        assert_eq!(
            node_of(&user("system:node:node-a", &["system:nodes"])).unwrap(),
            "node-a"
        );
        assert_eq!(
            node_of(&user(
                "system:node:node-b",
                &["system:authenticated", "system:nodes"]
            ))
            .unwrap(),
            "node-b"
        );
        for (name, groups) in [
            ("system:node:node-a", &[][..]),
            ("system:node:node-a", &["system:masters"][..]),
            ("system:node:", &["system:nodes"][..]),
            ("alice", &["system:nodes"][..]),
            ("kube-apiserver-kubelet-client", &["system:masters"][..]),
            ("system:nodes", &["system:nodes"][..]),
        ] {
            let err = node_of(&user(name, groups)).unwrap_err();
            assert!(
                err.contains("node") || err.contains("group"),
                "{name}: {err}"
            );
        }
    }
}
