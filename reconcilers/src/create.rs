//! CreatePod (spec/behavior.md §3): the bring-up step machine, adoption, and what follows a
//! successful bring-up. One step runs at a time per pod; each step's outcome picks the next.

use crate::action::{Action, Counter, EventType, Histogram, Level, Timer};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::config::RestoreMode;
use crate::event::{CocoonOk, SnapshotInfo};
use crate::names;
use crate::pod::PodKey;
use crate::spec::{Backend, Mode, Os, VmSpec};
use crate::state::{Busy, IpWait, Lifecycle, OpOwner, State, Step, Tracked};
use crate::status::parse_ready_condition;
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};
use crate::{delete, keys, lease_release, leases, lifecycle, probe, vmevents};

const LEASE_WAIT_MS: u64 = 45_000;
const MAX_ATTEMPTS: u32 = 20;

pub fn begin(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    e.busy = Some(Busy {
        op: None,
        step: Step::RemoveFork,
        since: s.now,
    });
    lifecycle::set(s, key, Lifecycle::Creating, None);
    // C6: a fresh bring-up never hands its predecessor's fork state to new sub-agents.
    run_step(
        s,
        key,
        Step::RemoveFork,
        CocoonCmd::SnapshotRm {
            name: names::fork_snapshot(&spec.vm_name),
        },
    );
}

pub(crate) fn run_step(s: &mut State, key: &PodKey, step: Step, cmd: CocoonCmd) {
    let op = s.new_op(OpOwner::Vm { key: key.clone() });
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let since = e.busy.as_ref().map(|b| b.since).unwrap_or(now);
    e.busy = Some(Busy {
        op: Some(op),
        step,
        since,
    });
    s.emit(Action::Cocoon {
        op,
        key: Some(key.clone()),
        cmd,
    });
}

pub fn step_done(s: &mut State, key: &PodKey, step: Step, result: Result<CocoonOk, CocoonError>) {
    let Some(e) = s.pods.get(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    let deleting = e.deleting;
    use CocoonErrorKind::*;
    match (step, result) {
        (Step::RemoveFork, Ok(_))
        | (
            Step::RemoveFork,
            Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => {
            if deleting {
                abandon(s, key);
            } else {
                first_source_step(s, key, &spec);
            }
        }
        (Step::PullImage, Ok(_)) if !deleting => run_step(s, key, Step::Run, run_cmd(&spec)),
        (Step::Run | Step::Clone, Ok(CocoonOk::Vm { vm })) => {
            if vm.id.is_empty() {
                fail(s, key, "cocoon returned a VM record without an id".into());
            } else if !vm.is_running() || vm.pid == 0 {
                // cocoon-cli.md §6.4/6.5: re-inspect for the live state and the PID stats need.
                let id = vm.id.clone();
                run_step(
                    s,
                    key,
                    Step::InspectAfterBoot { record: vm },
                    CocoonCmd::VmInspect { vm: id },
                );
            } else {
                booted(s, key, vm);
            }
        }
        (
            Step::Run | Step::Clone,
            Err(CocoonError {
                kind: VmNameTaken, ..
            }),
        ) if !deleting => run_step(
            s,
            key,
            Step::InspectNameTaken,
            CocoonCmd::VmInspect {
                vm: spec.vm_name.clone(),
            },
        ),
        (Step::InspectAfterBoot { .. }, Ok(CocoonOk::Vm { vm })) => booted(s, key, vm),
        (Step::InspectAfterBoot { record }, Err(_)) => booted(s, key, record),
        (Step::InspectNameTaken, Ok(CocoonOk::Vm { vm }))
            if vm.is_running() && vm.name == spec.vm_name =>
        {
            clear_busy(s, key);
            adopt(s, key, vm, "adopted");
        }
        (Step::InspectNameTaken, Ok(CocoonOk::Vm { vm })) => fail(
            s,
            key,
            format!(
                "vm name {:?} is taken by VM {} in state {:?}",
                spec.vm_name, vm.id, vm.state
            ),
        ),
        (Step::InspectSnapshot { name }, Ok(CocoonOk::Snapshot { snapshot })) if !deleting => {
            snapshot_found(s, key, &spec, name, snapshot)
        }
        (
            Step::InspectSnapshot { name },
            Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) if !deleting => match &spec.fork_from {
            Some(source) => fork_source(s, key, source),
            None => {
                s.emit(Action::Count {
                    counter: Counter::SnapshotPull {
                        result: "failed".into(),
                    },
                });
                fail(s, key, format!("snapshot {name:?} is not on this node and no registry pull is available in this build"))
            }
        },
        (Step::InspectForkSource, Ok(CocoonOk::Vm { vm })) if !deleting => {
            save_fork(s, key, &vm.name, vm.id, false);
        }
        (
            Step::SaveForkSnapshot { vm, again: false },
            Err(CocoonError {
                kind: SnapshotNameTaken,
                message,
            }),
        ) if !deleting => {
            let source = spec.fork_from.as_deref().unwrap_or_default();
            let name = taken_by(&message).unwrap_or_else(|| names::fork_snapshot(source));
            run_step(
                s,
                key,
                Step::RemoveTakenFork { vm },
                CocoonCmd::SnapshotRm { name },
            );
        }
        (
            Step::RemoveTakenFork { vm },
            Ok(_)
            | Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) if !deleting => {
            let source = spec.fork_from.clone().unwrap_or_default();
            save_fork(s, key, &source, vm, true);
        }
        (Step::SaveForkSnapshot { .. }, Ok(_)) if !deleting => {
            let name = names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default());
            run_step(
                s,
                key,
                Step::Clone,
                clone_cmd(s, &spec, CloneSource::Snapshot(name), false),
            );
        }
        (_, Ok(_)) => abandon(s, key),
        (step, Err(err)) => {
            if step == Step::Clone && spec.clone_from_dir.is_some() {
                s.emit(Action::Count {
                    counter: Counter::CloneFromDir {
                        result: "failed".into(),
                    },
                });
            }
            fail(
                s,
                key,
                format!("{}: {}", step_label(&step, &spec), err.message),
            )
        }
    }
}

fn step_label(step: &Step, spec: &VmSpec) -> String {
    match step {
        Step::RemoveFork => format!("snapshot rm {}", names::fork_snapshot(&spec.vm_name)),
        Step::PullImage => format!("image pull {}", spec.image),
        Step::Run => format!("vm run {}", spec.vm_name),
        Step::Clone => format!("vm clone {}", spec.vm_name),
        Step::InspectSnapshot { name } => format!("snapshot inspect {name}"),
        Step::InspectForkSource => format!(
            "vm inspect {}",
            spec.fork_from.as_deref().unwrap_or_default()
        ),
        Step::SaveForkSnapshot { .. } | Step::RemoveTakenFork { .. } => format!(
            "snapshot save {}",
            names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default())
        ),
        Step::InspectNameTaken => format!("vm name {} is taken", spec.vm_name),
        _ => "create".into(),
    }
}

