//! `make bench-e2e`: N pods (BENCH_PODS, default 200) created at once on the real testbed with
//! zero-boot VMs whose guests share one simulator hub process and listen on loopback addresses. Measures — never asserts — create → Ready (from the daemon's own
//! journal, so the figures are the daemon's view, in ms), API writes per pod lifecycle, daemon
//! RSS and CPU at steady state, and VM-vanished → pod Failed latency. The one assertion: the
//! node Lease never misses a renewal while the pods are created (N17). It ends with one table
//! of the scale goals beside what the run measured, replay --verify of a synthetic 1,000-pod
//! journal and of the run's own included (`make bench-all` runs it at 1,000 pods, release).

use e2e::daemon;
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, percentile, phase, pod_manifest, terminated_reason, usage, watch_for, DaemonOptions,
};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use reconcilers::{Action, Event};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";

/// Bytes on disk and lines (two per reduced event) of every journal file in `dir`.
fn journal_size(dir: &Path) -> Result<(u64, u64)> {
    let (mut bytes, mut lines) = (0, 0);
    for f in std::fs::read_dir(dir)? {
        let raw = std::fs::read(f?.path())?;
        bytes += raw.len() as u64;
        let text = vk_cocoon::journal::frame::lines_of_file(&raw).unwrap_or_else(|(t, _)| t);
        lines += text.iter().filter(|b| **b == b'\n').count() as u64;
    }
    Ok((bytes, lines))
}

/// Per pod, from the daemon's own journal, sorted.
struct Latencies {
    /// Create → Ready pushed, ms.
    total: Vec<f64>,
    /// The part of it not spent inside cocoon calls or probe waits, ms (the journal's
    /// millisecond times: it holds the waits on the apiserver and the daemon's queues too).
    overhead: Vec<f64>,
    /// The daemon's own reduce time on the pod's steps until Ready, µs (`reduce_us`).
    share_us: Vec<f64>,
}

