//! What a restarted daemon owes and what a registry fault undoes, end to end: the real daemon,
//! the simulator and (for the second test) the testbed's registry behind a gate the test can
//! close. A daemon killed with SIGKILL in the middle of a `vm run` that dies with it (as on a
//! host that went down) leaves a `creating` record that the next one collects (B3); a pod that
//! lost its id adopts the VM of its name (B5); a clone killed in its post-clone fix-up gets it
//! again (B9). A hibernate whose push is refused rolls back and hibernates once the registry
//! answers (U4); a wake ignores a local `<vm>` that is not the tag's snapshot and fails, without
//! the local copy, while the registry cannot verify it (U6); `main-only` pushes slot 0 of a
//! CocoonSet at delete, not slot 1 (D4). The journal the daemons share is replayed with --verify.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotate, annotation, create_pod, is_ready, lifecycle_is, metric_series, pod_manifest, until,
    wait_ready, Daemon, DaemonOptions,
};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use vk_cocoon::registry::Registry;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(90);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const PREFIX: &str = "cocoon";
const ID: &str = "vm.cocoonstack.io/id";
const IP: &str = "vm.cocoonstack.io/ip";
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";
const STATIC_SNAPSHOT: &str = "resume/static:v1";

fn vm_name(pod: &str) -> String {
    format!("vk-{NS}-{pod}")
}

fn run_pod(name: &str, extra: Value) -> Result<Pod> {
    let mut a = json!({"cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": vm_name(name),
        "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": IMAGE});
    a.as_object_mut()
        .context("annotations")?
        .extend(extra.as_object().context("extra")?.clone());
    pod_manifest(NS, name, NODE, a)
}

/// The ids and states of the simulator's VMs named `name`.
fn vms_named(sim: &CocoonSim, name: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for id in sim.vm_ids() {
        // A directory whose record is gone (a collected create) is no VM.
        let Ok(out) = sim.run(&["vm", "inspect", &id]) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&out) else {
            continue;
        };
        if v["config"]["name"] == name {
            found.push((id, v["state"].as_str().unwrap_or_default().to_string()));
        }
    }
    found
}

/// One series of a counter on the daemon's /metrics (0 when it was never counted).
async fn counter(port: u16, name: &str, labels: &str) -> Result<f64> {
    Ok(metric_series(port, name)
        .await?
        .into_iter()
        .filter(|(l, _)| l == labels)
        .map(|(_, v)| v)
        .sum())
}

/// The `cocoon` processes of this simulator whose arguments include all of `words`.
fn cocoon_procs(sim: &CocoonSim, words: &[&str]) -> Result<Vec<i32>> {
    let root = format!("COCOON_SIM_ROOT={}", sim.root.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let (Ok(cmdline), Ok(environ)) = (
            std::fs::read(entry.path().join("cmdline")),
            std::fs::read(entry.path().join("environ")),
        ) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = environ.split(|b| *b == 0).any(|v| v == root.as_bytes());
        let is_cocoon = args
            .first()
            .is_some_and(|a| std::path::Path::new(a).file_name() == Some("cocoon".as_ref()));
        if ours && is_cocoon && words.iter().all(|w| args.iter().any(|a| a == w)) {
            found.push(pid);
        }
    }
    Ok(found)
}

/// Waits for the one `cocoon` process with `words` (see [`cocoon_procs`]).
async fn cocoon_proc(sim: &CocoonSim, words: &[&str]) -> Result<i32> {
    until(&format!("cocoon {words:?} running"), LIMIT, || async {
        let pids = cocoon_procs(sim, words)?;
        ensure!(pids.len() <= 1, "cocoon processes with {words:?}: {pids:?}");
        Ok(pids.first().copied())
    })
    .await
}

