//! The Hibernating phase (U1–U4): a Running pod asked to hibernate is saved as `<vm>`, pushed
//! to `<vm>:hibernate`, and its VM removed; the pod stays, Hibernated, until it is woken. A
//! failed step goes back to Running with lifecycle `failed` and a Warning, and is retried
//! while `hibernate=true` remains.

use crate::action::{Action, Counter, EventType, Level, RegistryCall, Timer};
use crate::backoff::Backoff;
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, RegistryError, RegistryOk};
use crate::labels::{HibernatePhase, Outcome};
use crate::phase::{
    Failure, HibernateStep, Hibernating, NicStage, Object, Phase, Running, SaveStep,
};
use crate::pod::PodKey;
use crate::snapshot::Saving;
use crate::spec::Os;
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{create, delete, lifecycle, outcome, probe, snapshot, tracking};

/// U4: a failed hibernate is tried again 5 s doubling to 5 min while `hibernate=true` remains;
/// each try saves and pushes the whole VM, so it is not hurried.
const RETRY: Backoff = Backoff::doubling(5_000, 300_000);

/// Whether the pod asks to hibernate and can: managed, not macOS, Running with no task out.
/// A macOS pod asked to hibernate fails with `HibernateUnsupported` (U1).
pub(crate) fn wanted(s: &mut State, key: &PodKey) -> bool {
    let Some(e) = s.pod(key) else { return false };
    let Ok(spec) = &e.spec else { return false };
    if !spec.hibernate || !spec.managed {
        return false;
    }
    let idle = matches!(&e.phase, Phase::Running(r) if r.task.is_none() && r.vm.managed());
    if !idle {
        return false;
    }
    if spec.os == Os::Macos {
        let msg = "hibernate: macOS guests cannot hibernate".to_string();
        if e.sticky.failure.is_none() {
            create::warn_event(s, key, "HibernateUnsupported", &msg);
            lifecycle::failed(s, key, msg);
        }
        return false;
    }
    // DEC-8: the push could only fail, so nothing is saved; the VM runs on.
    if s.config.registry.is_none() {
        let msg = "hibernate: OCI_REGISTRY is not set, so the VM's state has nowhere to go; \
                   the VM keeps running"
            .to_string();
        if e.sticky.failure.is_none() {
            create::warn_event(s, key, "HibernatePushFailed", &msg);
            lifecycle::failed(s, key, msg);
        }
        return false;
    }
    true
}

/// U3: lifecycle `hibernating`, then `snapshot save --name <vm>`.
pub(crate) fn begin(s: &mut State, key: &PodKey, attempts: u32) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Running(r) = &e.phase else {
        return crate::outcome::unexpected(s, &format!("pod {key}: begin found it not Running"));
    };
    let mut running = r.clone();
    // The guest steps end with this VM: a wake brings up a new one with its own, and a
    // rollback leaves the pod `failed`; an outcome of theirs that comes meanwhile is dropped,
    // so keeping them would leave a step waiting for it forever.
    running.settle = None;
    // T1: the snapshot is named after the VM the pod holds, never after its annotation now,
    // which a tenant may have changed to another pod's VM name since.
    let name = running.vm.record.name.clone();
    let id = running.vm.record.id.clone();
    let drops_nic = e.spec.as_ref().is_ok_and(|sp| sp.drops_nic());
    lifecycle::attempt(s, key);
    let owner = CocoonOwner::Pod { key: key.clone() };
    let (step, op) = match (running.vm.record.is_running(), drops_nic) {
        (false, _) => {
            let op = s.run_cocoon(owner, Some(key.clone()), CocoonCmd::VmStart { id });
            (HibernateStep::Start, op)
        }
        (true, true) => {
            let op = s.run_cocoon(owner, Some(key.clone()), guest(&id, "/release"));
            (HibernateStep::ReleaseLease, op)
        }
        (true, false) => {
            let save = SaveStep::Save;
            (
                HibernateStep::Save { save },
                snapshot::save(s, key, &name, &id),
            )
        }
    };
    let now = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        e.phase = Phase::Hibernating(Hibernating {
            running,
            step,
            op,
            since: now,
            attempts,
            cancel: None,
        });
    }
}

