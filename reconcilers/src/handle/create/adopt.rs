//! Entering Running: a VM booted by the bring-up, one adopted (C4, C5), or one re-attached
//! after a restart (B4, B5, B9).

use crate::action::{Action, Counter, EventType, Histogram};
use crate::labels::{self, LifecycleReason, ResumeOp};
use crate::phase::{IpWait, Phase, Purpose, Running};
use crate::pod::PodKey;
use crate::provider::{self, Op, Outcome};
use crate::spec::{Mode, VmSpec};
use crate::state::{Lifecycle, State, Tracked, VmOwner};
use crate::vm::VmRecord;
use crate::{delete, keys, probe, tracking};

/// C12: the VM is up. Track it, probe it, and wait for the IP that `ready` needs — or, when
/// a delete came meanwhile, hand it to the delete, which removes it.
pub(super) fn booted(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let Some(e) = s.pod(key) else { return };
    let (Phase::Creating(c), Ok(spec)) = (&e.phase, &e.spec) else {
        // The step that booted the VM found the pod bringing it up, with a spec.
        return crate::outcome::unexpected(s, &format!("pod {key}: a boot outside its bring-up"));
    };
    let (since, cancel, purpose, scratch) = (c.since, c.cancel, c.purpose, c.scratch.clone());
    let woken = purpose != Purpose::Fresh;
    let clone_path = woken
        || spec.mode != Mode::Run
        || spec.clone_from_dir.is_some()
        || spec.fork_from.is_some();
    let backend = spec.backend.as_str().to_string();
    let from_dir = spec.clone_from_dir.is_some();
    s.emit(Action::Observe {
        histogram: Histogram::VmBootDuration {
            mode: if clone_path { "clone" } else { "run" }.into(),
            backend,
        },
        millis: (now - since).max(0) as u64,
    });
    if clone_path && from_dir {
        s.emit(Action::Count {
            counter: Counter::CloneFromDir {
                result: labels::Outcome::Ok,
            },
        });
    }
    let tracked = Tracked {
        record: vm,
        ip: None,
        owner: VmOwner::Vk,
    };
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = Some(now);
    }
    if !woken {
        crate::latency::vm_created(s, key);
    }
    // A registry import or a peer's staged copy served this clone only (U6).
    if let Some(scratch) = scratch {
        crate::snapshot::drop_scratch(s, key, scratch);
    }
    if let Some(object) = cancel {
        return delete::with_new_vm(s, key, tracked, object);
    }
    enter_running(s, key, tracked);
    probe::start(s, key);
    let op = if woken { Op::Wake } else { Op::Create };
    provider::outcome(s, key, op, Outcome::Ok, LifecycleReason::None);
    let wait = match (woken, clone_path) {
        (true, _) => IpWait::Wake,
        (false, true) => IpWait::Clone,
        (false, false) => IpWait::Run,
    };
    if let Some(e) = s.pods.get_mut(key) {
        e.post_clone = None;
    }
    crate::guest::begin(s, key, wait);
    // U2: a hibernate asked for while the VM was being made (the operator sets `hibernate`
    // on a pod it remade with the restore marker) starts once the VM is up.
    if crate::hibernate::wanted(s, key) {
        crate::hibernate::begin(s, key, 0);
    }
}

/// The pod holds this VM now: Running with no task, indexed, its IP resolved.
pub(crate) fn enter_running(s: &mut State, key: &PodKey, vm: Tracked) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.phase = Phase::Running(Running {
        vm,
        task: None,
        settle: None,
    });
    tracking::indexed(s, key);
}

/// C4: a VM of this name is already here: take it over instead of creating another.
pub fn adopt(s: &mut State, key: &PodKey, vm: VmRecord, reason: LifecycleReason) {
    let now = s.now;
    let tracked = Tracked {
        record: vm,
        ip: None,
        owner: VmOwner::Vk,
    };
    enter_running(s, key, tracked);
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = e.started_at.or(Some(now));
    }
    probe::start(s, key);
    provider::outcome(s, key, Op::Create, Outcome::Ok, reason);
    // No guest work is owed, but `ready` still needs the IP (usually already leased).
    crate::guest::lease(s, key, IpWait::Adopt);
}

/// C5: an unmanaged pod brings its own VM; vk only probes its address. T10: only a VM and
/// address this node proves are the pod's to name; anything else is refused.
pub fn adopt_unmanaged(s: &mut State, key: &PodKey, spec: &VmSpec) {
    let record = match crate::unmanaged::check(s, key, spec) {
        crate::unmanaged::Claim::Proven(record) => *record,
        crate::unmanaged::Claim::Wait => return crate::unmanaged::wait(s, key),
        crate::unmanaged::Claim::Refused(msg) => return super::fail(s, key, msg),
    };
    let now = s.now;
    let tracked = Tracked {
        ip: record.static_ip.clone(),
        record,
        owner: VmOwner::Pod,
    };
    enter_running(s, key, tracked);
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = e.started_at.or(Some(now));
    }
    probe::start(s, key);
    // A claim refused before and proven at last is a new attempt: its failure ends (L3).
    crate::lifecycle::attempt(s, key);
    provider::outcome(s, key, Op::Create, Outcome::Ok, LifecycleReason::Unmanaged);
}