/// SIGKILLs a cocoon process and its group: the daemon starts each cocoon as a group leader.
fn kill_cocoon(pid: i32) {
    // SAFETY: plain syscalls on a process this test's daemon started.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

struct Running {
    d: Daemon,
    metrics: u16,
}

fn start(tb: &Testbed, opts: &DaemonOptions, journal: &std::path::Path) -> Result<Running> {
    let metrics = e2e::ports::free_port()?;
    let d = daemon::start(tb, opts, journal, metrics, e2e::ports::free_port()?)?;
    Ok(Running { d, metrics })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_collects_adopts_and_resumes() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        STATIC_SNAPSHOT,
        "--network",
        "cocoon-static",
        "--image",
        "acme/base:1",
    ])?;
    // A clone with a static NIC owes its fix-up, which only `vm exec` in the guest gives it.
    let opts = DaemonOptions {
        env: vec![("COCOON_SIM_GUEST_FIXUP".into(), "1".into())],
        ..DaemonOptions::default()
    };
    // One journal across the restarts, as a host keeps it: each process reads back from it
    // which pod holds each VM (T11).
    let journal = tb.run_dir().join("journal").join("events.journal");
    let mut r = start(&tb, &opts, &journal)?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);

    create_pod(&pods, &run_pod("named", json!({}))?).await?;
    let named = wait_ready(&pods, "named", LIMIT)
        .await
        .with_context(|| r.d.proc.log_tail(60))?;
    let named_id = annotation(&named, ID).context("named has no id")?;
    let named_ip = annotation(&named, IP).context("named has no ip")?;

    // B3: the daemon and its `vm run` die while the run holds the `creating` record, so the
    // record's create lock has no owner any more.
    sim.run(&["sim", "fault", "delay", "vm run", "8000", "--times", "1"])?;
    create_pod(&pods, &run_pod("stale", json!({}))?).await?;
    let stale_id = until("the stale pod's create under way", LIMIT, || async {
        Ok(vms_named(sim, &vm_name("stale"))
            .into_iter()
            .find(|(_, state)| state == "creating")
            .map(|(id, _)| id))
    })
    .await
    .with_context(|| r.d.proc.log_tail(40))?;
    // The daemon's cocoon children lead process groups of their own and outlive it; a create
    // is left stale only when its `vm run` dies too, as on a host that went down.
    let run = cocoon_proc(sim, &["run", &vm_name("stale")]).await?;
    r.d.proc.signal(libc::SIGKILL);
    kill_cocoon(run);
    ensure!(
        annotation(&pods.get("stale").await?, ID).is_none(),
        "the stale pod got an id before the kill"
    );

    // B5: the pod forgets its VM, as if the daemon died between `vm run` and the id write.
    annotate(&pods, "named", ID, None).await?;
    annotate(&pods, "named", IP, None).await?;

    r = start(&tb, &opts, &journal)?;
    let stale = wait_ready(&pods, "stale", LIMIT)
        .await
        .with_context(|| r.d.proc.log_tail(80))?;
    let vms = vms_named(sim, &vm_name("stale"));
    ensure!(vms.len() == 1, "VMs of the stale pod: {vms:?}");
    ensure!(
        vms[0].0 != stale_id && vms[0].1 == "running",
        "the stale record {stale_id} survived: {vms:?}"
    );
    ensure!(
        annotation(&stale, ID).as_deref() == Some(vms[0].0.as_str()),
        "the stale pod's id {:?} is not its VM {:?}",
        annotation(&stale, ID),
        vms[0]
    );
    let collected = counter(
        r.metrics,
        "cocoon_vk_stale_create_reconcile_total",
        r#"outcome="collected""#,
    )
    .await?;
    ensure!(collected == 1.0, "stale creates collected: {collected}");

    let adopted = until("the named pod adopted its VM", LIMIT, || async {
        let p = pods.get("named").await?;
        Ok(
            (annotation(&p, ID).is_some() && annotation(&p, IP).is_some() && is_ready(&p))
                .then_some(p),
        )
    })
    .await
    .with_context(|| r.d.proc.log_tail(80))?;
    ensure!(
        annotation(&adopted, ID).as_deref() == Some(named_id.as_str())
            && annotation(&adopted, IP).as_deref() == Some(named_ip.as_str()),
        "adopted as {:?}/{:?}, ran as {named_id}/{named_ip}",
        annotation(&adopted, ID),
        annotation(&adopted, IP)
    );
    let vms = vms_named(sim, &vm_name("named"));
    ensure!(
        vms.len() == 1 && vms[0].0 == named_id,
        "VMs of the named pod: {vms:?}"
    );
    let by_name = counter(r.metrics, "cocoon_vk_reconcile_adopt_by_name_total", "").await?;
    ensure!(by_name == 1.0, "adoptions by name: {by_name}");

    // B9: the daemon dies while the clone's fix-up runs in the guest.
    sim.run(&["sim", "fault", "delay", "vm exec", "8000", "--times", "1"])?;
    create_pod(
        &pods,
        &pod_manifest(
            NS,
            "fixup",
            NODE,
            json!({"cocoonset.cocoonstack.io/managed": "true",
                "vm.cocoonstack.io/name": vm_name("fixup"),
                "cocoonset.cocoonstack.io/image": STATIC_SNAPSHOT,
                "cocoonset.cocoonstack.io/network": "cocoon-static"}),
        )?,
    )
    .await?;
    let fixing = until("the fix-up under way", LIMIT, || async {
        let p = pods.get("fixup").await?;
        Ok((annotation(&p, POST_CLONE_STATE).as_deref() == Some("running")).then_some(p))
    })
    .await
    .with_context(|| r.d.proc.log_tail(60))?;
    let fixup_id = annotation(&fixing, ID).context("the clone has no id")?;
    let exec = cocoon_proc(sim, &["exec", &fixup_id]).await?;
    r.d.proc.signal(libc::SIGKILL);
    // Otherwise the old fix-up would finish on its own and hide whether the new daemon ran one.
    kill_cocoon(exec);
    let info: Value = serde_json::from_str(&sim.run(&["sim", "info", &fixup_id])?)?;
    ensure!(
        info["fixup"]["done"] == false,
        "the fix-up finished before the kill: {info}"
    );

    r = start(&tb, &opts, &journal)?;
    let fixed = match wait_ready(&pods, "fixup", LIMIT).await {
        Ok(p) => p,
        Err(e) => {
            let p = pods.get("fixup").await?;
            let info = sim.run(&["sim", "info", &fixup_id]).unwrap_or_default();
            return Err(e.context(format!(
                "annotations {:?}\nsim info {info}\n{}",
                p.metadata.annotations,
                r.d.proc.log_tail(80)
            )));
        }
    };
    ensure!(
        annotation(&fixed, POST_CLONE_STATE).as_deref() == Some("done"),
        "post-clone-state after the resume: {:?}",
        annotation(&fixed, POST_CLONE_STATE)
    );
    let info: Value = serde_json::from_str(&sim.run(&["sim", "info", &fixup_id])?)?;
    ensure!(
        info["fixup"]["done"] == true,
        "Ready without the fix-up: {info}"
    );
    let vms = vms_named(sim, &vm_name("fixup"));
    ensure!(
        vms.len() == 1 && vms[0].0 == fixup_id,
        "VMs of the fixup pod: {vms:?}"
    );
    let resumed = counter(
        r.metrics,
        "cocoon_vk_startup_resume_total",
        r#"op="post_clone""#,
    )
    .await?;
    ensure!(resumed == 1.0, "post-clone resumes: {resumed}");

    drop(r);
    daemon::replay_verify(&journal)?;
    Ok(())
}

