//! Local snapshots: where a pod's VM gets saved, and who may remove a snapshot.
//!
//! - Saving: every `snapshot save` of a pod's VM runs the one step machine here, [`save`]
//!   then [`save_done`] (F1: a taken name has its holder removed and the save tried once
//!   more). Its callers hold a [`SaveStep`] in their phase: the fork save of a bring-up (C9,
//!   `CreateStep::SaveForkSnapshot`), the hibernate (U3, `HibernateStep::Save`) and the
//!   delete-time snapshot (D4, `DeleteWait::Save`); each decides what a saved or refused
//!   snapshot means for its pod.
//! - Removing: every `snapshot rm` goes through [`remove`], which names why ([`Removal`]);
//!   [`removable`] decides whether this pod may remove it.
//! - What every save and push reports (counters, durations) and the push they make.

use crate::action::{Action, Counter, Histogram, Level, OpId, RegistryCall};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::names;
use crate::phase::{SaveStep, Scratch};
use crate::pod::PodKey;
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::time::Millis;
use crate::vm::{CocoonError, CocoonErrorKind};

/// Where a save went after its step's outcome.
pub(crate) enum Saving {
    /// The next step's call is out; the phase holds `SaveStep` and waits for `OpId`.
    Next(SaveStep, OpId),
    /// The snapshot is saved.
    Saved,
    /// The step failed for good (`SaveStep`: which one).
    Refused(SaveStep, CocoonError),
    /// The step answered with a shape it cannot have.
    Unexpected(SaveStep, Box<CocoonOk>),
}

/// Starts saving the VM `vm` (an id) as the local snapshot `snapshot`, for `key`'s step.
pub(crate) fn save(s: &mut State, key: &PodKey, snapshot: &str, vm: &str) -> OpId {
    let cmd = CocoonCmd::SnapshotSave {
        name: snapshot.to_string(),
        vm: vm.to_string(),
    };
    s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    )
}

/// The outcome of save step `step` of `vm` into `snapshot`: the next step, or the end.
pub(crate) fn save_done(
    s: &mut State,
    key: &PodKey,
    step: SaveStep,
    snapshot: &str,
    vm: &str,
    result: Result<CocoonOk, CocoonError>,
) -> Saving {
    use CocoonErrorKind::{SnapshotNameTaken, SnapshotNotFound};
    match (step, result) {
        (SaveStep::Save | SaveStep::SaveAgain, Ok(CocoonOk::Done)) => Saving::Saved,
        // F1: the name is taken: its holder goes, then one more save.
        (
            SaveStep::Save,
            Err(CocoonError {
                kind: SnapshotNameTaken,
                message,
            }),
        ) => {
            let holder = taken_by(&message).unwrap_or_else(|| snapshot.to_string());
            match remove(s, key, Removal::Holder(holder)) {
                Some(op) => Saving::Next(SaveStep::RemoveHolder, op),
                // The holder stays: the name is still taken, and the save refused for good.
                None => Saving::Refused(
                    SaveStep::Save,
                    CocoonError {
                        kind: SnapshotNameTaken,
                        message,
                    },
                ),
            }
        }
        (
            SaveStep::RemoveHolder,
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => Saving::Next(SaveStep::SaveAgain, save(s, key, snapshot, vm)),
        (step, Err(err)) => Saving::Refused(step, err),
        (step, Ok(other)) => Saving::Unexpected(step, Box::new(other)),
    }
}

/// The holder of a taken snapshot name: the token after `already in use by ` (or `held by
/// `), trailing `)` stripped (CLI-3).
pub(crate) fn taken_by(message: &str) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    let at = ["already in use by ", "held by "]
        .iter()
        .find_map(|p| lower.find(p).map(|i| i + p.len()))?;
    let id = message[at..].split_whitespace().next()?;
    let id = id.trim_end_matches(')');
    (!id.is_empty()).then(|| id.to_string())
}