fn create_to_ready(journal: &Path) -> Result<Latencies> {
    let dir = journal.parent().context("dir")?;
    let files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut waited: BTreeMap<String, i64> = BTreeMap::new();
    let mut cocoon: BTreeMap<u64, (String, i64)> = BTreeMap::new();
    let mut probes: BTreeMap<(String, u64), i64> = BTreeMap::new();
    let mut done: std::collections::BTreeSet<String> = Default::default();
    let mut reduce_us: BTreeMap<String, u64> = BTreeMap::new();
    let (mut total, mut overhead, mut share_us) = (Vec::new(), Vec::new(), Vec::new());
    for entry in vk_cocoon::journal::Reader::open(&files)? {
        let vk_cocoon::journal::Entry::Step {
            envelope,
            actions,
            reduce_us: step_us,
            ..
        } = entry?
        else {
            continue;
        };
        let at = envelope.at;
        // Every pod the step is about: its event's, and those its actions are for.
        let mut about: std::collections::BTreeSet<String> = Default::default();
        match &envelope.event {
            Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
                about.insert(format!("{}/{}", pod.namespace, pod.name));
            }
            Event::CocoonDone { op, .. } => {
                if let Some((key, _)) = cocoon.get(op) {
                    about.insert(key.clone());
                }
            }
            Event::ProbeDone { key, .. } => {
                about.insert(key.to_string());
            }
            _ => {}
        }
        for a in &actions {
            if let Action::RunCocoon { key: Some(k), .. }
            | Action::RunProbe { key: k, .. }
            | Action::PatchPod { key: k, .. } = a
            {
                about.insert(k.to_string());
            }
        }
        for key in about.into_iter().filter(|k| !done.contains(k)) {
            *reduce_us.entry(key).or_default() += step_us.unwrap_or(0);
        }
        match &envelope.event {
            Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
                seen.entry(format!("{}/{}", pod.namespace, pod.name))
                    .or_insert(at);
            }
            Event::CocoonDone { op, .. } => {
                if let Some((key, t0)) = cocoon.remove(op) {
                    *waited.entry(key).or_default() += at - t0;
                }
            }
            Event::ProbeDone {
                key, seq: probe, ..
            } => {
                if let Some(t0) = probes.remove(&(key.to_string(), *probe)) {
                    *waited.entry(key.to_string()).or_default() += at - t0;
                }
            }
            _ => {}
        }
        for a in &actions {
            match a {
                Action::RunCocoon {
                    op, key: Some(key), ..
                } => {
                    cocoon.insert(*op, (key.to_string(), at));
                }
                Action::RunProbe {
                    key, seq: probe, ..
                } => {
                    probes.insert((key.to_string(), *probe), at);
                }
                Action::PatchPod {
                    key,
                    status: Some(status),
                    ..
                } => {
                    let ready = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let key = key.to_string();
                    if let (true, Some(t0)) = (ready, seen.get(&key)) {
                        if done.insert(key.clone()) {
                            let t = (at - t0) as f64;
                            total.push(t);
                            overhead.push((t - *waited.get(&key).unwrap_or(&0) as f64).max(0.0));
                            share_us.push(*reduce_us.get(&key).unwrap_or(&0) as f64);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    for v in [&mut total, &mut overhead, &mut share_us] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    Ok(Latencies {
        total,
        overhead,
        share_us,
    })
}

/// `replay --verify` of `files` in this process: (events, events per second).
fn replay_rate(files: &[PathBuf]) -> Result<(u64, f64)> {
    let opts = vk_cocoon::replay::Options {
        files: files.to_vec(),
        verify: true,
        quiet: true,
        ..Default::default()
    };
    let t = Instant::now();
    let (summary, _) = vk_cocoon::replay::run(&opts, &mut std::io::sink())
        .map_err(|e| anyhow::anyhow!("replay --verify: {e}"))?;
    Ok((
        summary.steps,
        summary.steps as f64 / t.elapsed().as_secs_f64(),
    ))
}

/// The journal of 1,000 synthetic pods through create → ready → delete (the testkit's world),
/// as the daemon's writer stores it: (bytes on disk per event, replay --verify events/s).
fn synthetic_journal() -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("events.journal");
    let w = support::scenarios::churn(1000);
    support::journal_world(&w, &path, 64 << 20, 8);
    let files = vk_cocoon::journal::existing_files(&path, 8);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let (events, rate) = replay_rate(&files)?;
    Ok((bytes as f64 / events as f64, rate))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: run with `make bench-e2e`"]
async fn bench_many_pods() -> Result<()> {
    let n: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let img = "ghcr.io/cocoonstack/ubuntu:24.04";
    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let opts = DaemonOptions {
        env: e2e::sim::CocoonSim::at_scale_env(),
        ..DaemonOptions::default()
    };
    let mut d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    let client = tb.client()?;
    daemon::until("node lease", Duration::from_secs(60), || async {
        let leases: Api<Lease> = Api::namespaced(tb.client()?, "kube-node-lease");
        Ok(leases.get_opt(NODE).await?.map(|_| ()))
    })
    .await?;

    // Every renewTime the Lease shows while the pods are created.
    let renewals: Arc<Mutex<Vec<i64>>> = Arc::default();
    let lease_task = {
        let renewals = renewals.clone();
        let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        tokio::spawn(async move {
            let cfg =
                kube::runtime::watcher::Config::default().fields(&format!("metadata.name={NODE}"));
            let mut s = kube::runtime::watcher(api, cfg).boxed();
            while let Some(Ok(ev)) = s.next().await {
                if let kube::runtime::watcher::Event::Apply(l)
                | kube::runtime::watcher::Event::InitApply(l) = ev
                {
                    if let Some(t) = l.spec.and_then(|s| s.renew_time) {
                        renewals.lock().unwrap().push(t.0.as_millisecond());
                    }
                }
            }
        })
    };

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let t0 = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i:04}")).collect();
    futures::stream::iter(names.clone())
        .map(|name| {
            let pods = pods.clone();
            async move {
                let p = pod_manifest(NS, &name, NODE, json!({
                    "cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/name": format!("vk-{name}"),
                    "cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": img}))?;
                daemon::create_pod(&pods, &p).await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let created = t0.elapsed();
    daemon::until(
        &format!("{n} pods Ready"),
        Duration::from_secs(600),
        || async {
            let list = pods.list(&ListParams::default()).await?;
            let ready = list.items.iter().filter(|p| daemon::is_ready(p)).count();
            Ok((ready == n).then_some(()))
        },
    )
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let all_ready = t0.elapsed();

    // Steady state: nothing changes for STEADY; sample the daemon's CPU and memory, what its
    // journal grows by, and how long a /metrics scrape takes.
    let steady = Duration::from_secs(
        std::env::var("BENCH_STEADY_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    let journal_dir = journal.parent().context("dir")?.to_path_buf();
    // The first sweep after the pods came up journals the whole VM list; every later one finds
    // it in the journal's compression window and costs a few hundred bytes. Steady state
    // starts after that first sweep (every 30 s).
    tokio::time::sleep(Duration::from_secs(31)).await;
    let (bytes0, lines0) = journal_size(&journal_dir)?;
    let (cpu0, _) = usage(d.proc.pid())?;
    tokio::time::sleep(steady).await;
    let (cpu1, rss) = usage(d.proc.pid())?;
    let (bytes1, lines1) = journal_size(&journal_dir)?;
    let mut scrape_ms = Vec::new();
    // A scrape that takes longer than the client's timeout is a figure too, not the end.
    let mut scrape_timeouts = 0;
    let http = e2e::ready::http();
    for _ in 0..20 {
        let t = Instant::now();
        let got = async {
            http.get(format!("http://127.0.0.1:{metrics_port}/metrics"))
                .send()
                .await?
                .bytes()
                .await
        }
        .await;
        match got {
            Ok(_) => scrape_ms.push(t.elapsed().as_secs_f64() * 1000.0),
            Err(e) if e.is_timeout() => scrape_timeouts += 1,
            Err(e) => return Err(e.into()),
        }
    }
    scrape_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let renew = renewals.lock().unwrap().clone();
    lease_task.abort();

    // VM vanished → pod Failed, for a handful of pods.
    let mut vanish_ms = Vec::new();
    for name in names.iter().take(5) {
        let p = pods.get(name).await?;
        let id = annotation(&p, "vm.cocoonstack.io/id").context("id")?;
        let seen = watch_for(pods.clone(), name, |p| {
            phase(p) == "Failed" && terminated_reason(p).as_deref() == Some("VMGone")
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        tb.sim
            .as_ref()
            .context("sim")?
            .run(&["sim", "fault", "vanish", &id])?;
        seen.wait("vanish evicted", Duration::from_secs(30)).await?;
        vanish_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    // Delete the rest and wait for the objects to go.
    for name in names.iter().skip(5) {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    daemon::until("all pods gone", Duration::from_secs(600), || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    let by_kind = daemon::metric_series(metrics_port, "cocoon_vk_api_writes_total").await?;
    let writes: f64 = by_kind.iter().map(|(_, v)| v).sum();
    d.proc.stop();

    // For a look at what the daemon did: `BENCH_KEEP_JOURNAL=DIR make bench-e2e`, then
    // `vk-cocoon replay --pod NS/NAME DIR/*.journal*`.
    if let Some(keep) = std::env::var_os("BENCH_KEEP_JOURNAL") {
        std::fs::create_dir_all(&keep)?;
        for f in std::fs::read_dir(journal.parent().context("dir")?)? {
            let f = f?.path();
            std::fs::copy(&f, Path::new(&keep).join(f.file_name().context("name")?))?;
        }
    }
    let journal_files: Vec<PathBuf> = std::fs::read_dir(&journal_dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    let journal_bytes: u64 = journal_files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let (run_events, run_replay) = replay_rate(&journal_files)?;
    let (synthetic_bytes, synthetic_replay) = synthetic_journal()?;
    let Latencies {
        total: lat,
        overhead,
        share_us,
    } = create_to_ready(&journal)?;
    vanish_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let max_gap = renew.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    println!("bench-e2e: {n} pods, zero-boot VMs, guests in one shared hub, loopback network");
    println!("  API create calls done in {created:?}; all Ready after {all_ready:?}");
    println!(
        "  create -> Ready (daemon journal, ms): p50 {:.0}  p99 {:.0}  max {:.0}  ({} pods)",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        lat.len()
    );
    println!(
        "  of which the daemon's own reduce time (µs): p50 {:.0}  p99 {:.0}",
        percentile(&share_us, 0.5),
        percentile(&share_us, 0.99)
    );
    println!(
        "  of which daemon overhead (not in cocoon calls or probe waits, ms): p50 {:.0}  p99 {:.0}",
        percentile(&overhead, 0.5),
        percentile(&overhead, 0.99)
    );
    println!(
        "  API writes per pod lifecycle: {:.2} ({})",
        writes / n as f64,
        by_kind
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", v / n as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let secs = steady.as_secs_f64();
    println!(
        "  daemon at steady state ({secs:.0} s): RSS {:.1} MiB, CPU {:.2} % of a core",
        rss as f64 / 1048576.0,
        (cpu1 - cpu0) / secs * 100.0
    );
    println!(
        "  journal at steady state: {:.2} events/s, {:.0} B/s ({:.1} MiB/day)",
        (lines1 - lines0) as f64 / 2.0 / secs,
        (bytes1 - bytes0) as f64 / secs,
        (bytes1 - bytes0) as f64 / secs * 86400.0 / 1048576.0
    );
    println!(
        "  /metrics scrape (ms): p50 {:.1}  max {:.1}  ({} of 20 timed out after 10 s)",
        percentile(&scrape_ms, 0.5),
        scrape_ms.last().copied().unwrap_or(f64::NAN),
        scrape_timeouts
    );
    println!(
        "  VM vanished -> pod Failed/VMGone (ms): p50 {:.0}  max {:.0}",
        percentile(&vanish_ms, 0.5),
        vanish_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  node Lease renewals seen: {}, largest gap {} ms",
        renew.len(),
        max_gap
    );

    // The scale goals, one row each: the figure, the goal, what this run measured.
    let per_day = (bytes1 - bytes0) as f64 / secs * 86400.0 / 1048576.0;
    let rows = [
        (
            "steady state: daemon CPU",
            "≤ 2 % of a core".to_string(),
            format!("{:.2} %", (cpu1 - cpu0) / secs * 100.0),
        ),
        (
            "steady state: daemon RSS",
            "≤ 40 MiB".into(),
            format!("{:.1} MiB", rss as f64 / 1048576.0),
        ),
        (
            "steady state: journal growth",
            "≤ 50 MiB/day".into(),
            format!("{per_day:.1} MiB/day"),
        ),
        (
            "steady state: /metrics scrape p50",
            "≤ 20 ms".into(),
            format!("{:.1} ms", percentile(&scrape_ms, 0.5)),
        ),
        (
            "mass create: pods Ready per second",
            "≥ 100".into(),
            format!("{:.1}", n as f64 / all_ready.as_secs_f64()),
        ),
        (
            "create → Ready p50 / p99",
            "-".into(),
            format!(
                "{:.0} / {:.0} ms",
                percentile(&lat, 0.5),
                percentile(&lat, 0.99)
            ),
        ),
        (
            "daemon's own share (reduce) p50 / p99",
            "≤ 5 / 20 ms".into(),
            format!(
                "{:.0} / {:.0} µs",
                percentile(&share_us, 0.5),
                percentile(&share_us, 0.99)
            ),
        ),
        (
            "create → Ready not in cocoon or probes p50 / p99",
            "-".into(),
            format!(
                "{:.0} / {:.0} ms",
                percentile(&overhead, 0.5),
                percentile(&overhead, 0.99)
            ),
        ),
        (
            "VM vanished → pod Failed p99",
            "≤ 50 ms".into(),
            format!("{:.0} ms", percentile(&vanish_ms, 0.99)),
        ),
        (
            "replay --verify, synthetic 1,000-pod journal",
            "≥ 1 M events/s".into(),
            format!("{:.0} k events/s", synthetic_replay / 1000.0),
        ),
        (
            "replay --verify, this run's journal",
            "-".into(),
            format!(
                "{:.0} k events/s ({run_events} events)",
                run_replay / 1000.0
            ),
        ),
        (
            "journal bytes per lifecycle event (synthetic)",
            "≤ 200".into(),
            format!("{synthetic_bytes:.0}"),
        ),
        (
            "journal bytes per event (this run)",
            "-".into(),
            format!("{:.0}", journal_bytes as f64 / run_events.max(1) as f64),
        ),
    ];
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("\n| {n} pods, {build} build | goal | measured |\n|---|---|---|");
    for (figure, goal, measured) in rows {
        println!("| {figure} | {goal} | {measured} |");
    }
    ensure!(renew.len() >= 2, "too few Lease renewals observed to judge");
    ensure!(
        max_gap < 20_000,
        "the node Lease missed a renewal: a gap of {max_gap} ms (renewals every 10 s)"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}
