//! metrics-server on loopback, registered with the testbed's apiserver as the aggregated API
//! `v1beta1.metrics.k8s.io`, so `kubectl top` goes the way it goes in a cluster: kubectl →
//! apiserver → metrics-server → each node's kubelet API (`/metrics/resource`).
//!
//! Routing to loopback: an APIService names a Service, and Endpoints and EndpointSlices refuse
//! loopback addresses. With aggregator routing off (the apiserver's default, set explicitly in
//! apiserver.rs) the apiserver resolves the Service itself, and for an `ExternalName` Service it
//! dials `https://<externalName>:<APIService port>` (k8s.io/apiserver `proxy.ResolveCluster`);
//! the availability check skips endpoints for that type (kube-aggregator
//! `remote_available_controller`). So the Service is `ExternalName: localhost`, and the
//! apiserver checks metrics-server's certificate for `metrics-server.kube-system.svc` against
//! the testbed CA given as the APIService's `caBundle`.
//!
//! Who it is: a client certificate of the testbed CA, user `system:metrics-server`, with the
//! RBAC of metrics-server's own manifests (`nodes/metrics`, pods and nodes, token and access
//! reviews, the authentication ConfigMap) plus `nodes/stats`. The same certificate is what it
//! presents to a kubelet, so a daemon that checks callers (K9) sees that user.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference,
};
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::apiserver::ApiServer;
use crate::bins;
use crate::certs::{CertPair, Pki};
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::wait_ready;
use crate::rundir::RunDir;
use crate::step;

pub const API_SERVICE: &str = "v1beta1.metrics.k8s.io";
pub const USER: &str = "system:metrics-server";
const NS: &str = "kube-system";
const NAME: &str = "metrics-server";

pub struct MetricsServer {
    pub proc: Proc,
    /// Its secure port on 127.0.0.1.
    pub port: u16,
    /// Its client certificate (user [`USER`]), for calling a kubelet API as it does.
    pub client: CertPair,
    /// From spawning the process to the APIService reported Available.
    pub ready_after: Duration,
}

