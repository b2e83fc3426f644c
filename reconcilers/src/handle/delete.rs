//! DeletePod (D1–D8, the virtual-kubelet delete contract): remove the VM, report the final
//! status, then delete the pod object with grace 0 bound to its UID. A pod whose object is
//! already gone only needs its VM removed.

use crate::action::{Action, Counter, Level};
use crate::backoff::Backoff;
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, KubeError, KubeErrorKind, KubeOk};
use crate::names;
use crate::phase::{
    Call, Creating, DeleteWait, Deleting, End, Gone, Object, ObjectDelete, Phase, Terminal, VmTask,
};
use crate::pod::PodKey;
use crate::state::{CocoonOwner, KubeOwner, Publish, State, Tracked};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{outcome, probe, tracking};

/// A failed `vm rm` of a deleted pod is tried again 2 s doubling to 60 s.
pub const RETRY: Backoff = Backoff::doubling(2000, 60_000);

/// A delete of the pod: its deletion timestamp was seen (`Present`), or it is gone.
pub fn request(s: &mut State, key: &PodKey, object: Object) {
    if s.pod(key).is_none() {
        return;
    }
    s.touched.insert(key);
    probe::stop(s, key);
    let Some(e) = s.pods.get_mut(key) else { return };
    // Gone is final: a deletion timestamp seen later cannot bring the object back.
    let merged = |had: Object| match had {
        Object::Gone => Object::Gone,
        Object::Present => object,
    };
    match &mut e.phase {
        Phase::Waiting | Phase::Failed(_) => without_vm(s, key, object),
        // Waiting for another pod's fork save, with no call of its own: nothing to wait for.
        Phase::Creating(Creating { op: None, .. }) => {
            crate::create::stop_waiting(s, key);
            without_vm(s, key, object)
        }
        Phase::Creating(c) => c.cancel = Some(c.cancel.map_or(object, merged)),
        Phase::Running(r) => {
            let vm = r.vm.clone();
            match r.task {
                Some(VmTask {
                    call: Call::Out(op),
                    ..
                }) => {
                    e.phase = Phase::Deleting(Deleting {
                        vm,
                        wait: DeleteWait::Task(op),
                        failures: 0,
                        object,
                    })
                }
                Some(VmTask {
                    call: Call::Timer, ..
                })
                | None => with_vm(s, key, vm, object),
            }
        }
        Phase::Evicting(ev) => match ev.delete {
            // The eviction's own delete is out; its outcome continues (W6, then this).
            Some(_) => ev.cancel = Some(ev.cancel.map_or(object, merged)),
            None => {
                let vm = ev.running.vm.clone();
                with_vm(s, key, vm, object)
            }
        },
        Phase::Deleting(d) => {
            d.object = merged(d.object);
            if d.wait == DeleteWait::Retry {
                remove_vm(s, key);
            }
        }
        Phase::Terminal(t) => match (object, t.object) {
            (Object::Present, ObjectDelete::NotAsked) => t.object = ObjectDelete::Asked,
            (Object::Present, ObjectDelete::Asked | ObjectDelete::Out(_)) => {}
            (Object::Gone, ObjectDelete::Out(op)) => {
                e.phase = Phase::Gone(Gone { delete: Some(op) })
            }
            (Object::Gone, ObjectDelete::NotAsked | ObjectDelete::Asked) => {
                e.phase = Phase::Gone(Gone { delete: None })
            }
        },
        Phase::Gone(_) => {}
    }
}

/// The pod is being deleted and holds `vm`: remove it (or, unmanaged, just let it go).
pub(crate) fn with_vm(s: &mut State, key: &PodKey, vm: Tracked, object: Object) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.phase = Phase::Deleting(Deleting {
        vm,
        wait: DeleteWait::Retry,
        failures: 0,
        object,
    });
    remove_vm(s, key);
}

/// A bring-up finished with a VM after its pod's delete came: index the VM like any other,
/// then remove it, so it is never leaked.
pub(crate) fn with_new_vm(s: &mut State, key: &PodKey, vm: Tracked, object: Object) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.phase = Phase::Deleting(Deleting {
        vm,
        wait: DeleteWait::Retry,
        failures: 0,
        object,
    });
    tracking::indexed(s, key);
    remove_vm(s, key);
}

/// The pod is being deleted and has no VM: its delete is done.
pub(crate) fn without_vm(s: &mut State, key: &PodKey, object: Object) {
    finish(s, key, object, "")
}

/// D5: `vm rm --force` of a managed VM; an unmanaged one is only forgotten (D1).
fn remove_vm(s: &mut State, key: &PodKey) {
    let Some(Phase::Deleting(d)) = s.pod(key).map(|e| &e.phase) else {
        return;
    };
    let (vm, object) = (d.vm.clone(), d.object);
    if !vm.managed() {
        tracking::unindex(s, key, &vm);
        return finish(s, key, object, "unmanaged");
    }
    let cmd = CocoonCmd::VmRm {
        id: vm.record.id.clone(),
    };
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    if let Some(Phase::Deleting(d)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        d.wait = DeleteWait::RemoveVm(op);
    }
}

