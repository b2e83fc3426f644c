//! A Running pod's VM, watched (W1–W5). A stream event or a sweep finding is only a hint: the
//! VM is inspected first, and only cocoon's explicit not-found evicts. A stopped VM is
//! restarted in place unless its last restart was under 30 s ago.

use crate::action::{Action, Counter, Level, Timer};
use crate::backoff::Backoff;
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, VmEventKind};
use crate::phase::{Call, EvictReason, Phase, VmStep, VmTask};
use crate::pod::PodKey;
use crate::state::{CocoonOwner, PodEntry, State, StreamState};
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};
use crate::{evict, outcome, tracking};

const RESTART_COOLDOWN_MS: i64 = 30_000;
const COOLDOWN_GC_MS: i64 = 60_000;
/// W4: the second inspect follows the first after 200 ms.
const INLINE_RETRY_MS: u64 = 200;
/// W5: deferred rechecks, 1 s doubling to 30 s, within a 30 min budget.
const RECHECK: Backoff = Backoff::doubling(1000, 30_000);
const RECHECK_BUDGET_MS: i64 = 30 * 60 * 1000;

pub fn stream_event(s: &mut State, kind: VmEventKind, vm: VmRecord) {
    // T10: the node's VM table, which unmanaged pods' claims are checked against.
    let now = s.now;
    match kind {
        VmEventKind::Added | VmEventKind::Modified => s.node_vms.reported(&vm, now),
        VmEventKind::Deleted => {
            if s.node_vms.deleted(&vm.id) && s.started() {
                crate::unmanaged::vm_gone(s, &vm.id);
            }
        }
    }
    // W3: a record that says `running` is no hint. Every (re)connect begins with `ADDED` for
    // each VM (CLI-7), and one that is not running then is how a VM that stopped while
    // nothing watched (the process was down, the stream reconnecting) is found: `vm list`
    // still shows its stored state.
    let hints = match kind {
        VmEventKind::Deleted => true,
        VmEventKind::Added | VmEventKind::Modified => !vm.is_running(),
    };
    if !s.started() || !hints {
        return;
    }
    let key = s.vm_ids.get(&vm.id).or_else(|| {
        (!vm.name.is_empty())
            .then(|| s.vm_names.get(&vm.name))
            .flatten()
    });
    let Some(key) = key.cloned() else { return };
    if !s.pod(&key).is_some_and(hintable) {
        return;
    }
    crate::latency::vm_event(s, &key);
    let Some(e) = s.pods.get_mut(&key) else {
        return;
    };
    // `hintable` holds only for a Running pod. One operation at a time: the hint waits for
    // the one out, which may have looked at the VM before this change (a removal racing a
    // restart).
    if let Phase::Running(r) = &mut e.phase {
        match &mut r.task {
            Some(task) => task.hint_deferred = true,
            None => hint(s, &key),
        }
    }
}

/// Whether a hint about this pod's VM (a stream event, a sweep finding) may be acted on: a
/// Running pod whose VM vk manages and that is not asked to hibernate.
pub(crate) fn hintable(e: &PodEntry) -> bool {
    match &e.phase {
        // cocoon's stream and list never show a macOS guest: its sweep is its own (R10).
        Phase::Running(r) => {
            r.vm.managed()
                && !e.spec.as_ref().is_ok_and(|sp| sp.hibernate)
                && !crate::macos::is_macos(e)
        }
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => false,
    }
}

/// W4: inspect the tracked VM before believing anything.
pub fn hint(s: &mut State, key: &PodKey) {
    let Some(Phase::Running(r)) = s.pod(key).map(|e| &e.phase) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: hint found it not Running"));
    };
    let id = r.vm.record.id.clone();
    let step = VmStep::Recover {
        attempt: 1,
        first_failure: None,
    };
    task(s, key, step, CocoonCmd::VmInspect { vm: id }, false);
}

/// Sends a task's cocoon call and records it as the pod's one operation.
fn task(s: &mut State, key: &PodKey, step: VmStep, cmd: CocoonCmd, hint_deferred: bool) {
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    if let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        r.task = Some(VmTask {
            step,
            call: Call::Out(op),
            hint_deferred,
        });
    }
}

