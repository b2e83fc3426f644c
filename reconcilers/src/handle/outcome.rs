//! Routing each operation's outcome back to whoever waits for it. Every owner and every
//! phase is matched by name, so a new operation or phase does not compile until it is routed.
//! An outcome nobody can take is a logged, counted error that leaves the pod as it was, so
//! the next event or timer can still move it.

use crate::action::{Action, Counter, Level, OpId};
use crate::event::{CocoonOk, KubeError, KubeOk, RegistryError, RegistryOk};
use crate::phase::{Call, Creating, DeleteWait, Deleting, Hibernating, Phase, Running, VmTask};
use crate::pod::PodKey;
use crate::state::{CocoonOwner, KubeOwner, RegistryOwner, State};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{create, delete, dhcp, evict, hibernate, publish, stale_create, sweep, vm_events};

/// An outcome the core cannot place: logged as an error and counted.
pub(crate) fn unexpected(s: &mut State, what: &str) {
    s.emit(Action::Log {
        level: Level::Error,
        message: format!("unexpected outcome: {what}"),
    });
    s.emit(Action::Count {
        counter: Counter::UnexpectedOutcome,
    });
}

pub fn cocoon_done(s: &mut State, op: OpId, result: Result<CocoonOk, CocoonError>) {
    let Some(owner) = s.cocoon_ops.remove(&op) else {
        return unexpected(s, &format!("cocoon operation #{op} is not out"));
    };
    match *owner {
        CocoonOwner::Pod { key } => pod_cocoon_done(s, &key, op, result),
        CocoonOwner::StaleCreate {
            id,
            name,
            attempt,
            call,
        } => stale_create::done(s, &id, &name, attempt, call, result),
        CocoonOwner::Sweep => sweep::done(s, result),
        CocoonOwner::Fixup { key } => crate::guest::fixup_done(s, &key, op, result),
        CocoonOwner::MacosInventory => crate::macos::listed(s, result),
        CocoonOwner::MacosSweep => crate::macos::swept(s, result),
        CocoonOwner::RenewNudge { key } => crate::guest::nudged(s, &key, result),
        CocoonOwner::GuardedRemoval { key, name } => {
            crate::snapshot::guarded_inspected(s, &key, &name, result)
        }
        CocoonOwner::Detached { what, release } => detached(s, &what, release, result),
    }
}

/// The pod's one VM operation came back: to the step of the phase that sent it, which gets
/// the phase it matched; an outcome no phase waits for is `unexpected`.
fn pod_cocoon_done(s: &mut State, key: &PodKey, op: OpId, result: Result<CocoonOk, CocoonError>) {
    // Touched before the lookup: publishing skips a key that has no entry.
    s.touched.insert(key);
    let Some(e) = s.pod(key) else {
        return unexpected(
            s,
            &format!("cocoon operation #{op} of pod {key}, which is gone"),
        );
    };
    let to = match &e.phase {
        Phase::Creating(c) if c.op == Some(op) => To::Create(c.clone()),
        Phase::Running(Running {
            task: Some(VmTask {
                call: Call::Out(o), ..
            }),
            ..
        }) if *o == op => To::Task,
        Phase::Deleting(d) if d.wait == DeleteWait::Task(op) => To::DeleteTask,
        Phase::Deleting(d) if d.wait == DeleteWait::RemoveVm(op) => To::DeleteRemove(d.clone()),
        Phase::Deleting(d) if matches!(d.wait, DeleteWait::Save(_, o) if o == op) => {
            To::DeleteSave(d.clone())
        }
        Phase::Deleting(d) if matches!(d.wait, DeleteWait::Keep(_, o) if o == op) => {
            To::DeleteKeep(d.clone())
        }
        Phase::Hibernating(h) if h.op == op => To::Hibernate(h.clone()),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {
            let phase = e.phase.name();
            return unexpected(
                s,
                &format!("cocoon operation #{op} of pod {key} in phase {phase}"),
            );
        }
    };
    match to {
        To::Create(c) => create::step_done(s, key, c, result),
        To::Task => vm_events::task_done(s, key, result),
        To::DeleteTask => delete::task_done(s, key),
        To::DeleteRemove(d) => delete::vm_removed(s, key, d, result),
        To::DeleteSave(d) => delete::save_done(s, key, d, result),
        To::DeleteKeep(d) => crate::kept::saved(s, key, d, result),
        To::Hibernate(h) => hibernate::step_done(s, key, h, result),
    }
}

