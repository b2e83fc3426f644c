//! The Creating phase (CreatePod, C3–C12): the bring-up step machine. One step's cocoon call
//! is out at a time; its outcome picks the next step, a Running pod, a Failed pod, or — when
//! a delete came meanwhile — hands the pod to the delete.

use crate::action::{Action, Counter, EventType, Histogram, Level, RegistryCall, Timer};
use crate::backoff::Backoff;
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::config::RestoreMode;
use crate::event::{
    ArtifactKind, CocoonOk, RegistryError, RegistryErrorKind, RegistryOk, SnapshotInfo,
};
use crate::names;
use crate::phase::{CreateStep, Creating, Failed, IpWait, Phase, Purpose, Retry, Running, Scratch};
use crate::pod::PodKey;
use crate::provider::{self, Op, Outcome};
use crate::spec::{Backend, Mode, Os, VmSpec};
use crate::state::{
    CocoonOwner, Lifecycle, Making, RegistryOwner, SnapshotClaim, State, Tracked, VmOwner,
};
use crate::time::Millis;
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};
use crate::{delete, keys, lifecycle, outcome, probe, tracking};

/// P3: a failed bring-up is retried 5 ms doubling to 1000 s, 20 attempts in all.
pub const RETRY: Backoff = Backoff::doubling(5, 1_000_000);
const MAX_ATTEMPTS: u32 = 20;

/// Starts a bring-up (C6: a fresh one first drops the fork snapshot of its VM name, so a
/// predecessor's fork state never reaches new sub-agents).
pub fn begin(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    if let Some(msg) = crate::trust::name_taken(s, key, &spec.vm_name) {
        return fail(s, key, msg);
    }
    let (attempts, last_failure) = e.phase.prior_failure();
    lifecycle::set(s, key, Lifecycle::Creating, None);
    let owner = || RegistryOwner::Pod { key: key.clone() };
    // C11 (evidence): with a registry, a fresh boot first asks whether the VM has a hibernate
    // snapshot, so a wake lost to a restart restores instead of booting over it.
    let (step, op) = match s.config.registry.is_some() {
        true => {
            let call = RegistryCall::Inspect {
                name: spec.vm_name.clone(),
                tag: "hibernate".into(),
            };
            let op = s.call_registry(owner(), Some(key.clone()), call);
            (CreateStep::CheckEvidence, op)
        }
        false => (CreateStep::RemoveFork, remove_fork(s, key, &spec)),
    };
    let since = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        e.phase = Phase::Creating(Creating::first(
            step,
            op,
            since,
            attempts,
            last_failure,
            Purpose::Fresh,
        ));
    }
}

/// C6: a fresh bring-up never hands its predecessor's fork state to new sub-agents.
fn remove_fork(s: &mut State, key: &PodKey, spec: &VmSpec) -> crate::action::OpId {
    let cmd = CocoonCmd::SnapshotRm {
        name: names::fork_snapshot(&spec.vm_name),
    };
    s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    )
}

/// C11: the outcome of the evidence check of a fresh bring-up.
fn evidence(s: &mut State, key: &PodKey, spec: &VmSpec, result: Result<RegistryOk, RegistryError>) {
    let verdict = |s: &mut State, v: &str| {
        s.emit(Action::Count {
            counter: Counter::HibernateEvidence { verdict: v.into() },
        })
    };
    let name = spec.vm_name.clone();
    match result {
        Ok(RegistryOk::Inspected { snapshot: None }) => {
            let op = remove_fork(s, key, spec);
            set_step(s, key, CreateStep::RemoveFork, op);
        }
        Ok(RegistryOk::Inspected { snapshot: Some(r) }) => {
            if spec.clone_from_dir.is_some() || spec.fork_from.is_some() {
                verdict(s, "source_conflict");
                let msg = format!("{name}:hibernate exists, but the pod also asks for clone-from-dir or fork-from; delete the tag or the annotation");
                return fail_as(
                    s,
                    key,
                    Some("HibernateEvidenceFailed"),
                    msg,
                    Retry::OnChange,
                );
            }
            if let Some(base) = r.base_image.as_deref().filter(|b| *b != spec.image) {
                let msg = format!("{name}:hibernate was taken from image {base:?}, the pod asks for {:?}; delete the tag to boot fresh", spec.image);
                verdict(s, "image_conflict");
                return fail_as(
                    s,
                    key,
                    Some("HibernateEvidenceFailed"),
                    msg,
                    Retry::OnChange,
                );
            }
            verdict(s, "restored");
            if let Some(e) = s.pod(key) {
                let uid = e.pod.uid.clone();
                s.emit(Action::RecordEvent {
                    source: crate::action::EventSource::Vk,
                    key: key.clone(),
                    uid,
                    kind: EventType::Warning,
                    reason: "HibernateSnapshotExists".into(),
                    message: format!(
                        "create: {name}:hibernate exists: restoring it instead of booting fresh"
                    ),
                });
            }
            restore(s, key, Purpose::Restore);
        }
        Ok(other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: evidence check of {name} answered {other:?}"),
            );
            verdict(s, "unavailable");
            fail_as(
                s,
                key,
                Some("HibernateEvidenceUnavailable"),
                format!("{name}:hibernate: unexpected answer from the registry client"),
                Retry::Timer,
            )
        }
        // Fail closed: a registry that cannot answer never gets a fresh boot.
        Err(err) => {
            verdict(s, "unavailable");
            let msg = format!(
                "cannot tell whether {name}:hibernate exists, so the VM is not booted fresh: {}",
                err.message
            );
            fail_as(
                s,
                key,
                Some("HibernateEvidenceUnavailable"),
                msg,
                Retry::Timer,
            )
        }
    }
}

/// U5 (and C11 with the restore marker): lifecycle `creating`, stale `id`/`ip` withdrawn,
/// then the source is resolved (U6): the local `<vm>` snapshot verified against the
/// registry's `<vm>:hibernate`, else a pull of that tag; then a clone as for a fresh pod.
pub fn wake(s: &mut State, key: &PodKey) {
    restore(s, key, Purpose::Wake)
}

