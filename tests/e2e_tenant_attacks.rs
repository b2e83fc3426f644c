//! Attacks by one tenant on another's VM through the node itself, end to end: namespace
//! `team-b` (the attacker) against `team-a` (the victim), on one node with the simulator.
//!
//! - D9, T7, T8: team-b squats the victim's registry tag `<vm>:latest` (and the local `<vm>`)
//!   before the victim exists. When the victim is deleted its delete-time snapshot is refused,
//!   and the daemon keeps the VM's state on the node as `kept-<vm>-<uid>` before removing the
//!   VM: the squat costs the victim its tag, never its last copy.
//! - B2: team-b binds a pod to the node that asks for a CPU class the node lacks. The daemon
//!   restarts with that pod on its node: it still starts, registers the node and hands the
//!   victim its VM back, and only the attacker's pod fails.

use e2e::daemon;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, pod_manifest, until, wait_ready, Daemon, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::Api;
use serde_json::json;

#[path = "support/tenant.rs"]
mod tenant;
use tenant::{delete_and_wait, sim_run, snapshots, tag};

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(45);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const ID: &str = "vm.cocoonstack.io/id";
const CLASS: &str = "cocoonstack.io/snapshot-cpu-class";

/// A managed run-mode pod `name` of `ns` on the node, its VM named `vm`.
fn run_pod(ns: &str, name: &str, vm: &str) -> Result<Pod> {
    pod_manifest(
        ns,
        name,
        NODE,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": vm,
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": IMAGE,
        }),
    )
}
/// The message of the daemon's Warning `reason` on pod `name` of `ns`.
async fn warning(tb: &Testbed, ns: &str, name: &str, reason: &str, d: &Daemon) -> Result<String> {
    let events: Api<Event> = Api::namespaced(tb.client()?, ns);
    daemon::warning(&events, name, Some(reason), LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))
}

