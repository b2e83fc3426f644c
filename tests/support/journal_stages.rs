//! Create → Ready per pod from the daemon's own journal, in the wall milliseconds it stamps
//! every event with: the totals the scale table reports, and each pod's steps (first seen,
//! the VM call out and back, the Ready status write out and back) for where the time goes;
//! and how fast `replay --verify` reads this journal and a synthetic one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::{Action, Event};

/// One pod's steps until Ready, wall ms.
#[derive(Clone, Debug, Default)]
pub struct DaemonPod {
    /// The pod's first event in the daemon.
    pub seen: Option<i64>,
    /// `vm run` or `vm clone` sent, and its successful outcome back.
    pub vm_call: Option<i64>,
    pub vm_running: Option<i64>,
    /// The first probe sent with the guest's IP (the lease was read), and the first probe
    /// that succeeded.
    pub ip_probe: Option<i64>,
    pub probe_ok: Option<i64>,
    /// The status patch that makes it Ready, decided, and its outcome back.
    pub ready_out: Option<i64>,
    pub ready_done: Option<i64>,
}

/// Per pod, from the daemon's own journal, sorted.
pub struct Latencies {
    /// Create → Ready pushed, ms.
    pub total: Vec<f64>,
    /// The part of it not spent inside cocoon calls or probe waits, ms (the journal's
    /// millisecond times: it holds the waits on the apiserver and the daemon's queues too).
    pub overhead: Vec<f64>,
    /// The daemon's own reduce time on the pod's steps until Ready, µs (`reduce_us`).
    pub share_us: Vec<f64>,
    /// Each pod's steps, by `namespace/name`.
    pub pods: BTreeMap<String, DaemonPod>,
}

/// What is open between an action and its outcome.
#[derive(Default)]
struct Open {
    cocoon: BTreeMap<u64, (String, i64, bool)>,
    probes: BTreeMap<(String, u64), i64>,
    ready_writes: BTreeMap<u64, String>,
}

