//! Reactions to cocoon's VM event stream (seed 000, spec/behavior.md §10). A stream event is
//! only a hint: the VM is inspected first, and only cocoon's explicit not-found evicts.

use crate::action::{Action, Counter, Level, Timer};
use crate::cocoon::CocoonCmd;
use crate::create;
use crate::event::{CocoonOk, VmEventKind};
use crate::pod::PodKey;
use crate::state::{Busy, OpOwner, PodEntry, State, Step, Terminal};
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};

const RESTART_COOLDOWN_MS: i64 = 30_000;
const COOLDOWN_GC_MS: i64 = 60_000;
const INLINE_RETRY_MS: u64 = 200;
const RECHECK_FIRST_MS: u64 = 1000;
const RECHECK_MAX_MS: u64 = 30_000;
const RECHECK_BUDGET_MS: i64 = 30 * 60 * 1000;
const EVICT_RETRY_MS: [u64; 2] = [200, 400];

pub fn stream_event(s: &mut State, kind: VmEventKind, vm: VmRecord) {
    if !s.started
        || kind == VmEventKind::Added
        || (kind == VmEventKind::Modified && vm.is_running())
    {
        return;
    }
    let key = s.vm_ids.get(&vm.id).or_else(|| {
        (!vm.name.is_empty())
            .then(|| s.vm_names.get(&vm.name))
            .flatten()
    });
    let Some(key) = key.cloned() else { return };
    let Some(e) = s.pods.get_mut(&key) else {
        return;
    };
    if !hintable(e) {
        return;
    }
    if e.busy.is_some() {
        // One operation at a time: the hint waits for the one in flight, which may have
        // looked at the VM before this change (a removal racing a restart).
        e.hint_pending = true;
        return;
    }
    hint(s, &key);
}

/// Whether a hint about this pod's VM (a stream event, a sweep finding) may be acted on: a
/// VM vk manages, with no delete, eviction or hibernate under way. A busy pod defers it.
pub(crate) fn hintable(e: &PodEntry) -> bool {
    e.vm.as_ref().is_some_and(|v| !v.unmanaged)
        && !e.deleting
        && e.terminal.is_none()
        && e.delete_op.is_none()
        && !e.spec.as_ref().is_ok_and(|sp| sp.hibernate)
}

/// A hint that arrived while an operation was in flight, taken up once it is done.
pub(crate) fn take_pending_hint(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get(key) else { return };
    if e.hint_pending && e.busy.is_none() && hintable(e) {
        hint(s, key);
    } else if e.busy.is_none() {
        if let Some(e) = s.pods.get_mut(key) {
            e.hint_pending = false;
        }
    }
}

/// W4: inspect the tracked VM before believing anything.
pub fn hint(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.hint_pending = false;
    let Some(vm) = &e.vm else { return };
    let id = vm.record.id.clone();
    create::run_step(
        s,
        key,
        Step::Recover {
            attempt: 1,
            first_failure: None,
            delay_ms: 0,
        },
        CocoonCmd::VmInspect { vm: id },
    );
}

pub fn stream_closed(s: &mut State, clean: bool) {
    // Whatever happened until the reconnect went unreported: the reconnect sweeps (R11).
    s.stream_gap = true;
    if clean {
        let now = s.now;
        s.restarts.retain(|_, at| now - *at < COOLDOWN_GC_MS);
    }
}

