//! The Creating phase (CreatePod, C3–C12): one step's call is out at a time; its outcome
//! picks the next step, a Running pod, a Failed pod, or — when a delete came meanwhile —
//! hands the pod to the delete.
//!
//! - `steps`: the fresh bring-up's step machine (C3–C10) and its registry steps;
//! - `wake`: the C11 evidence check, wake and restore (U5, U6);
//! - `claims`: fork-save and clone-base claims shared by pods of one source (C8.3, C9);
//! - `adopt`: entering Running: a booted VM, an adoption, a resume after a restart;
//! - `failure`: a failed attempt, its retry and Warning.

mod adopt;
pub(crate) mod asleep;
mod claims;
mod failure;
mod source;
mod steps;
mod wake;

use crate::action::{OpId, RegistryCall};
use crate::cocoon::{CloneSource, CocoonCmd};
use crate::config::RestoreMode;
use crate::event::{CocoonOk, RegistryError, RegistryOk};
use crate::lifecycle;
use crate::names;
use crate::phase::{CreateStep, Creating, Phase, Purpose};
use crate::pod::PodKey;
use crate::spec::{Backend, Os, VmSpec};
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::vm::CocoonError;
use claims::settle_snapshot_claim;
use steps::{advance, registry_advance};

pub(crate) use adopt::enter_running;
pub use adopt::{adopt, adopt_unmanaged, resume};
pub(crate) use claims::stop_waiting;
pub use failure::{fail, fail_permanently};
pub(crate) use failure::{retry, warn_event};
pub(crate) use wake::restore;
pub use wake::wake;

/// Starts a bring-up (C6: a fresh one first drops the fork snapshot of its VM name, so a
/// predecessor's fork state never reaches new sub-agents).
pub fn begin(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    if let Some(msg) = crate::trust::name_taken(s, key, &spec.vm_name) {
        return fail(s, key, msg);
    }
    lifecycle::attempt(s, key);
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
        false => (
            CreateStep::RemoveFork { removing: false },
            inspect_fork(s, key, &spec),
        ),
    };
    enter(s, key, step, op);
}

/// The pod starts a bring-up at `step`, with `op` out, keeping the count of its earlier
/// failed attempts.
pub(super) fn enter(s: &mut State, key: &PodKey, step: CreateStep, op: OpId) {
    let since = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        let (attempts, last_failure) = e.phase.prior_failure();
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

/// C6: a fresh bring-up never hands its predecessor's fork state to new sub-agents; the
/// snapshot `fork-<vm>` is looked at first, since only its owner's namespace removes it (T8).
pub(super) fn inspect_fork(s: &mut State, key: &PodKey, spec: &VmSpec) -> OpId {
    crate::snapshot::inspect(s, key, names::fork_snapshot(&spec.vm_name))
}

pub(super) fn set_step(s: &mut State, key: &PodKey, next: CreateStep, op: crate::action::OpId) {
    let now = s.now;
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = Some(op);
        c.step_since = now;
    }
}

/// The next step of the bring-up under way.
pub(super) fn step(s: &mut State, key: &PodKey, next: CreateStep, cmd: CocoonCmd) {
    let op = s.run_cocoon(
        CocoonOwner::Pod { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
    set_step_op(s, key, next, op);
}

/// The next step, whose call `op` is out (unlike `set_step`, its start is not a duration's).
pub(super) fn set_step_op(s: &mut State, key: &PodKey, next: CreateStep, op: OpId) {
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = Some(op);
    }
}

/// A step that waits for another pod instead of a call of its own.
pub(super) fn wait_for_other(s: &mut State, key: &PodKey, next: CreateStep) {
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = next;
        c.op = None;
    }
}

/// The outcome of the step's call (the router checked it is this step's).
pub(crate) fn step_done(
    s: &mut State,
    key: &PodKey,
    c: Creating,
    result: Result<CocoonOk, CocoonError>,
) {
    advance(s, key, c, result);
    settle_snapshot_claim(s, key);
}

/// The outcome of the bring-up's registry call (the router checked it is this step's).
pub(crate) fn registry_step_done(
    s: &mut State,
    key: &PodKey,
    c: Creating,
    result: Result<RegistryOk, RegistryError>,
) {
    registry_advance(s, key, c, result);
    settle_snapshot_claim(s, key);
}

pub(super) fn run_cmd(s: &State, spec: &VmSpec) -> CocoonCmd {
    CocoonCmd::VmRun {
        name: spec.vm_name.clone(),
        image: spec.image.clone(),
        cpu: spec.vcpus,
        cpu_policy: s.config.cocoon.cpu_knobs.then_some(spec.cpu),
        memory: spec.memory_bytes,
        storage: spec.storage_bytes,
        network: spec.network.clone(),
        windows: spec.os == Os::Windows,
        fc: spec.backend == Backend::Firecracker,
        no_direct_io: spec.no_direct_io,
    }
}

pub(super) fn clone_cmd(s: &State, spec: &VmSpec, source: CloneSource, pull: bool) -> CocoonCmd {
    let restore_mode = match (spec.backend, spec.os) {
        (Backend::Firecracker, _) => None,
        (Backend::CloudHypervisor, Os::Windows) => Some(RestoreMode::Copy),
        (Backend::CloudHypervisor, Os::Linux | Os::Android | Os::Macos) => {
            Some(s.config.restore_mode)
        }
    };
    let caps = s.config.cocoon;
    // CLI-10: an older cocoon knows only lazy restore, as `--on-demand`; copy is its default.
    let (restore_mode, on_demand) = match caps.restore_mode {
        true => (restore_mode, false),
        false => (None, restore_mode == Some(RestoreMode::Ondemand)),
    };
    CocoonCmd::VmClone {
        name: spec.vm_name.clone(),
        source,
        network: spec.network.clone(),
        no_direct_io: spec.no_direct_io,
        pull,
        restore_mode,
        on_demand,
        cpu_policy: caps.cpu_knobs.then_some(spec.cpu),
        nics: None,
    }
}