/// C3 path order after the fork snapshot is dropped: clone-from-dir, fork-from, run, clone.
fn first_source_step(s: &mut State, key: &PodKey, spec: &VmSpec) {
    if let Some(dir) = &spec.clone_from_dir {
        let cmd = clone_cmd(s, spec, CloneSource::FromDir(dir.clone()), true);
        run_step(s, key, Step::Clone, cmd);
    } else if let Some(source) = &spec.fork_from {
        let name = names::fork_snapshot(source);
        run_step(
            s,
            key,
            Step::InspectSnapshot { name: name.clone() },
            CocoonCmd::SnapshotInspect { name },
        );
    } else if spec.mode == Mode::Run {
        let cmd = CocoonCmd::ImagePull {
            image: spec.image.clone(),
            force: spec.force_pull,
        };
        run_step(s, key, Step::PullImage, cmd);
    } else {
        let name = names::image_snapshot_name(&spec.image).0;
        run_step(
            s,
            key,
            Step::InspectSnapshot { name: name.clone() },
            CocoonCmd::SnapshotInspect { name },
        );
    }
}

fn snapshot_found(s: &mut State, key: &PodKey, spec: &VmSpec, name: String, snap: SnapshotInfo) {
    let backend_set = s.pods[key].pod.annotation(keys::BACKEND).is_some();
    if backend_set && !snap.hypervisor.is_empty() && snap.hypervisor != spec.backend.as_str() {
        let msg = format!(
            "snapshot {name:?} was taken on {}, the pod asks for {}",
            snap.hypervisor,
            spec.backend.as_str()
        );
        fail(s, key, msg);
        return;
    }
    if spec.fork_from.is_none() {
        s.emit(Action::Count {
            counter: Counter::SnapshotPull {
                result: "ok".into(),
            },
        });
    }
    let pull = spec.fork_from.is_none() && !snap.image.is_empty();
    let mut cmd = clone_cmd(s, spec, CloneSource::Snapshot(name), pull);
    if let CocoonCmd::VmClone { restore_mode, .. } = &mut cmd {
        // The backend of a clone is the snapshot's, not the pod's (cocoon-cli.md §6.5).
        if snap.hypervisor == Backend::Firecracker.as_str() {
            *restore_mode = None;
        }
    }
    run_step(s, key, Step::Clone, cmd);
}

