//! The node certificate the peer API presents, serving and dialing alike, read again when its
//! files change: the kubelet rotates its client certificate by pointing
//! `kubelet-client-current.pem` at a new file, and a daemon that kept the first one would go
//! on presenting it until it expires.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context, Result};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use super::tls::node_of_certificate;

/// What identifies one version of the files: inode, modification time and length of each,
/// read through the links (a rotation swaps the link's target, an edit the contents).
type Stamp = Option<[(u64, SystemTime, u64); 2]>;

pub(super) struct Credential {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({})", self.cert.display())
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).ok()?;
        Some((m.ino(), m.modified().ok()?, m.len()))
    };
    Some([one(cert)?, one(key)?])
}

/// The chain and key as one signing credential, and the node the certificate names.
fn read(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<(CertifiedKey, String)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading VK_PEER_CERT {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing VK_PEER_CERT {}", cert.display()))?;
    let first = chain
        .first()
        .with_context(|| format!("VK_PEER_CERT {} holds no certificate", cert.display()))?;
    let node = node_of_certificate(first)
        .map_err(|e| anyhow::anyhow!("VK_PEER_CERT {}: {e}", cert.display()))?;
    let der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading VK_PEER_KEY {}", key.display()))?;
    let certified = CertifiedKey::from_der(chain, der, provider)
        .context("VK_PEER_CERT and VK_PEER_KEY do not match")?;
    Ok((certified, node))
}

impl Credential {
    /// Reads both files; the node the certificate names comes back with it.
    pub(super) fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<(Credential, String)> {
        let before = stamp(cert, key);
        let (certified, node) = read(cert, key, &provider)?;
        let credential = Credential {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: Mutex::new((before, Arc::new(certified))),
        };
        Ok((credential, node))
    }

    /// The credential to present now: read again when the files changed since the last read.
    /// A new version that does not load (half written, another node's, a mismatched key)
    /// leaves the previous one in use, with a warning.
    pub(super) fn current(&self) -> Arc<CertifiedKey> {
        let now = stamp(&self.cert, &self.key);
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if now.is_some() && now != current.0 {
            match read(&self.cert, &self.key, &self.provider) {
                Ok((certified, node)) => {
                    tracing::info!(%node, cert = %self.cert.display(), "peer API certificate reloaded");
                    *current = (now, Arc::new(certified));
                }
                Err(e) => {
                    tracing::warn!(
                        "peer API certificate not reloaded, the previous one stays: {e:#}"
                    );
                    current.0 = now;
                }
            }
        }
        current.1.clone()
    }

    /// The end-entity certificate presented now.
    pub(super) fn end_entity(&self) -> CertificateDer<'static> {
        self.current().cert[0].clone()
    }

    /// The chain presented now, CA-side certificates after the first.
    pub(super) fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current().cert.clone()
    }
}

impl ResolvesServerCert for Credential {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for Credential {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
