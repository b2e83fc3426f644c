//! The fresh bring-up's steps (C3–C10, C12): the fork snapshot dropped, the source chosen
//! (clone-from-dir, fork-from, run, clone), the image or base prepared, the VM booted.

use super::adopt::{adopt, booted};
use super::claims::{claim, fork_source};
use super::failure::{fail, fail_permanently};
use super::source::{fork_inspected, snapshot_found};
use super::wake::{evidence, wake_registry, wake_source};
use super::{clone_cmd, run_cmd, set_step, set_step_op, step};
use crate::action::{Action, Counter, Histogram, RegistryCall};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::event::{ArtifactKind, CocoonOk, RegistryError, RegistryErrorKind, RegistryOk};
use crate::names;
use crate::phase::{CreateStep, Creating, Phase, SaveStep, Scratch};
use crate::pod::PodKey;
use crate::snapshot::Saving;
use crate::spec::{Mode, VmSpec};
use crate::state::{Making, RegistryOwner, State};
use crate::vm::{CocoonError, CocoonErrorKind};
use crate::{delete, outcome};

pub(super) fn advance(
    s: &mut State,
    key: &PodKey,
    c: Creating,
    result: Result<CocoonOk, CocoonError>,
) {
    let (current, cancel) = (c.step, c.cancel);
    let Some(e) = s.pod(key) else {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    };
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
    // C14: a macOS guest's steps are cocoon-macos's (macos.rs).
    if let CreateStep::Macos { macos } = current {
        return crate::macos::step_done(s, key, &spec, macos, cancel, result);
    }
    // A delete is waiting: only a step that may have made a VM matters, so it is removed.
    if let Some(object) = cancel {
        match current {
            CreateStep::Run
            | CreateStep::Clone
            | CreateStep::InspectAfterBoot { .. }
            | CreateStep::Macos { .. } => {}
            CreateStep::RemoveFork { .. }
            | CreateStep::PullImage
            | CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::InspectNameTaken
            | CreateStep::PullSnapshot { .. }
            | CreateStep::CheckEvidence
            | CreateStep::CheckHibernated
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
    match current {
        CreateStep::Run
        | CreateStep::Clone
        | CreateStep::InspectAfterBoot { .. }
        | CreateStep::InspectNameTaken => {
            boot_done(s, key, &spec, current, cancel.is_some(), result)
        }
        CreateStep::RemoveFork { .. }
        | CreateStep::PullImage
        | CreateStep::ClassifyImage
        | CreateStep::ImportCloudImage
        | CreateStep::InspectSnapshot { .. }
        | CreateStep::SaveForkSnapshot { .. }
        | CreateStep::PullSnapshot { .. }
        | CreateStep::CheckEvidence
        | CreateStep::CheckHibernated
        | CreateStep::InspectLocal { .. }
        | CreateStep::VerifyRemote { .. }
        | CreateStep::PeerRestore { .. }
        | CreateStep::PullHibernate { .. }
        | CreateStep::AwaitSnapshot { .. }
        | CreateStep::Macos { .. } => source_done(s, key, &spec, current, result),
    }
}

/// The outcome of a step that boots the VM or looks at it: `vm run`, `vm clone`, the inspect
/// after them, and the inspect of a taken name (C4, T1).
fn boot_done(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    current: CreateStep,
    cancelled: bool,
    result: Result<CocoonOk, CocoonError>,
) {
    use CocoonErrorKind::VmNameTaken;
    match (current, result) {
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
        ) if !cancelled => {
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
            let other = crate::trust::holder_words(key, &s.vm_ids[&vm.id]);
            fail(
                s,
                key,
                format!(
                    "VM name {:?} belongs to {other} (VM {}); give this pod another vm.cocoonstack.io/name",
                    spec.vm_name, vm.id
                ),
            )
        }
        (CreateStep::InspectNameTaken, Ok(CocoonOk::Vm { vm }))
            if vm.is_running() && vm.name == spec.vm_name =>
        {
            // T11: only the pod (or namespace) the VM is recorded for takes it over.
            match crate::trust::may_take(s, key, &vm, crate::trust::Moment::Later) {
                Ok(()) => adopt(s, key, vm, crate::labels::LifecycleReason::Adopted),
                Err(msg) => fail(s, key, msg),
            }
        }
        (CreateStep::InspectNameTaken, Ok(CocoonOk::Vm { vm })) => fail(
            s,
            key,
            format!(
                "vm name {:?} is taken by VM {} in state {:?}",
                spec.vm_name, vm.id, vm.state
            ),
        ),
        (failed_step, Err(err)) => step_failed(s, key, spec, &failed_step, err),
        (other_step, Ok(other)) => step_unexpected(s, key, spec, &other_step, other),
    }
}

/// The outcome of a step that prepares the VM's source: the fork snapshot dropped (C6), a
/// clone base inspected, a fork source saved (C9).
fn source_done(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    current: CreateStep,
    result: Result<CocoonOk, CocoonError>,
) {
    use CocoonErrorKind::SnapshotNotFound;
    match (current, result) {
        (CreateStep::RemoveFork { removing: false }, Ok(CocoonOk::Snapshot { snapshot })) => {
            fork_inspected(s, key, spec, snapshot)
        }
        (
            CreateStep::RemoveFork { .. },
            Ok(CocoonOk::Done)
            | Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => first_source_step(s, key, spec),
        (CreateStep::PullImage, Ok(CocoonOk::Done)) => {
            let cmd = run_cmd(s, spec);
            step(s, key, CreateStep::Run, cmd)
        }
        (CreateStep::InspectSnapshot { name }, Ok(CocoonOk::Snapshot { snapshot })) => {
            snapshot_found(s, key, spec, name, snapshot)
        }
        (
            CreateStep::InspectSnapshot { name },
            Err(CocoonError {
                kind: SnapshotNotFound,
                ..
            }),
        ) => match &spec.fork_from {
            Some(source) => fork_source(s, key, source),
            None => pull(s, key, spec, name),
        },
        (CreateStep::SaveForkSnapshot { vm, save }, result) => {
            fork_save_done(s, key, spec, vm, save, result)
        }
        (failed_step, Err(err)) => step_failed(s, key, spec, &failed_step, err),
        (other_step, Ok(other)) => step_unexpected(s, key, spec, &other_step, other),
    }
}

/// C9: the outcome of a step of the fork source's save (see `snapshot.rs`): once saved, the
/// pod clones from it.
fn fork_save_done(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    vm: String,
    save: SaveStep,
    result: Result<CocoonOk, CocoonError>,
) {
    let name = names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default());
    match crate::snapshot::save_done(s, key, save, &name, &vm, result) {
        Saving::Next(save, op) => {
            set_step_op(s, key, CreateStep::SaveForkSnapshot { vm, save }, op)
        }
        Saving::Saved => {
            let cmd = clone_cmd(s, spec, CloneSource::Snapshot(name), false);
            step(s, key, CreateStep::Clone, cmd);
        }
        Saving::Refused(save, err) => step_failed(
            s,
            key,
            spec,
            &CreateStep::SaveForkSnapshot { vm, save },
            err,
        ),
        Saving::Unexpected(save, other) => step_unexpected(
            s,
            key,
            spec,
            &CreateStep::SaveForkSnapshot { vm, save },
            *other,
        ),
        Saving::Foreign(why) => fail(s, key, format!("snapshot save {name}: {why}")),
    }
}

/// A step's call failed: the attempt fails (C12.6).
fn step_failed(s: &mut State, key: &PodKey, spec: &VmSpec, step: &CreateStep, err: CocoonError) {
    count_clone_from_dir_failure(s, step, spec, &err);
    let label = step_label(step, spec);
    fail(s, key, format!("{label}: {}", err.message))
}

/// An answer of the wrong shape for the call: cocoon and vk disagree on the contract. The
/// attempt fails like any other, so the pod retries.
fn step_unexpected(s: &mut State, key: &PodKey, spec: &VmSpec, step: &CreateStep, other: CocoonOk) {
    let label = step_label(step, spec);
    outcome::unexpected(s, &format!("pod {key}: {label} answered {other:?}"));
    fail(s, key, format!("{label}: unexpected answer from cocoon"))
}

pub(super) fn count_clone_from_dir_failure(
    s: &mut State,
    step: &CreateStep,
    spec: &VmSpec,
    _err: &CocoonError,
) {
    if matches!(step, CreateStep::Clone) && spec.clone_from_dir.is_some() {
        s.emit(Action::Count {
            counter: Counter::CloneFromDir {
                result: crate::labels::Outcome::Failed,
            },
        });
    }
}

pub(super) fn step_label(step: &CreateStep, spec: &VmSpec) -> String {
    let fork = || names::fork_snapshot(spec.fork_from.as_deref().unwrap_or_default());
    match step {
        CreateStep::RemoveFork { removing: false } => {
            format!("snapshot inspect {}", names::fork_snapshot(&spec.vm_name))
        }
        CreateStep::RemoveFork { removing: true } => {
            format!("snapshot rm {}", names::fork_snapshot(&spec.vm_name))
        }
        CreateStep::PullImage => format!("image pull {}", spec.image),
        CreateStep::ClassifyImage => format!("registry inspect {}", spec.image),
        CreateStep::ImportCloudImage => format!("image import {}", spec.image),
        CreateStep::Run => format!("vm run {}", spec.vm_name),
        CreateStep::Clone => format!("vm clone {}", spec.vm_name),
        CreateStep::InspectAfterBoot { record } => format!("vm inspect {}", record.id),
        CreateStep::InspectSnapshot { name } => format!("snapshot inspect {name}"),
        CreateStep::SaveForkSnapshot { .. } => {
            format!("snapshot save {}", fork())
        }
        CreateStep::InspectNameTaken => format!("vm name {} is taken", spec.vm_name),
        CreateStep::AwaitSnapshot { name } => format!("snapshot save {name}"),
        CreateStep::PullSnapshot { repo, tag, .. } => format!("pull {repo}:{tag}"),
        CreateStep::CheckEvidence | CreateStep::CheckHibernated => {
            format!("inspect {}:hibernate", spec.vm_name)
        }
        CreateStep::InspectLocal { name } => format!("snapshot inspect {name}"),
        CreateStep::VerifyRemote { name, .. } => format!("verify {name}:hibernate"),
        CreateStep::PeerRestore { name, node, .. } => format!("copy {name} from node {node}"),
        CreateStep::PullHibernate { name, .. } => format!("pull {name}:hibernate"),
        CreateStep::Macos { .. } => format!("cocoon-macos {}", spec.vm_name),
    }
}

/// C3 path order after the fork snapshot is dropped: clone-from-dir, fork-from, run, clone.
pub(super) fn first_source_step(s: &mut State, key: &PodKey, spec: &VmSpec) {
    if let Some(dir) = &spec.clone_from_dir {
        if let Some(msg) = crate::trust::from_dir_refused(s, dir) {
            s.emit(Action::Count {
                counter: Counter::CloneFromDir {
                    result: crate::labels::Outcome::Failed,
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
pub(super) fn registry_ref(s: &State, image: &str) -> Option<(String, String)> {
    s.config.registry.as_ref()?;
    if image.starts_with("http://") || image.starts_with("https://") {
        return None;
    }
    let (_, repo, tag) = names::image_snapshot_name(image);
    Some((repo, tag))
}

/// C7.2: anything that is not a cloud image in the registry goes through `cocoon image pull`.
pub(super) fn pull_image(s: &mut State, key: &PodKey, spec: &VmSpec) {
    let cmd = CocoonCmd::ImagePull {
        image: spec.image.clone(),
        force: spec.force_pull,
    };
    step(s, key, CreateStep::PullImage, cmd);
}

/// C7.2: what the registry holds decides how the run image is prepared.
pub(super) fn classified(
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
pub(super) fn pull(s: &mut State, key: &PodKey, spec: &VmSpec, name: String) {
    if s.config.registry.is_none() {
        s.emit(Action::Count {
            counter: Counter::SnapshotPull {
                result: crate::labels::Outcome::Failed,
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
        namespace: key.namespace().to_string(),
        namespace_uid: s.tenant(key).uid.map(str::to_string),
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

pub(super) fn registry_advance(
    s: &mut State,
    key: &PodKey,
    c: Creating,
    result: Result<RegistryOk, RegistryError>,
) {
    let (step_now, since, cancel, purpose) = (c.step, c.step_since, c.cancel, c.purpose);
    let Some(e) = s.pod(key) else {
        return outcome::unexpected(s, &format!("pod {key}: an outcome for a pod that is gone"));
    };
    let spec = e.spec.clone();
    if let Some(object) = cancel {
        return registry_cancelled(s, key, step_now, &result, object);
    }
    let spec = match spec {
        Ok(spec) => spec,
        // The pod changed into something undecodable while the step was out.
        Err(err) => return fail_permanently(s, key, err.to_string()),
    };
    match step_now {
        CreateStep::VerifyRemote { .. }
        | CreateStep::PeerRestore { .. }
        | CreateStep::PullHibernate { .. } => {
            wake_registry(s, key, &spec, purpose, step_now, since, result)
        }
        CreateStep::CheckEvidence => evidence(s, key, &spec, result),
        CreateStep::CheckHibernated => super::asleep::evidence(s, key, &spec, result),
        CreateStep::ClassifyImage => classified(s, key, &spec, result),
        CreateStep::ImportCloudImage => imported(s, key, &spec, result),
        CreateStep::PullSnapshot { name, repo, tag } => {
            pulled(s, key, name, (repo, tag), since, result)
        }
        CreateStep::RemoveFork { .. }
        | CreateStep::PullImage
        | CreateStep::Run
        | CreateStep::Clone
        | CreateStep::InspectAfterBoot { .. }
        | CreateStep::InspectSnapshot { .. }
        | CreateStep::SaveForkSnapshot { .. }
        | CreateStep::InspectNameTaken
        | CreateStep::InspectLocal { .. }
        | CreateStep::AwaitSnapshot { .. }
        | CreateStep::Macos { .. } => {
            let what = format!("pod {key}: a registry outcome for step {step_now:?}");
            outcome::unexpected(s, &what)
        }
    }
}

/// A registry step came back after the pod's delete: what the step made for this bring-up
/// goes with it, and the delete takes over.
fn registry_cancelled(
    s: &mut State,
    key: &PodKey,
    step_now: CreateStep,
    result: &Result<RegistryOk, RegistryError>,
    object: crate::phase::Object,
) {
    match (step_now, result) {
        (CreateStep::PeerRestore { staging, .. }, Ok(_)) => {
            crate::snapshot::drop_scratch(s, key, Scratch::Staging(staging))
        }
        (CreateStep::PullHibernate { import, .. }, Ok(_)) => {
            crate::snapshot::drop_scratch(s, key, Scratch::Snapshot(import))
        }
        (
            CreateStep::ClassifyImage
            | CreateStep::ImportCloudImage
            | CreateStep::CheckEvidence
            | CreateStep::CheckHibernated
            | CreateStep::VerifyRemote { .. }
            | CreateStep::PeerRestore { .. }
            | CreateStep::PullHibernate { .. }
            | CreateStep::PullSnapshot { .. },
            Ok(_) | Err(_),
        ) => {}
        (
            step_now @ (CreateStep::RemoveFork { .. }
            | CreateStep::PullImage
            | CreateStep::Run
            | CreateStep::Clone
            | CreateStep::InspectAfterBoot { .. }
            | CreateStep::InspectSnapshot { .. }
            | CreateStep::SaveForkSnapshot { .. }
            | CreateStep::InspectNameTaken
            | CreateStep::InspectLocal { .. }
            | CreateStep::AwaitSnapshot { .. }
            | CreateStep::Macos { .. }),
            Ok(_) | Err(_),
        ) => {
            let what = format!("pod {key}: a registry outcome for step {step_now:?}");
            return outcome::unexpected(s, &what);
        }
    }
    delete::without_vm(s, key, object)
}

/// C7.2: the cloud image is imported: it runs like a pulled image.
fn imported(s: &mut State, key: &PodKey, spec: &VmSpec, result: Result<RegistryOk, RegistryError>) {
    match result {
        Ok(RegistryOk::Pulled) => {
            let cmd = run_cmd(s, spec);
            step(s, key, CreateStep::Run, cmd)
        }
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
    }
}

/// C8.3: the clone base `name` was pulled from `<repo>:<tag>` (or not).
fn pulled(
    s: &mut State,
    key: &PodKey,
    name: String,
    (repo, tag): (String, String),
    since: crate::time::Millis,
    result: Result<RegistryOk, RegistryError>,
) {
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
                    result: crate::labels::Outcome::Failed,
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
                    result: crate::labels::Outcome::Failed,
                },
            });
            let msg = match err.kind {
                RegistryErrorKind::Absent => format!(
                    "snapshot {name:?} is not on this node and {repo}:{tag} is not in the registry"
                ),
                RegistryErrorKind::NotConfigured
                | RegistryErrorKind::Refused
                | RegistryErrorKind::Foreign
                | RegistryErrorKind::Failed => format!("pull {repo}:{tag}: {}", err.message),
            };
            fail(s, key, msg)
        }
    }
}
