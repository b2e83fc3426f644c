//! kube-controller-manager on loopback, with the controllers of a cluster that act on a cocoon
//! node's pods: node lifecycle (the `not-ready` taint comes off a Ready node; an expired lease
//! marks it Unknown and taints it), taint eviction, the garbage collectors of owned objects and
//! of orphaned pods, the ServiceAccount controllers (every namespace gets `default`), the
//! namespace, ReplicaSet and Deployment controllers.

use std::process::Command;

use anyhow::Result;

use crate::apiserver::ApiServer;
use crate::bins;
use crate::certs::Pki;
use crate::component::{self, Component};
use crate::procs::Proc;
use crate::rundir::RunDir;

/// The user the bootstrap RBAC (`system:kube-controller-manager`) is bound to.
pub const USER: &str = "system:kube-controller-manager";

/// No node IPAM among them, so no `--cluster-cidr` is needed.
pub const CONTROLLERS: &[&str] = &[
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "replicaset-controller",
    "deployment-controller",
];

pub struct ControllerManager {
    pub proc: Proc,
    /// Its secure port on 127.0.0.1 (`/healthz`, `/metrics`).
    pub port: u16,
}

impl ControllerManager {
    pub async fn start(run: &RunDir, pki: &Pki, api: &ApiServer) -> Result<ControllerManager> {
        let c = Component::prepare(run, pki, api, "kube-controller-manager", USER)?;
        let p = |p: &std::path::Path| p.display().to_string();
        let mut cmd = Command::new(bins::built("kube-controller-manager")?);
        c.common_args(&mut cmd);
        cmd.arg("--leader-elect=false")
            // Not `*`: with per-controller credentials each controller costs a ServiceAccount
            // and a token request at start, and the whole default set delays every testbed by
            // ~5 s for controllers (volumes, jobs, quotas, ...) no test here exercises.
            .arg(format!("--controllers={}", CONTROLLERS.join(",")))
            // Each controller acts as its own ServiceAccount (system:serviceaccount:kube-system:
            // <controller>), with the bootstrap role of that controller, as kubeadm runs it.
            .arg("--use-service-account-credentials=true")
            // The same key the apiserver signs tokens with: the token controller's legacy
            // secrets, and what `--use-service-account-credentials` authenticates with.
            .arg(format!(
                "--service-account-private-key-file={}",
                p(&pki.sa_key)
            ))
            // Published in every namespace as the `kube-root-ca.crt` ConfigMap.
            .arg(format!("--root-ca-file={}", p(&pki.ca.cert)));
        let (proc, port) = component::spawn_healthy(run, c, cmd).await?;
        Ok(ControllerManager { proc, port })
    }
}