impl MetricsServer {
    /// Creates the RBAC and the Service, starts metrics-server, registers the APIService and
    /// waits until the apiserver reports it Available. Scraping starts at once; a node's
    /// figures are served from its second scrape (metrics-server computes CPU as a rate), i.e.
    /// `resolution` after the node's kubelet API first answers.
    pub async fn start(
        run: &RunDir,
        pki: &Pki,
        api: &ApiServer,
        client: &kube::Client,
        resolution: Duration,
    ) -> Result<MetricsServer> {
        let bin = bins::built("metrics-server")?;
        let port = free_port()?;
        let serving = pki.issue_serving(
            "metrics-server",
            &[&format!("{NAME}.{NS}.svc"), "localhost", "127.0.0.1"],
        )?;
        let user = pki.issue_client("metrics-server-client", USER, &[])?;
        let kubeconfig = run.path().join("metrics-server.kubeconfig");
        crate::kubeconfig::write_for(&kubeconfig, &api.url, pki, &user)?;
        grant(client).await?;
        create(
            &Api::<Service>::namespaced(client.clone(), NS),
            json!({
                "metadata": {"name": NAME, "namespace": NS},
                "spec": {"type": "ExternalName", "externalName": "localhost",
                         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
            }),
        )
        .await?;

        step!("starting metrics-server on 127.0.0.1:{port} (scrapes every {resolution:?})");
        let p = |p: &std::path::Path| p.display().to_string();
        let kc = p(&kubeconfig);
        let mut cmd = Command::new(bin);
        cmd.arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg(format!("--tls-cert-file={}", p(&serving.cert)))
            .arg(format!("--tls-private-key-file={}", p(&serving.key)))
            .arg(format!("--kubeconfig={kc}"))
            .arg(format!("--authentication-kubeconfig={kc}"))
            .arg(format!("--authorization-kubeconfig={kc}"))
            .arg(format!("--metric-resolution={}s", resolution.as_secs()))
            // Kubelets are dialled at the node's InternalIP (127.0.0.1 here) and the port the
            // node reports, never at a Hostname address that would need DNS.
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--kubelet-use-node-status-port")
            // The daemon may serve a self-signed certificate, as the apiserver also accepts.
            .arg("--kubelet-insecure-tls")
            .arg("--kubelet-request-timeout=5s")
            .arg("--v=2")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy");
        let started = Instant::now();
        let mut proc = run.spawn("metrics-server", cmd)?;
        // Registered only once it listens: a discovery check that fails is retried with backoff.
        wait_ready(
            &mut proc,
            "metrics-server",
            Duration::from_secs(60),
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await?;
        let services: Api<APIService> = Api::all(client.clone());
        let spec = APIService {
            metadata: ObjectMeta {
                name: Some(API_SERVICE.into()),
                ..Default::default()
            },
            spec: Some(APIServiceSpec {
                group: Some("metrics.k8s.io".into()),
                version: Some("v1beta1".into()),
                group_priority_minimum: 100,
                version_priority: 100,
                ca_bundle: Some(ByteString(std::fs::read(&pki.ca.cert)?)),
                service: Some(ServiceReference {
                    name: Some(NAME.into()),
                    namespace: Some(NS.into()),
                    port: Some(i32::from(port)),
                }),
                insecure_skip_tls_verify: None,
            }),
            status: None,
        };
        ok_if_exists(services.create(&PostParams::default(), &spec).await)?;
        let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let available = wait_ready(
            &mut proc,
            "metrics-server APIService",
            Duration::from_secs(120),
            || {
                let services = services.clone();
                let last = last.clone();
                async move {
                    let Ok(s) = services.get(API_SERVICE).await else {
                        return false;
                    };
                    let cond = s
                        .status
                        .and_then(|s| s.conditions)
                        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Available"));
                    if let Some(c) = &cond {
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = format!(
                            "{} {}: {}",
                            c.status,
                            c.reason.as_deref().unwrap_or_default(),
                            c.message.as_deref().unwrap_or_default()
                        );
                    }
                    cond.is_some_and(|c| c.status == "True")
                }
            },
        )
        .await;
        available.with_context(|| {
            let last = last.lock().unwrap_or_else(|e| e.into_inner());
            format!("APIService {API_SERVICE} last said: {last}")
        })?;
        let ready_after = started.elapsed();
        step!("metrics-server Available after {ready_after:?}");
        Ok(MetricsServer {
            proc,
            port,
            client: user,
            ready_after,
        })
    }
}

/// metrics-server's own RBAC (its release manifests), with `nodes/stats` added: the daemon's
/// guard authorizes `/stats/…` as that subresource.
async fn grant(client: &kube::Client) -> Result<()> {
    create(
        &Api::<ClusterRole>::all(client.clone()),
        json!({
            "metadata": {"name": USER},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics", "nodes/stats"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        }),
    )
    .await?;
    let user = json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": USER}]);
    let cluster_role = |name: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name});
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    create(
        &bindings,
        json!({"metadata": {"name": USER}, "roleRef": cluster_role(USER), "subjects": user}),
    )
    .await?;
    // TokenReviews and SubjectAccessReviews, for the callers the apiserver forwards.
    create(
        &bindings,
        json!({"metadata": {"name": "metrics-server:system:auth-delegator"},
               "roleRef": cluster_role("system:auth-delegator"), "subjects": user}),
    )
    .await?;
    // The requestheader CA and names, from kube-system/extension-apiserver-authentication.
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), NS),
        json!({"metadata": {"name": "metrics-server-auth-reader", "namespace": NS},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "extension-apiserver-authentication-reader"},
               "subjects": user}),
    )
    .await
}

async fn create<K>(api: &Api<K>, obj: serde_json::Value) -> Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj)?;
    // kube-system appears a moment after /readyz, made by the apiserver itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ok_if_exists(api.create(&PostParams::default(), &obj).await) {
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r,
        }
    }
}

fn ok_if_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
