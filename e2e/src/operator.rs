//! The real cocoon-operator (CocoonSet, CocoonHibernation) on loopback, built from the source in
//! `../shared/vendor` by `build-deps.sh cocoon-operator`, which also installs its CRDs and its
//! RBAC next to the binary (`~/.cache/vk-cocoon/share/cocoon-operator/`).
//!
//! Who it is: a client certificate of the testbed CA for the user
//! `system:serviceaccount:cocoon-system:cocoon-operator`. RBAC matches a ServiceAccount subject by
//! that user name, so the operator's own `config/rbac/role.yaml` (its ClusterRole and the binding
//! to that ServiceAccount) applies unchanged, and a rule it lacks shows up here as a Forbidden in
//! its log, as it would in a cluster.
//!
//! Where it looks: `OCI_REGISTRY` is the testbed registry with the same repository prefix the
//! daemon is given, so the operator's `HEAD`/`DELETE <prefix>/<vm>:hibernate` see the tags the
//! daemon pushes. One replica, so no leader election; metrics and probes on free loopback ports.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

use crate::apiserver::ApiServer;
use crate::bins;
use crate::certs::Pki;
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::{http, wait_ready};
use crate::registry::Registry;
use crate::rundir::RunDir;
use crate::step;

/// The ServiceAccount the operator's own ClusterRoleBinding names, as a user name.
pub const USER: &str = "system:serviceaccount:cocoon-system:cocoon-operator";
/// The repository prefix under the testbed registry; a daemon that works with the operator is
/// given the same (`OCI_REGISTRY=<registry>/<PREFIX>`).
pub const PREFIX: &str = "cocoon";
/// The CRDs' API group and version.
pub const GROUP: &str = "cocoonset.cocoonstack.io";
pub const VERSION: &str = "v1";
const CRDS: [&str; 2] = [
    "cocoonsets.cocoonset.cocoonstack.io",
    "cocoonhibernations.cocoonset.cocoonstack.io",
];

pub struct Operator {
    pub proc: Proc,
    /// Prometheus metrics (plain HTTP) on 127.0.0.1.
    pub metrics_port: u16,
    /// `/healthz` and `/readyz` (plain HTTP) on 127.0.0.1.
    pub probe_port: u16,
    /// What `OCI_REGISTRY` is set to: `<registry addr>/<PREFIX>`.
    pub oci_registry: String,
    /// From spawning the process to `/readyz` answering 200.
    pub ready_after: Duration,
}

/// CRDs and RBAC as build-deps.sh installed them from the operator's source.
pub fn manifests_dir() -> Result<PathBuf> {
    let dir = bins::cache_bin_dir()
        .parent()
        .map(|c| c.join("share/cocoon-operator"))
        .context("the cache's bin directory has no parent")?;
    if !dir.join("crd").is_dir() || !dir.join("rbac/role.yaml").is_file() {
        bail!(
            "{} is missing its crd/ or rbac/role.yaml: run `bash e2e/scripts/build-deps.sh cocoon-operator`",
            dir.display()
        );
    }
    Ok(dir)
}

impl Operator {
    /// Applies the CRDs (and waits until they are Established) and the operator's RBAC, then
    /// starts it and waits until its `/readyz` answers.
    pub async fn start(
        run: &RunDir,
        pki: &Pki,
        api: &ApiServer,
        client: &kube::Client,
        registry: &Registry,
    ) -> Result<Operator> {
        let bin = bins::built("cocoon-operator")?;
        let manifests = manifests_dir()?;
        let crd_dir = manifests.join("crd").display().to_string();
        crate::kube::kubectl(&api.kubeconfig, &["apply", "--server-side", "-f", &crd_dir]).await?;
        established(client).await?;
        let role = manifests.join("rbac/role.yaml").display().to_string();
        crate::kube::kubectl(&api.kubeconfig, &["apply", "-f", &role]).await?;

        let user = pki.issue_client("cocoon-operator-client", USER, &[])?;
        let kubeconfig = run.path().join("cocoon-operator.kubeconfig");
        crate::kubeconfig::write_for(&kubeconfig, &api.url, pki, &user)?;
        let metrics_port = free_port()?;
        let probe_port = free_port()?;
        let oci_registry = format!("{}/{PREFIX}", registry.addr);
        step!("starting cocoon-operator (probes on 127.0.0.1:{probe_port}, OCI_REGISTRY={oci_registry})");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{probe_port}"
            ))
            .arg("--leader-elect=false")
            .env("KUBECONFIG", &kubeconfig)
            .env("OCI_REGISTRY", &oci_registry)
            .env("OPERATOR_LOG_LEVEL", "debug")
            // Its Docker keychain reads ~/.docker/config.json: a developer's credentials have no
            // business in a loopback registry, and the anonymous pull is what the testbed serves.
            .env("DOCKER_CONFIG", run.path().join("cocoon-operator-docker"))
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy");
        let started = Instant::now();
        let mut proc = run.spawn("cocoon-operator", cmd)?;
        let url = format!("http://127.0.0.1:{probe_port}/readyz");
        let c = http();
        wait_ready(
            &mut proc,
            "cocoon-operator",
            Duration::from_secs(60),
            || async {
                c.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await?;
        let ready_after = started.elapsed();
        step!("cocoon-operator ready after {ready_after:?}");
        Ok(Operator {
            proc,
            metrics_port,
            probe_port,
            oci_registry,
            ready_after,
        })
    }
}

/// Waits until the apiserver serves both CRDs. Polled rather than `kubectl wait`, which fails
/// at once on a CRD whose status has no conditions yet.
async fn established(client: &kube::Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut missing = Vec::new();
        for name in CRDS {
            let ok = crds.get_opt(name).await?.is_some_and(|c| {
                c.status.and_then(|s| s.conditions).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
            });
            if !ok {
                missing.push(name);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRDs not Established within 60 s: {missing:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
