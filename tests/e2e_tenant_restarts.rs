//! Attacks by one tenant on another's VM across a daemon restart and through annotations
//! changed after a pod is made, end to end: namespace `team-b` (the attacker) against `team-a`
//! (the victim), on one node with the simulator.
//!
//! - T1, T11, D2: team-b's macOS pods name team-a's guest. Refused while the daemon runs, they
//!   get nothing from a restart on the same journal, and deleting them, with the daemon up or
//!   while it is down, leaves the guest running.
//! - T1, T6, T7, U2, D4: team-b flips annotations on its pods after they are made:
//!   `hibernate=true` on a pod refused the victim's VM name, and the victim's VM name on pods
//!   that run their own VMs, then are deleted or hibernated. The victim keeps its VM, its name's
//!   snapshots and tags stay its own, and after its owner hibernates, deletes and remakes it, or
//!   only hibernates it, it wakes with its data.

use e2e::daemon;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotate, annotation, create_pod, is_ready, lifecycle_is, pod_manifest, until, wait_ready,
    Daemon, DaemonOptions,
};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};
use vk_cocoon::registry::Registry;

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const ID: &str = "vm.cocoonstack.io/id";
const NAME: &str = "vm.cocoonstack.io/name";
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
const LIFECYCLE: &str = "vm.cocoonstack.io/lifecycle-state";
const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";
const REFUSED: &str = "another namespace";

/// A refusal given to team-b names the name it asked for, and nothing of team-a's beyond it.
fn refusal_ok(said: &str, vm: &str) -> bool {
    said.contains(REFUSED) && !said.replace(vm, "").contains("team-a")
}

/// A managed pod `name` of `ns` on the node, its VM named `vm`, with `extra` annotations.
fn managed(ns: &str, name: &str, vm: &str, extra: Value) -> Result<Pod> {
    let mut a = json!({
        "cocoonset.cocoonstack.io/managed": "true",
        NAME: vm,
        "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": IMAGE,
    });
    let map = a.as_object_mut().context("annotations")?;
    map.extend(extra.as_object().cloned().unwrap_or_default());
    pod_manifest(ns, name, NODE, a)
}

/// A managed macOS pod `name` of `ns`, its guest named `vm`.
fn macos_pod(ns: &str, name: &str, vm: &str) -> Result<Pod> {
    let os = json!({"cocoonset.cocoonstack.io/os": "macos",
        "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/macos:sequoia"});
    managed(ns, name, vm, os)
}

/// `cocoon-macos vm list` of the simulator: (name, pid) of each guest.
fn guests(sim: &CocoonSim) -> Result<Vec<(String, i64)>> {
    let text = sim.run(&["--personality", "macos", "vm", "list"])?;
    let list: Vec<Value> = serde_json::from_str(&text)?;
    Ok(list
        .iter()
        .map(|g| {
            let name = g["name"].as_str().or(g["id"].as_str()).unwrap_or_default();
            (name.to_string(), g["pid"].as_i64().unwrap_or(0))
        })
        .collect())
}

/// The journal's records as written (the files hold them compressed), every file of its dir.
fn journal_text(journal: &Path) -> Result<String> {
    let dir = journal.parent().context("journal dir")?;
    let mut all = String::new();
    for f in std::fs::read_dir(dir)?.flatten() {
        let raw = std::fs::read(f.path())?;
        let lines = vk_cocoon::journal::frame::lines_of_file(&raw).unwrap_or_else(|(l, _)| l);
        all += &String::from_utf8_lossy(&lines);
    }
    Ok(all)
}

