//! Local snapshots: where a pod's VM gets saved, and who may remove a snapshot.
//!
//! - Saving: every `snapshot save` of a pod's VM runs the one step machine here, [`save`]
//!   then [`save_done`] (F1: a taken name has its holder removed and the save tried once
//!   more). Its callers hold a [`SaveStep`] in their phase: the fork save of a bring-up (C9,
//!   `CreateStep::SaveForkSnapshot`), the hibernate (U3, `HibernateStep::Save`) and the
//!   delete-time snapshot (D4, `DeleteWait::Save`); each decides what a saved or refused
//!   snapshot means for its pod.
//! - Removing: every `snapshot rm` is preceded by a `snapshot inspect` of what it removes, and
//!   [`removal_refused`] decides on the record found (T8): a cleanup through [`remove`], which
//!   names why ([`Removal`]); C6's `fork-<vm>` and F1's holder as steps of their phases.
//! - What every save and push reports (counters, durations) and the push they make.

use crate::action::{Action, Counter, Histogram, Level, OpId, RegistryCall};
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, SnapshotInfo};
use crate::names;
use crate::outcome;
use crate::owner::{Owner, Record};
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
    /// T8: the name is held by a snapshot this pod may not remove; no retry changes that.
    Foreign(String),
}

/// Starts saving the VM `vm` (an id) as the local snapshot `snapshot`, for `key`'s step. The
/// description carries `key` as the snapshot's owner (T5).
pub(crate) fn save(s: &mut State, key: &PodKey, snapshot: &str, vm: &str) -> OpId {
    let cmd = CocoonCmd::SnapshotSave {
        name: snapshot.to_string(),
        vm: vm.to_string(),
        description: Owner::of(key, s.tenant(key).uid).description(),
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
        // F1: the name is taken: its holder is looked at (T8), removed, then one more save.
        (
            SaveStep::Save,
            Err(CocoonError {
                kind: SnapshotNameTaken,
                message,
            }),
        ) => {
            let holder = taken_by(&message).unwrap_or_else(|| snapshot.to_string());
            Saving::Next(SaveStep::InspectHolder, inspect(s, key, holder))
        }
        (SaveStep::InspectHolder, Ok(CocoonOk::Snapshot { snapshot: held })) => {
            match removal_refused(s, key, &held) {
                None => {
                    let target = if held.id.is_empty() {
                        held.name.clone()
                    } else {
                        held.id.clone()
                    };
                    Saving::Next(SaveStep::RemoveHolder, rm(s, key, target, true))
                }
                // The holder stays: the name is still taken, and the save refused for good.
                Some(why) => Saving::Foreign(format!(
                    "snapshot name {snapshot:?} is taken and {why}, so it is not replaced"
                )),
            }
        }
        (
            SaveStep::RemoveHolder | SaveStep::InspectHolder,
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

/// T8, T15: why `key` may not remove the snapshot `snap`, if it may not: an owned one only by
/// a pod of its namespace; a public base or one without a record by no pod. (Under a
/// configuration from before public bases were listed, a record-less one was removable:
/// every name a removal starts from is the pod's own.)
pub(crate) fn removal_refused(s: &State, key: &PodKey, snap: &SnapshotInfo) -> Option<String> {
    let what = format!("snapshot {:?}", snap.name);
    Record::from_description(&snap.description, &snap.name, s.config.bases())
        .replaceable_by(s.tenant(key), &what)
        .err()
}

/// Why a pod removes local snapshots without a step waiting for it: what [`remove`] decides
/// on. (C6's `fork-<vm>` and F1's holder are steps of their phases: [`inspect`], then
/// [`removal_refused`], then [`rm`].)
pub(crate) enum Removal {
    /// U6: what a bring-up made for itself alone (a registry import).
    Scratch(String),
    /// U6 (a stale local copy) and D3 (a hibernated pod deleted): `<vm>` and `fork-<vm>` of
    /// a VM name, unless another pod holds that name (T1).
    Copies(String),
    /// D7: `<vm>` and `fork-<vm>` of the VM the deleted pod held until its removal.
    DeletedVm(String),
}

/// Which snapshots `why` names that `key` may look at for removal (T1); T8 then decides on
/// each one's record.
fn removable(s: &mut State, key: &PodKey, why: &Removal) -> Vec<String> {
    match why {
        Removal::Scratch(name) => vec![name.clone()],
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

/// Every cleanup `snapshot rm` of the core starts here: each snapshot `why` names is inspected
/// first (T8) and removed only if [`removal_refused`] lets `key` remove it
/// ([`guarded_inspected`]); the outcomes are only logged.
pub(crate) fn remove(s: &mut State, key: &PodKey, why: Removal) {
    for name in removable(s, key, &why) {
        let owner = CocoonOwner::GuardedRemoval {
            key: key.clone(),
            name: name.clone(),
        };
        s.run_cocoon(
            owner,
            Some(key.clone()),
            CocoonCmd::SnapshotInspect { name },
        );
    }
}

/// A step's `snapshot inspect` of a snapshot it may remove (T8).
pub(crate) fn inspect(s: &mut State, key: &PodKey, name: String) -> OpId {
    s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        CocoonCmd::SnapshotInspect { name },
    )
}

/// `snapshot rm` of a snapshot T8 let `key` remove: a step's (`step`) or a cleanup's.
pub(crate) fn rm(s: &mut State, key: &PodKey, name: String, step: bool) -> OpId {
    let owner = match step {
        true => CocoonOwner::Pod { key: key.clone() },
        false => CocoonOwner::Detached {
            what: format!("snapshot rm {name}"),
            release: None,
        },
    };
    s.run_cocoon(owner, Some(key.clone()), CocoonCmd::SnapshotRm { name })
}

/// T8: a cleanup's inspect came back: the snapshot goes if `key` may remove it.
pub(crate) fn guarded_inspected(
    s: &mut State,
    key: &PodKey,
    name: &str,
    result: Result<CocoonOk, CocoonError>,
) {
    match result {
        Ok(CocoonOk::Snapshot { snapshot }) => match removal_refused(s, key, &snapshot) {
            None => {
                rm(s, key, name.to_string(), false);
            }
            Some(why) => s.emit(Action::Log {
                level: Level::Warn,
                message: format!("pod {key}: {why}, so it is not removed"),
            }),
        },
        Err(CocoonError {
            kind: CocoonErrorKind::SnapshotNotFound,
            ..
        }) => {}
        Err(err) => s.emit(Action::Log {
            level: Level::Warn,
            message: format!(
                "pod {key}: snapshot {name} is left: its inspect failed: {}",
                err.message
            ),
        }),
        Ok(other) => outcome::unexpected(
            s,
            &format!("pod {key}: snapshot inspect {name} answered {other:?}"),
        ),
    }
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

/// The push of the local snapshot `<vm>` to `<vm>:<tag>`, the pod's image as its base image
/// and the pod as its owner (T5, T7).
pub(crate) fn push_of(s: &State, key: &PodKey, vm: &str, tag: &str, image: String) -> RegistryCall {
    RegistryCall::Push {
        snapshot: vm.to_string(),
        name: vm.to_string(),
        tag: tag.to_string(),
        base_image: image,
        owner: Owner::of(key, s.tenant(key).uid).record(),
    }
}