pub(crate) fn restore(s: &mut State, key: &PodKey, purpose: Purpose) {
    let Some(e) = s.pod(key) else { return };
    let Some(name) = e.vm_name().map(str::to_string) else {
        return;
    };
    let (attempts, last_failure) = e.phase.prior_failure();
    lifecycle::set(s, key, Lifecycle::Creating, None);
    let cmd = CocoonCmd::SnapshotInspect { name: name.clone() };
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    let since = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        let step = CreateStep::InspectLocal { name };
        e.phase = Phase::Creating(Creating::first(
            step,
            op,
            since,
            attempts,
            last_failure,
            purpose,
        ));
    }
}

/// U6: the outcome of a wake's source steps.
fn wake_source(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    step_now: CreateStep,
    result: Result<CocoonOk, CocoonError>,
) {
    let registry = s.config.registry.is_some();
    match (step_now, result) {
        (CreateStep::InspectLocal { name }, Ok(CocoonOk::Snapshot { snapshot })) if registry => {
            let call = RegistryCall::Inspect {
                name: name.clone(),
                tag: "hibernate".into(),
            };
            let op = s.call_registry(
                RegistryOwner::Pod { key: key.clone() },
                Some(key.clone()),
                call,
            );
            set_step(
                s,
                key,
                CreateStep::VerifyRemote {
                    name,
                    local_id: snapshot.id,
                    local_image: snapshot.image,
                },
                op,
            );
        }
        // No registry: the local copy is all there is, and counts as verified.
        (CreateStep::InspectLocal { name }, Ok(CocoonOk::Snapshot { snapshot })) => {
            verified(s, "ok");
            clone_local(s, key, spec, name, !snapshot.image.is_empty());
        }
        // A restore checks the tag's identity before pulling it (C11); a wake pulls at once.
        (
            CreateStep::InspectLocal { name },
            Err(CocoonError {
                kind: CocoonErrorKind::SnapshotNotFound,
                ..
            }),
        ) => {
            // The tag is read first: its identity (a restore checks it, C11) and the node
            // that pushed it, whose copy is fetched before the registry's.
            if registry {
                let call = RegistryCall::Inspect {
                    name: name.clone(),
                    tag: "hibernate".into(),
                };
                let op = s.call_registry(
                    RegistryOwner::Pod { key: key.clone() },
                    Some(key.clone()),
                    call,
                );
                let next = CreateStep::VerifyRemote {
                    name,
                    local_id: String::new(),
                    local_image: String::new(),
                };
                return set_step(s, key, next, op);
            }
            pull_hibernate(s, key, name)
        }
        (CreateStep::InspectLocal { name }, Err(err)) => wake_failed(
            s,
            key,
            "WakePullFailed",
            format!("snapshot inspect {name}: {}", err.message),
        ),
        (CreateStep::PullHibernate { import, .. }, Ok(CocoonOk::Snapshot { snapshot })) => {
            if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                c.scratch = Some(Scratch::Snapshot(import.clone()));
            }
            let cmd = wake_clone_cmd(
                s,
                spec,
                CloneSource::Snapshot(import),
                !snapshot.image.is_empty(),
            );
            step(s, key, CreateStep::Clone, cmd);
        }
        (CreateStep::PullHibernate { import, .. }, Err(err)) => wake_failed(
            s,
            key,
            "WakePullFailed",
            format!("snapshot inspect {import}: {}", err.message),
        ),
        (other, Ok(answer)) => wake_unexpected(s, key, &other, &answer, "cocoon"),
        (other, Err(err)) => wake_step_failed(s, key, &other, &err.message),
    }
}

/// A wake step answered with a shape it cannot have: a contract mismatch, failed like any
/// other wake error.
fn wake_unexpected(
    s: &mut State,
    key: &PodKey,
    step: &CreateStep,
    answer: &dyn std::fmt::Debug,
    from: &str,
) {
    outcome::unexpected(
        s,
        &format!("pod {key}: wake step {step:?} answered {answer:?}"),
    );
    wake_failed(
        s,
        key,
        "WakePullFailed",
        format!("wake: unexpected answer from {from}"),
    )
}

fn wake_step_failed(s: &mut State, key: &PodKey, step: &CreateStep, why: &str) {
    wake_failed(s, key, "WakePullFailed", format!("{step:?}: {why}"))
}