fn fork_source(s: &mut State, key: &PodKey, source: &str) {
    let tracked = s
        .vm_names
        .get(source)
        .and_then(|k| s.pods.get(k))
        .and_then(|e| e.vm.as_ref());
    match tracked {
        Some(vm) => {
            let id = vm.record.id.clone();
            save_fork(s, key, source, id, false);
        }
        None => run_step(
            s,
            key,
            Step::InspectForkSource,
            CocoonCmd::VmInspect {
                vm: source.to_string(),
            },
        ),
    }
}

fn save_fork(s: &mut State, key: &PodKey, source: &str, vm: String, again: bool) {
    let cmd = CocoonCmd::SnapshotSave {
        name: names::fork_snapshot(source),
        vm: vm.clone(),
    };
    run_step(s, key, Step::SaveForkSnapshot { vm, again }, cmd);
}

/// The holder of a taken snapshot name: the token after `already in use by ` (or `held by
/// `), trailing `)` stripped (cocoon-cli.md §3).
fn taken_by(message: &str) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    let at = ["already in use by ", "held by "]
        .iter()
        .find_map(|p| lower.find(p).map(|i| i + p.len()))?;
    let id = message[at..].split_whitespace().next()?;
    let id = id.trim_end_matches(')');
    (!id.is_empty()).then(|| id.to_string())
}

fn run_cmd(spec: &VmSpec) -> CocoonCmd {
    CocoonCmd::VmRun {
        name: spec.vm_name.clone(),
        image: spec.image.clone(),
        cpu: spec.vcpus,
        cpu_policy: spec.cpu,
        memory: spec.memory_bytes,
        storage: spec.storage_bytes,
        network: spec.network.clone(),
        windows: spec.os == Os::Windows,
        fc: spec.backend == Backend::Firecracker,
        no_direct_io: spec.no_direct_io,
    }
}

fn clone_cmd(s: &State, spec: &VmSpec, source: CloneSource, pull: bool) -> CocoonCmd {
    let restore_mode = match (spec.backend, spec.os) {
        (Backend::Firecracker, _) => None,
        (_, Os::Windows) => Some(RestoreMode::Copy),
        _ => Some(s.config.restore_mode),
    };
    CocoonCmd::VmClone {
        name: spec.vm_name.clone(),
        source,
        network: spec.network.clone(),
        no_direct_io: spec.no_direct_io,
        pull,
        restore_mode,
        cpu_policy: spec.cpu,
    }
}

/// C12: the VM is up. Track it, probe it, and wait for the IP that `ready` needs.
fn booted(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    let since = e.busy.as_ref().map(|b| b.since).unwrap_or(now);
    let clone_path =
        spec.mode != Mode::Run || spec.clone_from_dir.is_some() || spec.fork_from.is_some();
    e.busy = None;
    e.failure = None;
    e.attempts = 0;
    e.started_at = Some(now);
    s.emit(Action::Observe {
        histogram: Histogram::VmBootDuration {
            mode: if clone_path { "clone" } else { "run" }.into(),
            backend: spec.backend.as_str().into(),
        },
        millis: (now - since).max(0) as u64,
    });
    if clone_path && spec.clone_from_dir.is_some() {
        s.emit(Action::Count {
            counter: Counter::CloneFromDir {
                result: "ok".into(),
            },
        });
    }
    track(s, key, vm, false);
    if s.pods[key].deleting {
        delete::proceed(s, key);
        return;
    }
    probe::start(s, key);
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "create".into(),
            result: "ok".into(),
            reason: String::new(),
        },
    });
    ready_wait(s, key, if clone_path { "clone" } else { "run" });
}

/// C16: `ready` needs a resolvable IP. Clones wait 45 s for the lease; a run or an adoption
/// has no deadline (annotations.md §4.2 rule 7: `ready` requires an IP on every managed path).
pub(crate) fn ready_wait(s: &mut State, key: &PodKey, op: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let has_ip = e.vm.as_ref().is_some_and(|v| v.ip.is_some());
    let deadline = op == "clone";
    e.ip_wait = Some(IpWait {
        op: op.to_string(),
        deadline,
    });
    if has_ip {
        ip_arrived(s, key);
    } else if deadline {
        let uid = e.pod.uid.clone();
        s.emit(Action::ArmTimer {
            timer: Timer::LeaseWait {
                key: key.clone(),
                uid,
            },
            after_ms: LEASE_WAIT_MS,
        });
    }
}

