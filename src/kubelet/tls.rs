//! The kubelet API's certificate (K1): `VK_TLS_CERT`/`VK_TLS_KEY` when the certificate file
//! exists (a load error is fatal), else an in-memory self-signed ECDSA P-256 certificate for the
//! node name, `localhost`, the node IP and 127.0.0.1, valid 10 years. A certificate file whose
//! certificate has expired is replaced by the self-signed one, with a warning.
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
    let (chain, key, _) = serving(cert, key, node, node_ip, std::time::SystemTime::now())?;
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

/// Where the serving certificate came from.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    Files,
    /// No certificate file.
    SelfSigned,
    /// The file's certificate was past its end at `now`: a kubelet would not be reachable
    /// with it, and the self-signed one is what K1 serves without a file.
    Expired,
}

type Serving = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>, Source);

fn serving(
    cert: &Path,
    key: &Path,
    node: &str,
    node_ip: &str,
    now: std::time::SystemTime,
) -> Result<Serving> {
    if !cert.exists() {
        let (chain, key) = self_signed(node, node_ip)?;
        return Ok((chain, key, Source::SelfSigned));
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading VK_TLS_CERT {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing VK_TLS_CERT {}", cert.display()))?;
    let leaf = chain
        .first()
        .with_context(|| format!("VK_TLS_CERT {} holds no certificate", cert.display()))?;
    let not_after =
        not_after(leaf).with_context(|| format!("parsing VK_TLS_CERT {}", cert.display()))?;
    if not_after < now {
        let ended = k8s_openapi::jiff::Timestamp::try_from(not_after)
            .map(|t| t.to_string())
            .unwrap_or_default();
        tracing::warn!(cert = %cert.display(), not_after = %ended,
            "VK_TLS_CERT has expired; serving a self-signed certificate until it is renewed \
             and the daemon restarted");
        let (chain, key) = self_signed(node, node_ip)?;
        return Ok((chain, key, Source::Expired));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading VK_TLS_KEY {}", key.display()))?;
    Ok((chain, key, Source::Files))
}

fn not_after(cert: &CertificateDer<'_>) -> Result<std::time::SystemTime> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, parsed) =
        X509Certificate::from_der(cert.as_ref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let secs = parsed.validity().not_after.timestamp();
    let secs = u64::try_from(secs).unwrap_or(0);
    Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::{Duration, SystemTime};

    fn write_cert(dir: &Path, from: SystemTime, to: SystemTime) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["node-a".to_string()]).unwrap();
        params.not_before = from.into();
        params.not_after = to.into();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (dir.join("kubelet.crt"), dir.join("kubelet.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn an_expired_certificate_on_disk_falls_back_to_a_self_signed_one() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let (c, k) = write_cert(dir.path(), now - 30 * day, now - day);
        let (chain, _, source) = serving(&c, &k, "node-a", "10.0.0.1", now).unwrap();
        assert_eq!(source, Source::Expired);
        assert!(not_after(&chain[0]).unwrap() > now + 365 * day);

        let (c, k) = write_cert(dir.path(), now - day, now + 30 * day);
        let (_, _, source) = serving(&c, &k, "node-a", "10.0.0.1", now).unwrap();
        assert_eq!(source, Source::Files);

        let absent = dir.path().join("absent.crt");
        let (_, _, source) = serving(&absent, &k, "node-a", "10.0.0.1", now).unwrap();
        assert_eq!(source, Source::SelfSigned);
    }
}
