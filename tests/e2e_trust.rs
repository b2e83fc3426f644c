//! Trust between pods on one node (T1, T2), end to end: a pod of another namespace that names
//! a running pod's VM, or forks it, gets a clear failure; the other pod's VM, its local
//! snapshot and its fork snapshot are untouched, also after the intruder is deleted.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, pod_manifest, until, wait_ready};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";

fn snapshots(tb: &Testbed) -> Result<Vec<String>> {
    let out = tb.host(None)?.run(&["snapshot", "list", "-o", "json"])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or(json!([]));
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

async fn warning_of(events: &Api<Event>, pod: &str) -> Result<String> {
    until(&format!("a Warning for {pod}"), LIMIT, || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            // The daemon's, not the scheduler's (FailedScheduling while the node registers).
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.involved_object.name.as_deref() == Some(pod)
                    && !daemon::from_the_scheduler(e)
            })
            .and_then(|e| e.message))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cannot_take_or_copy_another_namespaces_vm() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let (d, journal) = daemon::start_default(&tb)?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");
    let managed = |extra: serde_json::Value| {
        let mut m = json!({"cocoonset.cocoonstack.io/managed": "true", "cocoonset.cocoonstack.io/image": IMAGE});
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        m
    };
    // The victim, and a snapshot of its VM of the kind a delete or a hibernate leaves.
    let victim = pod_manifest(
        "team-a",
        "victim",
        NODE,
        managed(
            json!({"vm.cocoonstack.io/name": "shared", "cocoonset.cocoonstack.io/mode": "run"}),
        ),
    )?;
    create_pod(&a, &victim).await?;
    let ready = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let id = annotation(&ready, "vm.cocoonstack.io/id").context("victim id")?;
    let sim = tb.host(None)?;
    sim.run(&["snapshot", "save", "--name", "shared", &id])?;
    sim.run(&["snapshot", "save", "--name", "fork-shared", &id])?;

    // Another namespace names the VM, and forks it.
    let events: Api<Event> = Api::namespaced(tb.client()?, "team-b");
    let intruder = pod_manifest(
        "team-b",
        "intruder",
        NODE,
        managed(
            json!({"vm.cocoonstack.io/name": "shared", "cocoonset.cocoonstack.io/mode": "run"}),
        ),
    )?;
    let copier = pod_manifest(
        "team-b",
        "copier",
        NODE,
        managed(json!({"vm.cocoonstack.io/name": "copy", "vm.cocoonstack.io/fork-from": "shared"})),
    )?;
    create_pod(&b, &intruder).await?;
    create_pod(&b, &copier).await?;
    let why = warning_of(&events, "intruder").await?;
    ensure!(
        why.contains("belongs to pod team-a/victim"),
        "intruder: {why}"
    );
    let why = warning_of(&events, "copier").await?;
    ensure!(why.contains("another namespace"), "copier: {why}");
    for name in ["intruder", "copier"] {
        let p = b.get(name).await?;
        ensure!(
            annotation(&p, "vm.cocoonstack.io/id").is_none(),
            "{name} was given a VM"
        );
    }

    // Deleting them takes nothing of the victim's with them.
    for name in ["intruder", "copier"] {
        b.delete(name, &DeleteParams::default()).await?;
    }
    until("the intruders gone", LIMIT, || async {
        let gone = b.get_opt("intruder").await?.is_none() && b.get_opt("copier").await?.is_none();
        Ok(gone.then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        tb.host(None)?.vm_ids().contains(&id),
        "the victim's VM is gone"
    );
    let snaps = snapshots(&tb)?;
    for s in ["shared", "fork-shared"] {
        ensure!(
            snaps.iter().any(|n| n == s),
            "snapshot {s} is gone: {snaps:?}"
        );
    }
    let still = a.get("victim").await?;
    ensure!(
        annotation(&still, "vm.cocoonstack.io/id").as_deref() == Some(id.as_str()),
        "the victim lost its VM"
    );
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
