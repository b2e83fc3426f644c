//! Runtime and lifecycle annotations (spec/annotations.md §3–4), kept declaratively: what vk
//! wants on the pod is derived from state and patched when the pod differs, so a lost write
//! is repaired by the next event instead of by bookkeeping.

use std::collections::BTreeMap;

use crate::action::Action;
use crate::keys;
use crate::pod::PodKey;
use crate::state::{Lifecycle, OpOwner, State};

const LIFECYCLE_TRIPLE: [&str; 3] = [
    keys::LIFECYCLE_STATE,
    keys::LIFECYCLE_GENERATION,
    keys::LIFECYCLE_MESSAGE,
];

pub fn desired(s: &State, key: &PodKey) -> BTreeMap<String, Option<String>> {
    let mut want = BTreeMap::new();
    let Some(e) = s.pods.get(key) else {
        return want;
    };
    if let Some(vm) = e.vm.as_ref().filter(|v| !v.unmanaged) {
        want.insert(keys::VM_ID.to_string(), Some(vm.record.id.clone()));
        if let Some(ip) = &vm.ip {
            want.insert(keys::VM_IP.to_string(), Some(ip.clone()));
        }
    }
    if let Some(state) = e.intent.state {
        want.insert(
            keys::LIFECYCLE_STATE.to_string(),
            Some(state.as_str().to_string()),
        );
        want.insert(
            keys::LIFECYCLE_GENERATION.to_string(),
            Some(e.intent.generation.to_string()),
        );
        want.insert(
            keys::LIFECYCLE_MESSAGE.to_string(),
            e.intent.message.clone().filter(|m| !m.is_empty()),
        );
    }
    want
}

pub fn sync(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get(key) else { return };
    if !s.started
        || e.gone
        || e.deleted_by_us
        || e.superseded
        || e.kube_backoff
        || e.annotations_op.is_some()
    {
        return;
    }
    let want = desired(s, key);
    let mut diff: BTreeMap<String, Option<String>> = want
        .iter()
        .filter(|(k, v)| e.pod.annotations.get(*k) != v.as_ref())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // L2: the lifecycle triple is written as one unit, message null when empty, even when
    // only one of the three differs from what the server holds.
    if LIFECYCLE_TRIPLE.iter().any(|k| diff.contains_key(*k)) {
        for k in LIFECYCLE_TRIPLE {
            if let Some(v) = want.get(k) {
                diff.insert(k.to_string(), v.clone());
            }
        }
    }
    if diff.is_empty() {
        return;
    }
    // §4.2 rule 7: the status goes out before `ready` is exposed.
    let exposes_ready = diff
        .get(keys::LIFECYCLE_STATE)
        .is_some_and(|v| v.as_deref() == Some(Lifecycle::Ready.as_str()));
    if exposes_ready && e.status_op.is_some() {
        return;
    }
    let uid = e.pod.uid.clone();
    let op = s.new_op(OpOwner::Annotations {
        key: key.clone(),
        set: diff.clone(),
    });
    s.pods.get_mut(key).expect("present").annotations_op = Some(op);
    s.emit(Action::PatchAnnotations {
        op,
        key: key.clone(),
        uid,
        set: diff,
    });
}
