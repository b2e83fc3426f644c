//! DeletePod (D1–D8, the virtual-kubelet delete contract): remove the VM, report the final
//! status, then delete the pod object with grace 0 bound to its UID. A pod whose object is
//! already gone only needs its VM removed.

use crate::action::{Action, Counter, Level};
use crate::backoff::Backoff;
use crate::cocoon::CocoonCmd;
use crate::event::{
    CocoonOk, KubeError, KubeErrorKind, KubeOk, RegistryError, RegistryErrorKind, RegistryOk,
};
use crate::labels::{self, LifecycleReason};
use crate::phase::{
    Call, Creating, DeleteStage, DeleteWait, Deleting, End, Gone, Object, ObjectDelete, Phase,
    SaveStep, Terminal, VmTask,
};
use crate::pod::PodKey;
use crate::provider::{self, Op, Outcome};
use crate::snapshot::Saving;
use crate::state::{CocoonOwner, KubeOwner, Publish, RegistryOwner, State, Tracked, VmOwner};
use crate::time::Millis;
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};
use crate::{outcome, probe, snapshot, tracking};

/// A failed `vm rm` of a deleted pod is tried again 2 s doubling to 60 s.
pub const RETRY: Backoff = Backoff::doubling(2000, 60_000);

/// A delete of the pod: its deletion timestamp was seen (`Present`), or it is gone.
pub fn request(s: &mut State, key: &PodKey, object: Object) {
    if s.pod(key).is_none() {
        return;
    }
    let now = s.now;
    s.touched.insert(key);
    probe::stop(s, key);
    let Some(e) = s.pods.get_mut(key) else { return };
    // Gone is final: a deletion timestamp seen later cannot bring the object back.
    let merged = |had: Object| match had {
        Object::Gone => Object::Gone,
        Object::Present => object,
    };
    match &mut e.phase {
        Phase::Waiting | Phase::Failed(_) => match crate::macos::leftover(s, key) {
            // D2: a macOS guest a failed bring-up may have left goes too.
            Some(vm) => with_vm(s, key, vm, object),
            None => without_vm(s, key, object),
        },
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
                }) => e.phase = Phase::Deleting(deleting(vm, DeleteWait::Task(op), object, now)),
                Some(VmTask {
                    call: Call::Timer, ..
                })
                | None => with_vm(s, key, vm, object),
            }
        }
        Phase::Hibernating(h) => h.cancel = Some(h.cancel.map_or(object, merged)),
        Phase::Hibernated => hibernated_deleted(s, key, object),
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
                next_step(s, key);
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

fn deleting(vm: Tracked, wait: DeleteWait, object: Object, now: Millis) -> Deleting {
    Deleting {
        vm,
        wait,
        failures: 0,
        object,
        stage: DeleteStage::Snapshot,
        since: now,
        blocked: None,
    }
}

/// The pod is being deleted and holds `vm`: snapshot it if the policy says so, then remove
/// it (or, unmanaged, just let it go).
pub(crate) fn with_vm(s: &mut State, key: &PodKey, vm: Tracked, object: Object) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    e.phase = Phase::Deleting(deleting(vm, DeleteWait::Retry, object, now));
    next_step(s, key);
}

/// B11: the pod's delete was under way when the previous process stopped, and its VM is
/// still listed: the delete goes on with it, from the snapshot its policy asks for (D4), as
/// if the deletion had been seen now. Left unclaimed, the VM would be removed as an orphan
/// without that snapshot.
pub(crate) fn resume(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let tracked = Tracked {
        ip: e.pod.annotation(crate::keys::VM_IP).map(str::to_string),
        record: vm,
        owner: VmOwner::Vk,
    };
    e.phase = Phase::Deleting(deleting(tracked, DeleteWait::Retry, Object::Present, now));
    tracking::indexed(s, key);
    next_step(s, key);
}

/// A bring-up finished with a VM after its pod's delete came: index the VM like any other,
/// then remove it, so it is never leaked. It holds nothing worth a snapshot, and pushing it
/// would replace the pod's last real one.
pub(crate) fn with_new_vm(s: &mut State, key: &PodKey, vm: Tracked, object: Object) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let mut d = deleting(vm, DeleteWait::Retry, object, now);
    d.stage = DeleteStage::Remove;
    e.phase = Phase::Deleting(d);
    tracking::indexed(s, key);
    next_step(s, key);
}

