//! The registered Node, field by field, against the N rules: labels (N2), the provider taint
//! (N4), addresses (N5), providerID (N6), nodeInfo (N7), conditions (N8), the kubelet
//! endpoint (N9), capacity and allocatable with the reserve and huge pages in canonical
//! quantities (N10–N12); then a restart with another pool and no CPU class reclassifies the
//! node without touching its taints (N3, N4).

use e2e::daemon;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{until, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

/// The host's default huge-page size as N11 names it (`2Mi`, `1Gi`), if the host has one.
fn huge_page_size() -> Option<String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("Hugepagesize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(match kb {
        kb if kb % (1024 * 1024) == 0 => format!("{}Gi", kb / (1024 * 1024)),
        kb if kb % 1024 == 0 => format!("{}Mi", kb / 1024),
        kb => format!("{kb}Ki"),
    })
}

/// The Node once its status carries the five conditions (registration creates it first).
async fn registered(nodes: &Api<Node>) -> Result<Value> {
    until("the node's status", LIMIT, || async {
        let Some(node) = nodes.get_opt(NODE).await? else {
            return Ok(None);
        };
        let v = serde_json::to_value(&node)?;
        let conditions = v["status"]["conditions"].as_array().map_or(0, Vec::len);
        Ok((conditions >= 5).then_some(v))
    })
    .await
}

