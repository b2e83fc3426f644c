//! `kubectl top` as a cluster serves it: kubectl asks the apiserver for `metrics.k8s.io`, the
//! apiserver forwards to metrics-server, and metrics-server scrapes the daemon's
//! `/metrics/resource` (K6) as user `system:metrics-server`, whom the daemon checks (K9). The
//! figures are the simulated VM's own: the guest process's RSS and its cgroup scope's CPU (M2).

use e2e::daemon;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::daemon::{create_pod, metric_series, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const NS: &str = "default";
const NODE: &str = "node-a";
const POD: &str = "top-a";
const LIMIT: Duration = Duration::from_secs(60);
/// metrics-server serves a figure from its second scrape, 10 s apart at the fastest; three
/// periods on a loaded 2-core machine, and the daemon's start, fit well within this.
const TOP_LIMIT: Duration = Duration::from_secs(90);

/// Calls `f` once a second until it yields `Some`, for at most `limit`; each `kubectl top`
/// is a process start, so the 100 ms of `until` would only load the machine.
async fn every_second<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    let mut last = String::new();
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what} (last error: {last})");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `1234m` → 1234; `0` → 0.
fn millicores(s: &str) -> Option<u64> {
    match s.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => s.parse::<u64>().ok().map(|c| c * 1000),
    }
}

fn mebibytes(s: &str) -> Option<u64> {
    s.strip_suffix("Mi")?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_shows_the_vm_and_the_node() -> Result<()> {
    let tb = Testbed::start(
        TestbedOptions::control_plane()
            .with_sim()
            .with_metrics_server(),
    )
    .await?;
    let ms = tb.metrics_server.as_ref().context("metrics-server")?;
    e2e::step!(
        "metrics-server Available {:?} after its start",
        ms.ready_after
    );
    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let kubelet_port = e2e::ports::free_port()?;
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        kubelet_port,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let registered = Instant::now();

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let pod = daemon::run_pod(NS, POD, NODE)?;
    create_pod(&pods, &pod).await?;
    wait_ready(&pods, POD, LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let ready = Instant::now();

    // NAME CPU(cores) MEMORY(bytes), e.g. `top-a 1m 3Mi`.
    let row = every_second("kubectl top pod", TOP_LIMIT, || async {
        let out = tb.kubectl(&["top", "pod", POD, "--no-headers"]).await?;
        Ok(out
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c.first().map(String::as_str) == Some(POD)))
    })
    .await
    .with_context(|| {
        format!(
            "daemon:\n{}\nmetrics-server:\n{}",
            d.proc.log_tail(20),
            ms.proc.log_tail(30)
        )
    })?;
    let pod_after = ready.elapsed();
    ensure!(row.len() == 3, "kubectl top pod printed {row:?}");
    let cpu = millicores(&row[1]).with_context(|| format!("CPU column {:?}", row[1]))?;
    let mem = mebibytes(&row[2]).with_context(|| format!("memory column {:?}", row[2]))?;
    // The guest is a real process: its RSS is megabytes, never 0 (metrics-server would have
    // dropped the pod). Its CPU is a rate and may round to 0m for an idle guest.
    ensure!(mem > 0, "kubectl top pod shows no memory: {row:?}");
    // The same figure the daemon exports for the VM, within the drift of an idle process.
    let rss: f64 = metric_series(metrics_port, "cocoon_vk_vm_memory_rss_bytes")
        .await?
        .iter()
        .filter(|(l, _)| l.contains(&format!("pod=\"{POD}\"")))
        .map(|(_, v)| v)
        .sum();
    let rss_mi = (rss / (1024.0 * 1024.0)) as u64;
    ensure!(
        mem.abs_diff(rss_mi) <= 2,
        "kubectl top pod {mem}Mi, the daemon's RSS {rss_mi}Mi"
    );

    // The raw API names the one container `agent` (the `container` label of K6).
    let raw = tb
        .kubectl(&[
            "get",
            "--raw",
            &format!("/apis/metrics.k8s.io/v1beta1/namespaces/{NS}/pods/{POD}"),
        ])
        .await?;
    let doc: serde_json::Value = serde_json::from_str(&raw)?;
    let containers = doc["containers"].as_array().context("containers")?;
    ensure!(
        containers.len() == 1 && containers[0]["name"] == "agent",
        "PodMetrics containers: {containers:?}"
    );

    // NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%).
    let node_row = every_second("kubectl top node", TOP_LIMIT, || async {
        let out = tb.kubectl(&["top", "node", NODE, "--no-headers"]).await?;
        Ok(out
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c.first().map(String::as_str) == Some(NODE)))
    })
    .await?;
    let node_after = registered.elapsed();
    ensure!(node_row.len() == 5, "kubectl top node printed {node_row:?}");
    let node_cpu = millicores(&node_row[1]).context("node CPU column")?;
    let node_mem = mebibytes(&node_row[3]).context("node memory column")?;
    // The host's own figures: busy CPU (DEC-2) and MemTotal − MemAvailable, both above 0 on
    // any machine running this test.
    ensure!(
        node_mem > 0,
        "kubectl top node shows no memory: {node_row:?}"
    );
    e2e::step!(
        "kubectl top pod: {row:?} ({cpu}m, {mem}Mi) {pod_after:?} after the pod was Ready; \
         kubectl top node: {node_row:?} ({node_cpu}m, {node_mem}Mi) {node_after:?} after the \
         node registered"
    );

    // /stats/summary (K5) with metrics-server's certificate: its `nodes/stats` grant is what
    // the daemon's guard asks the apiserver about (K9).
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--fail", "--max-time", "10", "--cert"])
        .arg(&ms.client.cert)
        .arg("--key")
        .arg(&ms.client.key)
        .arg(format!("https://127.0.0.1:{kubelet_port}/stats/summary"))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "GET /stats/summary as {}: {}",
        e2e::metrics_server::USER,
        out.status
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(summary["node"]["nodeName"] == NODE, "{summary}");
    let entry = summary["pods"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == POD))
        .with_context(|| format!("{POD} is not in /stats/summary: {summary}"))?;
    let agent = &entry["containers"][0];
    ensure!(
        agent["name"] == "agent"
            && agent["memory"]["workingSetBytes"].as_u64() > Some(0)
            && agent["cpu"]["usageCoreNanoSeconds"].as_u64() > Some(0),
        "{POD} in /stats/summary: {entry}"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}