/// The outcome of a wake's registry calls: the verification of the local copy, or the pull.
fn wake_registry(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    purpose: Purpose,
    step_now: CreateStep,
    since: Millis,
    result: Result<RegistryOk, RegistryError>,
) {
    match (step_now, result) {
        (
            CreateStep::VerifyRemote {
                name,
                local_id,
                local_image,
            },
            Ok(RegistryOk::Inspected { snapshot }),
        ) => {
            if let (Purpose::Restore, Some(base)) = (
                purpose,
                snapshot.as_ref().and_then(|r| r.base_image.as_deref()),
            ) {
                if base != spec.image {
                    return image_conflict(s, key, &name, base, &spec.image);
                }
            }
            match snapshot {
                // No local copy: the peer that pushed the tag, else the registry.
                Some(r) if local_id.is_empty() => from_peer_or_registry(s, key, name, r),
                None if local_id.is_empty() => pull_hibernate(s, key, name),
                Some(r) if r.snapshot_id == local_id => {
                    verified(s, "ok");
                    clone_local(s, key, spec, name, !local_image.is_empty())
                }
                // Stale: the tag holds another save; the local copies go.
                Some(r) => {
                    verified(s, "stale");
                    crate::delete::remove_local_snapshots(s, key, &name);
                    from_peer_or_registry(s, key, name, r)
                }
                // Stale: the tag is gone, so no peer can be checked against it either.
                None => {
                    verified(s, "stale");
                    crate::delete::remove_local_snapshots(s, key, &name);
                    pull_hibernate(s, key, name)
                }
            }
        }
        (CreateStep::PeerRestore { staging, .. }, Ok(RegistryOk::Staged { dir })) => {
            peer_restored(s, "ok", since);
            if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                c.scratch = Some(Scratch::Staging(staging));
            }
            let cmd = wake_clone_cmd(s, spec, CloneSource::FromDir(dir), true);
            step(s, key, CreateStep::Clone, cmd);
        }
        // Any failure of the peer falls through to the registry.
        (CreateStep::PeerRestore { name, node, .. }, Err(err)) => {
            peer_restored(s, "failed", since);
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "pod {key}: copying {name} from node {node} failed, pulling {name}:hibernate instead: {}",
                    err.message
                ),
            });
            pull_hibernate(s, key, name)
        }
        (CreateStep::VerifyRemote { name, .. }, Err(err)) => {
            // An unverified local copy is never used.
            verified(s, "error");
            wake_failed(
                s,
                key,
                "WakePullFailed",
                format!("verify {name}:hibernate: {}", err.message),
            )
        }
        (CreateStep::PullHibernate { name, import }, Ok(RegistryOk::Pulled)) => {
            s.emit(Action::Observe {
                histogram: Histogram::SnapshotPullDuration,
                millis: (s.now - since).max(0) as u64,
            });
            let cmd = CocoonCmd::SnapshotInspect {
                name: import.clone(),
            };
            let op = s.run_cocoon(
                CocoonOwner::Pod { key: key.clone() },
                Some(key.clone()),
                cmd,
            );
            set_step(s, key, CreateStep::PullHibernate { name, import }, op);
        }
        (CreateStep::PullHibernate { name, .. }, Err(err)) => wake_failed(
            s,
            key,
            "WakePullFailed",
            format!("pull {name}:hibernate: {}", err.message),
        ),
        (other, Ok(answer)) => wake_unexpected(s, key, &other, &answer, "the registry client"),
        (other, Err(err)) => wake_step_failed(s, key, &other, &err.message),
    }
}

fn set_step(s: &mut State, key: &PodKey, next: CreateStep, op: crate::action::OpId) {
    let now = s.now;
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = Some(op);
        c.step_since = now;
    }
}

/// U6: the copy on the node that pushed `<vm>:hibernate` comes before the registry, unless
/// that node is this one (its copy would have been found locally) or unknown.
fn from_peer_or_registry(
    s: &mut State,
    key: &PodKey,
    name: String,
    remote: crate::event::RemoteSnapshot,
) {
    let node = match remote.from_node {
        Some(node) if !node.is_empty() && node != s.config.node_name => node,
        Some(_) | None => return pull_hibernate(s, key, name),
    };
    let staging = names::peer_staging(&name);
    let call = RegistryCall::PeerRestore {
        name: name.clone(),
        tag: "hibernate".into(),
        node: node.clone(),
        snapshot_id: remote.snapshot_id,
        staging: staging.clone(),
    };
    let op = s.call_registry(
        RegistryOwner::Pod { key: key.clone() },
        Some(key.clone()),
        call,
    );
    set_step(
        s,
        key,
        CreateStep::PeerRestore {
            name,
            node,
            staging,
        },
        op,
    );
}

fn peer_restored(s: &mut State, result: &str, since: Millis) {
    s.emit(Action::Count {
        counter: Counter::SnapshotPeerRestore {
            result: result.into(),
        },
    });
    s.emit(Action::Observe {
        histogram: Histogram::SnapshotPeerRestoreDuration,
        millis: (s.now - since).max(0) as u64,
    });
}

fn verified(s: &mut State, result: &str) {
    s.emit(Action::Count {
        counter: Counter::SnapshotVerify {
            result: result.into(),
        },
    });
}

fn clone_local(s: &mut State, key: &PodKey, spec: &VmSpec, name: String, pull: bool) {
    let cmd = wake_clone_cmd(s, spec, CloneSource::Snapshot(name), pull);
    step(s, key, CreateStep::Clone, cmd);
}

/// A wake's clone: a cloud-hypervisor Windows snapshot has no NIC, so the clone adds one (U7).
fn wake_clone_cmd(s: &State, spec: &VmSpec, source: CloneSource, pull: bool) -> CocoonCmd {
    let mut cmd = clone_cmd(s, spec, source, pull);
    if let CocoonCmd::VmClone { nics, .. } = &mut cmd {
        *nics = spec.drops_nic().then_some(1);
    }
    cmd
}

fn pull_hibernate(s: &mut State, key: &PodKey, name: String) {
    if s.config.registry.is_none() {
        let msg = format!("wake {name}: no local snapshot and OCI_REGISTRY is not set");
        return wake_failed(s, key, "WakePullFailed", msg);
    }
    let import = format!("{name}-hibernate-import");
    let call = RegistryCall::Pull {
        name: name.clone(),
        tag: "hibernate".into(),
        local: import.clone(),
    };
    let op = s.call_registry(
        RegistryOwner::Pod { key: key.clone() },
        Some(key.clone()),
        call,
    );
    set_step(s, key, CreateStep::PullHibernate { name, import }, op);
}

/// C11: the hibernated VM ran another image than the pod asks for: refuse rather than
/// restore the wrong machine or boot a fresh one over its state.
fn image_conflict(s: &mut State, key: &PodKey, name: &str, base: &str, image: &str) {
    s.emit(Action::Count {
        counter: Counter::HibernateEvidence {
            verdict: "image_conflict".into(),
        },
    });
    let msg = format!("restore {name}: {name}:hibernate was taken from image {base:?}, the pod asks for {image:?}; delete the tag to boot fresh");
    wake_failed(s, key, "HibernateEvidenceFailed", msg)
}