/// A task that waits on a timer before its call.
fn wait(s: &mut State, key: &PodKey, step: VmStep, after_ms: u64, hint_deferred: bool) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Running(r) = &mut e.phase else {
        return crate::outcome::unexpected(s, &format!("pod {key}: wait found it not Running"));
    };
    r.task = Some(VmTask {
        step,
        call: Call::Timer,
        hint_deferred,
    });
    let uid = e.pod.uid.clone();
    s.emit(Action::ArmTimer {
        timer: Timer::Recheck {
            key: key.clone(),
            uid,
        },
        after_ms,
    });
}

pub fn stream_closed(s: &mut State, clean: bool) {
    // Whatever happened until the reconnect went unreported: the reconnect sweeps (R11).
    s.stream = StreamState::Gap;
    if clean {
        let now = s.now;
        s.restarts.retain(|_, at| now - *at < COOLDOWN_GC_MS);
    }
}

/// The outcome of the Running pod's task call (the router checked it is this task's).
pub(crate) fn task_done(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: task_done found it not Running"),
        );
    };
    let Some(done) = r.task.take() else { return };
    let id = r.vm.record.id.clone();
    let deferred = done.hint_deferred;
    step_done(s, key, done.step, id, result, deferred);
    // U2: a hibernate asked for while the task was out starts once it is done.
    if crate::hibernate::wanted(s, key) {
        return crate::hibernate::begin(s, key, 0);
    }
    // A hint that waited for this task: carried to the next task, or taken up now.
    if deferred {
        match s.pods.get_mut(key).map(|e| &mut e.phase) {
            Some(Phase::Running(r)) => match &mut r.task {
                Some(next) => next.hint_deferred = true,
                None => {
                    if s.pod(key).is_some_and(hintable) {
                        hint(s, key);
                    }
                }
            },
            Some(
                Phase::Waiting
                | Phase::Failed(_)
                | Phase::Creating(_)
                | Phase::Evicting(_)
                | Phase::Hibernating(_)
                | Phase::Hibernated
                | Phase::Deleting(_)
                | Phase::Terminal(_)
                | Phase::Gone(_),
            )
            | None => {}
        }
    }
}

fn step_done(
    s: &mut State,
    key: &PodKey,
    step: VmStep,
    id: String,
    result: Result<CocoonOk, CocoonError>,
    deferred: bool,
) {
    use CocoonErrorKind::VmNotFound;
    match step {
        VmStep::Recover {
            attempt,
            first_failure,
        } => match result {
            Err(CocoonError {
                kind: VmNotFound, ..
            }) => evict::begin(s, key, EvictReason::VmGone, "vm no longer exists"),
            Ok(CocoonOk::Vm { vm }) if vm.is_running() => refresh(s, key, vm),
            Ok(CocoonOk::Vm { vm }) => not_running(s, key, vm, deferred),
            Err(_) => inconclusive(s, key, attempt, first_failure, deferred),
            Ok(other) => {
                outcome::unexpected(s, &format!("pod {key}: vm inspect {id} answered {other:?}"));
                inconclusive(s, key, attempt, first_failure, deferred)
            }
        },
        VmStep::Restart => match result {
            Ok(CocoonOk::Done) => {
                let step = VmStep::InspectAfterRestart;
                task(s, key, step, CocoonCmd::VmInspect { vm: id }, deferred)
            }
            // Only cocoon's not-found proves the VM gone: it was removed while restarting.
            Err(CocoonError {
                kind: VmNotFound, ..
            }) => evict::begin(s, key, EvictReason::VmGone, "vm no longer exists"),
            Err(err) => {
                let step = VmStep::RemoveForEvict {
                    reason: EvictReason::RestartFailed,
                    message: err.message,
                };
                task(s, key, step, CocoonCmd::VmRm { id }, deferred)
            }
            Ok(other) => {
                // The start may have worked: look at the VM rather than guess.
                outcome::unexpected(s, &format!("pod {key}: vm start {id} answered {other:?}"));
                let step = VmStep::InspectAfterRestart;
                task(s, key, step, CocoonCmd::VmInspect { vm: id }, deferred)
            }
        },
        VmStep::InspectAfterRestart => match result {
            Ok(CocoonOk::Vm { vm }) if vm.is_running() => refresh(s, key, vm),
            // Down again right after its restart: W4's cooldown decides.
            Ok(CocoonOk::Vm { vm }) => not_running(s, key, vm, deferred),
            Err(CocoonError {
                kind: VmNotFound, ..
            }) => evict::begin(s, key, EvictReason::VmGone, "vm no longer exists"),
            // Inconclusive: the restart went through; the stream or the sweep reports more.
            Err(_) => {}
            Ok(other) => {
                outcome::unexpected(s, &format!("pod {key}: vm inspect {id} answered {other:?}"))
            }
        },
        VmStep::MacosStart => crate::macos::restarted(s, key, result),
        VmStep::RemoveForEvict { reason, message } => match result {
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: VmNotFound, ..
            }) => evict::begin(s, key, reason, &message),
            Err(err) => kept_after_failed_rm(s, key, &err.message, deferred),
            Ok(other) => {
                outcome::unexpected(s, &format!("pod {key}: vm rm {id} answered {other:?}"));
                kept_after_failed_rm(s, key, "unexpected answer from cocoon", deferred)
            }
        },
    }
}