/// `ipconfig <arg>` in the Windows guest.
fn guest(id: &str, arg: &str) -> CocoonCmd {
    CocoonCmd::VmExec {
        id: id.to_string(),
        argv: vec!["ipconfig".into(), arg.into()],
    }
}

/// The next step's call.
fn call(s: &mut State, key: &PodKey, step: HibernateStep, cmd: CocoonCmd) {
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    next(s, key, step, op);
}

/// Whether the VM is without its NIC at this step (U4 puts it back).
fn nic_dropped(s: &State, key: &PodKey, step: &HibernateStep) -> bool {
    let drops = s
        .pod(key)
        .is_some_and(|e| e.spec.as_ref().is_ok_and(|sp| sp.drops_nic()));
    drops
        && match step {
            HibernateStep::Save { .. } | HibernateStep::Push | HibernateStep::Remove => true,
            HibernateStep::Start
            | HibernateStep::ReleaseLease
            | HibernateStep::DropNic
            | HibernateStep::RestoreNic { .. } => false,
        }
}

fn next(s: &mut State, key: &PodKey, step: HibernateStep, op: crate::action::OpId) {
    let now = s.now;
    if let Some(Phase::Hibernating(h)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        h.step = step;
        h.op = op;
        h.since = now;
    }
}

fn count(s: &mut State, phase: HibernatePhase, result: Outcome) {
    s.emit(Action::Count {
        counter: Counter::Hibernate { phase, result },
    });
}

/// The outcome of the hibernate's cocoon call: a step of the VM's save, of its NIC, or its
/// removal.
pub(crate) fn step_done(
    s: &mut State,
    key: &PodKey,
    h: Hibernating,
    result: Result<CocoonOk, CocoonError>,
) {
    let name = h.running.vm.record.name.clone();
    let (step, since, cancel, id) = (h.step, h.since, h.cancel, h.running.vm.record.id);
    let Some(e) = s.pod(key) else {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    };
    let image = e
        .spec
        .as_ref()
        .map(|sp| sp.image.clone())
        .unwrap_or_default();
    if let Some(object) = cancel {
        return hand_to_delete(s, key, object, step, &result);
    }
    match step {
        HibernateStep::Save { save } => {
            let vm = Vm { name, id, image };
            save_done(s, key, save, vm, since, result)
        }
        HibernateStep::RestoreNic { stage, failed } => {
            restore_nic(s, key, &id, stage, failed, result)
        }
        HibernateStep::Start
        | HibernateStep::ReleaseLease
        | HibernateStep::DropNic
        | HibernateStep::Remove => vm_step_done(s, key, step, &name, &id, result),
        HibernateStep::Push => outcome::unexpected(
            s,
            &format!("pod {key}: a cocoon outcome for the hibernate push"),
        ),
    }
}

/// The VM being hibernated: its name, id and image.
struct Vm {
    name: String,
    id: String,
    image: String,
}

/// U3: a step of the save (see `snapshot.rs`); once saved, the push to `<vm>:hibernate`.
fn save_done(
    s: &mut State,
    key: &PodKey,
    save: SaveStep,
    vm: Vm,
    since: crate::time::Millis,
    result: Result<CocoonOk, CocoonError>,
) {
    let Vm { name, id, image } = vm;
    match snapshot::save_done(s, key, save, &name, &id, result) {
        Saving::Next(save, op) => next(s, key, HibernateStep::Save { save }, op),
        Saving::Saved => {
            count(s, HibernatePhase::Snapshot, Outcome::Ok);
            snapshot::saved(s, since);
            let call = snapshot::push_of(s, key, &name, "hibernate", image);
            let owner = RegistryOwner::Pod { key: key.clone() };
            let op = s.call_registry(owner, Some(key.clone()), call);
            next(s, key, HibernateStep::Push, op);
        }
        Saving::Refused(_, err) => {
            count(s, HibernatePhase::Snapshot, Outcome::Failed);
            s.emit(Action::Count {
                counter: Counter::SnapshotSave {
                    result: Outcome::Failed,
                },
            });
            let msg = format!("hibernate: snapshot save {name}: {}", err.message);
            roll_back(s, key, "HibernateSnapshotFailed", msg);
        }
        Saving::Foreign(why) => {
            count(s, HibernatePhase::Snapshot, Outcome::Failed);
            s.emit(Action::Count {
                counter: Counter::SnapshotSave {
                    result: Outcome::Failed,
                },
            });
            let msg = format!("hibernate: snapshot save {name}: {why}");
            roll_back(s, key, "HibernateSnapshotFailed", msg);
        }
        Saving::Unexpected(save, other) => {
            let step = save_label(save);
            outcome::unexpected(
                s,
                &format!("pod {key}: hibernate step {step} answered {other:?}"),
            );
            roll_back(
                s,
                key,
                "HibernateSnapshotFailed",
                format!("hibernate: {step}: unexpected answer from cocoon"),
            );
        }
    }
}