fn wake_failed(s: &mut State, key: &PodKey, reason: &str, msg: String) {
    s.emit(Action::Count {
        counter: Counter::Wake {
            result: "failed".into(),
        },
    });
    fail_as(s, key, Some(reason), msg, Retry::Timer)
}

/// The next step of the bring-up under way.
fn step(s: &mut State, key: &PodKey, next: CreateStep, cmd: CocoonCmd) {
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = Some(op);
    }
}

/// A step that waits for another pod instead of a call of its own.
fn wait_for_other(s: &mut State, key: &PodKey, next: CreateStep) {
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = None;
    }
}

/// The outcome of the step's call (the router checked it is this step's).
pub(crate) fn step_done(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    advance(s, key, result);
    settle_snapshot_claim(s, key);
}

fn advance(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    let Some(e) = s.pod(key) else { return };
    let Phase::Creating(c) = &e.phase else { return };
    let (current, cancel) = (c.step.clone(), c.cancel);
    let purpose = c.purpose;
    let spec = match &e.spec {
        Ok(spec) => spec.clone(),
        // The pod changed into something undecodable while the step was out.
        Err(err) => return fail_permanently(s, key, err.to_string()),
    };
    if let (None, CreateStep::InspectLocal { .. } | CreateStep::PullHibernate { .. }) =
        (cancel, &current)
    {
        return wake_source(s, key, &spec, current, result);
    }
    let _ = purpose;
    // C14: a macOS guest's steps are cocoon-macos's (macos.rs).
    if let CreateStep::Macos { macos } = current {
        return crate::macos::step_done(s, key, &spec, macos, cancel, result);
    }
    use CocoonErrorKind::{SnapshotNameTaken, SnapshotNotFound, VmNameTaken};
    // A delete is waiting: only a step that may have made a VM matters, so it is removed.
    if let Some(object) = cancel {
        match current {
            CreateStep::Run
            | CreateStep::Clone
            | CreateStep::InspectAfterBoot { .. }
            | CreateStep::Macos { .. } => {}
            CreateStep::RemoveFork
            | CreateStep::PullImage
            | CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::RemoveTakenFork { .. }
            | CreateStep::InspectNameTaken
            | CreateStep::PullSnapshot { .. }
            | CreateStep::CheckEvidence
            | CreateStep::InspectLocal { .. }
            | CreateStep::VerifyRemote { .. }
            | CreateStep::PeerRestore { .. }
            | CreateStep::PullHibernate { .. }
            | CreateStep::AwaitSnapshot { .. } => {
                if let Err(err) = &result {
                    count_clone_from_dir_failure(s, &current, &spec, err);
                }
                return delete::without_vm(s, key, object);
            }
        }
    }
    match (current, result) {
        (
            CreateStep::RemoveFork,
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => first_source_step(s, key, &spec),
        (CreateStep::PullImage, Ok(CocoonOk::Done)) => {
            step(s, key, CreateStep::Run, run_cmd(&spec))
        }
        (CreateStep::Run | CreateStep::Clone, Ok(CocoonOk::Vm { vm })) => {
            if vm.id.is_empty() {
                fail(s, key, "cocoon returned a VM record without an id".into());
            } else if !vm.is_running() || vm.pid == 0 {
                // A record that is not running yet: inspect for the live state and the PID
                // the stats need.
                let id = vm.id.clone();
                step(
                    s,
                    key,
                    CreateStep::InspectAfterBoot { record: vm },
                    CocoonCmd::VmInspect { vm: id },
                );
            } else {
                booted(s, key, vm);
            }
        }
        (
            CreateStep::Run | CreateStep::Clone,
            Err(CocoonError {
                kind: VmNameTaken, ..
            }),
        ) if cancel.is_none() => {
            let vm = spec.vm_name.clone();
            step(
                s,
                key,
                CreateStep::InspectNameTaken,
                CocoonCmd::VmInspect { vm },
            );
        }
        (CreateStep::InspectAfterBoot { .. }, Ok(CocoonOk::Vm { vm })) => booted(s, key, vm),
        // The VM came up; the record from the boot call is what we know of it.
        (CreateStep::InspectAfterBoot { record }, Err(_)) => booted(s, key, record),
        (CreateStep::InspectAfterBoot { record }, Ok(other)) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: vm inspect {} answered {other:?}", record.id),
            );
            booted(s, key, record)
        }
        // T1: a VM another pod holds is never handed over, whatever its name says.
        (CreateStep::InspectNameTaken, Ok(CocoonOk::Vm { vm }))
            if s.vm_ids.get(&vm.id).is_some_and(|k| k != key) =>
        {
            let other = s.vm_ids[&vm.id].clone();
            fail(
                s,
                key,
                format!(
                    "VM name {:?} belongs to pod {other} (VM {}); give this pod another vm.cocoonstack.io/name",
                    spec.vm_name, vm.id
                ),
            )
        }
        (CreateStep::InspectNameTaken, Ok(CocoonOk::Vm { vm }))
            if vm.is_running() && vm.name == spec.vm_name =>
        {
            adopt(s, key, vm, "adopted")
        }
        (CreateStep::InspectNameTaken, Ok(CocoonOk::Vm { vm })) => fail(
            s,
            key,
            format!(
                "vm name {:?} is taken by VM {} in state {:?}",
                spec.vm_name, vm.id, vm.state
            ),
        ),
        (CreateStep::InspectSnapshot { name }, Ok(CocoonOk::Snapshot { snapshot })) => {
            snapshot_found(s, key, &spec, name, snapshot)
        }
        (
            CreateStep::InspectSnapshot { name },
            Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => match &spec.fork_from {
            Some(source) => fork_source(s, key, source),
            None => pull(s, key, &spec, name),
        },
        (
            CreateStep::SaveForkSnapshot { vm, again: false },
            Err(CocoonError {
                kind: SnapshotNameTaken,
                message,
            }),
        ) => {
            let source = spec.fork_from.as_deref().unwrap_or_default();
            let name = taken_by(&message).unwrap_or_else(|| names::fork_snapshot(source));
            step(
                s,
                key,
                CreateStep::RemoveTakenFork { vm },
                CocoonCmd::SnapshotRm { name },
            );
        }
        (
            CreateStep::RemoveTakenFork { vm },
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => {
            let source = spec.fork_from.clone().unwrap_or_default();
            save_fork(s, key, &source, vm, true);
        }
        (CreateStep::SaveForkSnapshot { .. }, Ok(CocoonOk::Done)) => {
            let name = names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default());
            let cmd = clone_cmd(s, &spec, CloneSource::Snapshot(name), false);
            step(s, key, CreateStep::Clone, cmd);
        }
        (failed_step, Err(err)) => {
            count_clone_from_dir_failure(s, &failed_step, &spec, &err);
            let label = step_label(&failed_step, &spec);
            fail(s, key, format!("{label}: {}", err.message))
        }
        // An answer of the wrong shape for the call: cocoon and vk disagree on the
        // contract. The attempt fails like any other, so the pod retries.
        (
            failed_step @ (CreateStep::RemoveFork
            | CreateStep::PullImage
            | CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::Run
            | CreateStep::Clone
            | CreateStep::InspectNameTaken
            | CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::RemoveTakenFork { .. }
            | CreateStep::PullSnapshot { .. }
            | CreateStep::CheckEvidence
            | CreateStep::InspectLocal { .. }
            | CreateStep::VerifyRemote { .. }
            | CreateStep::PeerRestore { .. }
            | CreateStep::PullHibernate { .. }
            | CreateStep::AwaitSnapshot { .. }
            | CreateStep::Macos { .. }),
            Ok(other),
        ) => {
            let label = step_label(&failed_step, &spec);
            outcome::unexpected(s, &format!("pod {key}: {label} answered {other:?}"));
            fail(s, key, format!("{label}: unexpected answer from cocoon"))
        }
    }
}

