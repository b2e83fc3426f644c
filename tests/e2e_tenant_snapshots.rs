//! Snapshots kept apart between tenants (T5–T8), end to end: two nodes, each with its own
//! cocoon host, one registry, two namespaces (team-a the victim, team-b the attacker). Every
//! way a pod of team-b could reach team-a's VM state through a snapshot is tried and refused
//! with a clear reason on the attacker's pod (a Warning Event and the lifecycle message):
//! cloning team-a's `<vm>:hibernate`, `<vm>:latest`, local `<vm>` or `fork-<vm>`; taking the
//! victim's VM name on the other node and hibernating over its `:hibernate` tag; being handed
//! its hibernated state as evidence; naming a VM `fork-<victim>` to take over its fork
//! snapshot. Afterwards the victim's tags keep their digests, its local snapshots their ids,
//! and it wakes Ready with its guest's state intact. One testbed serves every attack.

use e2e::daemon;
use e2e::daemon::{annotate, lifecycle_is};

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, pod_manifest, until, wait_ready, Daemon, DaemonOptions};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::Api;
use serde_json::json;
use vk_cocoon::registry::Registry;

#[path = "support/tenant.rs"]
mod tenant;
use tenant::{delete_and_wait, sim_run, tag};

const LIMIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const VICTIM_VM: &str = "vk-team-a-victim";
const GONE_VM: &str = "vk-team-a-gone";
const FORK: &str = "fork-vk-team-a-victim";
const STATE: &str = "vm.cocoonstack.io/lifecycle-state";
const MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";

/// A managed pod's annotations: vm name `vm`, plus `extra`.
fn managed(ns: &str, name: &str, node: &str, vm: &str, extra: serde_json::Value) -> Result<Pod> {
    let mut a = json!({
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": vm,
        "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": IMAGE,
    });
    a.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    pod_manifest(ns, name, node, a)
}

/// A team-b pod that clones `image`.
fn cloner(name: &str, node: &str, image: &str) -> Result<Pod> {
    let extra = json!({
        "cocoonset.cocoonstack.io/mode": "clone",
        "cocoonset.cocoonstack.io/image": image,
    });
    managed("team-b", name, node, &format!("vk-team-b-{name}"), extra)
}