/// How logs and messages name a save step.
fn save_label(save: SaveStep) -> &'static str {
    match save {
        SaveStep::Save => "Save",
        SaveStep::InspectHolder => "InspectTakenSave",
        SaveStep::RemoveHolder => "RemoveTakenSave",
        SaveStep::SaveAgain => "SaveAgain",
    }
}

/// The steps on the VM around the save: its start (B9), the NIC's drop (U3), its removal.
fn vm_step_done(
    s: &mut State,
    key: &PodKey,
    step: HibernateStep,
    name: &str,
    id: &str,
    result: Result<CocoonOk, CocoonError>,
) {
    use CocoonErrorKind::VmNotFound;
    match (step, result) {
        (HibernateStep::Start, Ok(CocoonOk::Done)) => {
            let drops_nic = s
                .pod(key)
                .is_some_and(|e| e.spec.as_ref().is_ok_and(|sp| sp.drops_nic()));
            if let Some(Phase::Hibernating(h)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                // Started: a rollback from here on puts back a running VM.
                h.running.vm.record.state = "running".into();
            }
            match drops_nic {
                true => call(s, key, HibernateStep::ReleaseLease, guest(id, "/release")),
                false => start_save(s, key, name, id),
            }
        }
        // Best effort: a guest that cannot give its lease back loses it with the NIC anyway.
        (HibernateStep::ReleaseLease, result) => {
            count(s, HibernatePhase::DhcpRelease, result.is_ok().into());
            let id = id.to_string();
            call(
                s,
                key,
                HibernateStep::DropNic,
                CocoonCmd::VmNet { id, nics: 0 },
            );
        }
        (HibernateStep::DropNic, Ok(CocoonOk::Done)) => {
            count(s, HibernatePhase::Netresize, Outcome::Ok);
            start_save(s, key, name, id);
        }
        // The NIC is still there: only the released lease is renewed.
        (HibernateStep::DropNic, Err(err)) => {
            count(s, HibernatePhase::Netresize, Outcome::Failed);
            let failed = Failure {
                reason: "HibernateNetResizeFailed".into(),
                message: format!("hibernate: vm net --nics 0 {name}: {}", err.message),
            };
            let step = HibernateStep::RestoreNic {
                stage: NicStage::Renew,
                failed,
            };
            call(s, key, step, guest(id, "/renew"));
        }
        (HibernateStep::Start, Err(err)) => {
            // Not a phase of `cocoon_vk_hibernate_total`: the Warning and the update
            // failure count it.
            let msg = format!("hibernate: vm start {name}: {}", err.message);
            roll_back(s, key, "ResumeStartFailed", msg);
        }
        (
            HibernateStep::Remove,
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: VmNotFound, ..
            }),
        ) => {
            count(s, HibernatePhase::Remove, Outcome::Ok);
            hibernated(s, key);
        }
        (HibernateStep::Remove, Err(err)) => {
            count(s, HibernatePhase::Remove, Outcome::Failed);
            // U4: so nobody sees a finished hibernate while the VM lives, the tag goes.
            let call = RegistryCall::DeleteTag {
                name: name.to_string(),
                tag: "hibernate".into(),
            };
            let owner = RegistryOwner::Detached {
                what: format!("rollback: delete {name}:hibernate"),
            };
            s.call_registry(owner, Some(key.clone()), call);
            let msg = format!("hibernate: vm rm {name}: {}", err.message);
            roll_back(s, key, "HibernateRemoveFailed", msg);
        }
        (
            step @ (HibernateStep::Start | HibernateStep::DropNic | HibernateStep::Remove),
            Ok(other),
        ) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: hibernate step {step:?} answered {other:?}"),
            );
            roll_back(
                s,
                key,
                "HibernateSnapshotFailed",
                format!("hibernate: {step:?}: unexpected answer from cocoon"),
            );
        }
        (
            step @ (HibernateStep::Save { .. }
            | HibernateStep::Push
            | HibernateStep::RestoreNic { .. }),
            Ok(_) | Err(_),
        ) => outcome::unexpected(
            s,
            &format!("pod {key}: hibernate step {step:?} routed as a VM step"),
        ),
    }
}