/// D3: a hibernated pod has no VM: its local snapshots go unless kept (the keep flag is the
/// released-seat wake's warm cache), nothing is pushed, and no Event is written.
fn hibernated_deleted(s: &mut State, key: &PodKey, object: Object) {
    let Some(e) = s.pod(key) else { return };
    let keep = e
        .spec
        .as_ref()
        .map(|sp| sp.keep_snapshot_on_delete)
        .unwrap_or(true);
    let name = e.vm_name().map(str::to_string);
    if let (false, Some(name)) = (keep, name) {
        snapshot::remove(s, key, snapshot::Removal::Copies(name));
    }
    let reason = if keep {
        LifecycleReason::SeatRelease
    } else {
        LifecycleReason::NoVm
    };
    finish_counted(s, key, object, Outcome::Skipped, reason)
}

/// The pod is being deleted and has no VM: its delete is done.
pub(crate) fn without_vm(s: &mut State, key: &PodKey, object: Object) {
    finish_counted(s, key, object, Outcome::Skipped, LifecycleReason::NoVm)
}

/// D4: whether this pod's VM is saved and pushed to `<vm>:latest` before it is removed.
fn snapshot_wanted(s: &mut State, key: &PodKey) -> bool {
    let Some(e) = s.pod(key) else { return false };
    let Ok(spec) = &e.spec else { return false };
    if !spec.snapshot_on_delete(&e.pod) {
        return false;
    }
    // DEC-11: a node without a registry cannot keep what the policy asks for; it says so on the
    // pod, where whoever deleted it looks, rather than only in its own log.
    if s.config.registry.is_none() {
        let node = s.config.node_name.clone();
        let msg = format!(
            "OCI_REGISTRY is not set on node {node}: VM {} is removed without the delete-time \
             snapshot its snapshot-policy asks for (set OCI_REGISTRY, or snapshot-policy=never \
             to ask for none)",
            spec.vm_name
        );
        crate::create::warn_event(s, key, "DeleteSnapshotSkipped", &msg);
        s.emit(Action::Log {
            level: Level::Warn,
            message: format!("pod {key}: {msg}"),
        });
        return false;
    }
    true
}

/// Runs the stage the delete is at: the snapshot (save, then push), or the removal (D5);
/// an unmanaged VM is only forgotten (D1).
pub(crate) fn next_step(s: &mut State, key: &PodKey) {
    let Some(Phase::Deleting(d)) = s.pod(key).map(|e| &e.phase) else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: next_step found it not Deleting"),
        );
    };
    let (vm, object, stage) = (d.vm.clone(), d.object, d.stage);
    if !vm.managed() {
        tracking::unindex(s, key, &vm);
        return finish(s, key, object, LifecycleReason::Unmanaged);
    }
    if let Some(reason) = crate::handle::outage::unasked_eviction(s, key) {
        crate::handle::outage::keep_for_successor(s, key, (vm, object), &reason);
        return finish(s, key, object, LifecycleReason::Evicted);
    }
    // D2: a macOS guest is removed by cocoon-macos, without a snapshot.
    let macos = s.pod(key).is_some_and(crate::macos::is_macos);
    let stage = match stage {
        DeleteStage::Snapshot if !macos && snapshot_wanted(s, key) => DeleteStage::Snapshot,
        DeleteStage::Snapshot | DeleteStage::Remove => DeleteStage::Remove,
    };
    match stage {
        DeleteStage::Snapshot => save(s, key),
        DeleteStage::Remove => {
            let cmd = match macos {
                true => CocoonCmd::MacosRm {
                    name: vm.record.name.clone(),
                },
                false => CocoonCmd::VmRm {
                    id: vm.record.id.clone(),
                },
            };
            let op = s.run_cocoon(
                CocoonOwner::Pod { key: key.clone() },
                Some(key.clone()),
                cmd,
            );
            set_wait(s, key, DeleteWait::RemoveVm(op), Some(DeleteStage::Remove));
        }
    }
}

pub(crate) fn set_wait(s: &mut State, key: &PodKey, wait: DeleteWait, stage: Option<DeleteStage>) {
    let now = s.now;
    if let Some(Phase::Deleting(d)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        d.wait = wait;
        if let Some(stage) = stage {
            if d.stage != stage || matches!(wait, DeleteWait::Save(SaveStep::Save, _)) {
                d.since = now;
            }
            d.stage = stage;
        }
    }
}