/// The handler an outcome goes to, with the phase it matched.
enum To {
    Create(Creating),
    Task,
    DeleteTask,
    DeleteRemove(Deleting),
    DeleteSave(Deleting),
    DeleteKeep(Deleting),
    Hibernate(Hibernating),
}

fn detached(
    s: &mut State,
    what: &str,
    release: Option<String>,
    result: Result<CocoonOk, CocoonError>,
) {
    use CocoonErrorKind::{SnapshotNotFound, VmNotFound};
    let gone = match &result {
        Ok(_)
        | Err(CocoonError {
            kind: VmNotFound, ..
        }) => true,
        Err(CocoonError {
            kind: SnapshotNotFound,
            ..
        }) => false,
        Err(err) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("{what} failed: {}", err.message),
            });
            false
        }
    };
    if let (true, Some(mac)) = (gone, release) {
        dhcp::release(s, &mac);
    }
}

pub fn registry_done(s: &mut State, op: OpId, result: Result<RegistryOk, RegistryError>) {
    let Some(owner) = s.registry_ops.remove(&op) else {
        return unexpected(s, &format!("registry operation #{op} is not out"));
    };
    match *owner {
        RegistryOwner::Pod { key } => pod_registry_done(s, &key, op, result),
        RegistryOwner::Classify { key } => crate::guest::classified(s, &key, op, result),
        RegistryOwner::Detached { what } => {
            if let Err(err) = result {
                s.emit(Action::Log {
                    level: Level::Warn,
                    message: format!("{what} failed: {}", err.message),
                });
            }
        }
    }
}

fn pod_registry_done(
    s: &mut State,
    key: &PodKey,
    op: OpId,
    result: Result<RegistryOk, RegistryError>,
) {
    // Touched before the lookup: publishing skips a key that has no entry.
    s.touched.insert(key);
    let Some(e) = s.pod(key) else {
        return unexpected(
            s,
            &format!("registry operation #{op} of pod {key}, which is gone"),
        );
    };
    let to = match &e.phase {
        Phase::Deleting(d) if d.wait == DeleteWait::Push(op) => Pushed::Delete(d.clone()),
        Phase::Hibernating(h) if h.op == op => Pushed::Hibernate(h.clone()),
        Phase::Creating(c) if c.op == Some(op) => Pushed::Create(c.clone()),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {
            let phase = e.phase.name();
            return unexpected(
                s,
                &format!("registry operation #{op} of pod {key} in phase {phase}"),
            );
        }
    };
    match to {
        Pushed::Delete(d) => delete::push_done(s, key, d, result),
        Pushed::Hibernate(h) => hibernate::push_done(s, key, h, result),
        Pushed::Create(c) => create::registry_step_done(s, key, c, result),
    }
}

/// The handler a registry outcome goes to, with the phase it matched.
enum Pushed {
    Delete(Deleting),
    Hibernate(Hibernating),
    Create(Creating),
}

pub fn kube_done(s: &mut State, op: OpId, result: Result<KubeOk, KubeError>) {
    let Some(owner) = s.kube_ops.remove(&op) else {
        return unexpected(s, &format!("Kubernetes operation #{op} is not out"));
    };
    match *owner {
        KubeOwner::Write {
            key,
            status,
            annotations,
        } => publish::write_done(s, &key, op, status, annotations, result),
        KubeOwner::DeleteObject { key } => delete::object_deleted(s, &key, op, result),
        KubeOwner::Evict { key } => evict::done(s, &key, op, result),
    }
}
