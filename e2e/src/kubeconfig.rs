//! The kubeconfig kubectl and kube-rs both read.

use std::path::Path;

use anyhow::Result;

use crate::certs::{CertPair, Pki};
use crate::rundir::write_file;

/// Writes an admin kubeconfig for `server` that refers to the PEM files by path (both kubectl
/// and kube-rs resolve them), so a human can inspect the certificates next to it.
pub fn write(path: &Path, server: &str, pki: &Pki) -> Result<()> {
    write_for(path, server, pki, &pki.admin)
}

/// The same for the user of another client certificate of the testbed CA.
pub fn write_for(path: &Path, server: &str, pki: &Pki, user: &CertPair) -> Result<()> {
    let yaml = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user_name}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testbed
  context:
    cluster: testbed
    user: {user_name}
    namespace: default
current-context: testbed
",
        ca = pki.ca.cert.display(),
        user_name = user
            .cert
            .file_stem()
            .map_or("user".into(), |s| s.to_string_lossy()),
        cert = user.cert.display(),
        key = user.key.display(),
    );
    write_file(path, &yaml)
}