/// The VM task that was out when the delete came is done: the removal can start.
pub(crate) fn task_done(s: &mut State, key: &PodKey) {
    remove_vm(s, key)
}

pub(crate) fn vm_removed(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Deleting(d) = &mut e.phase else {
        return;
    };
    match result {
        Ok(CocoonOk::Done)
        | Err(CocoonError {
            kind: CocoonErrorKind::VmNotFound,
            ..
        }) => {
            let (vm, object) = (d.vm.clone(), d.object);
            let keep = e
                .spec
                .as_ref()
                .map(|sp| sp.keep_snapshot_on_delete)
                .unwrap_or(true);
            let name = e.vm_name().map(str::to_string);
            tracking::forget(s, key, &vm);
            // D7: the local snapshots go unless the operator asked to keep them as a cache.
            if let (false, Some(name)) = (keep, name) {
                for snap in [name.clone(), names::fork_snapshot(&name)] {
                    let owner = CocoonOwner::Detached {
                        what: format!("snapshot rm {snap}"),
                        release: None,
                    };
                    s.run_cocoon(
                        owner,
                        Some(key.clone()),
                        CocoonCmd::SnapshotRm { name: snap },
                    );
                }
            }
            finish(s, key, object, "");
        }
        Ok(other) => {
            let what = format!("pod {key}: vm rm answered {other:?}");
            outcome::unexpected(s, &what);
            removal_failed(s, key, "unexpected answer from cocoon".into());
        }
        Err(err) => removal_failed(s, key, err.message),
    }
}

fn removal_failed(s: &mut State, key: &PodKey, why: String) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Deleting(d) = &mut e.phase else {
        return;
    };
    d.failures += 1;
    d.wait = DeleteWait::Retry;
    let after_ms = RETRY.after(d.failures);
    let uid = e.pod.uid.clone();
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: vm rm failed, retrying: {why}"),
    });
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "delete".into(),
            result: "failed".into(),
            reason: "vm_rm".into(),
        },
    });
    s.emit(Action::ArmTimer {
        timer: crate::action::Timer::DeleteRetry {
            key: key.clone(),
            uid,
        },
        after_ms,
    });
}

/// The delete-retry timer.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    match &e.phase {
        Phase::Deleting(d) if d.wait == DeleteWait::Retry => remove_vm(s, key),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}

/// The VM is handled: the pod ends Succeeded (D8), or, its object gone, the entry waits to
/// be collected.
fn finish(s: &mut State, key: &PodKey, object: Object, reason: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    s.touched.insert(key);
    match object {
        Object::Gone => e.phase = Phase::Gone(Gone { delete: None }),
        Object::Present => {
            e.phase = Phase::Terminal(Terminal {
                end: End::Succeeded,
                object: ObjectDelete::Asked,
            });
            s.emit(Action::Count {
                counter: Counter::PodLifecycle {
                    op: "delete".into(),
                    result: "ok".into(),
                    reason: reason.into(),
                },
            });
        }
    }
}

/// After the final status is on the server, remove the object (grace 0, UID-bound).
pub(crate) fn finalize(p: &mut Publish, key: &PodKey) {
    let Phase::Terminal(t) = &p.entry.phase else {
        return;
    };
    if t.object != ObjectDelete::Asked || !p.entry.writer.can_write() {
        return;
    }
    let op = p.fx.kube_op(KubeOwner::DeleteObject { key: key.clone() });
    if let Phase::Terminal(t) = &mut p.entry.phase {
        t.object = ObjectDelete::Out(op);
    }
    p.fx.emit(Action::DeletePod {
        op,
        key: key.clone(),
        uid: p.entry.pod.uid.clone(),
        grace_seconds: Some(0),
    });
}

/// The outcome of vk's delete of the pod object.
pub(crate) fn object_deleted(
    s: &mut State,
    key: &PodKey,
    op: crate::action::OpId,
    result: Result<KubeOk, KubeError>,
) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let end = match &e.phase {
        Phase::Terminal(Terminal {
            object: ObjectDelete::Out(o),
            end,
        }) if *o == op => Some(end.clone()),
        Phase::Gone(Gone { delete: Some(o) }) if *o == op => None,
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {
            let what = format!(
                "pod {key}: a pod delete outcome in phase {}",
                e.phase.name()
            );
            return outcome::unexpected(s, &what);
        }
    };
    s.touched.insert(key);
    match result {
        Ok(_)
        | Err(KubeError {
            kind: KubeErrorKind::NotFound | KubeErrorKind::Conflict,
            ..
        }) => {
            e.phase = Phase::Gone(Gone { delete: None });
            let uid = e.pod.uid.clone();
            s.tombstones.insert(uid, key.clone());
        }
        Err(err) => {
            e.phase = match end {
                None => Phase::Gone(Gone { delete: None }),
                Some(end) => Phase::Terminal(Terminal {
                    end,
                    object: ObjectDelete::Asked,
                }),
            };
            crate::publish::write_failed(s, key, crate::publish::Write::ObjectDelete, err)
        }
    }
}