/// A TCP forwarder to the registry that the test can close: a closed gate drops every
/// connection, open or new, so the daemon's registry calls fail at once, as with a registry
/// that went away, and open it again without restarting anything.
struct Gate {
    addr: String,
    down: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    async fn to(target: String) -> Result<Gate> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (down, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut rx = rx.clone();
                let target = target.clone();
                tokio::spawn(async move {
                    if *rx.borrow() {
                        return;
                    }
                    let Ok(mut out) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut out) => {}
                        _ = rx.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Ok(Gate { addr, down, task })
    }

    fn close(&self) {
        self.down.send_replace(true);
    }

    fn open(&self) {
        self.down.send_replace(false);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn warnings(tb: &Testbed, pod: &str, reason: &str) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(tb.client()?, NS);
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    Ok(events
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect())
}

async fn tag(reg: &Registry, name: &str, t: &str) -> Result<Option<String>> {
    Ok(reg
        .inspect(name, t)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .map(|s| s.snapshot_id))
}

fn registry(tb: &Testbed) -> Result<Registry> {
    let addr = &tb.registry.as_ref().context("registry")?.addr;
    let spool = tb.run_dir().join("test-spool");
    std::fs::create_dir_all(&spool)?;
    Ok(Registry::from_config(&format!("{addr}/{PREFIX}"))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(spool))
}

/// `cocoon vm exec` with the guest filesystem on the host, so what it writes is in the next
/// snapshot and what a clone of that snapshot reads.
fn host_exec(sim: &CocoonSim, id: &str, script: &str) -> Result<String> {
    let out = sim
        .command()
        .env("COCOON_SIM_EXEC", "host")
        .args(["vm", "exec", id, "--", "sh", "-c", script])
        .output()?;
    ensure!(
        out.status.success(),
        "vm exec {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn local_snapshot_id(sim: &CocoonSim, name: &str) -> Result<String> {
    let v: Value = serde_json::from_str(&sim.run(&["snapshot", "inspect", name])?)?;
    Ok(v["id"].as_str().context("snapshot id")?.to_string())
}

fn set_pod(slot: u32) -> Result<Pod> {
    let name = format!("set-{slot}");
    let mut pod = run_pod(
        &name,
        json!({"cocoonset.cocoonstack.io/snapshot-policy": "main-only"}),
    )?;
    // No CocoonSet object exists here: the daemon reads only the reference, and the garbage
    // collector leaves a pod alone whose owner's kind it cannot resolve.
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cocoonset.cocoonstack.io/v1".into(),
        kind: "CocoonSet".into(),
        name: "set".into(),
        uid: "00000000-0000-4000-8000-000000000001".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    Ok(pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_faults_roll_back_fail_wakes_and_main_only_pushes_slot_0() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    let reg = registry(&tb)?;
    let gate = Gate::to(tb.registry.as_ref().context("registry")?.addr.clone()).await?;
    let opts = DaemonOptions {
        env: vec![
            ("OCI_REGISTRY".into(), format!("{}/{PREFIX}", gate.addr)),
            ("COCOON_SIM_EXEC".into(), "host".into()),
        ],
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let r = start(&tb, &opts, &journal)?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let never = json!({"cocoonset.cocoonstack.io/snapshot-policy": "never"});
    create_pod(&pods, &set_pod(0)?).await?;
    create_pod(&pods, &set_pod(1)?).await?;
    create_pod(&pods, &run_pod("roll", never.clone())?).await?;
    create_pod(&pods, &run_pod("wake", never)?).await?;
    for name in ["set-0", "set-1", "roll", "wake"] {
        wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| r.d.proc.log_tail(60))?;
    }

    // D4: main-only pushes the main agent (slot 0) at delete, not the sub-agent.
    for name in ["set-0", "set-1"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    until("the set's pods gone", LIMIT, || async {
        let a = pods.get_opt("set-0").await?;
        let b = pods.get_opt("set-1").await?;
        Ok((a.is_none() && b.is_none()).then_some(()))
    })
    .await
    .with_context(|| r.d.proc.log_tail(60))?;
    ensure!(
        tag(&reg, &vm_name("set-0"), "latest").await?.is_some(),
        "slot 0 was not pushed"
    );
    ensure!(
        tag(&reg, &vm_name("set-1"), "latest").await?.is_none(),
        "slot 1 was pushed"
    );
    for slot in ["set-0", "set-1"] {
        let vms = vms_named(sim, &vm_name(slot));
        ensure!(vms.is_empty(), "VMs of {slot} after its delete: {vms:?}");
    }

    // U4: the registry refuses the push; the pod runs on as it ran until it answers again.
    let before = pods.get("roll").await?;
    let (roll_id, roll_ip) = (
        annotation(&before, ID).context("roll id")?,
        annotation(&before, IP).context("roll ip")?,
    );
    gate.close();
    annotate(&pods, "roll", HIBERNATE, Some("true")).await?;
    let failed = lifecycle_is(&pods, "roll", "failed")
        .await
        .with_context(|| r.d.proc.log_tail(60))?;
    ensure!(
        annotation(&failed, ID).as_deref() == Some(roll_id.as_str())
            && annotation(&failed, IP).as_deref() == Some(roll_ip.as_str()),
        "rolled back to {:?}/{:?}, ran as {roll_id}/{roll_ip}",
        annotation(&failed, ID),
        annotation(&failed, IP)
    );
    let vms = vms_named(sim, &vm_name("roll"));
    ensure!(
        vms == [(roll_id.clone(), "running".to_string())],
        "VMs of the rolled-back pod: {vms:?}"
    );
    until("HibernatePushFailed", LIMIT, || async {
        Ok((!warnings(&tb, "roll", "HibernatePushFailed")
            .await?
            .is_empty())
        .then_some(()))
    })
    .await?;
    gate.open();
    lifecycle_is(&pods, "roll", "hibernated")
        .await
        .with_context(|| r.d.proc.log_tail(60))?;
    ensure!(
        tag(&reg, &vm_name("roll"), "hibernate").await?.is_some(),
        "the retried hibernate pushed nothing"
    );
    let vms = vms_named(sim, &vm_name("roll"));
    ensure!(vms.is_empty(), "VMs of the hibernated pod: {vms:?}");

    // U6 stale: the local `<vm>` is replaced by another snapshot of that name; the wake
    // takes the tag from the registry, with what the guest wrote before it slept.
    let wake_vm = vm_name("wake");
    let id = annotation(&pods.get("wake").await?, ID).context("wake id")?;
    host_exec(sim, &id, "echo hello-resume > marker")?;
    annotate(&pods, "wake", HIBERNATE, Some("true")).await?;
    lifecycle_is(&pods, "wake", "hibernated")
        .await
        .with_context(|| r.d.proc.log_tail(60))?;
    let tagged = tag(&reg, &wake_vm, "hibernate")
        .await?
        .context("no hibernate tag")?;
    ensure!(
        local_snapshot_id(sim, &wake_vm)? == tagged,
        "the local copy is not the tag's snapshot"
    );
    sim.run(&["snapshot", "rm", &wake_vm])?;
    // Another snapshot of the pod's own (its record names the pod's namespace, T6), so the
    // wake verifies it against the tag and finds it stale.
    let own = format!("vk-cocoon owner={NS}/wake");
    let seed = ["sim", "seed-snapshot", "--name", &wake_vm, "--image", IMAGE];
    sim.run(&[&seed[..], &["--description", &own]].concat())?;
    ensure!(local_snapshot_id(sim, &wake_vm)? != tagged);
    annotate(&pods, "wake", HIBERNATE, None).await?;
    let woken = wait_ready(&pods, "wake", LIMIT)
        .await
        .with_context(|| r.d.proc.log_tail(80))?;
    let stale = counter(
        r.metrics,
        "cocoon_vk_snapshot_verify_total",
        r#"result="stale""#,
    )
    .await?;
    ensure!(stale == 1.0, "stale verifies: {stale}");
    let id = annotation(&woken, ID).context("woken id")?;
    let marker = host_exec(sim, &id, "cat marker")?;
    ensure!(
        marker == "hello-resume",
        "marker after the wake: {marker:?}"
    );

    // U6 error: a good local copy, but the registry cannot say so; the wake fails and
    // leaves no VM until the registry answers.
    annotate(&pods, "wake", HIBERNATE, Some("true")).await?;
    lifecycle_is(&pods, "wake", "hibernated")
        .await
        .with_context(|| r.d.proc.log_tail(60))?;
    let tagged = tag(&reg, &wake_vm, "hibernate")
        .await?
        .context("no hibernate tag")?;
    ensure!(local_snapshot_id(sim, &wake_vm)? == tagged);
    let ok_before = counter(
        r.metrics,
        "cocoon_vk_snapshot_verify_total",
        r#"result="ok""#,
    )
    .await?;
    gate.close();
    annotate(&pods, "wake", HIBERNATE, None).await?;
    until("WakePullFailed", LIMIT, || async {
        Ok((!warnings(&tb, "wake", "WakePullFailed").await?.is_empty()).then_some(()))
    })
    .await
    .with_context(|| r.d.proc.log_tail(60))?;
    let errors = counter(
        r.metrics,
        "cocoon_vk_snapshot_verify_total",
        r#"result="error""#,
    )
    .await?;
    ensure!(errors >= 1.0, "verify errors: {errors}");
    let p = pods.get("wake").await?;
    let vms = vms_named(sim, &wake_vm);
    ensure!(
        vms.is_empty() && !is_ready(&p) && annotation(&p, ID).is_none(),
        "an unverified wake went on: VMs {vms:?}, Ready {}",
        is_ready(&p)
    );
    let ok = counter(
        r.metrics,
        "cocoon_vk_snapshot_verify_total",
        r#"result="ok""#,
    )
    .await?;
    ensure!(ok == ok_before, "verified ok while the registry was down");
    gate.open();
    wait_ready(&pods, "wake", LIMIT)
        .await
        .with_context(|| r.d.proc.log_tail(80))?;
    let ok = counter(
        r.metrics,
        "cocoon_vk_snapshot_verify_total",
        r#"result="ok""#,
    )
    .await?;
    ensure!(ok == ok_before + 1.0, "ok verifies: {ok_before} -> {ok}");
    let vms = vms_named(sim, &wake_vm);
    ensure!(vms.len() == 1, "VMs after the wake: {vms:?}");

    drop(r);
    daemon::replay_verify(&journal)?;
    Ok(())
}