/// Why a pod removes local snapshots: what [`remove`] decides on. The first two are steps of
/// the pod's phase, whose outcome comes back to it; the rest are cleanups whose outcome is
/// only logged.
pub(crate) enum Removal {
    /// C6: `fork-<vm>` of the pod's own VM name, before a fresh bring-up, so a predecessor's
    /// fork state never reaches new sub-agents.
    OwnFork(String),
    /// F1: whatever holds the name a save of this pod was refused (cocoon names it).
    Holder(String),
    /// U6: what a bring-up made for itself alone (a registry import).
    Scratch(String),
    /// U6 (a stale local copy) and D3 (a hibernated pod deleted): `<vm>` and `fork-<vm>` of
    /// a VM name, unless another pod holds that name (T1).
    Copies(String),
    /// D7: `<vm>` and `fork-<vm>` of the VM the deleted pod held until its removal.
    DeletedVm(String),
}

/// Who may remove a snapshot: the snapshots `why` names that `key` may remove (none: the
/// removal is refused, and said so in the log).
fn removable(s: &mut State, key: &PodKey, why: &Removal) -> Vec<String> {
    match why {
        Removal::OwnFork(vm) => vec![names::fork_snapshot(vm)],
        Removal::Holder(name) | Removal::Scratch(name) => vec![name.clone()],
        // T1: another pod's snapshots under a name this pod only claimed are not this pod's.
        Removal::Copies(vm) => match crate::trust::name_holder(s, key, vm) {
            Some(other) => {
                s.emit(Action::Log {
                    level: Level::Warn,
                    message: format!(
                        "pod {key}: local snapshots of {vm} are left alone: the name belongs to pod {other}"
                    ),
                });
                Vec::new()
            }
            None => vec![vm.clone(), names::fork_snapshot(vm)],
        },
        Removal::DeletedVm(vm) => vec![vm.clone(), names::fork_snapshot(vm)],
    }
}

/// Every `snapshot rm` of the core goes through here: what `why` names, if [`removable`] lets
/// `key` remove it. Returns the call a step waits for (`OwnFork`, `Holder`), `None` for a
/// cleanup or a refused removal.
pub(crate) fn remove(s: &mut State, key: &PodKey, why: Removal) -> Option<OpId> {
    let step = match why {
        Removal::OwnFork(_) | Removal::Holder(_) => true,
        Removal::Scratch(_) | Removal::Copies(_) | Removal::DeletedVm(_) => false,
    };
    let mut out = None;
    for name in removable(s, key, &why) {
        let owner = match step {
            true => CocoonOwner::Pod { key: key.clone() },
            false => CocoonOwner::Detached {
                what: format!("snapshot rm {name}"),
                release: None,
            },
        };
        let op = s.run_cocoon(owner, Some(key.clone()), CocoonCmd::SnapshotRm { name });
        out = out.or(step.then_some(op));
    }
    out
}

/// Removes what a bring-up made for itself alone (U6); the outcome is only logged.
pub(crate) fn drop_scratch(s: &mut State, key: &PodKey, scratch: Scratch) {
    match scratch {
        Scratch::Snapshot(name) => {
            remove(s, key, Removal::Scratch(name));
        }
        Scratch::Staging(staging) => {
            let owner = RegistryOwner::Detached {
                what: format!("remove staging {staging}"),
            };
            s.call_registry(
                owner,
                Some(key.clone()),
                RegistryCall::RemoveStaging { staging },
            );
        }
    }
}

/// A `snapshot save` that began at `since` succeeded.
pub(crate) fn saved(s: &mut State, since: Millis) {
    s.emit(Action::Count {
        counter: Counter::SnapshotSave {
            result: crate::labels::Outcome::Ok,
        },
    });
    s.emit(Action::Observe {
        histogram: Histogram::SnapshotSaveDuration,
        millis: (s.now - since).max(0) as u64,
    });
}

/// A push that began at `since` succeeded.
pub(crate) fn pushed(s: &mut State, since: Millis) {
    s.emit(Action::Count {
        counter: Counter::SnapshotPush {
            result: crate::labels::Outcome::Ok,
        },
    });
    s.emit(Action::Observe {
        histogram: Histogram::SnapshotPushDuration,
        millis: (s.now - since).max(0) as u64,
    });
}

/// The push of the local snapshot `<vm>` to `<vm>:<tag>`, the pod's image as its base image.
pub(crate) fn push_of(vm: &str, tag: &str, image: String) -> RegistryCall {
    RegistryCall::Push {
        snapshot: vm.to_string(),
        name: vm.to_string(),
        tag: tag.to_string(),
        base_image: image,
    }
}