fn kept_after_failed_rm(s: &mut State, key: &PodKey, why: &str, deferred: bool) {
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!(
            "pod {key}: vm rm failed, keeping the pod so its name is not reused: {why}"
        ),
    });
    // W4 keeps the pod, but a stopped VM sends no further events: without a W5 recheck
    // (which replays W4) the pod would stay NotReady forever.
    let now = s.now;
    let step = VmStep::Recover {
        attempt: 3,
        first_failure: Some(now),
    };
    wait(s, key, step, RECHECK.after(1), deferred);
}

/// W4 "any other state": restart in place unless the last restart was under 30 s ago.
fn not_running(s: &mut State, key: &PodKey, vm: VmRecord, deferred: bool) {
    let now = s.now;
    let id = vm.id.clone();
    match s.restarts.get(&id) {
        Some(at) if now - at < RESTART_COOLDOWN_MS => {
            let step = VmStep::RemoveForEvict {
                reason: EvictReason::RestartCooldown,
                message: "restart cooldown not elapsed".into(),
            };
            task(s, key, step, CocoonCmd::VmRm { id }, deferred);
        }
        Some(_) | None => {
            s.restarts.insert(id.clone(), now);
            s.emit(Action::Log {
                level: Level::Info,
                message: format!(
                    "pod {key}: VM {id} is {:?}; restarting it in place",
                    vm.state
                ),
            });
            task(s, key, VmStep::Restart, CocoonCmd::VmStart { id }, deferred);
        }
    }
}

/// The VM is fine: keep the fresher record (PID and NICs feed the stats).
fn refresh(s: &mut State, key: &PodKey, vm: VmRecord) {
    let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: refresh found it not Running"));
    };
    if r.vm.record.id != vm.id {
        return;
    }
    let old = r.vm.clone();
    // The IP stays: it is re-resolved right away, and before the lease file is read the
    // cached one is all there is.
    r.vm.record = vm;
    tracking::unindex(s, key, &old);
    tracking::indexed(s, key);
    crate::latency::vm_event_settled(s, key);
}

fn inconclusive(
    s: &mut State,
    key: &PodKey,
    attempt: u32,
    first_failure: Option<i64>,
    deferred: bool,
) {
    let now = s.now;
    let first = first_failure.unwrap_or(now);
    let next = VmStep::Recover {
        attempt: attempt + 1,
        first_failure: Some(first),
    };
    if attempt < 2 {
        return wait(s, key, next, INLINE_RETRY_MS, deferred);
    }
    if attempt == 2 {
        s.emit(Action::Count {
            counter: Counter::VmInspectTransientFail,
        });
    }
    if now - first >= RECHECK_BUDGET_MS {
        return evict::begin(
            s,
            key,
            EvictReason::VmInspectTimeout,
            "vm inspect did not resolve within budget",
        );
    }
    wait(s, key, next, RECHECK.after(attempt - 1), deferred);
}

/// The recheck timer: the inspect that waited runs now.
pub(crate) fn recheck(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    let r = match &mut e.phase {
        Phase::Running(r) => r,
        // The pod left Running (deleted, evicted) while the timer ran: its task ended with it.
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => return,
    };
    let Some(VmTask {
        step: step @ VmStep::Recover { .. },
        call: Call::Timer,
        hint_deferred,
    }) = r.task.clone()
    else {
        return;
    };
    let id = r.vm.record.id.clone();
    task(s, key, step, CocoonCmd::VmInspect { vm: id }, hint_deferred);
}
