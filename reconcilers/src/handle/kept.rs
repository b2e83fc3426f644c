//! D9: a delete whose snapshot is refused for good (the tag, or the local `<vm>`, is another
//! namespace's) must not take the only copy of the VM's state with it. The delete saves the VM once more, under
//! a name only the daemon makes (`kept-<vm>-<uid>`, which no managed VM may take), says so
//! (Warning `DeleteSnapshotKept` naming the snapshot; `cocoon_vk_snapshot_kept_total` once it
//! is made), and only then removes the VM. A kept save that fails holds the delete, as any
//! failed delete-time snapshot does.

use crate::action::{Action, Counter, Level};
use crate::event::CocoonOk;
use crate::labels;
use crate::names;
use crate::phase::{DeleteStage, DeleteWait, Deleting, SaveStep};
use crate::pod::PodKey;
use crate::snapshot::{self, Saving};
use crate::state::State;
use crate::vm::CocoonError;
use crate::{delete, outcome};

/// The name the VM of `key` is kept under, from the name of the VM it holds (never its
/// annotation now, T1) and its UID.
fn name_of(s: &State, key: &PodKey) -> Option<String> {
    let e = s.pod(key)?;
    Some(names::kept_snapshot(&e.vm()?.record.name, &e.pod.uid))
}

/// The delete-time snapshot was refused for `why`: save the VM (`vm_id`) under its kept name.
pub(crate) fn begin(s: &mut State, key: &PodKey, vm_id: &str, why: String) {
    let Some(name) = name_of(s, key) else {
        return outcome::unexpected(s, &format!("pod {key}: a kept save without a VM name"));
    };
    let msg = format!(
        "delete: {why}; the VM's state is kept on this node as local snapshot {name} before the VM is removed"
    );
    crate::create::warn_event(s, key, "DeleteSnapshotKept", &msg);
    let op = snapshot::save(s, key, &name, vm_id);
    delete::set_wait(s, key, DeleteWait::Keep(SaveStep::Save, op), None);
}

/// The outcome of a step of the kept save.
pub(crate) fn saved(
    s: &mut State,
    key: &PodKey,
    d: Deleting,
    result: Result<CocoonOk, CocoonError>,
) {
    let DeleteWait::Keep(step, _) = d.wait else {
        let what = format!(
            "pod {key}: a kept save outcome while the delete waits for {:?}",
            d.wait
        );
        return outcome::unexpected(s, &what);
    };
    let Some(name) = name_of(s, key) else {
        return outcome::unexpected(s, &format!("pod {key}: a kept save without a VM name"));
    };
    let failed = |s: &mut State, why: String| {
        let counter = Counter::SnapshotSave {
            result: labels::Outcome::Failed,
        };
        delete::snapshot_failed(s, key, counter, format!("snapshot save {name}: {why}"));
    };
    match snapshot::save_done(s, key, step, &name, &d.vm.record.id, result) {
        Saving::Next(step, op) => delete::set_wait(s, key, DeleteWait::Keep(step, op), None),
        Saving::Saved => {
            s.emit(Action::Count {
                counter: Counter::SnapshotKept,
            });
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("pod {key}: the VM's state is kept as {name}; removing the VM"),
            });
            delete::set_wait(s, key, DeleteWait::Retry, Some(DeleteStage::Remove));
            delete::next_step(s, key);
        }
        Saving::Refused(_, err) => failed(s, err.message),
        Saving::Foreign(why) => failed(s, why),
        Saving::Unexpected(_, other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: snapshot save {name} answered {other:?}"),
            );
            failed(s, "unexpected answer from cocoon".to_string())
        }
    }
}
