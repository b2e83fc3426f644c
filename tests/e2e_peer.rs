//! Peer restore between two nodes on one testbed (U6, K7, B10): two daemons, each with its own
//! cocoon host (simulator root) and loopback address, one registry. A pod hibernates on
//! node-a, which keeps its local snapshot; the pod is deleted there (the snapshot kept) and
//! recreated on node-b with the restore marker. node-b reads `<vm>:hibernate`, sees node-a
//! pushed it, copies node-a's files over the peer API into its staging directory and clones
//! them: the guest's marker file is intact, no registry pull ran, and the staging directory is
//! empty again. With node-a's daemon gone, a second restore falls through to the registry.

use e2e::daemon;
use e2e::daemon::lifecycle_is;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, metric, pod_manifest, until, wait_ready, DaemonOptions};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

const NS: &str = "default";
const LIMIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";

/// `cocoon <args>` on one host, guests' commands run on the host (`vm exec`).
fn sim_run(sim: &CocoonSim, args: &[&str]) -> Result<String> {
    let out = sim
        .command()
        .env("COCOON_SIM_EXEC", "host")
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "cocoon {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn managed(node: &str, name: &str, extra: serde_json::Value) -> Result<Pod> {
    let mut a = json!({
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": format!("vk-default-{name}"),
        "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": IMAGE,
    });
    a.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    pod_manifest(NS, name, node, a)
}

/// Entries of a directory (none when it does not exist).
fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `text` into the guest of pod `name` and hibernates the pod on its node; answers the
/// tag's snapshot id once the pod reports `hibernated`.
async fn hibernate_with_marker(
    pods: &Api<Pod>,
    sim: &CocoonSim,
    name: &str,
    text: &str,
) -> Result<()> {
    let p = wait_ready(pods, name, LIMIT).await?;
    let id = annotation(&p, "vm.cocoonstack.io/id").context("id")?;
    sim_run(
        sim,
        &[
            "vm",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            &format!("echo {text} > marker"),
        ],
    )?;
    let patch = json!({"metadata": {"annotations": {"vm.cocoonstack.io/hibernate": "true"}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    lifecycle_is(pods, name, "hibernated").await?;
    Ok(())
}

async fn delete_and_wait(pods: &Api<Pod>, name: &str) -> Result<()> {
    pods.delete(name, &DeleteParams::default()).await?;
    until(&format!("{name} deleted"), LIMIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_vm_wakes_on_another_node_from_its_peer() -> Result<()> {
    let mut tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    tb.add_host("sim-b")?;
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();
    // Both nodes serve the peer API on one port, each on its own loopback address: the client
    // dials the other node's InternalIP at its own port.
    let peer_port = e2e::ports::free_port()?;
    let node_opts = |node: &str, ip: &str, host: Option<&str>| DaemonOptions {
        node: node.into(),
        env: vec![
            ("OCI_REGISTRY".into(), format!("{addr}/{PREFIX}")),
            ("COCOON_SIM_EXEC".into(), "host".into()),
        ],
        host: host.map(str::to_string),
        node_ip: Some(ip.into()),
        peer_addr: Some(format!("{ip}:{peer_port}")),
        ..DaemonOptions::default()
    };
    // B10: a staging entry a killed process left on node-b is gone once it starts.
    let staging_b = tb.host(Some("sim-b"))?.root.join("vk-staging");
    std::fs::create_dir_all(staging_b.join("peer-leftover"))?;
    std::fs::write(staging_b.join("peer-leftover").join("disk.raw"), b"stale")?;

    let metrics_a = e2e::ports::free_port()?;
    let metrics_b = e2e::ports::free_port()?;
    let a = daemon::start(
        &tb,
        &node_opts("node-a", "127.0.0.2", None),
        &tb.run_dir().join("journal-a").join("events.journal"),
        metrics_a,
        e2e::ports::free_port()?,
    )?;
    let journal_b = tb.run_dir().join("journal-b").join("events.journal");
    let b = daemon::start(
        &tb,
        &node_opts("node-b", "127.0.0.3", Some("sim-b")),
        &journal_b,
        metrics_b,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let sim_a = tb.host(None)?;
    let sim_b = tb.host(Some("sim-b"))?;

    // Two pods on node-a, hibernated there; each keeps its local snapshot when deleted.
    for name in ["roamer", "fallback"] {
        let keep = json!({"vm.cocoonstack.io/keep-snapshot-on-delete": "true"});
        create_pod(&pods, &managed("node-a", name, keep)?).await?;
    }
    for (name, text) in [("roamer", "hello-peer"), ("fallback", "hello-registry")] {
        hibernate_with_marker(&pods, sim_a, name, text)
            .await
            .with_context(|| a.proc.log_tail(60))?;
        delete_and_wait(&pods, name).await?;
    }
    ensure!(
        entries(&staging_b).is_empty(),
        "node-b's stale staging entries survived its start: {:?}",
        entries(&staging_b)
    );

    // The first is restored on node-b from node-a's copy.
    let marker = json!({"vm.cocoonstack.io/restore-from-hibernate": "true"});
    create_pod(&pods, &managed("node-b", "roamer", marker.clone())?).await?;
    let woken = wait_ready(&pods, "roamer", LIMIT)
        .await
        .with_context(|| b.proc.log_tail(80))?;
    let id = annotation(&woken, "vm.cocoonstack.io/id").context("id on node-b")?;
    let text = sim_run(sim_b, &["vm", "exec", &id, "--", "cat", "marker"])?;
    ensure!(
        text.trim() == "hello-peer",
        "marker after the peer restore: {text:?}"
    );
    ensure!(
        metric(metrics_b, "cocoon_vk_snapshot_peer_restore_total").await? == 1.0,
        "node-b counted no peer restore"
    );
    let series = daemon::metric_series(metrics_b, "cocoon_vk_snapshot_peer_restore_total").await?;
    ensure!(
        series
            .iter()
            .any(|(l, v)| l == "result=\"ok\"" && *v == 1.0),
        "peer restore series: {series:?}"
    );
    ensure!(
        metric(metrics_b, "cocoon_vk_snapshot_pull_duration_seconds_count").await? == 0.0,
        "node-b pulled from the registry although the peer had the snapshot"
    );
    until("node-b's staging directory emptied", LIMIT, || async {
        Ok(entries(&staging_b)
            .iter()
            .all(|e| !e.starts_with("peer-"))
            .then_some(()))
    })
    .await?;

    // node-a is gone: the second restore falls through to the registry.
    drop(a);
    create_pod(&pods, &managed("node-b", "fallback", marker)?).await?;
    let woken = wait_ready(&pods, "fallback", LIMIT)
        .await
        .with_context(|| b.proc.log_tail(80))?;
    let id = annotation(&woken, "vm.cocoonstack.io/id").context("id on node-b")?;
    let text = sim_run(sim_b, &["vm", "exec", &id, "--", "cat", "marker"])?;
    ensure!(
        text.trim() == "hello-registry",
        "marker after the registry restore: {text:?}"
    );
    let series = daemon::metric_series(metrics_b, "cocoon_vk_snapshot_peer_restore_total").await?;
    ensure!(
        series
            .iter()
            .any(|(l, v)| l == "result=\"failed\"" && *v == 1.0),
        "peer restore series after node-a left: {series:?}"
    );
    ensure!(
        metric(metrics_b, "cocoon_vk_snapshot_pull_duration_seconds_count").await? == 1.0,
        "node-b did not pull the second snapshot from the registry"
    );

    drop(b);
    daemon::replay_verify(&journal_b)?;
    Ok(())
}