/// The snapshot `name` on `sim`: its id and description.
fn snapshot(sim: &CocoonSim, name: &str) -> Result<(String, String)> {
    let out = sim.run(&["snapshot", "inspect", "--", name])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("snapshot inspect")?;
    let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    Ok((field("id"), field("description")))
}
/// The attack on pod `name` of team-b was refused saying `why`: a Warning Event of reason
/// `reason` and the lifecycle message both carry it, and the pod was given no VM.
async fn refused(b: &Api<Pod>, name: &str, reason: &str, why: &str, logs: &Daemon) -> Result<()> {
    let events: Api<Event> = Api::namespaced(b.clone().into_client(), "team-b");
    let event = daemon::warning(&events, name, Some(reason), LIMIT)
        .await
        .with_context(|| logs.proc.log_tail(60))?;
    ensure!(event.contains(why), "{name}: the Warning says {event:?}");
    let p = until(&format!("{name}: lifecycle message"), LIMIT, || async {
        let p = b.get(name).await?;
        let said = annotation(&p, MESSAGE).is_some_and(|m| m.contains(why));
        Ok(said.then_some(p))
    })
    .await
    .with_context(|| logs.proc.log_tail(60))?;
    ensure!(
        annotation(&p, STATE).as_deref() == Some("failed"),
        "{name}: lifecycle {:?}",
        annotation(&p, STATE)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespaces_snapshots_are_never_cloned_restored_or_replaced() -> Result<()> {
    let mut tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    tb.add_host("sim-b")?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();
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
    let journal_a = tb.run_dir().join("journal-a").join("events.journal");
    let journal_b = tb.run_dir().join("journal-b").join("events.journal");
    let da = daemon::start(
        &tb,
        &node_opts("node-a", "127.0.0.2", None),
        &journal_a,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let db = daemon::start(
        &tb,
        &node_opts("node-b", "127.0.0.3", Some("sim-b")),
        &journal_b,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");
    let sim_a = tb.host(None)?;
    let reg =
        Registry::from_config(&format!("{addr}/{PREFIX}")).map_err(|e| anyhow::anyhow!("{e}"))?;

    // team-a: the victim with a secret in its guest, a sub-agent forked from it (leaving the
    // fork snapshot), and a pod deleted on node-a (leaving `<vm>:latest`).
    create_pod(
        &a,
        &managed("team-a", "victim", "node-a", VICTIM_VM, json!({}))?,
    )
    .await?;
    let p = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| da.proc.log_tail(60))?;
    let id = annotation(&p, "vm.cocoonstack.io/id").context("victim id")?;
    sim_run(
        sim_a,
        &[
            "vm",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo victim-secret > marker",
        ],
    )?;
    let fork =
        json!({"vm.cocoonstack.io/fork-from": VICTIM_VM, "cocoonset.cocoonstack.io/mode": "clone"});
    create_pod(
        &a,
        &managed("team-a", "sub", "node-a", "vk-team-a-sub", fork)?,
    )
    .await?;
    create_pod(
        &a,
        &managed("team-a", "gone", "node-a", GONE_VM, json!({}))?,
    )
    .await?;
    for name in ["sub", "gone"] {
        wait_ready(&a, name, LIMIT)
            .await
            .with_context(|| da.proc.log_tail(60))?;
    }
    delete_and_wait(&a, "gone", LIMIT, None).await?;
    let (gone_digest, gone_owner) = tag(&reg, GONE_VM, "latest").await?;
    ensure!(
        e2e::daemon::owned_by(gone_owner.as_deref(), "team-a/gone"),
        "{GONE_VM}:latest owner {gone_owner:?}"
    );

    // team-b takes the victim's VM name on node-b before the victim hibernates (names are
    // global; each node only knows its own pods).
    let never = json!({"cocoonset.cocoonstack.io/snapshot-policy": "never"});
    create_pod(
        &b,
        &managed("team-b", "squatter", "node-b", VICTIM_VM, never)?,
    )
    .await?;
    wait_ready(&b, "squatter", LIMIT)
        .await
        .with_context(|| db.proc.log_tail(60))?;

    annotate(&a, "victim", "vm.cocoonstack.io/hibernate", Some("true")).await?;
    lifecycle_is(&a, "victim", "hibernated")
        .await
        .with_context(|| da.proc.log_tail(60))?;
    let (hib_digest, hib_owner) = tag(&reg, VICTIM_VM, "hibernate").await?;
    ensure!(
        e2e::daemon::owned_by(hib_owner.as_deref(), "team-a/victim"),
        "{VICTIM_VM}:hibernate owner {hib_owner:?}"
    );
    let local = snapshot(sim_a, VICTIM_VM)?;
    let forked = snapshot(sim_a, FORK)?;
    ensure!(
        e2e::daemon::owned_by(Some(&local.1), "team-a/victim")
            && e2e::daemon::owned_by(Some(&forked.1), "team-a/sub"),
        "the victim's local snapshots carry {local:?} and {forked:?}"
    );

    // T7: hibernating the squatter would replace the victim's `:hibernate`.
    annotate(&b, "squatter", "vm.cocoonstack.io/hibernate", Some("true")).await?;
    let taken = "belongs to another namespace";
    refused(&b, "squatter", "HibernatePushFailed", taken, &db).await?;
    delete_and_wait(&b, "squatter", LIMIT, None).await?;

    // T6: a newcomer that names the victim's VM is not handed its hibernated state.
    create_pod(
        &b,
        &managed("team-b", "newcomer", "node-b", VICTIM_VM, json!({}))?,
    )
    .await?;
    refused(&b, "newcomer", "HibernateEvidenceFailed", taken, &db).await?;

    // T6, T7: clones of each of team-a's snapshots: the registry's tags (node-b), the local
    // snapshot and the fork snapshot (node-a).
    let tries = [
        (
            "clone-hibernate",
            "node-b",
            format!("{VICTIM_VM}:hibernate"),
        ),
        ("clone-latest", "node-b", format!("{GONE_VM}:latest")),
        ("clone-local", "node-a", VICTIM_VM.to_string()),
        ("clone-fork", "node-a", FORK.to_string()),
    ];
    for (name, node, image) in &tries {
        create_pod(&b, &cloner(name, node, image)?).await?;
    }
    for (name, node, _) in &tries {
        let logs = if *node == "node-a" { &da } else { &db };
        refused(&b, name, "CreateBringUpFailed", taken, logs).await?;
    }

    // T5: a VM named like the victim's fork snapshot.
    create_pod(&b, &managed("team-b", "forker", "node-a", FORK, json!({}))?).await?;
    refused(
        &b,
        "forker",
        "CreateBringUpFailed",
        "kept for fork snapshots",
        &da,
    )
    .await?;
    for name in ["newcomer", "forker"]
        .into_iter()
        .chain(tries.iter().map(|t| t.0))
    {
        let p = b.get(name).await?;
        ensure!(
            annotation(&p, "vm.cocoonstack.io/id").is_none(),
            "{name} was given a VM"
        );
        delete_and_wait(&b, name, LIMIT, None).await?;
    }

    // The victim's tags, local snapshots and guest are as they were.
    ensure!(
        tag(&reg, VICTIM_VM, "hibernate").await?.0 == hib_digest,
        "{VICTIM_VM}:hibernate was replaced"
    );
    ensure!(
        tag(&reg, GONE_VM, "latest").await?.0 == gone_digest,
        "{GONE_VM}:latest was replaced"
    );
    ensure!(
        snapshot(sim_a, VICTIM_VM)? == local,
        "the local {VICTIM_VM} changed"
    );
    ensure!(snapshot(sim_a, FORK)? == forked, "the local {FORK} changed");
    annotate(&a, "victim", "vm.cocoonstack.io/hibernate", None).await?;
    let woken = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| da.proc.log_tail(60))?;
    let id = annotation(&woken, "vm.cocoonstack.io/id").context("woken id")?;
    let text = sim_run(sim_a, &["vm", "exec", &id, "--", "cat", "marker"])?;
    ensure!(
        text.trim() == "victim-secret",
        "the victim woke with {text:?}"
    );
    lifecycle_is(&a, "victim", "ready").await?;

    drop(da);
    drop(db);
    daemon::replay_verify(&journal_a)?;
    daemon::replay_verify(&journal_b)?;
    Ok(())
}
