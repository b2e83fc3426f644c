//! The Node object and its Lease (N1–N17). Registration happens once the core says startup
//! reconcile is done; the Lease is renewed on its own task so pod work can never delay it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::backoff::Backoff;

#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub name: String,
    pub ip: String,
    pub pool: String,
    pub cpu_class: Option<String>,
    pub provider_id: Option<String>,
    pub kubelet_port: u16,
    /// K4: declare `ExtendWebSocketsToKubelet` (`VK_KUBELET_WEBSOCKET`).
    pub websocket: bool,
    pub version: String,
    pub capacity: BTreeMap<String, i128>,
    pub allocatable: BTreeMap<String, i128>,
}

const NODE_LEASE_RENEW: Duration = Duration::from_secs(10);
/// Retries of the node's registration and of its Lease renewal: quick at first, and capped at
/// 7 s so a failing renewal is tried several times within the Lease's 40 s.
pub const RENEW_RETRY: Backoff =
    Backoff::doubling(Duration::from_millis(200), Duration::from_secs(7));
const NODE_LEASE_SECONDS: i32 = 40;
const STATUS_EVERY: Duration = Duration::from_secs(60);
const CLASS_LABEL: &str = "cocoonstack.io/snapshot-cpu-class";

fn labels(s: &NodeSettings) -> Value {
    json!({
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": s.name,
        "cocoonstack.io/pool": s.pool,
        "node-role.kubernetes.io/cocoon-vm": "",
        CLASS_LABEL: s.cpu_class,
    })
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

fn status(s: &NodeSettings) -> Value {
    let t = now().to_string();
    let cond = |ty: &str, st: &str, reason: &str, msg: &str| json!({"type": ty, "status": st, "reason": reason, "message": msg, "lastHeartbeatTime": t});
    let q = |m: &BTreeMap<String, i128>| {
        m.iter()
            .map(|(k, v)| {
                let text = crate::node_resources::canonical(k, *v);
                (k.clone(), Value::String(text))
            })
            .collect::<serde_json::Map<_, _>>()
    };
    json!({
        "addresses": [{"type": "InternalIP", "address": s.ip}, {"type": "Hostname", "address": s.name}],
        "capacity": q(&s.capacity),
        "allocatable": q(&s.allocatable),
        "conditions": [
            cond("Ready", "True", "KubeletReady", "vk-cocoon is ready"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "vk-cocoon has no disk pressure"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "vk-cocoon has sufficient memory"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "vk-cocoon has sufficient PID available"),
            cond("NetworkUnavailable", "False", "RouteCreated", "NodeController create implicit route"),
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": s.kubelet_port}},
        "declaredFeatures": declared_features(s),
        "nodeInfo": {"kubeletVersion": s.version, "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                     "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": kube_arch()},
    })
}

/// N7: the machine's architecture in Kubernetes' naming (Go's GOARCH: `amd64`, `arm64`), the
/// one `kubectl get nodes -o wide`, the kubelet and image platforms use; Rust calls them
/// `x86_64` and `aarch64`.
pub fn kube_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// K4: the node features the apiserver consults before proxying. With
/// `ExtendWebSocketsToKubelet` it hands exec and port-forward WebSockets straight to the
/// kubelet API; without it, it translates them to SPDY first. Both are served, so this only
/// picks the transport. An empty list is written rather than none, so turning the setting off
/// withdraws an earlier declaration.
fn declared_features(s: &NodeSettings) -> Vec<&'static str> {
    match s.websocket {
        true => vec!["ExtendWebSocketsToKubelet"],
        false => Vec::new(),
    }
}

/// N19: a Node of this name that no virtual kubelet made (no `type=virtual-kubelet` label)
/// is somebody else's, most likely the host's own kubelet: taking it over would overwrite its
/// status and Lease and claim every pod scheduled to the host.
pub fn foreign(node: &Node) -> Option<String> {
    let ours = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("type"))
        .is_some_and(|t| t == "virtual-kubelet");
    let name = node.metadata.name.as_deref().unwrap_or_default();
    (!ours).then(|| {
        format!(
            "Node {name} already exists and is not a virtual node (no label type=virtual-kubelet); \
             it is probably the host's own. Refusing to take it over: give this daemon a node \
             name of its own with VK_NODE_NAME (the shipped DaemonSet uses <host>-cocoon)"
        )
    })
}

/// N19 at startup: stop before anything runs when the node name is already someone else's.
/// An API that cannot answer is no verdict; registration checks again.
pub async fn refuse_foreign(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(node)) => match foreign(&node) {
            Some(why) => anyhow::bail!(why),
            None => Ok(()),
        },
        Ok(None) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, node = name, "could not look the node up before registering");
            Ok(())
        }
    }
}

