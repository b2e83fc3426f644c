//! A null node: an in-process agent that does the least a kubelet must, and nothing else. It
//! registers a Node that is Ready and large enough for 2,000 pods, renews its Lease in
//! `kube-node-lease` every 10 s, and for each pod bound to it writes one status patch that
//! makes it Running and Ready; a pod being deleted it deletes with grace 0, bound to the pod's
//! UID, as a kubelet does once its containers are gone. Pods run nowhere. What the same
//! control plane does with such a node is the ceiling a real node's mass create and delete
//! can be measured against: the rest is the node's own cost.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};

/// The label only a null node carries, with its name as the value: pods meant for it select
/// it, and no other node can take them.
pub const LABEL: &str = "bench.cocoonstack.io/null-node";

/// Status patches and deletes in flight at once: as many as the benchmarks' create calls, so
/// the agent is never what a mass create waits for.
const IN_FLIGHT: usize = 32;
const LEASE_EVERY: Duration = Duration::from_secs(10);

/// The writes the agent made, by kind (successful ones; `failed` counts the rest).
#[derive(Clone, Copy, Debug, Default)]
pub struct Writes {
    pub node: u64,
    pub lease: u64,
    pub status: u64,
    pub delete: u64,
    pub failed: u64,
}

/// What the agent did to one pod, in wall milliseconds since the epoch ([`wall_ms`]).
#[derive(Clone, Debug, Default)]
pub struct PodTrace {
    /// Its first watch event here, i.e. once it was bound to the node.
    pub seen: f64,
    pub status_sent: Option<f64>,
    pub status_done: Option<f64>,
    pub deletion_seen: Option<f64>,
    pub delete_done: Option<f64>,
}

#[derive(Default)]
struct Shared {
    writes: Mutex<Writes>,
    /// By `namespace/name`.
    pods: Mutex<HashMap<String, PodTrace>>,
    /// Pod UIDs given their one status patch, and those being deleted.
    patched: Mutex<HashSet<String>>,
    deleting: Mutex<HashSet<String>>,
    next_ip: AtomicU32,
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut Writes)) {
        f(&mut self.writes.lock().unwrap());
    }

    fn trace(&self, key: &str, f: impl FnOnce(&mut PodTrace)) {
        if let Some(t) = self.pods.lock().unwrap().get_mut(key) {
            f(t);
        }
    }
}

pub struct NullNode {
    pub name: String,
    client: Client,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Now, in milliseconds since the epoch with microseconds: the clock the daemon's journal and
/// the benchmarks' watches share.
pub fn wall_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

impl NullNode {
    /// Registers node `name` and starts its Lease and its pod watch.
    pub async fn start(client: Client, name: &str) -> Result<NullNode> {
        let shared = Arc::new(Shared::default());
        let uid = register(&client, name).await?;
        shared.count(|w| w.node += 2);
        let lease = tokio::spawn(lease_loop(
            client.clone(),
            name.to_string(),
            uid,
            shared.clone(),
        ));
        let pods = tokio::spawn(pods_loop(client.clone(), name.to_string(), shared.clone()));
        Ok(NullNode {
            name: name.to_string(),
            client,
            shared,
            tasks: vec![lease, pods],
        })
    }

    /// What a pod's spec needs to be placed here and nowhere else.
    pub fn node_selector(&self) -> std::collections::BTreeMap<String, String> {
        [(LABEL.to_string(), self.name.clone())].into()
    }

    pub fn writes(&self) -> Writes {
        *self.shared.writes.lock().unwrap()
    }

    /// Every pod it has seen, by `namespace/name`.
    pub fn traces(&self) -> HashMap<String, PodTrace> {
        self.shared.pods.lock().unwrap().clone()
    }

    /// Stops the agent and deletes its Node (the Lease goes with it, its owner).
    pub async fn stop(mut self) -> Result<()> {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes.delete(&self.name, &DeleteParams::default()).await?;
        Ok(())
    }
}

impl Drop for NullNode {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Waits until `node` carries neither the `not-ready` nor the `unreachable` taint: the
/// apiserver puts `not-ready` on every new Node, and kube-controller-manager takes it off once
/// the node is Ready. Until then the scheduler places nothing there.
pub async fn untainted(client: &Client, node: &str, limit: Duration) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    crate::daemon::until(&format!("node {node} untainted"), limit, || async {
        let Some(n) = nodes.get_opt(node).await? else {
            return Ok(None);
        };
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        let blocked = taints.iter().any(|t| {
            t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
        });
        Ok((!blocked).then_some(()))
    })
    .await
}

/// Creates the Node, then its status, as a kubelet registers: two writes. Returns its UID.
async fn register(client: &Client, name: &str) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "type": "null-node", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            LABEL: name}},
        // The same taint a cocoon node carries, so the scheduler filters as much here.
        "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "value": "null", "effect": "NoSchedule"}]},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |ty: &str, st: &str, reason: &str| json!({"type": ty, "status": st, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    // Room for 2,000 pods of the benchmarks' size (500m, 512Mi).
    let room = json!({"pods": "2000", "cpu": "1000", "memory": "1000Gi"});
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "capacity": room, "allocatable": room,
        "conditions": [
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "nodeInfo": {"kubeletVersion": "null", "machineID": "", "systemUUID": "", "bootID": "",
            "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH},
    }});
    let node = nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await?;
    node.metadata.uid.context("the node has no uid")
}

