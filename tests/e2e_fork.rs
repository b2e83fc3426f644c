//! Forks of one source share one fork snapshot (C9), end to end: several sub-agents that fork
//! the same main VM at once all come up from a single `snapshot save` of `fork-<main>`, with
//! no failed bring-up on the way (no `CreateBringUpFailed`, no retry).

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, metric_series, pod_manifest, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(90);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const SUBAGENTS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_agents_forking_one_main_at_once_share_one_save() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let main = pod_manifest(
        NS,
        "main",
        NODE,
        json!({"cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-main",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": IMAGE}),
    )?;
    create_pod(&pods, &main).await?;
    wait_ready(&pods, "main", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;

    // All sub-agents at once: each misses fork-vk-default-main when it looks.
    let names: Vec<String> = (1..=SUBAGENTS).map(|i| format!("sub-{i}")).collect();
    let creates = names.iter().map(|name| {
        let pods = pods.clone();
        let pod = pod_manifest(
            NS,
            name,
            NODE,
            json!({"cocoonset.cocoonstack.io/managed": "true",
                "vm.cocoonstack.io/name": format!("vk-default-{name}"),
                "vm.cocoonstack.io/fork-from": "vk-default-main",
                "cocoonset.cocoonstack.io/image": IMAGE}),
        );
        async move { create_pod(&pods, &pod?).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    let mut ids = Vec::new();
    for name in &names {
        let p = wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(80))?;
        ids.push(annotation(&p, "vm.cocoonstack.io/id").context("id")?);
    }
    ids.sort();
    ids.dedup();
    ensure!(ids.len() == SUBAGENTS, "sub-agents share VMs: {ids:?}");

    // No bring-up failed on the way.
    let failed: Vec<(String, f64)> = metric_series(metrics_port, "cocoon_vk_pod_lifecycle_total")
        .await?
        .into_iter()
        .filter(|(l, v)| l.contains("result=\"failed\"") && *v > 0.0)
        .collect();
    ensure!(failed.is_empty(), "failed bring-ups: {failed:?}");
    let events: Api<Event> = Api::namespaced(tb.client()?, NS);
    let warnings: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        // Only the pods' own: the API server reports its own repairs as Warnings too. Nor the
        // scheduler's: a pod created before the node registers waits as FailedScheduling.
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.involved_object.kind.as_deref() == Some("Pod")
                && !daemon::from_the_scheduler(e)
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect();
    ensure!(warnings.is_empty(), "Warning events: {warnings:?}");

    // One save of the fork snapshot, by the journal's record of what the daemon ran.
    drop(d);
    let raw = std::fs::read(&journal)?;
    let lines = vk_cocoon::journal::frame::lines_of_file(&raw)
        .map_err(|(_, e)| anyhow::anyhow!("{e:?}"))?;
    let text = String::from_utf8(lines)?;
    let saves = text
        .lines()
        .filter(|l| l.contains(r#""verb":"snapshot_save","name":"fork-vk-default-main""#))
        .count();
    ensure!(saves == 1, "fork-vk-default-main saved {saves} times");
    daemon::replay_verify(&journal)?;
    Ok(())
}