/// B4/B5: re-attach a pod to its VM after a restart, keeping what the server already shows
/// (start time, readiness and its transition time) so a restart does not flap the pod. Its
/// `ip` annotation is the IP cache until the lease file is read (R6).
pub fn resume(s: &mut State, key: &PodKey, vm: VmRecord) {
    let running = vm.is_running();
    let Some(e) = s.pod(key) else { return };
    let cached_ip = e.pod.annotation(keys::VM_IP).map(str::to_string);
    let tracked = Tracked {
        record: vm,
        ip: cached_ip,
        owner: VmOwner::Vk,
    };
    enter_running(s, key, tracked);
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    e.started_at = e
        .pod
        .status
        .start_time
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .or(Some(now));
    if let Some((ready, since)) = crate::status::parse_ready_condition(&e.pod.status) {
        e.probe.ready = ready;
        e.ready_changed_at = since;
    }
    // What the previous process said (L1): a failure stays, a bring-up resumes its guest step.
    let shown = match &e.sticky.failure {
        Some(_) => Some(Lifecycle::Failed),
        None => e
            .pod
            .annotation(keys::LIFECYCLE_STATE)
            .and_then(Lifecycle::parse),
    };
    let uid = e.pod.uid.clone();
    probe::start(s, key);
    match shown {
        Some(Lifecycle::Failed) => {}
        Some(Lifecycle::Creating) => resume_guest_step(s, key, &uid),
        // Seeded `ready` stays as the server has it: no rewrite, no flap.
        Some(Lifecycle::Ready) => {}
        Some(Lifecycle::Hibernating | Lifecycle::Hibernated) | None => {
            crate::guest::lease(s, key, IpWait::Adopt)
        }
    }
    // A stopped VM is restarted (W4) unless the pod is to hibernate: then the hibernate
    // boots it (B9), and a failed boot never evicts the pod and removes the VM.
    let hibernating = s
        .pod(key)
        .is_some_and(|e| e.spec.as_ref().is_ok_and(|sp| sp.hibernate && sp.managed));
    if !running && !hibernating {
        crate::vm_events::hint(s, key);
    }
}

/// B9: a bring-up that had its VM but not `ready` when the process stopped. The pod's
/// `post-clone-state` says how far the guest step got; without one, the plan is derived again
/// from the spec and the VM, as at the end of a bring-up.
pub(super) fn resume_guest_step(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pod(key) else { return };
    let Ok(spec) = &e.spec else { return };
    let Some(vm) = e.vm() else { return };
    // A run-mode pod's VM was booted, not copied; anything else came from a snapshot.
    let wait = match spec.mode == Mode::Run
        && spec.clone_from_dir.is_none()
        && spec.fork_from.is_none()
        && !spec.restore_from_hibernate
    {
        true => IpWait::Run,
        false => IpWait::Clone,
    };
    let needed = crate::guest::needed(spec, &vm.record, wait);
    let state = e.pod.annotation(keys::POST_CLONE_STATE).map(str::to_string);
    let state = state.as_deref();
    // A cloud-hypervisor Windows clone may be a fresh clone or a wake that restored the
    // hibernate snapshot (with a NIC added back): the registry's evidence tells which.
    let classify =
        state.is_none() && wait == IpWait::Clone && spec.drops_nic() && s.config.registry.is_some();
    let (op, message) = match (state, needed) {
        _ if classify => (
            ResumeOp::ClassifyDropNic,
            "reconcile: finding out whether the VM was restored from its hibernate snapshot",
        ),
        (Some("done"), _) => (
            ResumeOp::ReadyWait,
            "reconcile: the guest fix-up was done; resuming the steps after it",
        ),
        (Some("running"), Some(_)) | (None, Some(_)) => (
            ResumeOp::PostClone,
            "reconcile: running the guest fix-up again",
        ),
        (Some(_), _) | (None, None) => (
            ResumeOp::ReadyWait,
            "reconcile: resuming the wait for the VM's IP",
        ),
    };
    s.emit(Action::Count {
        counter: Counter::StartupResume { op },
    });
    s.emit(Action::RecordEvent {
        source: crate::action::EventSource::Vk,
        key: key.clone(),
        uid: uid.to_string(),
        kind: EventType::Normal,
        reason: "ResumedAfterRestart".into(),
        message: message.into(),
    });
    match (state, needed) {
        _ if classify => crate::guest::classify(s, key),
        (Some("done"), _) => crate::guest::resume_after_fixup(s, key, wait),
        (_, Some(kind)) if state != Some("failed") => crate::guest::start_fixup(s, key, kind, wait),
        (_, _) => crate::guest::lease(s, key, wait),
    }
}