/// The node's taints but the node lifecycle controller's (`node.kubernetes.io/…`), which it
/// may set for a moment before the first status arrives.
fn ours(node: &Value) -> Vec<Value> {
    node["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter(|t| {
                    !t["key"]
                        .as_str()
                        .unwrap_or_default()
                        .starts_with("node.kubernetes.io/")
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn strings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn expect_map(what: &str, got: &Value, want: &[(&str, &str)]) -> Result<()> {
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let got = strings(got);
    ensure!(got == want, "{what}: got {got:#?}, want {want:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_is_registered_as_the_spec_says() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let kubelet_port = e2e::ports::free_port()?;
    let pages = huge_page_size();
    let mut env = vec![
        ("VK_NODE_CPU", "640"),
        ("VK_NODE_MEM", "640Gi"),
        ("VK_NODE_STORAGE", "1Ti"),
        ("VK_NODE_PODS", "1024"),
        ("VK_RESERVE_PERCENT", "25"),
        ("VK_NODE_POOL", "gpu-a"),
        ("VK_SNAPSHOT_CPU_CLASS", "epyc-9004"),
        ("VK_PROVIDER_ID", "cocoon://host-1/node-a"),
    ];
    if pages.is_some() {
        env.push(("VK_NODE_HUGEPAGES", "4Gi"));
    }
    let opts = DaemonOptions {
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..DaemonOptions::default()
    };
    let mut d = daemon::start(&tb, &opts, &journal, e2e::ports::free_port()?, kubelet_port)?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let nodes: Api<Node> = Api::all(tb.client()?);
    let node = registered(&nodes)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    e2e::step!("registered: {}", serde_json::to_string_pretty(&node)?);

    // N2: the labels are the framework's and cocoon's; the apiserver adds none of its own.
    expect_map(
        "labels",
        &node["metadata"]["labels"],
        &[
            ("type", "virtual-kubelet"),
            ("kubernetes.io/role", "agent"),
            ("kubernetes.io/hostname", NODE),
            ("cocoonstack.io/pool", "gpu-a"),
            ("node-role.kubernetes.io/cocoon-vm", ""),
            ("cocoonstack.io/snapshot-cpu-class", "epyc-9004"),
        ],
    )?;
    // N4: the provider taint, once.
    ensure!(
        ours(&node)
            == vec![
                json!({"key": "virtual-kubelet.io/provider", "value": "cocoon", "effect": "NoSchedule"})
            ],
        "taints: {}",
        node["spec"]["taints"]
    );
    // N6.
    ensure!(
        node["spec"]["providerID"] == "cocoon://host-1/node-a",
        "providerID: {}",
        node["spec"]["providerID"]
    );
    let status = &node["status"];
    // N5: the node IP first, then the node name.
    ensure!(
        status["addresses"]
            == json!([{"type": "InternalIP", "address": "127.0.0.1"},
                      {"type": "Hostname", "address": NODE}]),
        "addresses: {}",
        status["addresses"]
    );
    // N9.
    ensure!(
        status["daemonEndpoints"] == json!({"kubeletEndpoint": {"Port": kubelet_port}}),
        "daemonEndpoints: {}",
        status["daemonEndpoints"]
    );
    // N7: the build's version; the machine's identity fields stay empty (the apiserver leaves
    // empty strings out); the phase is left alone.
    let info = &status["nodeInfo"];
    let version = info["kubeletVersion"].as_str().unwrap_or_default();
    ensure!(
        version == vk_cocoon::version::kubelet_version(),
        "kubeletVersion: {version:?}"
    );
    for field in [
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeProxyVersion",
    ] {
        ensure!(
            info[field].as_str().unwrap_or_default().is_empty(),
            "nodeInfo.{field}: {}",
            info[field]
        );
    }
    // N7: the platform in Kubernetes' naming, as a kubelet reports it.
    ensure!(
        info["operatingSystem"] == "linux" && info["architecture"] == "amd64",
        "nodeInfo platform: {} {}",
        info["operatingSystem"],
        info["architecture"]
    );
    ensure!(
        status["phase"].is_null(),
        "the node's phase is set: {}",
        status["phase"]
    );
    // N8: five static conditions, heartbeat only.
    let conditions: BTreeMap<String, Value> = status["conditions"]
        .as_array()
        .context("conditions")?
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_string(),
                c.clone(),
            )
        })
        .collect();
    let want = [
        ("Ready", "True", "KubeletReady", "vk-cocoon is ready"),
        (
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "vk-cocoon has no disk pressure",
        ),
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "vk-cocoon has sufficient memory",
        ),
        (
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "vk-cocoon has sufficient PID available",
        ),
        (
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "NodeController create implicit route",
        ),
    ];
    ensure!(
        conditions.len() == want.len(),
        "conditions: {:?}",
        conditions.keys()
    );
    for (ty, st, reason, message) in want {
        let c = conditions
            .get(ty)
            .with_context(|| format!("condition {ty}"))?;
        ensure!(
            c["status"] == st && c["reason"] == reason && c["message"] == message,
            "condition {ty}: {c}"
        );
        ensure!(
            c["lastHeartbeatTime"].is_string() && c["lastTransitionTime"].is_null(),
            "condition {ty}'s times: {c}"
        );
    }
    // N10–N12: canonical quantities, as `kubectl describe node` shows them; allocatable keeps
    // 75 % of each and every pod.
    let mut capacity = vec![
        ("cpu", "640"),
        ("memory", "640Gi"),
        ("ephemeral-storage", "1Ti"),
        ("pods", "1024"),
    ];
    let mut allocatable = vec![
        ("cpu", "480"),
        ("memory", "480Gi"),
        ("ephemeral-storage", "768Gi"),
        ("pods", "1024"),
    ];
    let page_key = pages.map(|p| format!("hugepages-{p}"));
    if let Some(key) = &page_key {
        capacity.push((key, "4Gi"));
        allocatable.push((key, "3Gi"));
    }
    expect_map("capacity", &status["capacity"], &capacity)?;
    expect_map("allocatable", &status["allocatable"], &allocatable)?;

    // N3, N4: an operator's extra taint and label survive a restart; the restart applies the
    // new pool, drops the CPU class, and adds no second provider taint.
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "virtual-kubelet.io/provider", "value": "cocoon", "effect": "NoSchedule"},
                {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}]},
                "metadata": {"labels": {"team": "infra"}}})),
        )
        .await?;
    d.proc.stop();
    let env: Vec<(String, String)> = opts
        .env
        .iter()
        .filter(|(k, _)| k != "VK_SNAPSHOT_CPU_CLASS" && k != "VK_NODE_POOL")
        .cloned()
        .chain([("VK_NODE_POOL".to_string(), "gpu-b".to_string())])
        .collect();
    let again = DaemonOptions {
        env,
        ..DaemonOptions::default()
    };
    let d = daemon::start(
        &tb,
        &again,
        &journal,
        e2e::ports::free_port()?,
        kubelet_port,
    )?;
    let node = until("the node reclassified", LIMIT, || async {
        let node = serde_json::to_value(nodes.get(NODE).await?)?;
        let pool = node["metadata"]["labels"]["cocoonstack.io/pool"].clone();
        Ok((pool == "gpu-b").then_some(node))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    expect_map(
        "labels after the restart",
        &node["metadata"]["labels"],
        &[
            ("type", "virtual-kubelet"),
            ("kubernetes.io/role", "agent"),
            ("kubernetes.io/hostname", NODE),
            ("cocoonstack.io/pool", "gpu-b"),
            ("node-role.kubernetes.io/cocoon-vm", ""),
            ("team", "infra"),
        ],
    )?;
    ensure!(
        ours(&node).len() == 2,
        "taints after the restart: {}",
        node["spec"]["taints"]
    );
    Ok(())
}

/// N17: the Lease is renewed in place from the copy the daemon last wrote, as a kubelet
/// renews it: an update every 10 s and no read of it back, which at 5,000 hosts would be
/// 500 quorum reads a second. Only the daemon talks to this apiserver, so every Lease request
/// it counts is the daemon's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_without_reading_it_back() -> Result<()> {
    use e2e::apiserver_metrics::Metrics;
    use k8s_openapi::api::coordination::v1::Lease;
    let tb = Testbed::start(TestbedOptions::control_plane().apiserver_only().with_sim()).await?;
    let (d, _) = daemon::start_default(&tb)?;
    let leases: Api<Lease> = Api::namespaced(tb.client()?, "kube-node-lease");
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = until("the node Lease", LIMIT, || async {
        Ok(leases.get_opt(NODE).await?.and_then(|l| renewed(&l)))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let client = tb.client()?;
    let before = Metrics::scrape(&client).await?;
    // Two renewals at least (every 10 s).
    tokio::time::sleep(Duration::from_secs(25)).await;
    let grown = Metrics::scrape(&client).await?.since(&before);
    let count = |verb: &str| {
        grown.sum("apiserver_request_total", |l| {
            l.get("resource").map(String::as_str) == Some("leases")
                && l.get("verb").map(String::as_str) == Some(verb)
        })
    };
    let (gets, puts) = (count("GET"), count("PUT"));
    ensure!(
        puts >= 2.0 && gets == 0.0,
        "in 25 s: {puts} Lease updates (want at least 2) and {gets} Lease reads (want none)"
    );
    let last = leases.get(NODE).await?;
    ensure!(
        renewed(&last).is_some_and(|t| t.0 > first.0),
        "the Lease was not renewed: {:?} then {:?}",
        first,
        renewed(&last)
    );
    Ok(())
}