fn count_clone_from_dir_failure(
    s: &mut State,
    step: &CreateStep,
    spec: &VmSpec,
    _err: &CocoonError,
) {
    if matches!(step, CreateStep::Clone) && spec.clone_from_dir.is_some() {
        s.emit(Action::Count {
            counter: Counter::CloneFromDir {
                result: "failed".into(),
            },
        });
    }
}

fn step_label(step: &CreateStep, spec: &VmSpec) -> String {
    let fork = || names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default());
    match step {
        CreateStep::RemoveFork => format!("snapshot rm {}", names::fork_snapshot(&spec.vm_name)),
        CreateStep::PullImage => format!("image pull {}", spec.image),
        CreateStep::ClassifyImage => format!("registry inspect {}", spec.image),
        CreateStep::ImportCloudImage => format!("image import {}", spec.image),
        CreateStep::Run => format!("vm run {}", spec.vm_name),
        CreateStep::Clone => format!("vm clone {}", spec.vm_name),
        CreateStep::InspectAfterBoot { record } => format!("vm inspect {}", record.id),
        CreateStep::InspectSnapshot { name } => format!("snapshot inspect {name}"),
        CreateStep::SaveForkSnapshot { .. } | CreateStep::RemoveTakenFork { .. } => {
            format!("snapshot save {}", fork())
        }
        CreateStep::InspectNameTaken => format!("vm name {} is taken", spec.vm_name),
        CreateStep::AwaitSnapshot { name } => format!("snapshot save {name}"),
        CreateStep::PullSnapshot { repo, tag, .. } => format!("pull {repo}:{tag}"),
        CreateStep::CheckEvidence => format!("inspect {}:hibernate", spec.vm_name),
        CreateStep::InspectLocal { name } => format!("snapshot inspect {name}"),
        CreateStep::VerifyRemote { name, .. } => format!("verify {name}:hibernate"),
        CreateStep::PeerRestore { name, node, .. } => format!("copy {name} from node {node}"),
        CreateStep::PullHibernate { name, .. } => format!("pull {name}:hibernate"),
        CreateStep::Macos { .. } => format!("cocoon-macos {}", spec.vm_name),
    }
}

/// C3 path order after the fork snapshot is dropped: clone-from-dir, fork-from, run, clone.
fn first_source_step(s: &mut State, key: &PodKey, spec: &VmSpec) {
    if let Some(dir) = &spec.clone_from_dir {
        if let Some(msg) = crate::trust::from_dir_refused(s, dir) {
            s.emit(Action::Count {
                counter: Counter::CloneFromDir {
                    result: "failed".into(),
                },
            });
            return fail_permanently(s, key, msg);
        }
        let cmd = clone_cmd(s, spec, CloneSource::FromDir(dir.clone()), true);
        step(s, key, CreateStep::Clone, cmd);
    } else if let Some(source) = &spec.fork_from {
        if let Some(msg) = crate::trust::fork_refused(s, key, source) {
            return fail(s, key, msg);
        }
        let name = names::fork_snapshot(source);
        step(
            s,
            key,
            CreateStep::InspectSnapshot { name: name.clone() },
            CocoonCmd::SnapshotInspect { name },
        );
    } else {
        match spec.mode {
            Mode::Run => match registry_ref(s, &spec.image) {
                // C7.2: a registry artifact may be a cloud image to stream into `image import`.
                Some((name, tag)) => {
                    let call = RegistryCall::Inspect { name, tag };
                    let owner = RegistryOwner::Pod { key: key.clone() };
                    let op = s.call_registry(owner, Some(key.clone()), call);
                    set_step(s, key, CreateStep::ClassifyImage, op);
                }
                None => pull_image(s, key, spec),
            },
            Mode::Clone => {
                let name = names::image_snapshot_name(&spec.image).0;
                step(
                    s,
                    key,
                    CreateStep::InspectSnapshot { name: name.clone() },
                    CocoonCmd::SnapshotInspect { name },
                );
            }
        }
    }
}

