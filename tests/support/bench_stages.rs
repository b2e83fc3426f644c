//! Where each pod's time goes from create to Ready and from delete to gone, per stage, for
//! the null node's run and the daemon's: the bench's watch gives created, bound, Ready,
//! deleting and gone; the node gives its own steps between bound and Ready (the null node's
//! record, the daemon's journal).

use std::collections::{BTreeMap, HashMap};

use e2e::null_node::PodTrace;

use crate::journal_stages::Latencies;
use crate::mass::{p50_p99, spans, Mass};

/// The namespace both runs' pods are in.
const NS: &str = "default";

/// One pod's steps in one run, wall ms: the watch's, and the node's own (the null node's
/// record, or the daemon's journal).
#[derive(Default)]
pub struct Steps {
    sent: Option<f64>,
    returned: Option<f64>,
    added: Option<f64>,
    bound: Option<f64>,
    node_seen: Option<f64>,
    vm_call: Option<f64>,
    vm_running: Option<f64>,
    ip_probe: Option<f64>,
    probe_ok: Option<f64>,
    write_out: Option<f64>,
    write_done: Option<f64>,
    ready: Option<f64>,
    del_sent: Option<f64>,
    deleting: Option<f64>,
    gone: Option<f64>,
}

/// What the watch saw, by pod name.
fn watched(m: &Mass) -> BTreeMap<String, Steps> {
    m.created
        .sent
        .keys()
        .map(|name| {
            let s = m.seen.get(name).cloned().unwrap_or_default();
            let steps = Steps {
                sent: m.created.sent.get(name).copied(),
                returned: m.created.returned.get(name).copied(),
                added: s.added,
                bound: s.bound,
                ready: s.ready,
                del_sent: m.deleted.sent.get(name).copied(),
                deleting: s.deleting,
                gone: s.gone,
                ..Steps::default()
            };
            (name.clone(), steps)
        })
        .collect()
}

pub fn null_steps(m: &Mass, traces: &HashMap<String, PodTrace>) -> Vec<Steps> {
    let mut all = watched(m);
    for (name, s) in all.iter_mut() {
        if let Some(t) = traces.get(&format!("{NS}/{name}")) {
            s.node_seen = Some(t.seen);
            s.write_out = t.status_sent;
            s.write_done = t.status_done;
        }
    }
    all.into_values().collect()
}

pub fn daemon_steps(m: &Mass, lat: &Latencies) -> Vec<Steps> {
    let mut all = watched(m);
    let ms = |t: Option<i64>| t.map(|t| t as f64);
    for (name, s) in all.iter_mut() {
        if let Some(p) = lat.pods.get(&format!("{NS}/{name}")) {
            s.node_seen = ms(p.seen);
            s.vm_call = ms(p.vm_call);
            s.vm_running = ms(p.vm_running);
            s.ip_probe = ms(p.ip_probe);
            s.probe_ok = ms(p.probe_ok);
            s.write_out = ms(p.ready_out);
            s.write_done = ms(p.ready_done);
        }
    }
    all.into_values().collect()
}

type At = fn(&Steps) -> Option<f64>;

/// Each stage: what it is, from, to.
const STAGES: &[(&str, At, At)] = &[
    ("create call sent → returned", |s| s.sent, |s| s.returned),
    (
        "create call sent → seen by the watch",
        |s| s.sent,
        |s| s.added,
    ),
    (
        "seen → bound (kube-scheduler's binding)",
        |s| s.added,
        |s| s.bound,
    ),
    (
        "bound → first seen by the node",
        |s| s.bound,
        |s| s.node_seen,
    ),
    (
        "first seen by the node → Ready status write sent",
        |s| s.node_seen,
        |s| s.write_out,
    ),
    (
        "  of which: first seen → `vm run` sent",
        |s| s.node_seen,
        |s| s.vm_call,
    ),
    (
        "  of which: `vm run` sent → its outcome",
        |s| s.vm_call,
        |s| s.vm_running,
    ),
    (
        "  of which: VM running → Ready write sent (probes)",
        |s| s.vm_running,
        |s| s.write_out,
    ),
    (
        "    of which: VM running → first probe with the lease's IP",
        |s| s.vm_running,
        |s| s.ip_probe,
    ),
    (
        "    of which: that probe sent → first probe success",
        |s| s.ip_probe,
        |s| s.probe_ok,
    ),
    (
        "    of which: first probe success → Ready write sent",
        |s| s.probe_ok,
        |s| s.write_out,
    ),
    (
        "Ready write sent → its outcome back at the node",
        |s| s.write_out,
        |s| s.write_done,
    ),
    (
        "outcome back → Ready seen by the watch",
        |s| s.write_done,
        |s| s.ready,
    ),
    (
        "create call sent → Ready seen (all of it)",
        |s| s.sent,
        |s| s.ready,
    ),
    (
        "delete call sent → deletion seen",
        |s| s.del_sent,
        |s| s.deleting,
    ),
    ("deletion seen → gone seen", |s| s.deleting, |s| s.gone),
    (
        "delete call sent → gone seen (all of it)",
        |s| s.del_sent,
        |s| s.gone,
    ),
];

pub fn print_stages(null: &[Steps], daemon: &[Steps]) {
    println!(
        "\nwhere each pod's time goes, ms p50 / p99. Created, bound, Ready, deletion and gone are \
         this process's watch receive times; the node's steps are the null node's own record \
         (its HTTP calls) or the daemon's journal (when its loop took the event or decided the \
         action, ms resolution: queueing in the daemon counts there). One clock, but a watch \
         can see a change after the node does, so a stage can be negative."
    );
    println!("| stage | null node | daemon |\n|---|---|---|");
    for (what, from, to) in STAGES {
        let (a, b) = (spans(null, from, to), spans(daemon, from, to));
        println!("| {what} | {} | {} |", p50_p99(&a), p50_p99(&b));
    }
}
