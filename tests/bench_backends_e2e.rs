//! `make bench-e2e BACKEND=sim|real`: BENCH_MIX (default `50+50`) run-mode and clone-mode pods
//! created at once on one backend, the simulator (the default; `TESTBED_COCOON` unset or
//! `sim`) or the real cocoon of the reference release over the cloud-hypervisor stand-in
//! (`TESTBED_COCOON=real`, needs root). Per pod, from the daemon's journal: create → VM running
//! (the `vm run`/`vm clone` call's successful outcome) and create → Ready; then where the time
//! goes (each cocoon verb's call time, the wait before the VM call, probes). On the real lane
//! the image pull, mkfs.erofs and CNI are also timed by hand before the daemon starts. Measures,
//! never asserts wall time; it fails only when the testbed or the daemon does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use e2e::daemon::{self, annotation, percentile, pod_manifest, DaemonOptions};
use e2e::real_cocoon::RealCocoon;
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as KubeEvent, Pod};
use kube::api::{Api, ListParams};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::{Action, Event};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
/// The real lane's clone source, made by hand from its own image so that the run pods' pull
/// of `tb.guest_image` is a cold one.
const REAL_SNAPSHOT: &str = "bench-agent";
const SIM_SNAPSHOT: &str = "acme/agent:v1";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Run,
    Clone,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Run => "run",
            Mode::Clone => "clone",
        }
    }
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn mix() -> Result<(usize, usize)> {
    let raw = std::env::var("BENCH_MIX").unwrap_or_else(|_| "50+50".into());
    let (r, c) = raw
        .split_once('+')
        .with_context(|| format!("BENCH_MIX={raw:?}: want RUN+CLONE, e.g. 50+50"))?;
    Ok((r.trim().parse()?, c.trim().parse()?))
}

/// What the real lane needs that a host may lack; `None` when all is there.
fn real_lane_missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root (cocoon creates network namespaces and TAPs)".into());
    }
    for b in ["cocoon-real", "mkfs.erofs", "registry"] {
        if let Err(e) = e2e::bins::built(b) {
            return Some(e.to_string());
        }
    }
    ["bridge", "host-local"].iter().find_map(|p| {
        let path = Path::new(e2e::cni::DEBIAN_PLUGIN_DIR).join(p);
        (!path.exists()).then(|| format!("{} (containernetworking-plugins)", path.display()))
    })
}

/// Milliseconds of one blocking step.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64() * 1000.0))
}