/// The registry-relative `(repository, tag)` of a run image, when a registry is configured
/// and the image is not a URL.
fn registry_ref(s: &State, image: &str) -> Option<(String, String)> {
    s.config.registry.as_ref()?;
    if image.starts_with("http://") || image.starts_with("https://") {
        return None;
    }
    let (_, repo, tag) = names::image_snapshot_name(image);
    Some((repo, tag))
}

/// C7.2: anything that is not a cloud image in the registry goes through `cocoon image pull`.
fn pull_image(s: &mut State, key: &PodKey, spec: &VmSpec) {
    let cmd = CocoonCmd::ImagePull {
        image: spec.image.clone(),
        force: spec.force_pull,
    };
    step(s, key, CreateStep::PullImage, cmd);
}

/// C7.2: what the registry holds decides how the run image is prepared.
fn classified(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    result: Result<RegistryOk, RegistryError>,
) {
    match result {
        Ok(RegistryOk::Inspected { snapshot: Some(r) }) if r.kind == ArtifactKind::CloudImage => {
            let (_, name, tag) = names::image_snapshot_name(&spec.image);
            let call = RegistryCall::PullCloudImage {
                name,
                tag,
                image: spec.image.clone(),
            };
            let op = s.call_registry(
                RegistryOwner::Pod { key: key.clone() },
                Some(key.clone()),
                call,
            );
            set_step(s, key, CreateStep::ImportCloudImage, op);
        }
        Ok(RegistryOk::Inspected { snapshot: Some(r) }) if r.kind == ArtifactKind::Snapshot => {
            let msg = format!(
                "{} is a VM snapshot, not an image to run: use mode=clone",
                spec.image
            );
            fail_permanently(s, key, msg)
        }
        // Absent, another kind, or a registry that cannot tell: cocoon pulls the image itself.
        Ok(RegistryOk::Inspected { .. }) | Err(_) => pull_image(s, key, spec),
        Ok(other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: classifying {} answered {other:?}", spec.image),
            );
            pull_image(s, key, spec)
        }
    }
}

/// C8.3: the clone base is missing here; with a registry it is pulled into the local name
/// the image maps to, then inspected again; without one the bring-up fails.
fn pull(s: &mut State, key: &PodKey, spec: &VmSpec, name: String) {
    if s.config.registry.is_none() {
        s.emit(Action::Count {
            counter: Counter::SnapshotPull {
                result: "failed".into(),
            },
        });
        let msg = format!(
            "snapshot {name:?} is not on this node and OCI_REGISTRY is not set, so it cannot be pulled"
        );
        return fail(s, key, msg);
    }
    // Another clone of this base is pulling it: clone from that pull, never a second import
    // that would replace the snapshot under the first pod's clone.
    if !claim(s, key, &name, Making::Pull) {
        return;
    }
    let (_, repo, tag) = names::image_snapshot_name(&spec.image);
    let call = RegistryCall::Pull {
        name: repo.clone(),
        tag: tag.clone(),
        local: name.clone(),
    };
    let op = s.call_registry(
        RegistryOwner::Pod { key: key.clone() },
        Some(key.clone()),
        call,
    );
    let now = s.now;
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = CreateStep::PullSnapshot { name, repo, tag };
        c.op = Some(op);
        c.step_since = now;
    }
}

/// The outcome of the bring-up's registry call (the router checked it is this step's).
pub(crate) fn registry_step_done(
    s: &mut State,
    key: &PodKey,
    result: Result<RegistryOk, RegistryError>,
) {
    registry_advance(s, key, result);
    settle_snapshot_claim(s, key);
}

fn registry_advance(s: &mut State, key: &PodKey, result: Result<RegistryOk, RegistryError>) {
    let Some(e) = s.pod(key) else { return };
    let Phase::Creating(c) = &e.phase else { return };
    let (step_now, since, cancel, purpose) = (c.step.clone(), c.step_since, c.cancel, c.purpose);
    if let (
        None,
        CreateStep::VerifyRemote { .. }
        | CreateStep::PeerRestore { .. }
        | CreateStep::PullHibernate { .. },
    ) = (cancel, &step_now)
    {
        let Ok(spec) = e.spec.clone() else { return };
        return wake_registry(s, key, &spec, purpose, step_now, since, result);
    }
    if let (None, CreateStep::CheckEvidence) = (cancel, &step_now) {
        let Ok(spec) = e.spec.clone() else { return };
        return evidence(s, key, &spec, result);
    }
    if let (None, CreateStep::ClassifyImage) = (cancel, &step_now) {
        let Ok(spec) = e.spec.clone() else { return };
        return classified(s, key, &spec, result);
    }
    if let (None, CreateStep::ImportCloudImage) = (cancel, &step_now) {
        let Ok(spec) = e.spec.clone() else { return };
        return match result {
            Ok(RegistryOk::Pulled) => step(s, key, CreateStep::Run, run_cmd(&spec)),
            Ok(other) => {
                outcome::unexpected(
                    s,
                    &format!("pod {key}: cloud image import answered {other:?}"),
                );
                fail(
                    s,
                    key,
                    format!(
                        "image import {}: unexpected answer from the registry client",
                        spec.image
                    ),
                )
            }
            Err(err) => fail(
                s,
                key,
                format!("image import {}: {}", spec.image, err.message),
            ),
        };
    }
    if let (
        Some(object),
        CreateStep::ClassifyImage
        | CreateStep::ImportCloudImage
        | CreateStep::CheckEvidence
        | CreateStep::VerifyRemote { .. }
        | CreateStep::PeerRestore { .. }
        | CreateStep::PullHibernate { .. },
    ) = (cancel, &step_now)
    {
        // What the cancelled step made for this bring-up goes with it.
        match (&step_now, &result) {
            (CreateStep::PeerRestore { staging, .. }, Ok(_)) => {
                crate::snapshot::drop_scratch(s, key, Scratch::Staging(staging.clone()))
            }
            (CreateStep::PullHibernate { import, .. }, Ok(_)) => {
                crate::snapshot::drop_scratch(s, key, Scratch::Snapshot(import.clone()))
            }
            (_, Ok(_) | Err(_)) => {}
        }
        return delete::without_vm(s, key, object);
    }
    let CreateStep::PullSnapshot { name, repo, tag } = step_now else {
        let what = format!("pod {key}: a registry outcome for step {step_now:?}");
        return outcome::unexpected(s, &what);
    };
    if let Some(object) = cancel {
        return delete::without_vm(s, key, object);
    }
    match result {
        Ok(RegistryOk::Pulled) => {
            s.emit(Action::Observe {
                histogram: Histogram::SnapshotPullDuration,
                millis: (s.now - since).max(0) as u64,
            });
            // The pulled snapshot's record (backend, base image) decides the clone.
            let cmd = CocoonCmd::SnapshotInspect { name: name.clone() };
            step(s, key, CreateStep::InspectSnapshot { name }, cmd);
        }
        Ok(other) => {
            outcome::unexpected(
                s,
                &format!("pod {key}: pull of {repo}:{tag} answered {other:?}"),
            );
            s.emit(Action::Count {
                counter: Counter::SnapshotPull {
                    result: "failed".into(),
                },
            });
            fail(
                s,
                key,
                format!("pull {repo}:{tag}: unexpected answer from the registry client"),
            )
        }
        Err(err) => {
            s.emit(Action::Count {
                counter: Counter::SnapshotPull {
                    result: "failed".into(),
                },
            });
            let msg = match err.kind {
                RegistryErrorKind::Absent => format!(
                    "snapshot {name:?} is not on this node and {repo}:{tag} is not in the registry"
                ),
                RegistryErrorKind::NotConfigured
                | RegistryErrorKind::Refused
                | RegistryErrorKind::Failed => format!("pull {repo}:{tag}: {}", err.message),
            };
            fail(s, key, msg)
        }
    }
}