pub fn step_done(s: &mut State, key: &PodKey, step: Step, result: Result<CocoonOk, CocoonError>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.busy = None;
    if e.deleting {
        crate::delete::proceed(s, key);
        return;
    }
    let Some(id) = e.vm.as_ref().map(|v| v.record.id.clone()) else {
        return;
    };
    match (step, result) {
        (
            Step::Recover { .. },
            Err(CocoonError {
                kind: CocoonErrorKind::VmNotFound,
                ..
            }),
        ) => evict(s, key, "VMGone", "vm no longer exists"),
        (Step::Recover { .. }, Ok(CocoonOk::Vm { vm })) if vm.is_running() => refresh(s, key, vm),
        (Step::Recover { .. }, Ok(CocoonOk::Vm { vm })) => not_running(s, key, vm),
        (
            Step::Recover {
                attempt,
                first_failure,
                delay_ms,
            },
            Err(_) | Ok(_),
        ) => inconclusive(s, key, attempt, first_failure, delay_ms),
        (Step::Restart, Ok(_)) => create::run_step(
            s,
            key,
            Step::InspectAfterRestart,
            CocoonCmd::VmInspect { vm: id },
        ),
        // Only cocoon's not-found proves the VM gone: it was removed while being restarted.
        (
            Step::Restart | Step::InspectAfterRestart,
            Err(CocoonError {
                kind: CocoonErrorKind::VmNotFound,
                ..
            }),
        ) => evict(s, key, "VMGone", "vm no longer exists"),
        (Step::Restart, Err(err)) => {
            let step = Step::RemoveForEvict {
                reason: "RestartFailed".into(),
                message: err.message,
            };
            create::run_step(s, key, step, CocoonCmd::VmRm { id });
        }
        (Step::InspectAfterRestart, Ok(CocoonOk::Vm { vm })) if vm.is_running() => {
            refresh(s, key, vm)
        }
        // Down again right after its restart: W4's cooldown decides.
        (Step::InspectAfterRestart, Ok(CocoonOk::Vm { vm })) => not_running(s, key, vm),
        (Step::InspectAfterRestart, _) => {}
        (
            Step::RemoveForEvict { reason, message },
            Ok(_)
            | Err(CocoonError {
                kind: CocoonErrorKind::VmNotFound,
                ..
            }),
        ) => evict(s, key, &reason, &message),
        (Step::RemoveForEvict { .. }, Err(err)) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "pod {key}: vm rm failed, keeping the pod so its name is not reused: {}",
                    err.message
                ),
            });
            // W4 keeps the pod, but a stopped VM sends no further events: without a W5
            // recheck (which replays W4) the pod would stay NotReady forever.
            defer_recheck(s, key);
        }
        _ => {}
    }
}

/// W4 "any other state": restart in place unless the last restart was under 30 s ago.
fn not_running(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let id = vm.id.clone();
    match s.restarts.get(&id) {
        Some(at) if now - at < RESTART_COOLDOWN_MS => {
            let step = Step::RemoveForEvict {
                reason: "RestartCooldown".into(),
                message: "restart cooldown not elapsed".into(),
            };
            create::run_step(s, key, step, CocoonCmd::VmRm { id });
        }
        _ => {
            s.restarts.insert(id.clone(), now);
            s.emit(Action::Log {
                level: Level::Info,
                message: format!(
                    "pod {key}: VM {id} is {:?}; restarting it in place",
                    vm.state
                ),
            });
            create::run_step(s, key, Step::Restart, CocoonCmd::VmStart { id });
        }
    }
}

/// The VM is fine: keep the fresher record (PID and NICs feed the stats).
fn refresh(s: &mut State, key: &PodKey, vm: VmRecord) {
    let Some(e) = s.pods.get(key) else { return };
    if e.vm.as_ref().is_some_and(|t| t.record.id == vm.id) {
        create::track(s, key, vm, false);
    }
}

fn inconclusive(
    s: &mut State,
    key: &PodKey,
    attempt: u32,
    first_failure: Option<i64>,
    delay_ms: u64,
) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let uid = e.pod.uid.clone();
    let first = first_failure.unwrap_or(now);
    let (next_delay, step_delay) = if attempt < 2 {
        (INLINE_RETRY_MS, 0)
    } else {
        if attempt == 2 {
            s.emit(Action::Count {
                counter: Counter::VmInspectTransientFail,
            });
        }
        if now - first >= RECHECK_BUDGET_MS {
            evict(
                s,
                key,
                "VMInspectTimeout",
                "vm inspect did not resolve within budget",
            );
            return;
        }
        let d = if delay_ms == 0 {
            RECHECK_FIRST_MS
        } else {
            (delay_ms * 2).min(RECHECK_MAX_MS)
        };
        (d, d)
    };
    let e = s.pods.get_mut(key).expect("present");
    e.busy = Some(Busy {
        op: None,
        step: Step::Recover {
            attempt: attempt + 1,
            first_failure: Some(first),
            delay_ms: step_delay,
        },
        since: now,
    });
    s.emit(Action::ArmTimer {
        timer: Timer::Recheck {
            key: key.clone(),
            uid,
        },
        after_ms: next_delay,
    });
}

