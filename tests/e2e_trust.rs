//! Trust between pods on one node (T1, T2, T11), end to end: a pod of another namespace that names
//! a running pod's VM, or forks it, gets a clear failure; the other pod's VM, its local
//! snapshot and its fork snapshot are untouched, also after the intruder is deleted.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, pod_manifest, until, wait_ready};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::json;

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";

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

/// The daemon's Warning for `pod`.
async fn warning_of(events: &Api<Event>, pod: &str) -> Result<String> {
    daemon::warning(events, pod, None, LIMIT).await
}

/// Annotations of a managed pod with `extra` added.
fn managed(extra: serde_json::Value) -> serde_json::Value {
    let mut m = json!({"cocoonset.cocoonstack.io/managed": "true", "cocoonset.cocoonstack.io/image": IMAGE});
    m.as_object_mut()
        .expect("an object")
        .extend(extra.as_object().expect("an object").clone());
    m
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
        why.contains("belongs to a pod of another namespace"),
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

/// T11, the restart steal: a pod of team-b names team-a's VM name before team-a's pod exists
/// and is refused (its fork source names nothing), so it holds nothing. After a restart, where
/// it is the older pod, it still gets nothing: the holder record gives the VM back to the
/// victim, and deleting the attacker's pod leaves the victim's VM running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_hands_a_vm_back_to_its_holder_not_an_older_pod_of_another_namespace(
) -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let (d, journal) = daemon::start_default(&tb)?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");
    let early = pod_manifest(
        "team-b",
        "early",
        NODE,
        managed(
            json!({"vm.cocoonstack.io/name": "prized", "vm.cocoonstack.io/fork-from": "nothing"}),
        ),
    )?;
    create_pod(&b, &early).await?;
    let events: Api<Event> = Api::namespaced(tb.client()?, "team-b");
    let why = warning_of(&events, "early").await?;
    ensure!(why.contains("fork-from"), "early: {why}");
    // A creation time has whole seconds: the victim must be the younger pod.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let victim = pod_manifest(
        "team-a",
        "victim",
        NODE,
        managed(
            json!({"vm.cocoonstack.io/name": "prized", "cocoonset.cocoonstack.io/mode": "run"}),
        ),
    )?;
    create_pod(&a, &victim).await?;
    let ready = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let id = annotation(&ready, "vm.cocoonstack.io/id").context("victim id")?;

    // The daemon restarts (an upgrade, a crash) with its journal.
    // Both processes log to one file: the restarted one has registered once a line more says so.
    let registered =
        |d: &daemon::Daemon| d.proc.log_tail(100_000).matches("node registered").count();
    let before = registered(&d);
    drop(d);
    let d = daemon::start(
        &tb,
        &daemon::DaemonOptions::default(),
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    // The node registers only after the startup claim has handed out every VM (N13).
    until("the restarted daemon registered", LIMIT, || async {
        Ok((registered(&d) > before).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let message = until("the attacker refused after the restart", LIMIT, || async {
        Ok(annotation(&b.get("early").await?, LIFECYCLE_MESSAGE)
            .filter(|m| m.contains("another namespace")))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        !message.contains("team-a"),
        "the refusal names team-a: {message}"
    );
    let still = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        annotation(&still, "vm.cocoonstack.io/id").as_deref() == Some(id.as_str()),
        "the victim lost its VM {id}: {:?}",
        annotation(&still, "vm.cocoonstack.io/id")
    );
    ensure!(
        annotation(&b.get("early").await?, "vm.cocoonstack.io/id").is_none(),
        "the attacker was given a VM"
    );

    // Deleting the attacker's pod takes nothing of the victim's.
    b.delete("early", &DeleteParams::default()).await?;
    until("the attacker gone", LIMIT, || async {
        Ok(b.get_opt("early").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        tb.host(None)?.vm_ids().contains(&id),
        "the victim's VM is gone: {}",
        d.proc.log_tail(80)
    );
    ensure!(
        !snapshots(&tb)?.iter().any(|n| n == "prized"),
        "the attacker's delete saved the victim's VM"
    );
    let still = wait_ready(&a, "victim", LIMIT).await?;
    ensure!(
        annotation(&still, "vm.cocoonstack.io/id").as_deref() == Some(id.as_str()),
        "the victim lost its VM after the attacker's delete"
    );
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