fn snapshot_found(s: &mut State, key: &PodKey, spec: &VmSpec, name: String, snap: SnapshotInfo) {
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
                result: "ok".into(),
            },
        });
    }
    let pull = spec.fork_from.is_none() && !snap.image.is_empty();
    let mut cmd = clone_cmd(s, spec, CloneSource::Snapshot(name), pull);
    if let CocoonCmd::VmClone { restore_mode, .. } = &mut cmd {
        // The backend of a clone is the snapshot's, not the pod's.
        if snap.hypervisor == Backend::Firecracker.as_str() {
            *restore_mode = None;
        }
    }
    step(s, key, CreateStep::Clone, cmd);
}

/// Claims the making of local snapshot `name` for `key`, or queues `key` behind the pod
/// already making it (then `false`: the pod waits, its step `AwaitSnapshot`).
fn claim(s: &mut State, key: &PodKey, name: &str, how: Making) -> bool {
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

fn fork_source(s: &mut State, key: &PodKey, source: &str) {
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
            save_fork(s, key, source, id, false);
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
fn settle_snapshot_claim(s: &mut State, key: &PodKey) {
    let saving = match s.pod(key).map(|e| &e.phase) {
        Some(Phase::Creating(c)) => match &c.step {
            CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::RemoveTakenFork { .. }
            | CreateStep::PullSnapshot { .. } => true,
            CreateStep::Clone => false,
            CreateStep::RemoveFork
            | CreateStep::PullImage
            | CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::Run
            | CreateStep::InspectAfterBoot { .. }
            | CreateStep::InspectNameTaken
            | CreateStep::CheckEvidence
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

fn save_fork(s: &mut State, key: &PodKey, source: &str, vm: String, again: bool) {
    let cmd = CocoonCmd::SnapshotSave {
        name: names::fork_snapshot(source),
        vm: vm.clone(),
    };
    step(s, key, CreateStep::SaveForkSnapshot { vm, again }, cmd);
}

/// The holder of a taken snapshot name: the token after `already in use by ` (or `held by
/// `), trailing `)` stripped (CLI-3).
pub(crate) fn taken_by(message: &str) -> Option<String> {
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
        (Backend::CloudHypervisor, Os::Windows) => Some(RestoreMode::Copy),
        (Backend::CloudHypervisor, Os::Linux | Os::Android | Os::Macos) => {
            Some(s.config.restore_mode)
        }
    };
    CocoonCmd::VmClone {
        name: spec.vm_name.clone(),
        source,
        network: spec.network.clone(),
        no_direct_io: spec.no_direct_io,
        pull,
        restore_mode,
        cpu_policy: spec.cpu,
        nics: None,
    }
}

/// C12: the VM is up. Track it, probe it, and wait for the IP that `ready` needs — or, when
/// a delete came meanwhile, hand it to the delete, which removes it.
fn booted(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let Some(e) = s.pod(key) else { return };
    let Phase::Creating(c) = &e.phase else { return };
    let Ok(spec) = &e.spec else { return };
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
                result: "ok".into(),
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
    provider::outcome(s, key, op, Outcome::Ok, "");
    let wait = match (woken, clone_path) {
        (true, _) => IpWait::Wake,
        (false, true) => IpWait::Clone,
        (false, false) => IpWait::Run,
    };
    if let Some(e) = s.pods.get_mut(key) {
        e.post_clone = None;
    }
    crate::guest::begin(s, key, wait);
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
pub fn adopt(s: &mut State, key: &PodKey, vm: VmRecord, reason: &str) {
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
    lifecycle::set(s, key, Lifecycle::Ready, None);
    provider::outcome(s, key, Op::Create, Outcome::Ok, "unmanaged");
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
    let intent = e.intent.state;
    let uid = e.pod.uid.clone();
    probe::start(s, key);
    match intent {
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
fn resume_guest_step(s: &mut State, key: &PodKey, uid: &str) {
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
            "classify_drop_nic",
            "reconcile: finding out whether the VM was restored from its hibernate snapshot",
        ),
        (Some("done"), _) => (
            "ready_wait",
            "reconcile: the guest fix-up was done; resuming the steps after it",
        ),
        (Some("running"), Some(_)) | (None, Some(_)) => {
            ("post_clone", "reconcile: running the guest fix-up again")
        }
        (Some(_), _) | (None, None) => {
            ("ready_wait", "reconcile: resuming the wait for the VM's IP")
        }
    };
    s.emit(Action::Count {
        counter: Counter::StartupResume { op: op.into() },
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

/// C12.6 / P3: a bring-up error. Warning Event, lifecycle `failed`, and a retry with backoff.
pub fn fail(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, Retry::Timer)
}

/// A bring-up error that a retry cannot change (a bad annotation): reported like any other,
/// then the pod waits for a change instead of a timer.
pub fn fail_permanently(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, Retry::OnChange)
}

fn fail_with(s: &mut State, key: &PodKey, msg: String, retry: Retry) {
    fail_as(s, key, None, msg, retry)
}

/// A failed bring-up; `reason` overrides the Warning's reason, which is otherwise
/// `CreateBringUpFailed` for a fresh pod and `WakeCloneFailed` / `WakePullFailed` for a wake.
fn fail_as(s: &mut State, key: &PodKey, reason: Option<&str>, msg: String, retry: Retry) {
    let scratch = match s.pods.get_mut(key).map(|e| &mut e.phase) {
        Some(Phase::Creating(c)) => c.scratch.take(),
        Some(_) | None => None,
    };
    if let Some(scratch) = scratch {
        crate::snapshot::drop_scratch(s, key, scratch);
    }
    let Some(e) = s.pod(key) else { return };
    let (purpose, reason) = match &e.phase {
        Phase::Creating(c) => {
            let wake_reason = match c.step {
                CreateStep::Clone | CreateStep::InspectAfterBoot { .. } => "WakeCloneFailed",
                CreateStep::CheckEvidence
                | CreateStep::RemoveFork
                | CreateStep::PullImage
                | CreateStep::ClassifyImage
                | CreateStep::ImportCloudImage
                | CreateStep::Run
                | CreateStep::InspectSnapshot { .. }
                | CreateStep::SaveForkSnapshot { .. }
                | CreateStep::RemoveTakenFork { .. }
                | CreateStep::InspectNameTaken
                | CreateStep::PullSnapshot { .. }
                | CreateStep::InspectLocal { .. }
                | CreateStep::VerifyRemote { .. }
                | CreateStep::PeerRestore { .. }
                | CreateStep::PullHibernate { .. }
                | CreateStep::AwaitSnapshot { .. }
                | CreateStep::Macos { .. } => "WakePullFailed",
            };
            match c.purpose {
                Purpose::Fresh => (c.purpose, reason.unwrap_or("CreateBringUpFailed")),
                Purpose::Wake | Purpose::Restore => (c.purpose, reason.unwrap_or(wake_reason)),
            }
        }
        Phase::Failed(f) => (f.purpose, reason.unwrap_or("CreateBringUpFailed")),
        Phase::Waiting
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => (Purpose::Fresh, reason.unwrap_or("CreateBringUpFailed")),
    };
    let attempts = match &e.phase {
        Phase::Creating(Creating {
            cancel: Some(object),
            ..
        }) => return delete::without_vm(s, key, *object),
        Phase::Creating(c) => c.attempts,
        Phase::Failed(f) => f.attempts,
        Phase::Waiting
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => 0,
    } + 1;
    let uid = e.pod.uid.clone();
    s.touched.insert(key);
    let op = match purpose {
        Purpose::Fresh => Op::Create,
        Purpose::Wake | Purpose::Restore => Op::Wake,
    };
    let verb = match op {
        Op::Create => "create",
        Op::Wake | Op::Update | Op::Delete => "wake",
    };
    warn_event(s, key, reason, &format!("{verb}: {msg}"));
    lifecycle::set(s, key, Lifecycle::Failed, Some(msg.clone()));
    let counted = match retry {
        Retry::Timer => "bring_up",
        Retry::OnChange => "invalid_spec",
    };
    provider::outcome(s, key, op, Outcome::Failed(&msg), counted);
    let retry = match retry {
        Retry::Timer if attempts < MAX_ATTEMPTS => {
            s.emit(Action::ArmTimer {
                timer: Timer::CreateRetry {
                    key: key.clone(),
                    uid,
                },
                after_ms: RETRY.after(attempts),
            });
            Retry::Timer
        }
        Retry::Timer => {
            s.emit(Action::Log {
                level: Level::Error,
                message: format!(
                    "pod {key}: create failed {attempts} times; giving up until the pod changes: {msg}"
                ),
            });
            Retry::OnChange
        }
        Retry::OnChange => Retry::OnChange,
    };
    if let Some(e) = s.pods.get_mut(key) {
        e.phase = Phase::Failed(Failed {
            message: msg,
            attempts,
            retry,
            purpose,
        });
    }
}

/// The create-retry timer: a failed pod tries again.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    match e.phase {
        // A failed wake wakes again: a fresh boot would lose the hibernated state.
        Phase::Failed(Failed {
            purpose: purpose @ (Purpose::Wake | Purpose::Restore),
            ..
        }) => restore(s, key, purpose),
        Phase::Failed(_) => crate::intake::intake(s, key),
        Phase::Waiting
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}

pub(crate) fn warn_event(s: &mut State, key: &PodKey, reason: &str, message: &str) {
    let Some(e) = s.pod(key) else { return };
    let uid = e.pod.uid.clone();
    s.emit(Action::RecordEvent {
        source: crate::action::EventSource::Vk,
        key: key.clone(),
        uid,
        kind: EventType::Warning,
        reason: reason.into(),
        message: lifecycle::truncate(message.to_string(), 512),
    });
}