/// D4: the save's first step (see `snapshot.rs`).
fn save(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    let Phase::Deleting(d) = &e.phase else {
        return crate::outcome::unexpected(s, &format!("pod {key}: save found it not Deleting"));
    };
    // T1: named after the VM the pod holds, never after its annotation now.
    let (name, id) = (d.vm.record.name.clone(), d.vm.record.id.clone());
    let op = snapshot::save(s, key, &name, &id);
    let wait = DeleteWait::Save(SaveStep::Save, op);
    set_wait(s, key, wait, Some(DeleteStage::Snapshot));
}

/// The outcome of a step of the delete-time save (see `snapshot.rs`).
pub(crate) fn save_done(
    s: &mut State,
    key: &PodKey,
    d: Deleting,
    result: Result<CocoonOk, CocoonError>,
) {
    let name = d.vm.record.name.clone();
    let (wait, since, id) = (d.wait, d.since, d.vm.record.id);
    let Some(e) = s.pod(key) else {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    };
    let image = e
        .spec
        .as_ref()
        .map(|sp| sp.image.clone())
        .unwrap_or_default();
    let DeleteWait::Save(save, _) = wait else {
        let what = format!("pod {key}: a save outcome while the delete waits for {wait:?}");
        return outcome::unexpected(s, &what);
    };
    use CocoonErrorKind::{NotRunning, VmNotFound};
    match snapshot::save_done(s, key, save, &name, &id, result) {
        Saving::Next(save, op) => set_wait(s, key, DeleteWait::Save(save, op), None),
        Saving::Saved => {
            snapshot::saved(s, since);
            let call = snapshot::push_of(s, key, &name, "latest", image);
            let op = s.call_registry(
                RegistryOwner::Pod { key: key.clone() },
                Some(key.clone()),
                call,
            );
            set_wait(s, key, DeleteWait::Push(op), None);
            if let Some(Phase::Deleting(d)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                d.since = s.now;
            }
        }
        // D4: a VM that is already gone or not running is removed without a snapshot.
        Saving::Refused(
            SaveStep::Save | SaveStep::SaveAgain,
            CocoonError {
                kind: kind @ (VmNotFound | NotRunning),
                message,
            },
        ) => {
            let why = if kind == VmNotFound {
                "is gone"
            } else {
                "is not running"
            };
            s.emit(Action::Log {
                level: Level::Info,
                message: format!("pod {key}: VM {why}, removed without a snapshot: {message}"),
            });
            set_wait(s, key, DeleteWait::Retry, Some(DeleteStage::Remove));
            next_step(s, key);
        }
        // T8: `<vm>` is another namespace's snapshot; the state is kept under its own name.
        Saving::Foreign(why) => {
            s.emit(Action::Count {
                counter: Counter::SnapshotSave {
                    result: labels::Outcome::Failed,
                },
            });
            crate::kept::begin(s, key, &id, format!("snapshot save {name}: {why}"));
        }
        Saving::Refused(_, err) => snapshot_failed(
            s,
            key,
            Counter::SnapshotSave {
                result: labels::Outcome::Failed,
            },
            format!("snapshot save {name}: {}", err.message),
        ),
        Saving::Unexpected(_, other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: snapshot save {name} answered {other:?}"),
            );
            snapshot_failed(
                s,
                key,
                Counter::SnapshotSave {
                    result: labels::Outcome::Failed,
                },
                format!("snapshot save {name}: unexpected answer from cocoon"),
            )
        }
    }
}

/// The outcome of the push to `<vm>:latest`.
pub(crate) fn push_done(
    s: &mut State,
    key: &PodKey,
    d: Deleting,
    result: Result<RegistryOk, RegistryError>,
) {
    let (since, name) = (d.since, d.vm.record.name.clone());
    if s.pod(key).is_none() {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    }
    match result {
        Ok(RegistryOk::Pushed { .. }) => {
            snapshot::pushed(s, since);
            if let Some(Phase::Deleting(d)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                d.blocked = None;
                d.failures = 0;
            }
            set_wait(s, key, DeleteWait::Retry, Some(DeleteStage::Remove));
            next_step(s, key);
        }
        Ok(other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: push of {name}:latest answered {other:?}"),
            );
            let why = format!("push {name}:latest: unexpected answer from the registry client");
            snapshot_failed(
                s,
                key,
                Counter::SnapshotPush {
                    result: labels::Outcome::Failed,
                },
                why,
            )
        }
        // T7: the tag belongs to another namespace; no retry can push it, so the VM's state
        // is kept on this node under a name only the daemon uses before the VM goes (D9).
        Err(RegistryError {
            kind: RegistryErrorKind::Foreign,
            message,
        }) => {
            s.emit(Action::Count {
                counter: Counter::SnapshotPush {
                    result: labels::Outcome::Failed,
                },
            });
            crate::kept::begin(
                s,
                key,
                &d.vm.record.id,
                format!("push {name}:latest refused: {message}"),
            );
        }
        Err(err) => {
            let why = format!("push {name}:latest: {}", err.message);
            snapshot_failed(
                s,
                key,
                Counter::SnapshotPush {
                    result: labels::Outcome::Failed,
                },
                why,
            )
        }
    }
}