pub(crate) fn ip_arrived(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Some(wait) = e.ip_wait.take() else { return };
    if wait.deadline {
        s.emit(Action::Count {
            counter: Counter::WakeIpWait {
                result: "ok".into(),
            },
        });
    }
    lifecycle::set(s, key, Lifecycle::Ready, None);
}

pub(crate) fn lease_wait_expired(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.pod.uid != uid || e.vm.as_ref().is_some_and(|v| v.ip.is_some()) {
        return;
    }
    let Some(wait) = e.ip_wait.take() else { return };
    let name = e.vm_name().unwrap_or_default().to_string();
    let msg = format!("{} {name}: dhcp lease not observed within 45s", wait.op);
    s.emit(Action::Count {
        counter: Counter::WakeIpWait {
            result: "timeout".into(),
        },
    });
    warn_event(s, key, "PostCloneIPWaitTimeout", &format!("create: {msg}"));
    lifecycle::set(s, key, Lifecycle::Failed, Some(msg));
}

/// C4: a VM of this name is already here: take it over instead of creating another.
pub fn adopt(s: &mut State, key: &PodKey, vm: VmRecord, reason: &str) {
    let now = s.now;
    track(s, key, vm, false);
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = e.started_at.or(Some(now));
        e.failure = None;
    }
    probe::start(s, key);
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "create".into(),
            result: "ok".into(),
            reason: reason.into(),
        },
    });
    // No guest work is owed, but `ready` still needs the IP (usually already leased).
    ready_wait(s, key, "adopt");
}

/// C5: an unmanaged pod brings its own VM; vk only probes the annotated IP.
pub fn adopt_unmanaged(s: &mut State, key: &PodKey, spec: &VmSpec) {
    let record = VmRecord {
        id: spec.static_id.clone().unwrap_or_default(),
        name: spec.vm_name.clone(),
        state: "running".into(),
        static_ip: spec.static_ip.clone(),
        ..VmRecord::default()
    };
    let now = s.now;
    track(s, key, record, true);
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = e.started_at.or(Some(now));
    }
    probe::start(s, key);
    lifecycle::set(s, key, Lifecycle::Ready, None);
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "create".into(),
            result: "ok".into(),
            reason: "unmanaged".into(),
        },
    });
}

/// B4/B5: re-attach a pod to its VM after a restart, keeping what the server already shows
/// (start time, readiness and its transition time) so a restart does not flap the pod.
pub fn resume(s: &mut State, key: &PodKey, vm: VmRecord) {
    let running = vm.is_running();
    let cached_ip = s
        .pods
        .get(key)
        .and_then(|e| e.pod.annotation(keys::VM_IP))
        .map(str::to_string);
    track_with_ip(s, key, vm, cached_ip);
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    e.started_at = e
        .pod
        .status
        .start_time
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .or(Some(now));
    if let Some((ready, since)) = parse_ready_condition(&e.pod.status) {
        e.probe.ready = ready;
        e.ready_changed_at = since;
    }
    let intent = e.intent.state;
    let uid = e.pod.uid.clone();
    probe::start(s, key);
    match intent {
        Some(Lifecycle::Failed) => {}
        Some(Lifecycle::Creating) => {
            s.emit(Action::Count {
                counter: Counter::StartupResume {
                    op: "ready_wait".into(),
                },
            });
            s.emit(Action::RecordEvent {
                key: key.clone(),
                uid,
                kind: EventType::Normal,
                reason: "ResumedAfterRestart".into(),
                message: "reconcile: resuming the wait for the VM's IP".into(),
            });
            ready_wait(s, key, "clone");
        }
        // Seeded `ready` stays as the server has it: no rewrite, no flap.
        Some(Lifecycle::Ready) => {}
        _ => ready_wait(s, key, "adopt"),
    }
    if !running {
        vmevents::hint(s, key);
    }
}

pub(crate) fn track(s: &mut State, key: &PodKey, record: VmRecord, unmanaged: bool) {
    let ip = if unmanaged {
        record.static_ip.clone()
    } else {
        None
    };
    track_inner(s, key, record, unmanaged, ip)
}

/// A managed VM re-attached after a restart: its `ip` annotation is the IP cache until the
/// lease file is read (R6), so the pod's podIP does not flap.
fn track_with_ip(s: &mut State, key: &PodKey, record: VmRecord, ip: Option<String>) {
    track_inner(s, key, record, false, ip)
}