/// Starts the daemon on `journal` once `d` (if any) has stopped, and returns it with its
/// metrics port once it has registered the node: both processes log to one file, so the new
/// one has registered once one line more says so.
async fn restart(
    tb: &Testbed,
    d: Option<Daemon>,
    opts: &DaemonOptions,
    journal: &Path,
) -> Result<(Daemon, u16)> {
    let registered = |d: &Daemon| d.proc.log_tail(100_000).matches("node registered").count();
    let before = d.as_ref().map_or(0, registered);
    drop(d);
    let metrics_port = e2e::ports::free_port()?;
    let d = daemon::start(tb, opts, journal, metrics_port, e2e::ports::free_port()?)?;
    until("the restarted daemon registered", LIMIT, || async {
        Ok((registered(&d) > before).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    Ok((d, metrics_port))
}

/// Bring-ups the daemon serving metrics on `port` has counted failed.
async fn failed_creates(port: u16) -> Result<f64> {
    let series = daemon::metric_series(port, "cocoon_vk_pod_lifecycle_total").await?;
    Ok(series
        .iter()
        .filter(|(l, _)| l.contains(r#"op="create""#) && l.contains(r#"result="failed""#))
        .map(|(_, v)| v)
        .sum())
}

/// The victim's macOS pod is Ready on guest `vm`, which runs as process `pid` and is the only
/// guest; no pod of team-b has an id.
async fn macos_victim_intact(
    a: &Api<Pod>,
    b: &Api<Pod>,
    sim: &CocoonSim,
    vm: &str,
    pid: i64,
) -> Result<()> {
    let p = a.get("mac").await?;
    ensure!(is_ready(&p), "the victim's macOS pod is not Ready");
    ensure!(
        annotation(&p, ID).as_deref() == Some(vm),
        "the victim's id is {:?}",
        annotation(&p, ID)
    );
    let g = guests(sim)?;
    ensure!(
        g == vec![(vm.to_string(), pid)],
        "guests {g:?}, not the victim's {vm} as pid {pid}"
    );
    for p in b.list(&Default::default()).await?.items {
        ensure!(
            annotation(&p, ID).is_none(),
            "team-b's {:?} was given {:?}",
            p.metadata.name,
            annotation(&p, ID)
        );
    }
    Ok(())
}

/// T1, T11, D2 on cocoon-macos: team-a runs a macOS guest; two pods of team-b name it and are
/// refused. The daemon restarts on the same journal: the victim keeps its guest (same QEMU
/// pid, no second `macos_run`) and Ready, the attackers get nothing and the restarted daemon
/// refuses them again. One attacker is deleted with the daemon up, the other while it is
/// down (so the next start finds it deleting, naming a listed guest): the guest stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_macos_guest_stays_its_holders_across_a_restart_and_the_attackers_deletes() -> Result<()>
{
    let started = Instant::now();
    const VM: &str = "vk-team-a-mac";
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let sim = tb.sim.as_ref().context("sim")?;
    let macos_bin = tb.run_dir().join("cocoon-macos");
    std::os::unix::fs::symlink(&sim.bin, &macos_bin)?;
    let opts = DaemonOptions {
        env: vec![(
            "VK_COCOON_MACOS_BIN".into(),
            macos_bin.display().to_string(),
        )],
        ..Default::default()
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
    let events: Api<Event> = Api::namespaced(tb.client()?, "team-b");

    e2e::step!("team-a's macOS pod runs guest {VM}");
    create_pod(&a, &macos_pod("team-a", "mac", VM)?).await?;
    wait_ready(&a, "mac", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let pid = guests(sim)?.first().map(|g| g.1).context("no guest")?;
    ensure!(pid > 0, "the guest is not alive");

    e2e::step!("team-b's two macOS pods name {VM}: refused");
    for name in ["thief-1", "thief-2"] {
        create_pod(&b, &macos_pod("team-b", name, VM)?).await?;
        let said = daemon::warning(&events, name, None, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
        ensure!(refusal_ok(&said, VM), "{name}: {said}");
    }
    macos_victim_intact(&a, &b, sim, VM, pid).await?;

    e2e::step!("the daemon restarts on the same journal");
    let runs = journal_text(&journal)?
        .matches(r#""verb":"macos_run""#)
        .count();
    let (d, metrics_port) = restart(&tb, Some(d), &opts, &journal).await?;
    until(
        "the restarted daemon refuses team-b's pods",
        LIMIT,
        || async { Ok((failed_creates(metrics_port).await? >= 2.0).then_some(())) },
    )
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let message = annotation(&b.get("thief-1").await?, LIFECYCLE_MESSAGE).unwrap_or_default();
    ensure!(
        refusal_ok(&message, VM),
        "thief-1 after the restart: {message:?}"
    );
    macos_victim_intact(&a, &b, sim, VM, pid).await?;

    e2e::step!("thief-1 is deleted while the daemon runs");
    delete_and_wait(&b, "thief-1", LIMIT, Some(&d)).await?;
    macos_victim_intact(&a, &b, sim, VM, pid).await?;

    e2e::step!("thief-2 is deleted while the daemon is down; the next start finds it deleting");
    let stopped = d.proc.log_tail(100_000).matches("node registered").count();
    drop(d);
    b.delete("thief-2", &DeleteParams::default()).await?;
    let deleting = b.get("thief-2").await?.metadata.deletion_timestamp;
    ensure!(deleting.is_some(), "thief-2 is not deleting");
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    until("the third daemon registered", LIMIT, || async {
        let n = d.proc.log_tail(100_000).matches("node registered").count();
        Ok((n > stopped).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    until("thief-2 gone", LIMIT, || async {
        Ok(b.get_opt("thief-2").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    macos_victim_intact(&a, &b, sim, VM, pid).await?;
    let text = journal_text(&journal)?;
    ensure!(
        text.matches(r#""verb":"macos_run""#).count() == runs,
        "a restarted daemon ran the guest again"
    );
    ensure!(
        !text.contains(r#""verb":"macos_rm""#),
        "a daemon asked cocoon-macos to remove a guest"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
/// The owner annotation of `name:tag` (`<namespace>/<pod>`, and what follows an `@`, if
/// anything), `None` when the tag is absent.
async fn tag_owner(reg: &Registry, name: &str, tag: &str) -> Result<Option<String>> {
    let r = reg
        .inspect(name, tag)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(r.map(|r| {
        r.manifest
            .annotations
            .get(vk_cocoon::registry::media::ANN_OWNER)
            .cloned()
            .unwrap_or_default()
    }))
}

/// Nothing under the victim's VM name `vm` is team-b's: no local snapshot, no tag.
async fn names_untouched(sim: &CocoonSim, reg: &Registry, vm: &str) -> Result<()> {
    let snaps = snapshots(sim)?;
    let foreign: Vec<_> = snaps
        .iter()
        .filter(|(n, desc)| n.contains(vm) && desc.contains("team-b"))
        .collect();
    ensure!(
        foreign.is_empty(),
        "team-b saved snapshots under {vm}: {foreign:?}"
    );
    for t in ["latest", "hibernate"] {
        let owner = tag_owner(reg, vm, t).await?;
        ensure!(
            !owner.as_deref().unwrap_or_default().contains("team-b"),
            "{vm}:{t} is team-b's ({owner:?})"
        );
    }
    Ok(())
}

/// The victim is Ready on VM `id`, which the node still runs.
async fn victim_runs(a: &Api<Pod>, sim: &CocoonSim, id: &str) -> Result<()> {
    let p = a.get("victim").await?;
    ensure!(
        is_ready(&p) && annotation(&p, ID).as_deref() == Some(id),
        "the victim lost its VM {id}: Ready {}, id {:?}",
        is_ready(&p),
        annotation(&p, ID)
    );
    ensure!(sim.vm_ids().iter().any(|v| v == id), "VM {id} is gone");
    Ok(())
}

/// The victim's VM name.
const VICTIM_VM: &str = "vk-team-a-victim";

/// One node with a registry, and team-a's `victim` Ready on [`VICTIM_VM`] with a marker
/// written into its guest.
struct Bed {
    tb: Testbed,
    d: Daemon,
    journal: std::path::PathBuf,
    metrics_port: u16,
    reg: Registry,
    a: Api<Pod>,
    b: Api<Pod>,
    /// The victim's VM id.
    id: String,
}

async fn bed() -> Result<Bed> {
    let tenant::Node {
        tb,
        d,
        journal,
        metrics_port,
        reg,
        a,
        b,
    } = tenant::one_node(PREFIX).await?;
    e2e::step!("team-a's victim runs {VICTIM_VM} and writes a marker");
    create_pod(&a, &managed("team-a", "victim", VICTIM_VM, json!({}))?).await?;
    let p = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&p, ID).context("victim id")?;
    let write = "echo victim-state > marker";
    sim_run(
        tb.host(None)?,
        &["vm", "exec", &id, "--", "sh", "-c", write],
    )?;
    Ok(Bed {
        tb,
        d,
        journal,
        metrics_port,
        reg,
        a,
        b,
        id,
    })
}

/// Waits for a retry of a refused bring-up that came at least `gap` after the one before it.
/// The backoff doubles, so the next retry is at least twice `gap` away.
async fn after_a_slow_retry(metrics_port: u16, gap: Duration) -> Result<()> {
    let deadline = Instant::now() + LIMIT;
    let (mut count, mut at) = (failed_creates(metrics_port).await?, Instant::now());
    loop {
        ensure!(
            Instant::now() < deadline,
            "no retry came {gap:?} after the one before"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = failed_creates(metrics_port).await?;
        if now > count {
            if at.elapsed() >= gap {
                return Ok(());
            }
            (count, at) = (now, Instant::now());
        }
    }
}

/// Whether owner record `owner` names pod `pod` (`<namespace>/<name>`).
use e2e::daemon::owned_by;

#[path = "support/tenant.rs"]
mod tenant;
use tenant::{delete_and_wait, sim_run, snapshots};

/// T1, T6, U2: team-b's `intruder` names the victim's VM and is refused, then asks to be
/// hibernated (which would hold the name from then on): still refused, never hibernated, and
/// nothing is saved or pushed under the name. The victim's owner hibernates it, deletes it and
/// makes it again (same name, `hibernate=true`, as the operator remakes a hibernated agent's
/// pod) between two of the intruder's retries: the new pod is not refused and wakes with the
/// data the first one wrote. Deleting the intruder then leaves the victim running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pod_flipped_to_hibernate_never_takes_the_victims_name() -> Result<()> {
    let started = Instant::now();
    let Bed {
        tb,
        d,
        journal,
        metrics_port,
        reg,
        a,
        b,
        id,
    } = bed().await?;
    let sim = tb.host(None)?;
    let events: Api<Event> = Api::namespaced(tb.client()?, "team-b");

    e2e::step!("team-b's intruder names {VICTIM_VM}: refused; then asks to be hibernated");
    create_pod(&b, &managed("team-b", "intruder", VICTIM_VM, json!({}))?).await?;
    let said = daemon::warning(&events, "intruder", None, LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(refusal_ok(&said, VICTIM_VM), "intruder: {said}");
    annotate(&b, "intruder", HIBERNATE, Some("true")).await?;
    // The change gives the refused pod a fresh start at once; it must stay refused.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(3) {
        let p = b.get("intruder").await?;
        ensure!(
            annotation(&p, LIFECYCLE).as_deref() != Some("hibernated")
                && annotation(&p, ID).is_none(),
            "the intruder took the name: {:?} {:?}",
            annotation(&p, LIFECYCLE),
            annotation(&p, LIFECYCLE_MESSAGE)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let message = annotation(&b.get("intruder").await?, LIFECYCLE_MESSAGE).unwrap_or_default();
    ensure!(
        refusal_ok(&message, VICTIM_VM),
        "the hibernating intruder: {message:?}"
    );
    victim_runs(&a, sim, &id).await?;
    names_untouched(sim, &reg, VICTIM_VM).await?;

    e2e::step!("the victim's owner hibernates it");
    annotate(&a, "victim", HIBERNATE, Some("true")).await?;
    lifecycle_is(&a, "victim", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let owner = tag_owner(&reg, VICTIM_VM, "hibernate").await?;
    ensure!(
        owned_by(owner.as_deref(), "team-a/victim"),
        "{VICTIM_VM}:hibernate owner {owner:?}"
    );
    // A retry of the intruder landing between the delete and the remake would find the name
    // free and hold it (names are first come, first served): the owner acts right after one.
    after_a_slow_retry(metrics_port, Duration::from_secs(2)).await?;
    e2e::step!("the owner deletes the hibernated victim and makes it again");
    delete_and_wait(&a, "victim", LIMIT, Some(&d)).await?;
    let again = managed("team-a", "victim", VICTIM_VM, json!({HIBERNATE: "true"}))?;
    create_pod(&a, &again).await?;
    let p = lifecycle_is(&a, "victim", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let message = annotation(&p, LIFECYCLE_MESSAGE).unwrap_or_default();
    ensure!(!message.contains(REFUSED), "the remade victim: {message}");
    e2e::step!("the owner wakes it");
    annotate(&a, "victim", HIBERNATE, None).await?;
    let woken = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&woken, ID).context("woken id")?;
    let text = sim_run(sim, &["vm", "exec", &id, "--", "cat", "marker"])?;
    ensure!(
        text.trim() == "victim-state",
        "the victim woke with {text:?}"
    );

    e2e::step!("the intruder holds nothing; deleting it leaves the victim running");
    let p = b.get("intruder").await?;
    ensure!(
        annotation(&p, ID).is_none() && annotation(&p, LIFECYCLE).as_deref() != Some("hibernated"),
        "the intruder took the name: {:?}",
        annotation(&p, LIFECYCLE)
    );
    delete_and_wait(&b, "intruder", LIMIT, Some(&d)).await?;
    victim_runs(&a, sim, &id).await?;
    names_untouched(sim, &reg, VICTIM_VM).await?;

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// team-b's pod `name` runs its own VM, then changes its VM name annotation to the victim's.
async fn renamed(b: &Api<Pod>, d: &Daemon, name: &str) -> Result<String> {
    let own = format!("vk-team-b-{name}");
    create_pod(b, &managed("team-b", name, &own, json!({}))?).await?;
    let p = wait_ready(b, name, LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    annotate(b, name, NAME, Some(VICTIM_VM)).await?;
    annotation(&p, ID).context("own VM id")
}

/// T1, T7, T8, U2, D4: team-b's pods run their own VMs and then take the victim's VM name in
/// their annotations. One is deleted as it runs (its delete-time snapshot), the other asks to
/// be hibernated and is then deleted: neither saves a local snapshot or pushes a tag under
/// the victim's name, and each one's own VM goes with its pod. The victim keeps its VM, and
/// its owner can still hibernate it and wake it with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_renamed_to_the_victims_vm_never_saves_or_pushes_under_its_name() -> Result<()> {
    let started = Instant::now();
    let Bed {
        tb,
        d,
        journal,
        reg,
        a,
        b,
        id,
        ..
    } = bed().await?;
    let sim = tb.host(None)?;

    e2e::step!("team-b's renamer-1 takes the name {VICTIM_VM} and is deleted as it runs");
    let own = renamed(&b, &d, "renamer-1").await?;
    delete_and_wait(&b, "renamer-1", LIMIT, Some(&d)).await?;
    ensure!(!sim.vm_ids().contains(&own), "renamer-1's VM outlived it");
    victim_runs(&a, sim, &id).await?;
    names_untouched(sim, &reg, VICTIM_VM).await?;

    e2e::step!("team-b's renamer-2 takes the name {VICTIM_VM} and asks to be hibernated");
    let own = renamed(&b, &d, "renamer-2").await?;
    annotate(&b, "renamer-2", HIBERNATE, Some("true")).await?;
    // Whatever the daemon makes of it (a hibernate of its own VM, or a refusal), it settles.
    let state = until("renamer-2's hibernate settled", LIMIT, || async {
        let s = annotation(&b.get("renamer-2").await?, LIFECYCLE).unwrap_or_default();
        Ok(matches!(s.as_str(), "hibernated" | "failed").then_some(s))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    e2e::step!("renamer-2's hibernate: {state}");
    victim_runs(&a, sim, &id).await?;
    names_untouched(sim, &reg, VICTIM_VM).await?;
    delete_and_wait(&b, "renamer-2", LIMIT, Some(&d)).await?;
    ensure!(!sim.vm_ids().contains(&own), "renamer-2's VM outlived it");
    names_untouched(sim, &reg, VICTIM_VM).await?;

    e2e::step!("the victim's owner hibernates it and wakes it");
    annotate(&a, "victim", HIBERNATE, Some("true")).await?;
    lifecycle_is(&a, "victim", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let owner = tag_owner(&reg, VICTIM_VM, "hibernate").await?;
    ensure!(
        owned_by(owner.as_deref(), "team-a/victim"),
        "{VICTIM_VM}:hibernate owner {owner:?}"
    );
    annotate(&a, "victim", HIBERNATE, None).await?;
    let woken = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&woken, ID).context("woken id")?;
    let text = sim_run(sim, &["vm", "exec", &id, "--", "cat", "marker"])?;
    ensure!(
        text.trim() == "victim-state",
        "the victim woke with {text:?}"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