/// The save's first step.
fn start_save(s: &mut State, key: &PodKey, name: &str, id: &str) {
    let op = snapshot::save(s, key, name, id);
    let save = SaveStep::Save;
    next(s, key, HibernateStep::Save { save }, op);
}

/// The outcome of the push to `<vm>:hibernate`.
pub(crate) fn push_done(
    s: &mut State,
    key: &PodKey,
    h: Hibernating,
    result: Result<RegistryOk, RegistryError>,
) {
    let name = h.running.vm.record.name.clone();
    let (since, cancel, id) = (h.since, h.cancel, h.running.vm.record.id);
    if s.pod(key).is_none() {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    }
    if let Some(object) = cancel {
        let result: Result<CocoonOk, CocoonError> = Ok(CocoonOk::Done);
        return hand_to_delete(s, key, object, HibernateStep::Push, &result);
    }
    match result {
        Ok(RegistryOk::Pushed { .. }) => {
            count(s, HibernatePhase::Push, Outcome::Ok);
            snapshot::pushed(s, since);
            // The `id` and `ip` annotations are withdrawn with this step (the wake gate must
            // not see a VM that is about to vanish), then the VM goes.
            let cmd = CocoonCmd::VmRm { id };
            let op = s.run_cocoon(
                CocoonOwner::Pod { key: key.clone() },
                Some(key.clone()),
                cmd,
            );
            next(s, key, HibernateStep::Remove, op);
        }
        Ok(other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: push of {name}:hibernate answered {other:?}"),
            );
            count(s, HibernatePhase::Push, Outcome::Failed);
            roll_back(
                s,
                key,
                "HibernatePushFailed",
                format!("hibernate: push {name}:hibernate: unexpected answer"),
            );
        }
        Err(err) => {
            count(s, HibernatePhase::Push, Outcome::Failed);
            s.emit(Action::Count {
                counter: Counter::SnapshotPush {
                    result: Outcome::Failed,
                },
            });
            let msg = format!("hibernate: push {name}:hibernate: {}", err.message);
            roll_back(s, key, "HibernatePushFailed", msg);
        }
    }
}

/// U3 steps 7–10: the VM is gone; its lease goes back, the probe stops, the pod is Pending
/// without container statuses, lifecycle `hibernated`, Normal `Hibernated`.
fn hibernated(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else {
        return outcome::unexpected(s, &format!("pod {key}: hibernated a pod that is gone"));
    };
    // Only a Hibernating pod becomes Hibernated: any other phase is kept as it is.
    let Phase::Hibernating(h) = &e.phase else {
        return outcome::unexpected(
            s,
            &format!("pod {key}: hibernated found it not Hibernating"),
        );
    };
    let vm = h.running.vm.clone();
    e.phase = Phase::Hibernated;
    let uid = e.pod.uid.clone();
    tracking::forget(s, key, &vm);
    lifecycle::stamp(s, key);
    s.emit(Action::RecordEvent {
        source: crate::action::EventSource::Vk,
        key: key.clone(),
        uid,
        kind: EventType::Normal,
        reason: "Hibernated".into(),
        message: "hibernate: the VM's state is in the registry and the VM is removed".into(),
    });
    crate::provider::outcome(
        s,
        key,
        crate::provider::Op::Update,
        crate::provider::Outcome::Ok,
        crate::labels::LifecycleReason::Hibernate,
    );
}

/// U4: back to Running as it was (its `id` and `ip` re-applied by the next publish),
/// lifecycle `failed`, a Warning, and a retry with backoff while `hibernate=true` remains.
fn roll_back(s: &mut State, key: &PodKey, reason: &str, msg: String) {
    let step = match s.pod(key).map(|e| &e.phase) {
        Some(Phase::Hibernating(h)) => h.step.clone(),
        Some(_) | None => return,
    };
    if nic_dropped(s, key, &step) {
        let Some(id) = s.pod(key).and_then(|e| e.vm()).map(|v| v.record.id.clone()) else {
            return;
        };
        let failed = Failure {
            reason: reason.into(),
            message: msg,
        };
        let step = HibernateStep::RestoreNic {
            stage: NicStage::Add,
            failed,
        };
        return call(s, key, step, CocoonCmd::VmNet { id, nics: 1 });
    }
    rolled_back(s, key, reason, msg)
}

