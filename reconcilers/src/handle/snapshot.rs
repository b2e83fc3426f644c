//! What every save and push of a VM shares (the delete-time snapshot, D4, and the hibernate,
//! U3): the counters and durations they report, the push they make, and the cleanup of a
//! local snapshot whose outcome is only logged.

use crate::action::{Action, Counter, Histogram, RegistryCall};
use crate::cocoon::CocoonCmd;
use crate::phase::Scratch;
use crate::pod::PodKey;
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::time::Millis;

/// A `snapshot save` that began at `since` succeeded.
pub(crate) fn saved(s: &mut State, since: Millis) {
    s.emit(Action::Count {
        counter: Counter::SnapshotSave {
            result: "ok".into(),
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
            result: "ok".into(),
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

/// Removes a local snapshot; a failure is only logged (a missing one is no failure).
pub(crate) fn remove_detached(s: &mut State, key: &PodKey, name: String) {
    let owner = CocoonOwner::Detached {
        what: format!("snapshot rm {name}"),
        release: None,
    };
    s.run_cocoon(owner, Some(key.clone()), CocoonCmd::SnapshotRm { name });
}

/// Removes what a bring-up made for itself alone (U6); the outcome is only logged.
pub(crate) fn drop_scratch(s: &mut State, key: &PodKey, scratch: Scratch) {
    match scratch {
        Scratch::Snapshot(name) => remove_detached(s, key, name),
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
