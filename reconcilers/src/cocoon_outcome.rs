//! Routing a cocoon call's outcome back to the step that asked for it.

use crate::action::OpId;
use crate::action::{Action, Level};
use crate::event::CocoonOk;
use crate::state::{OpOwner, State, Step};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{create, delete, vmevents};

pub fn done(s: &mut State, op: OpId, result: Result<CocoonOk, CocoonError>) {
    let Some(owner) = s.ops.remove(&op) else {
        return;
    };
    match *owner {
        OpOwner::Vm { key } => {
            let Some(e) = s.pods.get_mut(&key) else {
                return;
            };
            let Some(busy) = e.busy.as_ref().filter(|b| b.op == Some(op)) else {
                return;
            };
            let step = busy.step.clone();
            s.touched.insert(&key);
            match step {
                Step::RemoveVm => delete::vm_removed(s, &key, result),
                Step::Recover { .. }
                | Step::Restart
                | Step::InspectAfterRestart
                | Step::RemoveForEvict { .. } => vmevents::step_done(s, &key, step, result),
                _ => create::step_done(s, &key, step, result),
            }
            vmevents::take_pending_hint(s, &key);
        }
        OpOwner::StaleCreate {
            id,
            name,
            attempt,
            call,
        } => crate::stale_create::done(s, &id, &name, attempt, call, result),
        OpOwner::Sweep => crate::sweep::done(s, result),
        OpOwner::Detached { what, release } => {
            let gone = matches!(
                &result,
                Ok(_)
                    | Err(CocoonError {
                        kind: CocoonErrorKind::VmNotFound,
                        ..
                    })
            );
            detached(s, &what, result);
            if let (true, Some(mac)) = (gone, release) {
                crate::lease_release::release(s, &mac);
            }
        }
        _ => {}
    }
}

fn detached(s: &mut State, what: &str, result: Result<CocoonOk, CocoonError>) {
    match result {
        Ok(_)
        | Err(CocoonError {
            kind: CocoonErrorKind::SnapshotNotFound | CocoonErrorKind::VmNotFound,
            ..
        }) => {}
        Err(err) => s.emit(Action::Log {
            level: Level::Warn,
            message: format!("{what} failed: {}", err.message),
        }),
    }
}
