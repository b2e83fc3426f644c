//! C11 evidence, wake and restore (U5, U6): the source of a hibernated VM is resolved — the
//! local `<vm>` snapshot verified against the registry, a peer's copy, or a pull — then
//! cloned like a fresh pod's.

use super::failure::{fail_as, warn_event};
use super::{clone_cmd, inspect_fork, set_step, step};
use crate::action::{Action, Counter, EventType, Histogram, Level, RegistryCall};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::event::{CocoonOk, RegistryError, RegistryOk};
use crate::labels::{EvidenceVerdict, Outcome, VerifyResult};
use crate::names;
use crate::owner::Record;
use crate::phase::{CreateStep, Creating, Phase, Purpose, Retry, Scratch};
use crate::pod::PodKey;
use crate::snapshot::Removal;
use crate::spec::VmSpec;
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::time::Millis;
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{lifecycle, outcome};

/// C11: the outcome of the evidence check of a fresh bring-up.
pub(super) fn evidence(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    result: Result<RegistryOk, RegistryError>,
) {
    let verdict = |s: &mut State, verdict: EvidenceVerdict| {
        s.emit(Action::Count {
            counter: Counter::HibernateEvidence { verdict },
        })
    };
    let name = spec.vm_name.clone();
    match result {
        Ok(RegistryOk::Inspected { snapshot: None }) => {
            let op = inspect_fork(s, key, spec);
            set_step(s, key, CreateStep::RemoveFork { removing: false }, op)
        }
        Ok(RegistryOk::Inspected { snapshot: Some(r) }) => {
            // T6: another namespace's hibernated state is never restored into this pod.
            let record = Record::from_annotation(r.owner.as_deref(), &name, s.config.bases());
            if let Err(why) = record.usable_by(s.tenant(key), &format!("VM name {name:?}")) {
                let msg = format!("{name}:hibernate exists and {why}; give this pod another vm.cocoonstack.io/name");
                return fail_as(s, key, Some("HibernateEvidenceFailed"), msg, Retry::Timer);
            }
            // C11.1: a tag pushed before this pod existed is no wake this pod lost; it is a
            // hibernation an earlier pod of the name left behind (a retain-mode unsuspend
            // keeps its tag), and restoring it would bring back state older than the wake.
            // A pod's creation time is whole seconds: a push within the second the pod was
            // created counts as before it (a lost wake needs a pod that existed well before its
            // hibernation's push).
            let created = s.pod(key).and_then(|e| e.pod.creation_timestamp);
            if let (Some(pushed), Some(created)) = (r.pushed_at, created) {
                if pushed.div_euclid(1000) <= created.div_euclid(1000) {
                    verdict(s, EvidenceVerdict::Predates);
                    let msg = format!(
                        "create: {name}:hibernate was pushed before this pod was created, so it \
                         is no wake this pod lost: booting fresh (set \
                         vm.cocoonstack.io/restore-from-hibernate=true to restore it, or delete \
                         the tag)"
                    );
                    warn_event(s, key, "HibernateSnapshotPredatesPod", &msg);
                    let op = inspect_fork(s, key, spec);
                    return set_step(s, key, CreateStep::RemoveFork { removing: false }, op);
                }
            }
            if spec.clone_from_dir.is_some() || spec.fork_from.is_some() {
                verdict(s, EvidenceVerdict::SourceConflict);
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
                verdict(s, EvidenceVerdict::ImageConflict);
                return fail_as(
                    s,
                    key,
                    Some("HibernateEvidenceFailed"),
                    msg,
                    Retry::OnChange,
                );
            }
            verdict(s, EvidenceVerdict::Restored);
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
            verdict(s, EvidenceVerdict::Unavailable);
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
            verdict(s, EvidenceVerdict::Unavailable);
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
    lifecycle::attempt(s, key);
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
pub(super) fn wake_source(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    step_now: CreateStep,
    result: Result<CocoonOk, CocoonError>,
) {
    let registry = s.config.registry.is_some();
    // T6: a local copy another namespace owns is never used; the wake looks elsewhere as if
    // there were none here.
    let result = match (&step_now, result) {
        (CreateStep::InspectLocal { name }, Ok(CocoonOk::Snapshot { snapshot })) => {
            match local_refused(s, key, &snapshot) {
                None => Ok(CocoonOk::Snapshot { snapshot }),
                Some(why) => {
                    s.emit(Action::Log {
                        level: Level::Warn,
                        message: format!("pod {key}: the local {name} is not used: {why}"),
                    });
                    Err(CocoonError::new(CocoonErrorKind::SnapshotNotFound, why))
                }
            }
        }
        (_, result) => result,
    };
    match (step_now, result) {
        (CreateStep::PullHibernate { import, .. }, Ok(CocoonOk::Snapshot { snapshot }))
            if local_refused(s, key, &snapshot).is_some() =>
        {
            let why = local_refused(s, key, &snapshot).unwrap_or_default();
            crate::snapshot::drop_scratch(s, key, Scratch::Snapshot(import));
            wake_failed(s, key, "WakePullFailed", format!("wake: {why}"))
        }
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
            verified(s, VerifyResult::Ok);
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

/// T6: why a local snapshot may not be used by `key`'s wake, if it may not.
fn local_refused(s: &State, key: &PodKey, snap: &crate::event::SnapshotInfo) -> Option<String> {
    let what = format!("snapshot {:?}", snap.name);
    Record::from_description(&snap.description, &snap.name, s.config.bases())
        .usable_by(s.tenant(key), &what)
        .err()
}

/// A wake step answered with a shape it cannot have: a contract mismatch, failed like any
/// other wake error.
pub(super) fn wake_unexpected(
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

pub(super) fn wake_step_failed(s: &mut State, key: &PodKey, step: &CreateStep, why: &str) {
    wake_failed(s, key, "WakePullFailed", format!("{step:?}: {why}"))
}

/// The outcome of a wake's registry calls: the verification of the local copy, or the pull.
pub(super) fn wake_registry(
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
            let owner = snapshot.as_ref().and_then(|r| r.owner.as_deref());
            let what = format!("{name}:hibernate");
            let record = Record::from_annotation(owner, &name, s.config.bases());
            if let Err(why) = record.usable_by(s.tenant(key), &what) {
                let reason = match purpose {
                    Purpose::Restore => "HibernateEvidenceFailed",
                    Purpose::Wake | Purpose::Fresh => "WakePullFailed",
                };
                let msg = format!("restore {name}: {why}, so it is not restored into this pod");
                return wake_failed(s, key, reason, msg);
            }
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
                    verified(s, VerifyResult::Ok);
                    clone_local(s, key, spec, name, !local_image.is_empty())
                }
                // Stale: the tag holds another save; the local copies go.
                Some(r) => {
                    verified(s, VerifyResult::Stale);
                    crate::snapshot::remove(s, key, Removal::Copies(name.clone()));
                    from_peer_or_registry(s, key, name, r)
                }
                // Stale: the tag is gone, so no peer can be checked against it either.
                None => {
                    verified(s, VerifyResult::Stale);
                    crate::snapshot::remove(s, key, Removal::Copies(name.clone()));
                    pull_hibernate(s, key, name)
                }
            }
        }
        (CreateStep::PeerRestore { staging, .. }, Ok(RegistryOk::Staged { dir })) => {
            peer_restored(s, Outcome::Ok, since);
            if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
                c.scratch = Some(Scratch::Staging(staging));
            }
            let cmd = wake_clone_cmd(s, spec, CloneSource::FromDir(dir), true);
            step(s, key, CreateStep::Clone, cmd);
        }
        // Any failure of the peer falls through to the registry.
        (CreateStep::PeerRestore { name, node, .. }, Err(err)) => {
            peer_restored(s, Outcome::Failed, since);
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
            verified(s, VerifyResult::Error);
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

/// U6: the copy on the node that pushed `<vm>:hibernate` comes before the registry, unless
/// that node is this one (its copy would have been found locally) or unknown.
pub(super) fn from_peer_or_registry(
    s: &mut State,
    key: &PodKey,
    name: String,
    remote: crate::event::RemoteSnapshot,
) {
    let node = match remote.from_node {
        // CLI-10: a peer's copy is staged as a directory, which only `--from-dir` clones.
        Some(node)
            if !node.is_empty() && node != s.config.node_name && s.config.cocoon.clone_from_dir =>
        {
            node
        }
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

pub(super) fn peer_restored(s: &mut State, result: Outcome, since: Millis) {
    s.emit(Action::Count {
        counter: Counter::SnapshotPeerRestore { result },
    });
    s.emit(Action::Observe {
        histogram: Histogram::SnapshotPeerRestoreDuration,
        millis: (s.now - since).max(0) as u64,
    });
}

pub(super) fn verified(s: &mut State, result: VerifyResult) {
    s.emit(Action::Count {
        counter: Counter::SnapshotVerify { result },
    });
}

pub(super) fn clone_local(s: &mut State, key: &PodKey, spec: &VmSpec, name: String, pull: bool) {
    let cmd = wake_clone_cmd(s, spec, CloneSource::Snapshot(name), pull);
    step(s, key, CreateStep::Clone, cmd);
}

/// A wake's clone: a cloud-hypervisor Windows snapshot has no NIC, so the clone adds one (U7).
pub(super) fn wake_clone_cmd(
    s: &State,
    spec: &VmSpec,
    source: CloneSource,
    pull: bool,
) -> CocoonCmd {
    let mut cmd = clone_cmd(s, spec, source, pull);
    if let CocoonCmd::VmClone { nics, .. } = &mut cmd {
        *nics = spec.drops_nic().then_some(1);
    }
    cmd
}

pub(super) fn pull_hibernate(s: &mut State, key: &PodKey, name: String) {
    if s.config.registry.is_none() {
        let msg = format!("wake {name}: no local snapshot and OCI_REGISTRY is not set");
        return wake_failed(s, key, "WakePullFailed", msg);
    }
    let import = format!("{name}-hibernate-import");
    let call = RegistryCall::Pull {
        name: name.clone(),
        tag: "hibernate".into(),
        local: import.clone(),
        namespace: key.namespace().to_string(),
        namespace_uid: s.tenant(key).uid.map(str::to_string),
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
pub(super) fn image_conflict(s: &mut State, key: &PodKey, name: &str, base: &str, image: &str) {
    s.emit(Action::Count {
        counter: Counter::HibernateEvidence {
            verdict: EvidenceVerdict::ImageConflict,
        },
    });
    let msg = format!("restore {name}: {name}:hibernate was taken from image {base:?}, the pod asks for {image:?}; delete the tag to boot fresh");
    wake_failed(s, key, "HibernateEvidenceFailed", msg)
}

pub(super) fn wake_failed(s: &mut State, key: &PodKey, reason: &str, msg: String) {
    s.emit(Action::Count {
        counter: Counter::Wake {
            result: Outcome::Failed,
        },
    });
    fail_as(s, key, Some(reason), msg, Retry::Timer)
}