/// D9, T7, T8: team-b squats the name the victim's VM will have. team-b's pod runs a VM of that
/// name and is deleted, so its delete-time snapshot leaves the local `<vm>` and the tag
/// `<vm>:latest`, both owned by team-b. The victim then runs under the name, writes a marker
/// into its guest and is deleted: its delete-time snapshot is refused (another namespace's),
/// team-b's tag is untouched, and the victim's state is kept on the node as a `kept-` snapshot
/// carrying team-a's owner record and the marker, counted once, with a Warning that does not
/// name team-b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatted_tag_never_costs_the_victim_its_last_copy() -> Result<()> {
    let started = Instant::now();
    const VM: &str = "vk-team-a-victim";
    let tenant::Node {
        tb,
        d,
        journal,
        metrics_port,
        reg,
        a,
        b,
    } = tenant::one_node(PREFIX).await?;
    let sim = tb.host(None)?;

    e2e::step!("team-b squats VM name {VM}: runs a pod under it and deletes it");
    create_pod(&b, &run_pod("team-b", "squat", VM)?).await?;
    wait_ready(&b, "squat", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    delete_and_wait(&b, "squat", LIMIT, Some(&d)).await?;
    let (squat_digest, squat_owner) = tag(&reg, VM, "latest").await?;
    ensure!(
        daemon::owned_by(squat_owner.as_deref(), "team-b/squat"),
        "{VM}:latest owner {squat_owner:?}"
    );
    e2e::step!("{VM}:latest is team-b's: {squat_digest}");

    e2e::step!("team-a's victim runs under {VM} and writes a marker into its guest");
    create_pod(&a, &run_pod("team-a", "victim", VM)?).await?;
    let p = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&p, ID).context("victim id")?;
    let uid = p.metadata.uid.clone().context("victim uid")?;
    sim_run(
        sim,
        &[
            "vm",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo victim-state > marker",
        ],
    )?;

    e2e::step!("the victim is deleted: its delete-time snapshot would go over team-b's");
    delete_and_wait(&a, "victim", LIMIT, Some(&d)).await?;
    let said = warning(&tb, "team-a", "victim", "DeleteSnapshotKept", &d).await?;
    e2e::step!("Warning DeleteSnapshotKept: {said}");
    ensure!(
        !said.contains("team-b"),
        "the Warning names the attacker's namespace: {said}"
    );
    let kept = said
        .split_whitespace()
        .map(|w| w.trim_end_matches([',', '.', ';', ':']))
        .find(|w| w.starts_with("kept-"))
        .with_context(|| format!("the Warning names no kept- snapshot: {said}"))?
        .to_string();
    let uid8: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    ensure!(
        kept == format!("kept-{VM}-{uid8}"),
        "kept snapshot {kept:?}, not named for {VM} and the victim's UID {uid}"
    );
    ensure!(
        !sim.vm_ids().contains(&id),
        "the victim's VM {id} is still there after its pod is gone"
    );

    e2e::step!("team-b's tag is untouched");
    let (digest, owner) = tag(&reg, VM, "latest").await?;
    ensure!(
        digest == squat_digest && daemon::owned_by(owner.as_deref(), "team-b/squat"),
        "{VM}:latest was replaced: {digest} owned by {owner:?}"
    );

    e2e::step!("the victim's state is on the node as {kept}, owned by team-a, counted once");
    let snaps = snapshots(sim)?;
    let description = snaps
        .iter()
        .find(|(name, _)| *name == kept)
        .map(|(_, desc)| desc.clone())
        .with_context(|| format!("no local snapshot {kept}: {snaps:?}"))?;
    ensure!(
        daemon::owned_by(Some(&description), "team-a/victim"),
        "{kept} carries {description:?}"
    );
    let counted = daemon::metric(metrics_port, "cocoon_vk_snapshot_kept_total").await?;
    ensure!(counted == 1.0, "cocoon_vk_snapshot_kept_total is {counted}");

    e2e::step!("a VM cloned from {kept} holds the victim's marker");
    let out = sim_run(
        sim,
        &["vm", "clone", "--output", "json", "--name", "proof", &kept],
    )?;
    let proof: serde_json::Value = serde_json::from_str(out.trim()).context("vm clone")?;
    let proof_id = proof["id"].as_str().context("clone id")?.to_string();
    let text = sim_run(sim, &["vm", "exec", &proof_id, "--", "cat", "marker"]);
    sim_run(sim, &["vm", "rm", "--force", &proof_id])?;
    let text = text?;
    ensure!(
        text.trim() == "victim-state",
        "the kept snapshot holds {text:?}"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// B2: a node with CPU class `icelake` runs team-a's victim. team-b binds a pod to the node
/// (`spec.nodeName`, past the scheduler) that asks for class `sapphire`. The daemon restarts
/// with its journal and that pod on its node: it stays up and registers the node again, the
/// victim keeps its VM and stays Ready, and only team-b's pod fails (`ProviderFailed`, saying
/// which class it asked for), with no VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_node_cannot_serve_does_not_keep_the_node_from_starting() -> Result<()> {
    let started = Instant::now();
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let opts = DaemonOptions {
        env: vec![("VK_SNAPSHOT_CPU_CLASS".into(), "icelake".into())],
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");

    e2e::step!("team-a's victim runs on {NODE} (cpu class icelake)");
    let mut victim = run_pod("team-a", "victim", "vk-team-a-victim")?;
    let spec = victim.spec.as_mut().context("victim spec")?;
    spec.node_selector
        .get_or_insert_with(Default::default)
        .insert(CLASS.into(), "icelake".into());
    create_pod(&a, &victim).await?;
    let p = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&p, ID).context("victim id")?;

    e2e::step!("team-b binds a pod asking for cpu class sapphire to {NODE}");
    let mut attacker = run_pod("team-b", "wrong-class", "vk-team-b-wrong-class")?;
    let spec = attacker.spec.as_mut().context("attacker spec")?;
    spec.node_name = Some(NODE.into());
    spec.node_selector
        .get_or_insert_with(Default::default)
        .insert(CLASS.into(), "sapphire".into());
    create_pod(&b, &attacker).await?;
    let failed = |p: &Pod| {
        let s = p.status.as_ref()?;
        let message = s.message.clone().unwrap_or_default();
        (s.reason.as_deref() == Some("ProviderFailed") && message.contains("cpu class"))
            .then_some(message)
    };
    let message = until("team-b's pod refused", LIMIT, || async {
        Ok(failed(&b.get("wrong-class").await?))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    e2e::step!("refused while running: {message}");

    e2e::step!("the daemon restarts with team-b's pod bound to its node");
    // Both processes log to one file: the restarted one has registered once a line more says so.
    let registered = |d: &Daemon| d.proc.log_tail(100_000).matches("node registered").count();
    let before = registered(&d);
    drop(d);
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    until("the restarted daemon registered", LIMIT, || async {
        Ok((registered(&d) > before).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    // The restarted daemon refused the pod itself (C1's counter), not only the first one.
    let series = until("the restarted daemon's refusal counted", LIMIT, || async {
        let series = daemon::metric_series(metrics_port, "cocoon_vk_pod_lifecycle_total").await?;
        let refused = series
            .iter()
            .any(|(labels, v)| labels.contains("snapshot_cpu_class_mismatch") && *v >= 1.0);
        Ok(refused.then_some(series))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    e2e::step!(
        "the restarted daemon registered the node and refused team-b's pod: {:?}",
        series
            .iter()
            .filter(|(l, _)| l.contains("snapshot_cpu_class_mismatch"))
            .collect::<Vec<_>>()
    );

    e2e::step!("the victim keeps its VM {id} and stays Ready");
    let still = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        annotation(&still, ID).as_deref() == Some(id.as_str()),
        "the victim lost its VM {id}: {:?}",
        annotation(&still, ID)
    );
    ensure!(
        tb.host(None)?.vm_ids().contains(&id),
        "the victim's VM {id} is gone"
    );
    let p = b.get("wrong-class").await?;
    let message = failed(&p).with_context(|| format!("team-b's pod shows {:?}", p.status))?;
    ensure!(
        message.contains("sapphire") && !message.contains("team-a"),
        "team-b's pod says {message:?}"
    );
    ensure!(
        annotation(&p, ID).is_none(),
        "team-b's pod was given a VM: {:?}",
        annotation(&p, ID)
    );
    ensure!(
        d.proc.running(),
        "the daemon exited: {}",
        d.proc.log_tail(60)
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