/// N14: patch the status of an existing node, else create the whole object; then re-assert
/// the labels (N3), since a status patch never changes them. Returns the node UID.
pub async fn register(client: &Client, s: &NodeSettings) -> anyhow::Result<String> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::default();
    match api.get_opt(&s.name).await? {
        None => {
            let mut spec = json!({"taints": [{"key": "virtual-kubelet.io/provider", "value": "cocoon", "effect": "NoSchedule"}]});
            if let Some(p) = &s.provider_id {
                spec["providerID"] = json!(p);
            }
            let labels: serde_json::Map<String, Value> = labels(s)
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .collect();
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": s.name, "labels": labels},
                "spec": spec,
            }))?;
            api.create(&PostParams::default(), &node).await?;
        }
        Some(node) if foreign(&node).is_some() => {
            anyhow::bail!(foreign(&node).unwrap_or_default())
        }
        // N4: the taint is written only when the node is created; an existing node keeps its own.
        Some(_) => {
            api.patch(
                &s.name,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": labels(s)}})),
            )
            .await?;
        }
    }
    let node = api
        .patch_status(
            &s.name,
            &pp,
            &Patch::Strategic(json!({"status": status(s)})),
        )
        .await?;
    Ok(node.metadata.uid.unwrap_or_default())
}

/// N16: the status with fresh heartbeats every 60 s; N17: the Lease every 10 s. Errors back
/// off and retry; they never end the task.
pub async fn heartbeat(
    client: Client,
    s: NodeSettings,
    uid: String,
    lease: crate::metrics::LeaseRenewals,
) {
    let node_lease_task = tokio::spawn(node_lease_loop(client.clone(), s.clone(), uid, lease));
    let api: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(STATUS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = api
            .patch_status(
                &s.name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": status(&s)})),
            )
            .await
        {
            tracing::warn!(error = %e, "node status heartbeat failed; next try in 60s");
        }
        if node_lease_task.is_finished() {
            return;
        }
    }
}

async fn node_lease_loop(
    client: Client,
    s: NodeSettings,
    uid: String,
    renewals: crate::metrics::LeaseRenewals,
) {
    let api: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut backoff = RENEW_RETRY;
    // The Lease as this daemon last wrote it: a renewal updates it in place, as a kubelet
    // does, and reads it back only when that write conflicts (N17). A GET per renewal would be
    // a quorum read from etcd every 10 s per node, 500/s on a 5,000-host cluster.
    let mut last = None;
    loop {
        match renew_node_lease(&api, &s, &uid, &mut last).await {
            Ok(()) => {
                renewals.renewed();
                backoff.reset();
                tokio::time::sleep(NODE_LEASE_RENEW).await;
            }
            Err(e) => {
                let backoff = backoff.failed();
                tracing::warn!(error = %e, ?backoff, "node lease renewal failed");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

async fn renew_node_lease(
    api: &Api<Lease>,
    s: &NodeSettings,
    uid: &str,
    last: &mut Option<Lease>,
) -> anyhow::Result<()> {
    for _ in 0..5 {
        let spec = LeaseSpec {
            holder_identity: Some(s.name.clone()),
            lease_duration_seconds: Some(NODE_LEASE_SECONDS),
            renew_time: Some(MicroTime(now())),
            ..LeaseSpec::default()
        };
        let current = match last.take() {
            Some(lease) => Some(lease),
            None => api.get_opt(&s.name).await?,
        };
        match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(s.name.clone()),
                        namespace: Some("kube-node-lease".into()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: s.name.clone(),
                            uid: uid.to_string(),
                            ..OwnerReference::default()
                        }]),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(written) => {
                        *last = Some(written);
                        return Ok(());
                    }
                    Err(kube::Error::Api(st)) if st.code == 409 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Some(mut lease) => {
                lease.spec = Some(spec);
                match api.replace(&s.name, &PostParams::default(), &lease).await {
                    Ok(written) => {
                        *last = Some(written);
                        return Ok(());
                    }
                    // Changed or deleted since this daemon wrote it: read it again.
                    Err(kube::Error::Api(st)) if st.code == 409 || st.code == 404 => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    anyhow::bail!("lease update conflicted 5 times in a row")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)]) -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": "host-1",
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_a_virtual_node_may_be_taken_over() {
        assert!(foreign(&node(&[("type", "virtual-kubelet")])).is_none());
        let why = foreign(&node(&[("kubernetes.io/hostname", "host-1")])).unwrap();
        assert!(
            why.contains("Node host-1") && why.contains("VK_NODE_NAME"),
            "{why}"
        );
        assert!(foreign(&node(&[("type", "kubelet")])).is_some());
    }
}