/// U4 after a NIC drop: the NIC back, the VM's new MAC, a lease renewal, each best effort
/// (a VM left without its NIC still runs, and a failed lifecycle says why); then the pod
/// goes back to Running.
fn restore_nic(
    s: &mut State,
    key: &PodKey,
    id: &str,
    stage: NicStage,
    failed: Failure,
    result: Result<CocoonOk, CocoonError>,
) {
    if let Err(err) = &result {
        s.emit(Action::Log {
            level: Level::Warn,
            message: format!("pod {key}: rollback {stage:?} of the NIC: {}", err.message),
        });
    }
    match (stage, result) {
        (NicStage::Add, Ok(_) | Err(_)) => {
            let step = HibernateStep::RestoreNic {
                stage: NicStage::Inspect,
                failed,
            };
            call(s, key, step, CocoonCmd::VmInspect { vm: id.to_string() });
        }
        (NicStage::Inspect, Ok(CocoonOk::Vm { vm })) => {
            // The new NIC has a new MAC: the old one's index and IP go until its lease shows.
            if let Some(old) = s.pod(key).and_then(|e| e.vm()).cloned() {
                tracking::unindex(s, key, &old);
            }
            if let Some(Phase::Hibernating(h)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                h.running.vm.record = vm;
                h.running.vm.ip = None;
            }
            let step = HibernateStep::RestoreNic {
                stage: NicStage::Renew,
                failed,
            };
            call(s, key, step, guest(id, "/renew"));
        }
        (NicStage::Inspect, Ok(_) | Err(_)) => {
            let step = HibernateStep::RestoreNic {
                stage: NicStage::Renew,
                failed,
            };
            call(s, key, step, guest(id, "/renew"));
        }
        (NicStage::Renew, Ok(_) | Err(_)) => rolled_back(s, key, &failed.reason, failed.message),
    }
}

fn rolled_back(s: &mut State, key: &PodKey, reason: &str, msg: String) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Hibernating(h) = &e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: rolled_back found it not Hibernating"),
        );
    };
    let (running, attempts) = (h.running.clone(), h.attempts + 1);
    e.phase = Phase::Running(running);
    let uid = e.pod.uid.clone();
    // The VM may have come back with another NIC (U4): index what it has now.
    tracking::indexed(s, key);
    create::warn_event(s, key, reason, &msg);
    lifecycle::failed(s, key, msg.clone());
    crate::provider::outcome(
        s,
        key,
        crate::provider::Op::Update,
        crate::provider::Outcome::Failed(&msg),
        crate::labels::LifecycleReason::Hibernate,
    );
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: {msg}; retrying"),
    });
    s.emit(Action::ArmTimer {
        timer: Timer::HibernateRetry {
            key: key.clone(),
            uid,
            attempt: attempts,
        },
        after_ms: RETRY.after(attempts),
    });
}

/// The hibernate-retry timer.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str, attempt: u32) {
    if s.pods.incarnation(key, uid).is_none() {
        return;
    }
    if wanted(s, key) {
        begin(s, key, attempt);
    }
}

/// A delete came while a hibernate step was out: the delete takes the VM over (D4, D5).
fn hand_to_delete(
    s: &mut State,
    key: &PodKey,
    object: Object,
    step: HibernateStep,
    result: &Result<CocoonOk, CocoonError>,
) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Hibernating(h) = &e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: hand_to_delete found it not Hibernating"),
        );
    };
    let running: Running = h.running.clone();
    let removed = step == HibernateStep::Remove
        && matches!(
            result,
            Ok(_)
                | Err(CocoonError {
                    kind: CocoonErrorKind::VmNotFound,
                    ..
                })
        );
    if removed {
        tracking::forget(s, key, &running.vm);
        return delete::without_vm(s, key, object);
    }
    probe::stop(s, key);
    delete::with_vm(s, key, running.vm, object)
}
