//! D10: an outage is not a delete. When a node stays unreachable past its pods' tolerations,
//! the taint manager deletes them, though no tenant asked; a host reboot or a slow daemon
//! upgrade would otherwise cost every tenant its VM. Such a delete keeps the VM running for the
//! pod that replaces the deleted one.

use crate::action::Action;
use crate::phase::Object;
use crate::pod::PodKey;
use crate::state::State;
use crate::state::Tracked;
use crate::{probe, tracking};

/// D10: the reasons of a `DisruptionTarget` condition for which the cluster, not the tenant,
/// deleted the pod, and the VM is kept: the taint manager deleting the pods of a node that was
/// unreachable past their tolerations (a host reboot, a daemon upgrade that took long).
const UNASKED: &[&str] = &["DeletionByTaintManager"];

/// The reason the pod `key` is deleted by an eviction its tenant did not ask for, if it is.
pub(crate) fn unasked_eviction(s: &State, key: &PodKey) -> Option<String> {
    let reason = s.pod(key)?.pod.disruption.as_deref()?;
    UNASKED.contains(&reason).then(|| reason.to_string())
}

/// D10: the pod goes (the caller finishes its delete), its VM stays running, held for the
/// next pod of the namespace that names it (the controller's replacement adopts it in place,
/// T11), and no orphan policy removes it.
pub(crate) fn keep_for_successor(
    s: &mut State,
    key: &PodKey,
    (vm, _object): (Tracked, Object),
    reason: &str,
) {
    tracking::unindex(s, key, &vm);
    probe::stop(s, key);
    let name = vm.record.name.clone();
    if let Some(held) = s.holders.get(&name).cloned() {
        s.hold(&name, Some(crate::holders::Held { kept: true, ..held }));
    }
    s.unclaimed.insert(name.clone(), vm.record.clone());
    if let Some(uid) = s.pod(key).map(|e| e.pod.uid.clone()) {
        s.emit(Action::RecordEvent {
            source: crate::action::EventSource::Vk,
            key: key.clone(),
            uid,
            kind: crate::action::EventType::Normal,
            reason: "VmKeptAfterEviction".into(),
            message: format!(
                "deleted by the cluster ({reason}), not by its owner: VM {name} keeps running for the pod that replaces this one"
            ),
        });
    }
}