/// The real lane's clone source, made as an operator would (pull, run, save, remove), with
/// each step timed: those are the only figures that separate the pull's layer conversion and
/// cocoon's CNI setup from the rest of a call. Returns (step, ms) rows.
async fn seed_real_snapshot(tb: &Testbed, real: &RealCocoon) -> Result<Vec<(String, f64)>> {
    let registry = tb.registry.as_ref().context("registry")?;
    let program = e2e::guest_image::GuestProgram {
        banner: "SSH-2.0-bench-snapshot-source".into(),
        ..Default::default()
    };
    let image = e2e::guest_image::push(registry, "vk/guest", "bench-snap", &program).await?;
    let mut rows = Vec::new();
    let (_, ms) = timed(|| real.run(&["image", "pull", &image]))?;
    rows.push((
        "image pull (cold: fetch + mkfs.erofs of 1 layer)".into(),
        ms,
    ));

    // The same conversion the pull ran, alone, on the same layer.
    let dir = tempfile::tempdir()?;
    let tar = dir.path().join("layer.tar");
    std::fs::write(&tar, e2e::guest_image::layer(&program))?;
    let erofs = e2e::bins::built("mkfs.erofs")?;
    let (out, ms) = timed(|| {
        Ok(std::process::Command::new(&erofs)
            .arg("--tar=f")
            .arg("-zlz4hc")
            .arg(dir.path().join("layer.erofs"))
            .arg(&tar)
            .output()?)
    })?;
    if out.status.success() {
        rows.push(("mkfs.erofs --tar=f -zlz4hc of that layer".into(), ms));
    } else {
        println!(
            "  mkfs.erofs by hand failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    // With and without a NIC: the difference is cocoon's CNI ADD (netns, veth, TAP, tc
    // redirect, host-local), which the daemon's journal only sees inside `vm run`.
    for (nics, label) in [("1", "vm run, 1 NIC"), ("0", "vm run, no NIC")] {
        for i in 0..3 {
            let name = format!("bench-seed-{nics}-{i}");
            let args = [
                "vm", "run", "--output", "json", "--name", &name, "--nics", nics,
            ];
            let args: Vec<&str> = args.iter().copied().chain([image.as_str()]).collect();
            match timed(|| real.run(&args)) {
                Ok((_, ms)) => rows.push((label.into(), ms)),
                Err(e) => println!("  {label} by hand failed: {e:#}"),
            }
        }
    }
    let (_, ms) = timed(|| {
        real.run(&[
            "snapshot",
            "save",
            "--name",
            REAL_SNAPSHOT,
            "bench-seed-1-0",
        ])
    })?;
    rows.push(("snapshot save".into(), ms));
    for id in real.vm_ids()? {
        let (_, ms) = timed(|| real.run(&["vm", "rm", "--force", &id]))?;
        rows.push(("vm rm --force".into(), ms));
    }
    Ok(rows)
}

/// Per pod, wall ms from the journal (and the create call for `created`).
#[derive(Default, Clone)]
struct PodTimes {
    created: i64,
    seen: Option<i64>,
    vm_call: Option<i64>,
    vm_running: Option<i64>,
    ready: Option<i64>,
    /// The Warning that the post-clone fix-up cannot run (reference release).
    warned: Option<i64>,
    /// The status write carrying `lifecycle-state=failed`.
    failed: Option<i64>,
}

/// What the journal says: per pod times, and each cocoon verb's call durations (ms).
struct JournalFigures {
    pods: BTreeMap<String, PodTimes>,
    calls: BTreeMap<String, Vec<f64>>,
    failed_calls: BTreeMap<String, usize>,
    /// Due → answered, ms: (answered, failed).
    probes: (Vec<f64>, Vec<f64>),
}

fn verb(cmd: &CocoonCmd) -> String {
    serde_json::to_value(cmd)
        .ok()
        .and_then(|v| v["verb"].as_str().map(|s| s.replace('_', " ")))
        .unwrap_or_else(|| "?".into())
}

fn read_journal(journal: &Path, created: &BTreeMap<String, i64>) -> Result<JournalFigures> {
    let dir = journal.parent().context("dir")?;
    let files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut pods: BTreeMap<String, PodTimes> = created
        .iter()
        .map(|(k, t)| {
            let times = PodTimes {
                created: *t,
                ..Default::default()
            };
            (k.clone(), times)
        })
        .collect();
    // op → (verb, pod, sent at, whether it brings the pod's VM up)
    let mut open: BTreeMap<u64, (String, Option<String>, i64, bool)> = BTreeMap::new();
    let mut probes_open: BTreeMap<(String, u64), i64> = BTreeMap::new();
    let mut calls: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut failed_calls: BTreeMap<String, usize> = BTreeMap::new();
    let (mut probes_ok, mut probes_failed) = (Vec::new(), Vec::new());
    for entry in vk_cocoon::journal::Reader::open(&files)? {
        let vk_cocoon::journal::Entry::Step {
            envelope, actions, ..
        } = entry?
        else {
            continue;
        };
        let at = envelope.at;
        match &envelope.event {
            Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
                if let Some(p) = pods.get_mut(&format!("{}/{}", pod.namespace, pod.name)) {
                    p.seen.get_or_insert(at);
                }
            }
            Event::CocoonDone { op, result } => {
                if let Some((v, key, t0, brings_up)) = open.remove(op) {
                    match result {
                        Ok(_) => calls.entry(v).or_default().push((at - t0) as f64),
                        Err(_) => *failed_calls.entry(v).or_default() += 1,
                    }
                    let pod = key.and_then(|k| pods.get_mut(&k));
                    if let (true, true, Some(p)) = (brings_up, result.is_ok(), pod) {
                        p.vm_running.get_or_insert(at);
                    }
                }
            }
            Event::RegistryDone { op, result } => {
                if let Some((v, _, t0, _)) = open.remove(op) {
                    match result {
                        Ok(_) => calls.entry(v).or_default().push((at - t0) as f64),
                        Err(_) => *failed_calls.entry(v).or_default() += 1,
                    }
                }
            }
            Event::ProbeDone { key, seq, ok, .. } => {
                if let Some(t0) = probes_open.remove(&(key.to_string(), *seq)) {
                    let into = if *ok {
                        &mut probes_ok
                    } else {
                        &mut probes_failed
                    };
                    into.push((at - t0) as f64);
                }
            }
            _ => {}
        }
        for a in &actions {
            match a {
                Action::RunCocoon { op, key, cmd } => {
                    let brings_up =
                        matches!(cmd, CocoonCmd::VmRun { .. } | CocoonCmd::VmClone { .. });
                    let key = key.as_ref().map(|k| k.to_string());
                    if let (true, Some(p)) = (brings_up, key.as_ref().and_then(|k| pods.get_mut(k)))
                    {
                        p.vm_call.get_or_insert(at);
                    }
                    open.insert(*op, (verb(cmd), key, at, brings_up));
                }
                Action::CallRegistry { op, call, .. } => {
                    let kind = format!("{call:?}");
                    let kind = kind.split([' ', '{', '(']).next().unwrap_or("?");
                    open.insert(*op, (format!("registry {kind}"), None, at, false));
                }
                Action::RunProbe {
                    key, seq, after_ms, ..
                } => {
                    // The delay is the probe schedule's, not the guest's answer.
                    probes_open.insert((key.to_string(), *seq), at + *after_ms as i64);
                }
                Action::PatchPod {
                    key,
                    status,
                    annotations,
                    ..
                } => {
                    let Some(p) = pods.get_mut(&key.to_string()) else {
                        continue;
                    };
                    let ready = status.iter().flat_map(|s| &s.conditions);
                    if ready
                        .into_iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                    {
                        p.ready.get_or_insert(at);
                    }
                    let state = annotations.get("vm.cocoonstack.io/lifecycle-state");
                    if let Some(Some("failed")) = state.map(|v| v.as_deref()) {
                        p.failed.get_or_insert(at);
                    }
                }
                Action::RecordEvent { key, reason, .. } if reason == "PostCloneExecExhausted" => {
                    if let Some(p) = pods.get_mut(&key.to_string()) {
                        p.warned.get_or_insert(at);
                    }
                }
                _ => {}
            }
        }
    }
    for v in calls.values_mut() {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    probes_ok.sort_by(|a, b| a.total_cmp(b));
    probes_failed.sort_by(|a, b| a.total_cmp(b));
    Ok(JournalFigures {
        pods,
        calls,
        failed_calls,
        probes: (probes_ok, probes_failed),
    })
}

/// Sorted `to - from` over the pods that have both.
fn spans(
    pods: &[&PodTimes],
    from: impl Fn(&PodTimes) -> Option<i64>,
    to: impl Fn(&PodTimes) -> Option<i64>,
) -> Vec<f64> {
    let mut v: Vec<f64> = pods
        .iter()
        .filter_map(|p| Some((to(p)? - from(p)?) as f64))
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

fn p50_p99(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    format!("{:.0} / {:.0}", percentile(v, 0.5), percentile(v, 0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: run with `make bench-e2e [BACKEND=real]`"]
async fn bench_run_and_clone_pods_at_once() -> Result<()> {
    let real_lane = e2e::real_cocoon::requested()?;
    let backend = if real_lane { "real" } else { "sim" };
    if real_lane {
        if let Some(reason) = real_lane_missing() {
            e2e::skip::unless_ci(reason);
            return Ok(());
        }
    }
    let (n_run, n_clone) = mix()?;
    let limit = Duration::from_secs(
        std::env::var("BENCH_LIMIT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    let mut opts = TestbedOptions::control_plane().with_sim();
    if real_lane {
        opts = opts.with_registry();
    }
    let tb = Testbed::start(opts).await?;
    let (run_image, clone_source, by_hand) = match (&tb.real_cocoon, &tb.sim) {
        (Some(real), _) => {
            let rows = seed_real_snapshot(&tb, real).await?;
            let image = tb.guest_image.clone().context("no guest image")?;
            (image, REAL_SNAPSHOT, rows)
        }
        (None, Some(_)) => {
            daemon::seed_clone_snapshot(&tb)?;
            (
                "ghcr.io/cocoonstack/ubuntu:24.04".to_string(),
                SIM_SNAPSHOT,
                Vec::new(),
            )
        }
        (None, None) => bail!("the testbed has no cocoon host"),
    };

    let journal = tb.run_dir().join("journal").join("events.journal");
    let mut d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::node_registered(&tb, &d, NODE, Duration::from_secs(60)).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);

    // Interleaved, so neither mode gets a head start in the daemon's queues.
    let mut wanted: Vec<(String, Mode)> = Vec::new();
    for i in 0..n_run.max(n_clone) {
        if i < n_run {
            wanted.push((format!("run-{i:03}"), Mode::Run));
        }
        if i < n_clone {
            wanted.push((format!("clone-{i:03}"), Mode::Clone));
        }
    }
    let t0 = Instant::now();
    let created: Vec<(String, i64)> = futures::stream::iter(wanted.clone())
        .map(|(name, mode)| {
            let pods = pods.clone();
            let run_image = run_image.clone();
            async move {
                let mut a = json!({"cocoonset.cocoonstack.io/managed": "true",
                    "vm.cocoonstack.io/name": format!("vk-{NS}-{name}")});
                a["cocoonset.cocoonstack.io/image"] = match mode {
                    Mode::Run => {
                        a["cocoonset.cocoonstack.io/mode"] = json!("run");
                        json!(run_image)
                    }
                    Mode::Clone => json!(clone_source),
                };
                let p = pod_manifest(NS, &name, NODE, a)?;
                let at = wall_ms();
                daemon::create_pod(&pods, &p).await?;
                anyhow::Ok((format!("{NS}/{name}"), at))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let create_calls = t0.elapsed();

    // Settled: Ready, or given up by the node (a clone on the reference release).
    let total = wanted.len();
    let settled = daemon::until(&format!("{total} pods settled"), limit, || async {
        let list = pods.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|p| {
                daemon::is_ready(p)
                    || annotation(p, "vm.cocoonstack.io/lifecycle-state").as_deref()
                        == Some("failed")
            })
            .count();
        Ok((done == total).then_some(()))
    })
    .await;
    let all_settled = t0.elapsed();
    if let Err(e) = &settled {
        println!("  not every pod settled: {e:#}\n{}", d.proc.log_tail(40));
    }
    let list = pods.list(&ListParams::default()).await?.items;
    let failed: Vec<String> = list
        .iter()
        .filter(|p| annotation(p, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("failed"))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let events: Api<KubeEvent> = Api::namespaced(tb.client()?, NS);
    let exhausted = events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PostCloneExecExhausted"))
        .filter_map(|e| e.involved_object.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let rss = daemon::usage(d.proc.pid()).map(|(_, rss)| rss).unwrap_or(0);
    d.proc.stop();
    // For a look at what the daemon did: `BENCH_KEEP_JOURNAL=DIR`, then `vk-cocoon replay
    // --pod NS/NAME DIR/*.journal*`.
    if let Some(keep) = std::env::var_os("BENCH_KEEP_JOURNAL") {
        std::fs::create_dir_all(&keep)?;
        for f in std::fs::read_dir(journal.parent().context("dir")?)? {
            let f = f?.path();
            std::fs::copy(&f, Path::new(&keep).join(f.file_name().context("name")?))?;
        }
    }

    let created: BTreeMap<String, i64> = created.into_iter().collect();
    let figures = read_journal(&journal, &created)?;
    println!(
        "\nbench-backends-e2e: {n_run} run + {n_clone} clone pods at once on the {backend} backend, {} build",
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!(
        "  create calls done in {create_calls:?}; every pod Ready or failed after {all_settled:?}; \
         lifecycle failed: {}, PostCloneExecExhausted Warnings: {exhausted}; daemon RSS {:.1} MiB",
        failed.len(),
        rss as f64 / 1048576.0
    );
    if !by_hand.is_empty() {
        println!("\n  by hand before the daemon started (ms):");
        let mut grouped: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (step, ms) in &by_hand {
            grouped.entry(step).or_default().push(*ms);
        }
        for (step, v) in grouped {
            let v: Vec<String> = v.iter().map(|ms| format!("{ms:.0}")).collect();
            println!("    {step}: {}", v.join(", "));
        }
    }
    println!(
        "\n  cocoon calls by the daemon (ms per call): verb, ok calls, p50 / p99, max, failed"
    );
    for (v, ms) in &figures.calls {
        println!(
            "    {v}: {}, {}, {:.0}, {}",
            ms.len(),
            p50_p99(ms),
            ms.last().copied().unwrap_or(f64::NAN),
            figures.failed_calls.get(v).copied().unwrap_or(0)
        );
    }
    for (v, n) in figures
        .failed_calls
        .iter()
        .filter(|(v, _)| !figures.calls.contains_key(*v))
    {
        println!("    {v}: 0 ok, {n} failed");
    }
    let (probes_ok, probes_failed) = &figures.probes;
    println!(
        "    probes answered (due → answer): {}, {}; failed (due → given up): {}, {}",
        probes_ok.len(),
        p50_p99(probes_ok),
        probes_failed.len(),
        p50_p99(probes_failed)
    );

    let group = |mode: Mode| -> Vec<&PodTimes> {
        wanted
            .iter()
            .filter(|(_, m)| *m == mode)
            .filter_map(|(name, _)| figures.pods.get(&format!("{NS}/{name}")))
            .collect()
    };
    let (run, clone) = (group(Mode::Run), group(Mode::Clone));
    type At = fn(&PodTimes) -> Option<i64>;
    let stages: [(&str, At, At); 7] = [
        (
            "create → seen by the daemon",
            |p| Some(p.created),
            |p| p.seen,
        ),
        (
            "seen → VM call sent (snapshot lookups, image pull)",
            |p| p.seen,
            |p| p.vm_call,
        ),
        (
            "VM call (vm run / vm clone)",
            |p| p.vm_call,
            |p| p.vm_running,
        ),
        ("VM running → Ready", |p| p.vm_running, |p| p.ready),
        (
            "VM running → PostCloneExecExhausted Warning",
            |p| p.vm_running,
            |p| p.warned,
        ),
        (
            "VM running → lifecycle failed written",
            |p| p.vm_running,
            |p| p.failed,
        ),
        (
            "create → lifecycle failed written",
            |p| Some(p.created),
            |p| p.failed,
        ),
    ];
    println!("\n  where the time goes per pod (ms, p50 / p99): stage | run | clone");
    for (stage, from, to) in stages {
        let (r, c) = (spans(&run, from, to), spans(&clone, from, to));
        if !r.is_empty() || !c.is_empty() {
            println!("    {stage} | {} | {}", p50_p99(&r), p50_p99(&c));
        }
    }
    let mut rows = Vec::new();
    for (mode, group) in [(Mode::Run, &run), (Mode::Clone, &clone)] {
        if group.is_empty() {
            continue;
        }
        let created_at = |p: &PodTimes| Some(p.created);
        let running = spans(group, created_at, |p| p.vm_running);
        let ready = spans(group, created_at, |p| p.ready);
        let ready_cell = match (ready.is_empty(), real_lane, mode) {
            (true, true, Mode::Clone) => "n/a (tier S)".to_string(),
            (true, _, _) => "none Ready".to_string(),
            (false, _, _) => format!("{} ({} Ready)", p50_p99(&ready), ready.len()),
        };
        rows.push(format!(
            "| {backend} | {} | {} | {} ({} running) | {ready_cell} |",
            mode.name(),
            group.len(),
            p50_p99(&running),
            running.len()
        ));
    }
    println!("\n| backend | mode | N | create → VM running p50 / p99 (ms) | create → Ready p50 / p99 (ms) |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    settled.map(|_| ())
}
