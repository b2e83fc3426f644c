//! Readiness probing (R1–R6). The shell runs the probes `Action::RunProbe` asks for; the
//! schedule and the debounce are decided here, so a replay reproduces every flip. A Ready
//! pod's steady probes run on a standing schedule that reports only a failure.

use crate::action::{Action, ProbeCheck, ProbeTarget};
use crate::backoff::Backoff;
use crate::dhcp;
use crate::pod::PodKey;
use crate::spec::Os;
use crate::state::{Agent, State};

/// R3 before Ready, in µs: 100, 150, 225, 337.5, 506.25, 759.375 ms, then 1 s. Kept in µs so
/// the series does not drift by rounding every step to whole milliseconds.
const NOT_READY: Backoff = Backoff::three_halves(100_000, 1_000_000);
const READY_INTERVAL_MS: u64 = 5000;
const FAILURES_TO_FLIP: u32 = 3;
/// How long the first status of a VM waits for a passing probe: R3's per-probe deadline. A
/// guest still booting or still without a lease is published not-ready once this has passed.
const FIRST_RESULT_BOUND_MS: crate::time::Millis = 3000;

/// Starts (or replaces) the pod's probe agent; the first probe runs at once (R2).
pub fn start(s: &mut State, key: &PodKey) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    e.probe.agent = Agent::AwaitingFirst;
    e.probe.started_at = now;
    e.probe.failures = 0;
    e.probe.waits = 0;
    schedule(s, key, 0, false);
}

pub fn stop(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    match e.probe.agent {
        Agent::Stopped => {}
        Agent::AwaitingFirst | Agent::Running => {
            e.probe.agent = Agent::Stopped;
            e.probe.ready = false;
            e.probe.seq += 1;
            s.emit(Action::StopProbe { key: key.clone() });
        }
    }
}

fn schedule(s: &mut State, key: &PodKey, after_ms: u64, standing: bool) {
    let Some(e) = s.pods.get_mut(key) else { return };
    // A pod whose VM went (deleted, hibernated) while its probe was due is not probed.
    let Some(vm) = e.phase.vm() else {
        return;
    };
    let port = e.spec.as_ref().ok().and_then(|sp| sp.probe_port);
    let macos = e.spec.as_ref().is_ok_and(|sp| sp.os == Os::Macos);
    let check = match (port, macos) {
        (Some(port), _) => ProbeCheck::Tcp { port },
        (None, true) => ProbeCheck::SshBanner,
        (None, false) => ProbeCheck::Icmp,
    };
    let target = ProbeTarget {
        ip: vm.ip.clone(),
        check,
    };
    e.probe.seq += 1;
    let seq = e.probe.seq;
    s.emit(Action::RunProbe {
        key: key.clone(),
        seq,
        target,
        after_ms,
        standing,
    });
}

/// R6: the pod's address changed (a new lease, or one that lapsed): the probe under way
/// targets the old one, so a new one starts at once.
pub(crate) fn retarget(s: &mut State, key: &PodKey) {
    let running = s
        .pod(key)
        .is_some_and(|e| e.probe.agent != Agent::Stopped && e.phase.vm().is_some());
    if running {
        schedule(s, key, 0, false);
    }
}

/// R4 debounce: one success makes a pod ready; three consecutive failures make it not ready.
pub fn done(s: &mut State, key: &PodKey, seq: u64, ok: bool) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.probe.agent == Agent::Stopped || seq != e.probe.seq {
        return;
    }
    // The wait for a first result ends on a success or once the bound has passed; a failure
    // inside it (no lease yet, guest not answering yet) is not worth a status of its own.
    let first_settled = ok || now.saturating_sub(e.probe.started_at) >= FIRST_RESULT_BOUND_MS;
    if e.probe.agent == Agent::AwaitingFirst && first_settled {
        e.probe.agent = Agent::Running;
        s.touched.insert(key);
    }
    let Some(e) = s.pods.get_mut(key) else { return };
    let p = &mut e.probe;
    let was_ready = p.ready;
    // Only a Ready pod with no failure counted probes on a standing schedule: every other
    // result changes what the core holds (a failure to count, a recovery, a flip).
    let (next, standing) = if ok {
        p.failures = 0;
        p.ready = true;
        (READY_INTERVAL_MS, true)
    } else if p.ready {
        p.failures += 1;
        if p.failures >= FAILURES_TO_FLIP {
            p.ready = false;
            p.failures = 0;
            p.waits = 1;
            (NOT_READY.after(1) / 1000, false)
        } else {
            (READY_INTERVAL_MS, false)
        }
    } else {
        p.waits += 1;
        (NOT_READY.after(p.waits) / 1000, false)
    };
    if p.ready != was_ready {
        e.ready_changed_at = Some(now);
        s.touched.insert(key);
    }
    if ok {
        crate::latency::probe_ok(s, key);
    }
    // R6: every tick re-resolves a DHCP VM's IP; the tracked IP is only a cache.
    dhcp::refresh_ip(s, key);
    schedule(s, key, next, standing);
}
