//! Local snapshots one pod makes for others of the same source (C8.3, C9): the first pod
//! claims the making, the rest wait and clone from it.

use super::failure::fail;
use super::{clone_cmd, set_step_op, step, wait_for_other};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::names;
use crate::phase::{CreateStep, Creating, Phase, SaveStep};
use crate::pod::PodKey;
use crate::state::{Making, SnapshotClaim, State};

/// Claims the making of local snapshot `name` for `key`, or queues `key` behind the pod
/// already making it (then `false`: the pod waits, its step `AwaitSnapshot`).
pub(super) fn claim(s: &mut State, key: &PodKey, name: &str, how: Making) -> bool {
    match s.snapshot_claims.get_mut(name) {
        Some(claim) if claim.maker != *key => {
            claim.waiting.insert(key.clone());
            let next = CreateStep::AwaitSnapshot {
                name: name.to_string(),
            };
            wait_for_other(s, key, next);
            false
        }
        Some(_) => true,
        None => {
            let claim = SnapshotClaim {
                maker: key.clone(),
                how,
                waiting: Default::default(),
            };
            s.snapshot_claims.insert(name.to_string(), claim);
            true
        }
    }
}

pub(super) fn fork_source(s: &mut State, key: &PodKey, source: &str) {
    let name = names::fork_snapshot(source);
    // Another fork of this source is saving it: clone from that save, never a second one
    // that would replace the snapshot under the first pod's clone.
    if !claim(s, key, &name, Making::ForkSave) {
        return;
    }
    // T2 let only a source some pod here holds through; it may have let go of it since.
    let tracked = s
        .vm_names
        .get(source)
        .and_then(|k| s.pod(k))
        .and_then(|e| e.vm());
    match tracked {
        Some(vm) => {
            let id = vm.record.id.clone();
            save_fork(s, key, source, id);
        }
        None => fail(
            s,
            key,
            format!("fork-from {source:?}: the source VM is no longer running on this node"),
        ),
    }
}

/// A pod that claimed a fork save and has left the steps of that save: the save is done
/// (the pod clones from it) or abandoned. Either way the pods waiting for it move on: to
/// clone from it, or to look for the snapshot again (and perhaps save it themselves).
pub(super) fn settle_snapshot_claim(s: &mut State, key: &PodKey) {
    let saving = match s.pod(key).map(|e| &e.phase) {
        Some(Phase::Creating(c)) => match &c.step {
            CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::PullSnapshot { .. } => true,
            CreateStep::Clone => false,
            CreateStep::RemoveFork { .. }
            | CreateStep::PullImage
            | CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::Run
            | CreateStep::InspectAfterBoot { .. }
            | CreateStep::InspectNameTaken
            | CreateStep::CheckEvidence
            | CreateStep::CheckHibernated
            | CreateStep::InspectLocal { .. }
            | CreateStep::VerifyRemote { .. }
            | CreateStep::PeerRestore { .. }
            | CreateStep::PullHibernate { .. }
            | CreateStep::AwaitSnapshot { .. }
            | CreateStep::Macos { .. } => false,
        },
        Some(_) | None => false,
    };
    if saving {
        return;
    }
    let saved = matches!(
        s.pod(key).map(|e| &e.phase),
        Some(Phase::Creating(Creating {
            step: CreateStep::Clone,
            ..
        }))
    );
    release_snapshot_claims(s, key, saved);
}

/// Ends every snapshot claim `key` holds; `saved`: the snapshot is there to clone from.
pub(crate) fn release_snapshot_claims(s: &mut State, key: &PodKey, saved: bool) {
    let held: Vec<String> = s
        .snapshot_claims
        .iter()
        .filter(|(_, f)| f.maker == *key)
        .map(|(name, _)| name.clone())
        .collect();
    for name in held {
        let Some(save) = s.snapshot_claims.remove(&name) else {
            continue;
        };
        for waiter in save.waiting {
            let waits = matches!(
                s.pod(&waiter).map(|e| &e.phase),
                Some(Phase::Creating(Creating { step: CreateStep::AwaitSnapshot { name: n }, op: None, .. })) if *n == name
            );
            if !waits {
                continue;
            }
            let Some(spec) = s.pod(&waiter).and_then(|e| e.spec.clone().ok()) else {
                continue;
            };
            // A pulled base is inspected first, as the puller did: its record decides the
            // backend check and `--pull` (C8.6); a fork snapshot is this node's own save.
            if saved && save.how == Making::ForkSave {
                let cmd = clone_cmd(s, &spec, CloneSource::Snapshot(name.clone()), false);
                step(s, &waiter, CreateStep::Clone, cmd);
            } else {
                let cmd = CocoonCmd::SnapshotInspect { name: name.clone() };
                step(
                    s,
                    &waiter,
                    CreateStep::InspectSnapshot { name: name.clone() },
                    cmd,
                );
            }
        }
    }
}

/// A pod waiting for another pod's fork save stops waiting (it is deleted or gone).
pub(crate) fn stop_waiting(s: &mut State, key: &PodKey) {
    for save in s.snapshot_claims.values_mut() {
        save.waiting.remove(key);
    }
}

pub(super) fn save_fork(s: &mut State, key: &PodKey, source: &str, vm: String) {
    let op = crate::snapshot::save(s, key, &names::fork_snapshot(source), &vm);
    let save = SaveStep::Save;
    set_step_op(s, key, CreateStep::SaveForkSnapshot { vm, save }, op);
}