pub fn create_to_ready(journal: &Path) -> Result<Latencies> {
    let dir = journal.parent().context("dir")?;
    let mut open = Open::default();
    let mut waited: BTreeMap<String, i64> = BTreeMap::new();
    let mut done: BTreeSet<String> = Default::default();
    let mut reduce_us: BTreeMap<String, u64> = BTreeMap::new();
    let mut pods: BTreeMap<String, DaemonPod> = BTreeMap::new();
    let (mut total, mut overhead, mut share_us) = (Vec::new(), Vec::new(), Vec::new());
    for step in vk_cocoon::journal::Reader::open_dir(dir)?.steps() {
        let vk_cocoon::journal::Step {
            envelope,
            actions,
            reduce_us: step_us,
        } = step?;
        let at = envelope.at;
        for key in about(&envelope.event, &actions, &open)
            .into_iter()
            .filter(|k| !done.contains(k))
        {
            *reduce_us.entry(key).or_default() += step_us.unwrap_or(0);
        }
        outcome(&envelope.event, at, &mut open, &mut waited, &mut pods);
        for a in &actions {
            match a {
                Action::RunCocoon {
                    op,
                    key: Some(key),
                    cmd,
                } => {
                    let brings_up =
                        matches!(cmd, CocoonCmd::VmRun { .. } | CocoonCmd::VmClone { .. });
                    if brings_up {
                        let p = pods.entry(key.to_string()).or_default();
                        p.vm_call.get_or_insert(at);
                    }
                    open.cocoon.insert(*op, (key.to_string(), at, brings_up));
                }
                Action::RunProbe {
                    key,
                    seq: probe,
                    target,
                    ..
                } => {
                    open.probes.insert((key.to_string(), *probe), at);
                    if target.ip.is_some() {
                        let p = pods.entry(key.to_string()).or_default();
                        p.ip_probe.get_or_insert(at);
                    }
                }
                Action::PatchPod {
                    op,
                    key,
                    status: Some(status),
                    ..
                } => {
                    let ready = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let key = key.to_string();
                    let seen = pods.get(&key).and_then(|p| p.seen);
                    if let (true, Some(t0)) = (ready, seen) {
                        if done.insert(key.clone()) {
                            let t = (at - t0) as f64;
                            total.push(t);
                            overhead.push((t - *waited.get(&key).unwrap_or(&0) as f64).max(0.0));
                            share_us.push(*reduce_us.get(&key).unwrap_or(&0) as f64);
                            pods.entry(key.clone()).or_default().ready_out = Some(at);
                            open.ready_writes.insert(*op, key);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    for v in [&mut total, &mut overhead, &mut share_us] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    Ok(Latencies {
        total,
        overhead,
        share_us,
        pods,
    })
}

/// Every pod a step is about: its event's, and those its actions are for.
fn about(event: &Event, actions: &[Action], open: &Open) -> BTreeSet<String> {
    let mut about = BTreeSet::new();
    match event {
        Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
            about.insert(format!("{}/{}", pod.namespace, pod.name));
        }
        Event::CocoonDone { op, .. } => {
            if let Some((key, _, _)) = open.cocoon.get(op) {
                about.insert(key.clone());
            }
        }
        Event::ProbeDone { key, .. } => {
            about.insert(key.to_string());
        }
        _ => {}
    }
    for a in actions {
        if let Action::RunCocoon { key: Some(k), .. }
        | Action::RunProbe { key: k, .. }
        | Action::PatchPod { key: k, .. } = a
        {
            about.insert(k.to_string());
        }
    }
    about
}

/// A step's event: a pod first seen, or the outcome of something open.
fn outcome(
    event: &Event,
    at: i64,
    open: &mut Open,
    waited: &mut BTreeMap<String, i64>,
    pods: &mut BTreeMap<String, DaemonPod>,
) {
    match event {
        Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
            let p = pods
                .entry(format!("{}/{}", pod.namespace, pod.name))
                .or_default();
            p.seen.get_or_insert(at);
        }
        Event::CocoonDone { op, result } => {
            if let Some((key, t0, brings_up)) = open.cocoon.remove(op) {
                *waited.entry(key.clone()).or_default() += at - t0;
                if brings_up && result.is_ok() {
                    pods.entry(key).or_default().vm_running.get_or_insert(at);
                }
            }
        }
        Event::ProbeDone {
            key,
            seq: probe,
            ok,
            ..
        } => {
            if let Some(t0) = open.probes.remove(&(key.to_string(), *probe)) {
                *waited.entry(key.to_string()).or_default() += at - t0;
            }
            if *ok {
                let p = pods.entry(key.to_string()).or_default();
                p.probe_ok.get_or_insert(at);
            }
        }
        Event::KubeDone { op, .. } => {
            if let Some(key) = open.ready_writes.remove(op) {
                pods.entry(key).or_default().ready_done = Some(at);
            }
        }
        _ => {}
    }
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
    let w = crate::support::scenarios::churn(1000);
    crate::support::journal_world(&w, &path, 64 << 20, 8);
    let files = vk_cocoon::journal::existing_files(&path, 8);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let (events, rate) = replay_rate(&files)?;
    Ok((bytes as f64 / events as f64, rate))
}

/// `replay --verify` and the journal's size, of this run's journal and a synthetic one.
pub struct Replay {
    pub run_events: u64,
    pub run_rate: f64,
    pub run_bytes: u64,
    pub synthetic_bytes: f64,
    pub synthetic_rate: f64,
}

pub fn replay_figures(journal_dir: &Path) -> Result<Replay> {
    let journal_files: Vec<PathBuf> = std::fs::read_dir(journal_dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    let run_bytes: u64 = journal_files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let (run_events, run_rate) = replay_rate(&journal_files)?;
    let (synthetic_bytes, synthetic_rate) = synthetic_journal()?;
    Ok(Replay {
        run_events,
        run_rate,
        run_bytes,
        synthetic_bytes,
        synthetic_rate,
    })
}
