//! Starting the real `vk-cocoon` daemon against a testbed, wired to its simulator.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::procs::Proc;
use crate::testbed::Testbed;

pub struct DaemonOptions {
    /// The `vk-cocoon` binary (tests pass `env!("CARGO_BIN_EXE_vk-cocoon")`).
    pub bin: PathBuf,
    pub node: String,
    pub orphan_policy: String,
    pub journal: PathBuf,
    pub metrics_port: u16,
    pub kubelet_port: u16,
    /// The node's InternalIP, where peers dial its peer API (a loopback address).
    pub node_ip: String,
    /// `VK_PEER_ADDR`: a free loopback port unless set, so daemons of parallel tests never
    /// meet on the default port.
    pub peer_addr: String,
    /// Which cocoon host the daemon drives: `None` for the testbed's own simulator, or a name
    /// given to `Testbed::add_host`.
    pub host: Option<String>,
    /// Extra environment, e.g. simulator timing for a benchmark.
    pub env: Vec<(String, String)>,
    /// A program and its arguments that start the daemon instead of running it directly, e.g.
    /// `setpriv` to take a capability away from it.
    pub launcher: Vec<String>,
}

impl DaemonOptions {
    pub fn new(bin: impl Into<PathBuf>, journal: PathBuf) -> Result<Self> {
        Ok(Self {
            bin: bin.into(),
            node: "node-a".into(),
            orphan_policy: "destroy".into(),
            journal,
            metrics_port: crate::ports::free_port()?,
            kubelet_port: crate::ports::free_port()?,
            node_ip: "127.0.0.1".into(),
            peer_addr: format!("127.0.0.1:{}", crate::ports::free_port()?),
            host: None,
            env: Vec::new(),
            launcher: Vec::new(),
        })
    }
}

/// Spawns `vk-cocoon run` as part of the testbed's run (torn down with it).
pub fn start(tb: &Testbed, o: &DaemonOptions) -> Result<Proc> {
    let sim = tb.host(o.host.as_deref())?;
    let mut cmd = match o.launcher.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&o.bin);
            c
        }
        None => Command::new(&o.bin),
    };
    cmd.arg("run")
        .envs(sim.env())
        .env("KUBECONFIG", tb.kubeconfig()?)
        .env("VK_NODE_NAME", &o.node)
        .env("VK_NODE_IP", &o.node_ip)
        .env("VK_PEER_ADDR", &o.peer_addr)
        .env("VK_KUBELET_PORT", o.kubelet_port.to_string())
        .env("VK_METRICS_ADDR", format!("127.0.0.1:{}", o.metrics_port))
        .env("VK_COCOON_BIN", &sim.bin)
        .env("VK_LEASES_PATH", &sim.leases)
        .env("COCOON_ROOT_DIR", &sim.root)
        .env("COCOON_CGROUP_PARENT", &sim.cgroup_parent)
        .env("VK_ORPHAN_POLICY", &o.orphan_policy)
        .env("VK_COCOON_NET_CONTROL_SOCKET", &sim.control_socket)
        .env("VK_JOURNAL_PATH", &o.journal)
        .env("VK_STAGING_DIR", sim.root.join("vk-staging"))
        .env("VK_COCOON_SNAPSHOT_DIR", sim.root.join("snapshots"))
        .env("VK_LOG_LEVEL", "info")
        // The scheduler places pods by allocatable: the node stands for a host big enough for
        // the benchmark's 1,000 pods of `pod_manifest`'s size (500m, 512Mi), after the default
        // 20 % reserve, rather than for this machine's own few cores.
        .env("VK_NODE_CPU", "640")
        .env("VK_NODE_MEM", "640Gi")
        .env("VK_NODE_PODS", "1024");
    // The apiserver presents its kubelet client certificate, signed by the testbed CA, when
    // it calls the kubelet API (kubectl logs); the daemon checks callers against that CA.
    if let Some(pki) = &tb.pki {
        cmd.env("VK_CLIENT_CA_FILE", &pki.ca.cert);
    }
    cmd.envs(o.env.iter().cloned());
    tb.spawn("vk-cocoon", cmd)
}

/// The pool the daemons started here belong to (`VK_NODE_POOL` unset).
pub const POOL: &str = "default";

/// A pod as the operator makes it for a CocoonSet pinned to `node`: the scheduler places it by
/// the pool label and a required hostname affinity, the provider taint's toleration lets it
/// onto a cocoon node, and it tolerates the node going not-ready or unreachable forever. One
/// placeholder container `agent`, grace 1 s, and the given annotations.
pub fn pod_manifest(
    ns: &str,
    name: &str,
    node: &str,
    annotations: serde_json::Value,
) -> Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "nodeSelector": {"cocoonstack.io/pool": POOL},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "agent", "image": "ghcr.io/cocoonstack/placeholder:latest",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}],
            "tolerations": [
                {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
            ]
        }
    }))?)
}

/// The clone source the samples and tests use: snapshot `acme/agent:v1` of image `acme/base:1`.
pub fn seed_clone_snapshot(tb: &Testbed) -> Result<()> {
    let sim = tb.sim.as_ref().context("testbed without the simulator")?;
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "acme/agent:v1",
        "--image",
        "acme/base:1",
    ])?;
    Ok(())
}
