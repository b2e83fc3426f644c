//! Per pod times and per call durations, read back from the daemon's journal: the daemon's own
//! view, in the wall milliseconds it stamps every event with.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::{Action, Event};

/// Per pod, wall ms from the journal (and the create call for `created`).
#[derive(Default, Clone)]
pub struct PodTimes {
    pub created: i64,
    pub seen: Option<i64>,
    pub vm_call: Option<i64>,
    pub vm_running: Option<i64>,
    pub ready: Option<i64>,
    /// The Warning that the post-clone fix-up cannot run (reference release).
    pub warned: Option<i64>,
    /// The status write carrying `lifecycle-state=failed`.
    pub failed: Option<i64>,
}

/// What the journal says: per pod times, and each cocoon verb's call durations (ms).
pub struct JournalFigures {
    pub pods: BTreeMap<String, PodTimes>,
    pub calls: BTreeMap<String, Vec<f64>>,
    pub failed_calls: BTreeMap<String, usize>,
    /// Due → answered, ms: (answered, failed).
    pub probes: (Vec<f64>, Vec<f64>),
}

fn verb(cmd: &CocoonCmd) -> String {
    serde_json::to_value(cmd)
        .ok()
        .and_then(|v| v["verb"].as_str().map(|s| s.replace('_', " ")))
        .unwrap_or_else(|| "?".into())
}

pub fn read(journal: &Path, created: &BTreeMap<String, i64>) -> Result<JournalFigures> {
    let dir = journal.parent().context("dir")?;
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
    for step in vk_cocoon::journal::Reader::open_dir(dir)?.steps() {
        let vk_cocoon::journal::Step {
            envelope, actions, ..
        } = step?;
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
pub fn spans(
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
