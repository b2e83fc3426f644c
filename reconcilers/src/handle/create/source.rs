//! What a clone starts from, once inspected: the clone base or fork snapshot (C8, C9) and the
//! fork snapshot a fresh bring-up drops first (C6), each checked against its owner record
//! (T6, T8).

use super::failure::fail;
use super::steps::first_source_step;
use super::{clone_cmd, set_step_op, step};
use crate::action::{Action, Counter, Level};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::event::SnapshotInfo;
use crate::keys;
use crate::owner::Record;
use crate::phase::CreateStep;
use crate::pod::PodKey;
use crate::spec::{Backend, VmSpec};
use crate::state::State;

/// C6: `fork-<vm>` is there: removed when this pod may remove it (T8), then the source steps.
pub(super) fn fork_inspected(s: &mut State, key: &PodKey, spec: &VmSpec, snapshot: SnapshotInfo) {
    match crate::snapshot::removal_refused(s, key, &snapshot) {
        None => {
            let op = crate::snapshot::rm(s, key, snapshot.name, true);
            set_step_op(s, key, CreateStep::RemoveFork { removing: true }, op)
        }
        // T8: another namespace's fork snapshot stays; T6 keeps it from this pod's
        // sub-agents, so it cannot leak into them either.
        Some(why) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("pod {key}: {why}, so it is not removed"),
            });
            first_source_step(s, key, spec)
        }
    }
}

pub(super) fn snapshot_found(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    name: String,
    snap: SnapshotInfo,
) {
    // T6: a clone copies the snapshot's memory and disks into this pod.
    let what = format!("snapshot {name:?}");
    let record = Record::from_description(&snap.description, &name, s.config.bases());
    if let Err(why) = record.usable_by(s.tenant(key), &what) {
        return fail(s, key, format!("clone from {name}: refused: {why}"));
    }
    let backend_set = s
        .pod(key)
        .is_some_and(|e| e.pod.annotation(keys::BACKEND).is_some());
    if backend_set && !snap.hypervisor.is_empty() && snap.hypervisor != spec.backend.as_str() {
        let msg = format!(
            "snapshot {name:?} was taken on {}, the pod asks for {}",
            snap.hypervisor,
            spec.backend.as_str()
        );
        return fail(s, key, msg);
    }
    if spec.fork_from.is_none() {
        s.emit(Action::Count {
            counter: Counter::SnapshotPull {
                result: crate::labels::Outcome::Ok,
            },
        });
    }
    let pull = spec.fork_from.is_none() && !snap.image.is_empty();
    let mut cmd = clone_cmd(s, spec, CloneSource::Snapshot(name), pull);
    if let CocoonCmd::VmClone {
        restore_mode,
        on_demand,
        ..
    } = &mut cmd
    {
        // The backend of a clone is the snapshot's, not the pod's.
        if snap.hypervisor == Backend::Firecracker.as_str() {
            *restore_mode = None;
            *on_demand = false;
        }
    }
    step(s, key, CreateStep::Clone, cmd);
}
