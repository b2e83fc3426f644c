//! Pods coming and going (P1–P6): the watch and its relist bracket, the choice
//! of what a new pod needs, and collecting an entry once nothing is left to do for it.

use crate::action::{Action, Level};
use crate::phase::{Failed, Gone, Object, Phase, Purpose, Retry};
use crate::pod::{PodKey, PodView};
use crate::spec::Os;
use crate::state::{PodEntry, State};
use crate::{create, delete, lifecycle};

pub fn relist_begin(s: &mut State) {
    s.relist.seen.clear();
}

/// Known pods that the complete list no longer holds are gone (P4).
pub fn relist_end(s: &mut State) {
    s.relist.complete_once = true;
    let seen = std::mem::take(&mut s.relist.seen);
    let missing: Vec<(PodKey, String)> = s
        .pods
        .sorted()
        .into_iter()
        .filter(|(k, e)| !seen.contains(*k) && !e.phase.object_gone())
        .map(|(k, e)| (k.clone(), e.pod.uid.clone()))
        .collect();
    s.tombstones.retain(|_, k| seen.contains(k));
    for (key, uid) in missing {
        pod_gone(s, &key, &uid);
    }
}

pub fn pod_applied(s: &mut State, pod: PodView) {
    if s.tombstones.contains_key(&pod.uid) {
        return;
    }
    let key = pod.key();
    let Some(e) = s.pods.get_mut(&key) else {
        s.pods.insert(key.clone(), Box::new(PodEntry::new(pod)));
        s.touched.insert(&key);
        crate::latency::seen(s, &key);
        if s.started() {
            intake(s, &key);
        }
        return;
    };
    if e.pod.uid != pod.uid {
        // A successor under the same name: the old incarnation is gone from the API.
        let old_uid = e.pod.uid.clone();
        e.successor = Some(pod);
        pod_gone(s, &key, &old_uid);
        return;
    }
    // A version from before vk's own last write (S10): everything it says, the write's answer
    // or the watch's next event says newer. Taking it would send that write again.
    if pod.older_than(e.pod.resource_version) {
        return;
    }
    let changed = !e.pod.same_desired(&pod);
    let starts_deleting = pod.deletion_timestamp.is_some() && !e.phase.deleting();
    e.pod = pod;
    s.touched.insert(&key);
    if matches!(s.startup, crate::state::Startup::Waiting { .. })
        || matches!(e.phase, Phase::Gone(_))
    {
        return;
    }
    if starts_deleting {
        delete::request(s, &key, Object::Present);
    } else if changed {
        updated(s, &key);
    }
}

