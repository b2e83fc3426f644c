//! The kubeconfig kubectl and kube-rs both read.

use std::path::Path;

use anyhow::Result;

use crate::certs::Pki;
use crate::rundir::write_file;

/// Writes an admin kubeconfig for `server` that refers to the PEM files by path (both kubectl
/// and kube-rs resolve them), so a human can inspect the certificates next to it.
pub fn write(path: &Path, server: &str, pki: &Pki) -> Result<()> {
    let yaml = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testbed
  context:
    cluster: testbed
    user: admin
    namespace: default
current-context: testbed
",
        ca = pki.ca.cert.display(),
        cert = pki.admin.cert.display(),
        key = pki.admin.key.display(),
    );
    write_file(path, &yaml)
}
