//! Readiness probing (spec/behavior.md §6). The shell runs one probe per `Action::Probe`; the
//! schedule and the debounce are decided here, so a replay reproduces every flip.

use crate::action::{Action, ProbeCheck, ProbeTarget};
use crate::leases;
use crate::pod::PodKey;
use crate::spec::Os;
use crate::state::State;

/// Kept in µs: R3's series (100, 150, 225, 337.5, 506.25, 759.375 ms, cap 1 s) must not
/// drift by rounding every step to whole milliseconds.
const FIRST_BACKOFF_US: u64 = 100_000;
const MAX_BACKOFF_US: u64 = 1_000_000;
const FIRST_BACKOFF_MS: u64 = FIRST_BACKOFF_US / 1000;
const READY_INTERVAL_MS: u64 = 5000;
const FAILURES_TO_FLIP: u32 = 3;
/// How long the first status of a VM waits for a passing probe: R3's per-probe deadline. A
/// guest still booting or still without a lease is published not-ready once this has passed.
const FIRST_RESULT_BOUND_MS: crate::time::Millis = 3000;

/// Starts (or replaces) the pod's probe agent; the first probe runs at once (R2).
pub fn start(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.probe.active = true;
    e.probe.awaiting_first = true;
    e.probe.started_at = s.now;
    e.probe.failures = 0;
    e.probe.backoff_us = FIRST_BACKOFF_US;
    schedule(s, key, 0);
}

pub fn stop(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.probe.active {
        e.probe.active = false;
        e.probe.ready = false;
        e.probe.seq += 1;
        s.emit(Action::StopProbe { key: key.clone() });
    }
}

fn schedule(s: &mut State, key: &PodKey, after_ms: u64) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Some(vm) = &e.vm else { return };
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
    let probe = e.probe.seq;
    s.emit(Action::Probe {
        key: key.clone(),
        probe,
        target,
        after_ms,
    });
}

/// R4 debounce: one success makes a pod ready; three consecutive failures make it not ready.
pub fn done(s: &mut State, key: &PodKey, seq: u64, ok: bool, _detail: &str) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    if !e.probe.active || seq != e.probe.seq {
        return;
    }
    // The wait for a first result ends on a success or once the bound has passed; a failure
    // inside it (no lease yet, guest not answering yet) is not worth a status of its own.
    let first_settled = ok || now.saturating_sub(e.probe.started_at) >= FIRST_RESULT_BOUND_MS;
    if e.probe.awaiting_first && first_settled {
        e.probe.awaiting_first = false;
        s.touched.insert(key);
    }
    let Some(e) = s.pods.get_mut(key) else { return };
    let p = &mut e.probe;
    let was_ready = p.ready;
    let next = if ok {
        p.failures = 0;
        p.ready = true;
        READY_INTERVAL_MS
    } else if p.ready {
        p.failures += 1;
        if p.failures >= FAILURES_TO_FLIP {
            p.ready = false;
            p.failures = 0;
            p.backoff_us = FIRST_BACKOFF_US * 3 / 2;
            FIRST_BACKOFF_MS
        } else {
            READY_INTERVAL_MS
        }
    } else {
        let wait = p.backoff_us.max(FIRST_BACKOFF_US);
        p.backoff_us = (wait * 3 / 2).min(MAX_BACKOFF_US);
        wait / 1000
    };
    if p.ready != was_ready {
        e.ready_changed_at = Some(now);
        s.touched.insert(key);
    }
    // R6: every tick re-resolves a DHCP VM's IP; the tracked IP is only a cache.
    leases::refresh_ip(s, key);
    schedule(s, key, next);
}