/// UpdatePod: re-decode, follow a generation bump, and give a failed create a fresh start.
fn updated(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let before = e.spec.clone();
    e.spec = crate::spec::decode(&e.pod);
    let spec_changed = before != e.spec;
    lifecycle::follow_generation(s, key);
    let Some(e) = s.pods.get_mut(key) else { return };
    let hibernate = e.spec.as_ref().is_ok_and(|sp| sp.hibernate);
    match e.phase {
        // A failed wake that changed: hibernate again, or wake anew; never a fresh boot.
        Phase::Failed(Failed {
            purpose: purpose @ (Purpose::Wake | Purpose::Restore),
            ..
        }) if spec_changed => match (hibernate, e.spec.clone()) {
            (true, Ok(spec)) => create::asleep::begin(s, key, &spec),
            (false, _) | (true, Err(_)) => create::restore(s, key, purpose),
        },
        // A failed pod that changed gets a fresh start, its attempts counted anew.
        Phase::Failed(_) if spec_changed => {
            e.phase = Phase::Waiting;
            intake(s, key);
        }
        // U2: `hibernate=true` with a VM hibernates it. Only a change of the pod's spec
        // starts one here: the echo of vk's own writes must not retry a failed hibernate
        // ahead of its backoff.
        Phase::Running(_) if hibernate && spec_changed => {
            if crate::hibernate::wanted(s, key) {
                crate::hibernate::begin(s, key, 0);
            }
        }
        // U2: no `hibernate` and no VM wakes it.
        Phase::Hibernated if !hibernate => create::wake(s, key),
        // U2: a change of what the pod asks for that is neither (its snapshot policy, say) is
        // an update with nothing to do: counted, and no status is published for it.
        Phase::Running(_) | Phase::Hibernated if spec_changed => crate::provider::outcome(
            s,
            key,
            crate::provider::Op::Update,
            crate::provider::Outcome::Skipped,
            crate::labels::LifecycleReason::Noop,
        ),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}

/// Decide what a pod that vk does not run yet needs (P2, C1–C3).
pub fn intake(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    match e.phase {
        Phase::Waiting | Phase::Failed(_) => {}
        Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => return,
    }
    if e.pod.deletion_timestamp.is_some() {
        delete::request(s, key, Object::Present);
        return;
    }
    if e.pod.is_terminal() {
        return;
    }
    let spec = match &e.spec {
        Ok(spec) => spec.clone(),
        // C1: only a missing or unusable VM name is a gate (counter, no Event, no lifecycle).
        // Any other bad annotation fails the claimed bring-up like a cocoon error would, so
        // the operator sees lifecycle `failed` naming the key; retrying cannot help, so the
        // pod waits for a change instead.
        Err(err) if err.key == crate::keys::VM_NAME => {
            let reason = if err.missing {
                crate::labels::LifecycleReason::MissingVmName
            } else {
                crate::labels::LifecycleReason::InvalidVmName
            };
            let msg = err.to_string();
            reject(s, key, msg, reason);
            return;
        }
        Err(err) => {
            let msg = err.to_string();
            create::fail_permanently(s, key, msg);
            return;
        }
    };
    if let Some(class) = &spec.cpu_class {
        if s.config.cpu_class.as_deref() != Some(class.as_str()) {
            let node = s.config.cpu_class.clone().unwrap_or_else(|| "none".into());
            let msg = format!(
                "pod requires snapshot cpu class {class:?}, node {} has {node:?}",
                s.config.node_name
            );
            reject(
                s,
                key,
                msg,
                crate::labels::LifecycleReason::SnapshotCpuClassMismatch,
            );
            return;
        }
    }
    if !spec.managed {
        create::adopt_unmanaged(s, key, &spec);
        return;
    }
    // C3 path 1 (C14): a managed macOS guest is cocoon-macos's, whatever else it asks.
    if spec.os == Os::Macos {
        crate::macos::begin(s, key);
        return;
    }
    // T5, T12, T14: whatever path the pod takes, what its spec would make the node do.
    if let Some(msg) = crate::trust::spec_refused(s, key, &spec) {
        return create::fail_permanently(s, key, msg);
    }
    if spec.hibernate {
        // T1: a hibernated pod holds its name, so it must not take another pod's.
        if let Some(msg) = crate::trust::name_taken(s, key, &spec.vm_name) {
            return create::fail(s, key, msg);
        }
        return create::asleep::begin(s, key, &spec);
    }
    if let Some(record) = s.unclaimed.get(&spec.vm_name).cloned() {
        // T11: a VM left without its pod goes only where its holder record allows.
        if let Err(msg) = crate::trust::may_take(s, key, &record, crate::trust::Moment::Later) {
            return create::fail(s, key, msg);
        }
        s.unclaimed.remove(&spec.vm_name);
        // A new attempt (L3, ANN-4.2.5): `creating` first, so a failed earlier attempt does not
        // hold the adopted VM's `ready` back.
        lifecycle::attempt(s, key);
        create::adopt(s, key, record, crate::labels::LifecycleReason::Adopted);
        return;
    }
    if spec.restore_from_hibernate {
        // T1: another pod's VM name is refused before its snapshots are looked at.
        if let Some(msg) = crate::trust::name_taken(s, key, &spec.vm_name) {
            return create::fail(s, key, msg);
        }
        // C11 (marker): restore the hibernated VM; never boot fresh over its state.
        create::restore(s, key, crate::phase::Purpose::Restore);
        return;
    }
    create::begin(s, key);
}

/// An input-validation reject (C1): counter and status only, no Event, no lifecycle write.
fn reject(s: &mut State, key: &PodKey, message: String, reason: crate::labels::LifecycleReason) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let attempts = e.phase.prior_failure().0;
    e.phase = Phase::Failed(Failed {
        message: message.clone(),
        attempts,
        retry: Retry::OnChange,
        purpose: Purpose::Fresh,
    });
    s.touched.insert(key);
    crate::provider::outcome(
        s,
        key,
        crate::provider::Op::Create,
        crate::provider::Outcome::Rejected,
        reason,
    );
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: rejected: {message}"),
    });
}

/// The pod object is gone from the API (watch delete, or missing from a complete relist).
pub fn pod_gone(s: &mut State, key: &PodKey, uid: &str) {
    s.tombstones.remove(uid);
    let started = s.started();
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.pod.uid != uid {
        // A successor waiting for its predecessor's cleanup may be gone before it is taken in.
        if e.successor.as_ref().is_some_and(|p| p.uid == uid) {
            e.successor = None;
        }
        return;
    }
    if e.phase.object_gone() {
        return;
    }
    if !started {
        // Nothing runs before startup: the entry only waits to be collected.
        e.phase = Phase::Gone(Gone { delete: None });
        s.touched.insert(key);
        return;
    }
    delete::request(s, key, Object::Gone);
}

/// The pod is gone and nothing is out for it: its entry can go.
pub(crate) fn collectable(e: &PodEntry) -> bool {
    matches!(e.phase, Phase::Gone(Gone { delete: None })) && e.writer.out().is_none()
}

/// Drops a collectable entry; a successor waiting under the same name is taken in.
pub fn collect(s: &mut State, key: &PodKey) {
    if !s.pod(key).is_some_and(collectable) {
        return;
    }
    let Some(mut e) = s.pods.remove(key) else {
        return;
    };
    if let Some(next) = e.successor.take() {
        pod_applied(s, next);
    }
}

/// B6: a hibernated pod without a VM is Pending until the hibernate key is withdrawn, which
/// wakes it (U5). A hibernate that got as far as removing the VM is complete.
pub(crate) fn enter_hibernated(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.phase = Phase::Hibernated;
    s.touched.insert(key);
    // A hibernate that had begun is done: `hibernated` at the pod's generation.
    if matches!(
        e.lifecycle(),
        Some((crate::state::Lifecycle::Hibernated, _, _))
    ) {
        lifecycle::stamp(s, key);
    }
}