/// One server-side apply of the Lease every 10 s, owned by the Node as a kubelet's is.
async fn lease_loop(client: Client, name: String, uid: String, shared: Arc<Shared>) {
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let pp = PatchParams::apply("null-node").force();
    loop {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now())},
        });
        match leases.patch(&name, &pp, &Patch::Apply(lease)).await {
            Ok(_) => shared.count(|w| w.lease += 1),
            Err(_) => shared.count(|w| w.failed += 1),
        }
        tokio::time::sleep(LEASE_EVERY).await;
    }
}

/// Watches the pods bound to the node and answers each once.
async fn pods_loop(client: Client, node: String, shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(pods, cfg).default_backoff().boxed();
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    while let Some(ev) = stream.next().await {
        let pod = match ev {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            _ => continue,
        };
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.clone(),
            pod.metadata.name.clone(),
            pod.metadata.uid.clone(),
        ) else {
            continue;
        };
        let key = format!("{ns}/{name}");
        let now = wall_ms();
        shared
            .pods
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_insert_with(|| PodTrace {
                seen: now,
                ..Default::default()
            });
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let job = Job {
            api,
            name,
            uid: uid.clone(),
            key,
            shared: shared.clone(),
            slots: slots.clone(),
        };
        if pod.metadata.deletion_timestamp.is_some() {
            if shared.deleting.lock().unwrap().insert(uid) {
                shared.trace(&job.key, |t| t.deletion_seen = Some(now));
                tokio::spawn(job.delete());
            }
        } else if !crate::daemon::is_ready(&pod) && shared.patched.lock().unwrap().insert(uid) {
            tokio::spawn(job.status(pod));
        }
    }
}

/// One write for one pod.
struct Job {
    api: Api<Pod>,
    name: String,
    uid: String,
    key: String,
    shared: Arc<Shared>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl Job {
    async fn status(self, pod: Pod) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let n = self.shared.next_ip.fetch_add(1, Ordering::Relaxed);
        let ip = format!(
            "10.{}.{}.{}",
            200 + (n >> 16) % 50,
            (n >> 8) & 0xff,
            n & 0xff
        );
        let body = Patch::Strategic(running_status(&pod, &ip));
        self.shared
            .trace(&self.key, |t| t.status_sent = Some(wall_ms()));
        let pp = PatchParams::default();
        let done = self
            .retry(|| self.api.patch_status(&self.name, &pp, &body))
            .await;
        if done {
            self.shared.count(|w| w.status += 1);
            self.shared
                .trace(&self.key, |t| t.status_done = Some(wall_ms()));
        }
    }

    async fn delete(self) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if self.retry(|| self.api.delete(&self.name, &dp)).await {
            self.shared.count(|w| w.delete += 1);
            self.shared
                .trace(&self.key, |t| t.delete_done = Some(wall_ms()));
        }
    }

    /// Up to five tries; a pod that is gone or is another by now (404, 409, 422) ends them.
    async fn retry<T, F, Fut>(&self, mut call: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = kube::Result<T>>,
    {
        for attempt in 0..5u32 {
            match call().await {
                Ok(_) => return true,
                Err(kube::Error::Api(s)) if [404, 409, 422].contains(&s.code) => {
                    self.shared.count(|w| w.failed += 1);
                    return false;
                }
                Err(_) => {
                    self.shared.count(|w| w.failed += 1);
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
        false
    }
}

/// The status a kubelet writes once every container runs and is ready, bound to the pod's
/// UID (a patch whose `metadata.uid` differs fails, so it never lands on a successor).
fn running_status(pod: &Pod, ip: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": now});
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "",
                "containerID": format!("null://{uid}/{}", c.name),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}}})
        })
        .collect();
    json!({
        "metadata": {"uid": uid},
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [cond("PodScheduled"), cond("PodReadyToStartContainers"),
                cond("Initialized"), cond("ContainersReady"), cond("Ready")],
            "containerStatuses": containers,
        }
    })
}
