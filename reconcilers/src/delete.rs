//! DeletePod (spec/behavior.md §7, virtual-kubelet's delete contract): remove the VM, report
//! the terminal status, then delete the pod object with grace 0 and a UID precondition.

use crate::action::{Action, Counter, Level, Timer};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::names;
use crate::pod::PodKey;
use crate::state::{OpOwner, Publish, State, Step, Terminal};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{create, probe};

pub fn begin(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.deleting = true;
    s.touched.insert(key);
    probe::stop(s, key);
    let e = s.pods.get_mut(key).expect("present");
    if e.delete_op.is_some() {
        // An eviction's delete is in flight; its outcome continues (W6 then P2).
        return;
    }
    match &e.busy {
        Some(b) if b.op.is_some() => {} // the step's outcome continues the delete
        _ => {
            e.busy = None;
            proceed(s, key);
        }
    }
}

/// Runs once nothing else is in flight for the pod.
pub fn proceed(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get(key) else { return };
    match &e.vm {
        Some(vm) if !vm.unmanaged => {
            let id = vm.record.id.clone();
            create::run_step(s, key, Step::RemoveVm, CocoonCmd::VmRm { id });
        }
        _ => finish(s, key),
    }
}

pub fn vm_removed(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.busy = None;
    match result {
        Ok(_)
        | Err(CocoonError {
            kind: CocoonErrorKind::VmNotFound,
            ..
        }) => {
            e.delete_failures = 0;
            let keep = e
                .spec
                .as_ref()
                .map(|sp| sp.keep_snapshot_on_delete)
                .unwrap_or(true);
            let name = e.vm_name().map(str::to_string);
            create::forget_vm(s, key);
            // D7: the local snapshots go unless the operator asked to keep them as a cache.
            if let (false, Some(name)) = (keep, name) {
                for snap in [name.clone(), names::fork_snapshot(&name)] {
                    let op = s.new_op(OpOwner::Detached {
                        what: format!("snapshot rm {snap}"),
                        release: None,
                    });
                    s.emit(Action::Cocoon {
                        op,
                        key: Some(key.clone()),
                        cmd: CocoonCmd::SnapshotRm { name: snap },
                    });
                }
            }
            finish(s, key);
        }
        Err(err) => {
            e.delete_failures += 1;
            let after_ms = (1000u64 << e.delete_failures.min(6)).min(60_000);
            let uid = e.pod.uid.clone();
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("pod {key}: vm rm failed, retrying: {}", err.message),
            });
            s.emit(Action::Count {
                counter: Counter::PodLifecycle {
                    op: "delete".into(),
                    result: "failed".into(),
                    reason: "vm_rm".into(),
                },
            });
            s.emit(Action::ArmTimer {
                timer: Timer::DeleteRetry {
                    key: key.clone(),
                    uid,
                },
                after_ms,
            });
        }
    }
}

fn finish(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    s.touched.insert(key);
    if e.gone || e.terminal.is_some() {
        return;
    }
    let reason = if e.vm.is_some() { "unmanaged" } else { "" };
    e.terminal = Some(Terminal::Succeeded);
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "delete".into(),
            result: "ok".into(),
            reason: reason.into(),
        },
    });
}

/// After the terminal status is on the server, remove the object (grace 0, UID-bound).
pub(crate) fn finalize(p: &mut Publish, key: &PodKey) {
    let e = &*p.entry;
    let ready = e.deleting
        && !e.gone
        && !e.deleted_by_us
        && !e.superseded
        && !e.kube_backoff
        && e.busy.is_none()
        && e.delete_op.is_none()
        && e.write_op.is_none()
        && e.terminal.is_some()
        && (e.vm.is_none() || e.vm.as_ref().is_some_and(|v| v.unmanaged));
    if !ready {
        return;
    }
    let op = p.fx.new_op(OpOwner::Delete { key: key.clone() });
    p.entry.delete_op = Some(op);
    p.fx.emit(Action::DeletePod {
        op,
        key: key.clone(),
        uid: p.entry.pod.uid.clone(),
        grace_seconds: Some(0),
    });
}

pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.get(key) else { return };
    if e.pod.uid == uid && e.busy.is_none() && (e.deleting || e.gone) {
        proceed(s, key);
    }
}
