//! The kubelet API's certificate (K1): `VK_TLS_CERT`/`VK_TLS_KEY` when the certificate file
//! exists (a load error is fatal), else an in-memory self-signed ECDSA P-256 certificate for the
//! node name, `localhost`, the node IP and 127.0.0.1, valid 10 years.
//!
//! With `VK_CLIENT_CA_FILE` a client certificate is asked for and verified against that CA
//! (K9), but not required: a caller with a token, or none, still reaches the auth layer, which
//! answers it as the kubelet would (401 rather than a failed handshake).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    node: &str,
    node_ip: &str,
) -> Result<ServerConfig> {
    let (chain, key) = if cert.exists() {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .with_context(|| format!("reading VK_TLS_CERT {}", cert.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("parsing VK_TLS_CERT {}", cert.display()))?;
        let key = PrivateKeyDer::from_pem_file(key)
            .with_context(|| format!("reading VK_TLS_KEY {}", key.display()))?;
        (chain, key)
    } else {
        self_signed(node, node_ip)?
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(chain, key)
        .context("the kubelet certificate and key do not match")?;
    Ok(config)
}

fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading VK_CLIENT_CA_FILE {}", ca.display()))?
    {
        let cert = cert.with_context(|| format!("parsing VK_CLIENT_CA_FILE {}", ca.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("VK_CLIENT_CA_FILE {}: not a CA certificate", ca.display()))?;
    }
    if roots.is_empty() {
        anyhow::bail!("VK_CLIENT_CA_FILE {} holds no certificate", ca.display());
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .with_context(|| format!("VK_CLIENT_CA_FILE {}", ca.display()))
}

fn self_signed(
    node: &str,
    node_ip: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let mut sans = vec![
        node.to_string(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    if !sans.iter().any(|s| s == node_ip) {
        sans.push(node_ip.to_string());
    }
    let mut params = rcgen::CertificateParams::new(sans).context("certificate names")?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node);
    let now = std::time::SystemTime::now();
    params.not_before = now.into();
    params.not_after = (now + std::time::Duration::from_secs(10 * 365 * 24 * 3600)).into();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .context("generating the kubelet key")?;
    let cert = params
        .self_signed(&key)
        .context("self-signing the kubelet certificate")?;
    let key = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| anyhow::anyhow!("kubelet key: {e}"))?;
    Ok((vec![cert.der().clone()], key))
}