/// D4: a failed delete-time save or push keeps the VM; the delete is retried from the save,
/// and the pod says why it is held.
pub(crate) fn snapshot_failed(s: &mut State, key: &PodKey, counter: Counter, why: String) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Deleting(d) = &mut e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: snapshot_failed found it not Deleting"),
        );
    };
    d.failures += 1;
    d.wait = DeleteWait::Retry;
    d.stage = DeleteStage::Snapshot;
    let after_ms = RETRY.after(d.failures);
    let message = format!(
        "delete held: {why}; the VM is kept and the snapshot retried in {}s",
        after_ms / 1000
    );
    d.blocked = Some(message.clone());
    let uid = e.pod.uid.clone();
    s.touched.insert(key);
    s.emit(Action::Count { counter });
    provider::outcome(
        s,
        key,
        Op::Delete,
        Outcome::Failed(&message),
        LifecycleReason::Snapshot,
    );
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: {message}"),
    });
    s.emit(Action::ArmTimer {
        timer: crate::action::Timer::DeleteRetry {
            key: key.clone(),
            uid,
        },
        after_ms,
    });
}

/// The VM task that was out when the delete came is done: the delete's own steps start.
pub(crate) fn task_done(s: &mut State, key: &PodKey) {
    set_wait(s, key, DeleteWait::Retry, None);
    next_step(s, key)
}

pub(crate) fn vm_removed(
    s: &mut State,
    key: &PodKey,
    d: Deleting,
    result: Result<CocoonOk, CocoonError>,
) {
    let Some(e) = s.pod(key) else {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
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
                .map(|sp| sp.keep_snapshot_on_delete || sp.os == crate::spec::Os::Macos)
                .unwrap_or(true);
            let name = Some(vm.record.name.clone());
            tracking::forget(s, key, &vm);
            // D7: the local snapshots go unless the operator asked to keep them as a cache.
            if let (false, Some(name)) = (keep, name) {
                snapshot::remove(s, key, snapshot::Removal::DeletedVm(name));
            }
            finish(s, key, object, LifecycleReason::None);
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
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: removal_failed found it not Deleting"),
        );
    };
    d.failures += 1;
    d.wait = DeleteWait::Retry;
    d.stage = DeleteStage::Remove;
    let after_ms = RETRY.after(d.failures);
    let uid = e.pod.uid.clone();
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: vm rm failed, retrying: {why}"),
    });
    provider::outcome(
        s,
        key,
        Op::Delete,
        Outcome::Failed(&format!("vm rm failed: {why}")),
        LifecycleReason::VmRm,
    );
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
        Phase::Deleting(d) if d.wait == DeleteWait::Retry => next_step(s, key),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}

/// The VM is handled: the pod ends Succeeded (D8), or, its object gone, the entry waits to
/// be collected.
fn finish(s: &mut State, key: &PodKey, object: Object, reason: LifecycleReason) {
    finish_counted(s, key, object, Outcome::Ok, reason)
}

fn finish_counted(
    s: &mut State,
    key: &PodKey,
    object: Object,
    result: Outcome<'_>,
    reason: LifecycleReason,
) {
    let Some(e) = s.pods.get_mut(key) else { return };
    s.touched.insert(key);
    match object {
        Object::Gone => e.phase = Phase::Gone(Gone { delete: None }),
        Object::Present => {
            e.phase = Phase::Terminal(Terminal {
                end: End::Succeeded,
                object: ObjectDelete::Asked,
            });
            provider::outcome(s, key, Op::Delete, result, reason);
        }
    }
}

/// After the final status is on the server, remove the object (grace 0, UID-bound).
pub(crate) fn finalize(p: &mut Publish, key: &PodKey) {
    let t = match &p.entry.phase {
        Phase::Terminal(t) => t,
        // Publishing runs for every touched pod; only a Terminal one has an object to remove.
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Gone(_) => return,
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
        | Phase::Hibernating(_)
        | Phase::Hibernated
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
