//! The control plane's PKI, generated fresh for every run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::rundir::write_file;

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Every file the apiserver, kubectl, kube-rs and the daemon need.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
    /// The one CA: it signs serving and client certificates alike, and the apiserver trusts it
    /// for client auth (`--client-ca-file`).
    pub ca: CertPair,
    /// The apiserver's serving certificate, for 127.0.0.1 and localhost.
    pub apiserver: CertPair,
    /// Admin client (O=system:masters), used by kubectl and the tests.
    pub admin: CertPair,
    /// What the apiserver presents when it calls a kubelet API (logs, exec, port-forward).
    pub kubelet_client: CertPair,
    /// The aggregation layer's own CA (`--requestheader-client-ca-file`): an aggregated API
    /// server believes the user headers only of a caller this CA vouches for, so it must not be
    /// the CA every testbed client certificate comes from.
    pub front_proxy_ca: CertPair,
    /// What the apiserver presents when it forwards a request to an aggregated API server
    /// (CN `front-proxy-client`, the one name `--requestheader-allowed-names` lets through).
    pub front_proxy_client: CertPair,
    /// Service-account token signing key and its public half.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

impl Pki {
    pub fn generate(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let ca_key = KeyPair::generate()?;
        let ca_params = ca_params()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = save(dir, "ca", &ca_cert.pem(), &ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let apiserver = issue_serving(
            &issuer,
            dir,
            "apiserver",
            "kube-apiserver",
            &[
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
        )?;
        let admin = issue_client(&issuer, dir, "admin", "testbed-admin", &["system:masters"])?;
        let kubelet_client = issue_client(
            &issuer,
            dir,
            "kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let fp_key = KeyPair::generate()?;
        let fp_params = ca_params_named("vk-cocoon-testbed-front-proxy-ca")?;
        let front_proxy_ca = save(
            dir,
            "front-proxy-ca",
            &fp_params.self_signed(&fp_key)?.pem(),
            &fp_key,
        )?;
        let front_proxy_client = issue_client(
            &Issuer::new(fp_params, fp_key),
            dir,
            "front-proxy-client",
            FRONT_PROXY_CLIENT,
            &[],
        )?;
        let sa = KeyPair::generate()?;
        let sa_key = dir.join("sa.key");
        let sa_pub = dir.join("sa.pub");
        write_file(&sa_key, &sa.serialize_pem())?;
        write_file(&sa_pub, &sa.public_key_pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            apiserver,
            admin,
            kubelet_client,
            front_proxy_ca,
            front_proxy_client,
            sa_key,
            sa_pub,
        })
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>> {
        let key = KeyPair::from_pem(&std::fs::read_to_string(&self.ca.key)?)
            .context("loading the testbed CA key")?;
        // An issuer is its subject name and key; the same parameters rebuild it without
        // parsing the certificate (which would need rcgen's x509-parser).
        Ok(Issuer::new(ca_params()?, key))
    }

    /// A serving certificate signed by the testbed CA, e.g. for the daemon's kubelet API, so
    /// the apiserver (which trusts this CA) can verify it.
    pub fn issue_serving(&self, name: &str, sans: &[&str]) -> Result<CertPair> {
        issue_serving(&self.issuer()?, &self.dir, name, name, sans)
    }

    /// A node's credential as kubeadm issues the kubelet's client certificate
    /// (CN=`system:node:<node>`, O=`system:nodes`): what the daemon's peer API presents and
    /// accepts (`VK_PEER_CERT`).
    pub fn issue_node(&self, node: &str) -> Result<CertPair> {
        self.issue_client(
            &format!("node-{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        )
    }

    /// A client certificate signed by the testbed CA (CN = user, O = groups).
    pub fn issue_client(&self, name: &str, user: &str, groups: &[&str]) -> Result<CertPair> {
        issue_client(&self.issuer()?, &self.dir, name, user, groups)
    }
}

/// The CN of the front-proxy client certificate, for `--requestheader-allowed-names`.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

fn ca_params() -> Result<CertificateParams> {
    ca_params_named("vk-cocoon-testbed-ca")
}

fn ca_params_named(cn: &str) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn save(dir: &Path, name: &str, cert_pem: &str, key: &KeyPair) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    write_file(&pair.cert, cert_pem)?;
    write_file(&pair.key, &key.serialize_pem())?;
    Ok(pair)
}

fn issue_serving(
    issuer: &Issuer<'_, KeyPair>,
    dir: &Path,
    file: &str,
    cn: &str,
    sans: &[&str],
) -> Result<CertPair> {
    let key = KeyPair::generate()?;
    // rcgen turns SANs that parse as IP addresses into IP SANs, which Go's verifier requires
    // for https://127.0.0.1.
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, issuer)?;
    save(dir, file, &cert.pem(), &key)
}

fn issue_client(
    issuer: &Issuer<'_, KeyPair>,
    dir: &Path,
    file: &str,
    user: &str,
    groups: &[&str],
) -> Result<CertPair> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer)?;
    save(dir, file, &cert.pem(), &key)
}