fn defer_recheck(s: &mut State, key: &PodKey) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let uid = e.pod.uid.clone();
    e.busy = Some(Busy {
        op: None,
        step: Step::Recover {
            attempt: 3,
            first_failure: Some(now),
            delay_ms: RECHECK_FIRST_MS,
        },
        since: now,
    });
    s.emit(Action::ArmTimer {
        timer: Timer::Recheck {
            key: key.clone(),
            uid,
        },
        after_ms: RECHECK_FIRST_MS,
    });
}

pub(crate) fn recheck(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.pod.uid != uid || e.deleting {
        return;
    }
    let Some(Busy {
        op: None,
        step: step @ Step::Recover { .. },
        ..
    }) = e.busy.clone()
    else {
        return;
    };
    let Some(vm) = &e.vm else {
        e.busy = None;
        return;
    };
    let id = vm.record.id.clone();
    create::run_step(s, key, step, CocoonCmd::VmInspect { vm: id });
}

/// W6: delete the API pod (UID-bound, 2 tries); only then forget the VM and report Failed.
pub fn evict(s: &mut State, key: &PodKey, reason: &str, message: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.evict_tries += 1;
    // The verdict is in: a hint that waited for it has nothing left to say.
    e.hint_pending = false;
    let uid = e.pod.uid.clone();
    let op = s.new_op(OpOwner::Evict {
        key: key.clone(),
        reason: reason.into(),
        message: message.into(),
    });
    s.pods.get_mut(key).expect("present").delete_op = Some(op);
    s.emit(Action::DeletePod {
        op,
        key: key.clone(),
        uid,
        grace_seconds: None,
    });
}

pub(crate) fn evicted(s: &mut State, key: &PodKey, reason: String, message: String, ok: bool) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.delete_op = None;
    if ok {
        e.evict_tries = 0;
        e.terminal = Some(Terminal::Evicted { reason, message });
        let deleting = e.deleting;
        create::forget_vm(s, key);
        if deleting {
            crate::delete::proceed(s, key);
        }
        return;
    }
    if e.deleting {
        // The pod is being deleted anyway: the normal delete removes the VM and the object.
        e.evict_tries = 0;
        e.busy = None;
        crate::delete::proceed(s, key);
        return;
    }
    let tries = e.evict_tries as usize;
    let uid = e.pod.uid.clone();
    if tries < EVICT_RETRY_MS.len() {
        // Remember the reason in a pending step; the retry timer re-sends the delete.
        e.busy = Some(Busy {
            op: None,
            step: Step::RemoveForEvict { reason, message },
            since: s.now,
        });
        s.emit(Action::ArmTimer {
            timer: Timer::EvictRetry {
                key: key.clone(),
                uid,
            },
            after_ms: EVICT_RETRY_MS[tries - 1],
        });
    } else {
        e.evict_tries = 0;
        s.emit(Action::Count {
            counter: Counter::PodEvictFailure,
        });
        s.emit(Action::Log {
            level: Level::Warn,
            message: format!("pod {key}: eviction ({reason}) failed; keeping all state"),
        });
    }
}

pub(crate) fn evict_retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.pod.uid != uid {
        return;
    }
    let Some(Busy {
        op: None,
        step: Step::RemoveForEvict { reason, message },
        ..
    }) = e.busy.take()
    else {
        return;
    };
    evict(s, key, &reason, &message);
}