fn track_inner(s: &mut State, key: &PodKey, record: VmRecord, unmanaged: bool, ip: Option<String>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let tracked = Tracked {
        record,
        ip,
        unmanaged,
    };
    s.vm_ids.insert(tracked.record.id.clone(), key.clone());
    s.vm_names.insert(tracked.record.name.clone(), key.clone());
    if tracked.record.static_ip.is_none() {
        if let Some(mac) = &tracked.record.mac {
            s.macs.insert(mac.to_ascii_lowercase(), key.clone());
        }
    }
    if let Some(old) = e.vm.replace(tracked) {
        if old.record.id
            != e.vm
                .as_ref()
                .map(|v| v.record.id.clone())
                .unwrap_or_default()
        {
            s.vm_ids.remove(&old.record.id);
        }
    }
    s.touched.insert(key);
    if !unmanaged {
        leases::refresh_ip(s, key);
    }
}

/// Drops the indexes that point at a pod's VM.
pub(crate) fn unindex(s: &mut State, key: &PodKey, vm: &Tracked) {
    if s.vm_ids.get(&vm.record.id) == Some(key) {
        s.vm_ids.remove(&vm.record.id);
    }
    if s.vm_names.get(&vm.record.name) == Some(key) {
        s.vm_names.remove(&vm.record.name);
    }
    if let Some(mac) = &vm.record.mac {
        let mac = mac.to_ascii_lowercase();
        if s.macs.get(&mac) == Some(key) {
            s.macs.remove(&mac);
        }
    }
}

/// The VM is gone for good (removed by vk, or found gone): untrack it and release its lease.
pub(crate) fn forget_vm(s: &mut State, key: &PodKey) {
    probe::stop(s, key);
    let Some(e) = s.pods.get_mut(key) else { return };
    e.ip_wait = None;
    if let Some(vm) = e.vm.take() {
        s.restarts.remove(&vm.record.id);
        unindex(s, key, &vm);
        if let Some(mac) = lease_release::dhcp_mac(&vm.record).filter(|_| !vm.unmanaged) {
            lease_release::release(s, &mac);
        }
    }
    s.touched.insert(key);
}

fn clear_busy(s: &mut State, key: &PodKey) {
    if let Some(e) = s.pods.get_mut(key) {
        e.busy = None;
    }
}

/// The create stopped without a VM because the pod is being deleted.
fn abandon(s: &mut State, key: &PodKey) {
    clear_busy(s, key);
    if s.pods.get(key).is_some_and(|e| e.deleting) {
        delete::proceed(s, key);
    }
}

/// C12.6 / P3: a bring-up error. Warning Event, lifecycle `failed`, and a retry with backoff.
pub fn fail(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, true)
}

/// A bring-up error that a retry cannot change (a bad annotation): reported like any other,
/// then the pod waits for a spec change (`intake::updated`) instead of a timer.
pub fn fail_permanently(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, false)
}

fn fail_with(s: &mut State, key: &PodKey, msg: String, retry: bool) {
    clear_busy(s, key);
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.deleting {
        delete::proceed(s, key);
        return;
    }
    e.failure = Some(msg.clone());
    e.attempts += 1;
    let attempts = e.attempts;
    let uid = e.pod.uid.clone();
    s.touched.insert(key);
    warn_event(s, key, "CreateBringUpFailed", &format!("create: {msg}"));
    lifecycle::set(s, key, Lifecycle::Failed, Some(msg.clone()));
    s.emit(Action::Count {
        counter: Counter::PodLifecycle {
            op: "create".into(),
            result: "failed".into(),
            reason: if retry { "bring_up" } else { "invalid_spec" }.into(),
        },
    });
    if !retry {
        s.pods.get_mut(key).expect("present").permanent_failure = true;
    } else if attempts < MAX_ATTEMPTS {
        let after_ms = (5u64 << (attempts - 1).min(40)).min(1_000_000);
        s.emit(Action::ArmTimer {
            timer: Timer::CreateRetry {
                key: key.clone(),
                uid,
            },
            after_ms,
        });
    } else {
        s.emit(Action::Log {
            level: Level::Error,
            message: format!(
                "pod {key}: create failed {attempts} times; giving up until the pod changes: {msg}"
            ),
        });
    }
}

pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.get(key) else { return };
    if e.pod.uid != uid
        || e.deleting
        || e.gone
        || e.vm.is_some()
        || e.busy.is_some()
        || e.failure.is_none()
    {
        return;
    }
    crate::intake::intake(s, key);
}

pub(crate) fn warn_event(s: &mut State, key: &PodKey, reason: &str, message: &str) {
    let Some(e) = s.pods.get(key) else { return };
    let uid = e.pod.uid.clone();
    s.emit(Action::RecordEvent {
        key: key.clone(),
        uid,
        kind: EventType::Warning,
        reason: reason.into(),
        message: lifecycle::truncate(message.to_string(), 512),
    });
}
