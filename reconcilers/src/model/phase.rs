//! Where a pod is in its life, as one value. Each variant holds what that phase needs and
//! nothing else, so a handler matches on the phase instead of combining flags, and a phase
//! added later (hibernating, waking, guest fix-ups) is one more variant the compiler makes
//! every match consider.

use serde::{Deserialize, Serialize};

use crate::action::OpId;
use crate::state::Tracked;
use crate::time::Millis;
use crate::vm::VmRecord;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Known, with nothing to run: before startup, a pod the API already shows finished, or
    /// a hibernated pod without a VM.
    Waiting,
    /// The last bring-up failed or the pod was rejected; shown as ProviderFailed.
    Failed(Failed),
    /// A bring-up is under way: one cocoon call out at a time.
    Creating(Creating),
    /// The pod has its VM.
    Running(Running),
    /// The VM is being saved, pushed to `<vm>:hibernate` and removed (U3).
    Hibernating(Hibernating),
    /// The VM's state is in the registry and the VM is gone; the pod waits to be woken (S1).
    Hibernated,
    /// The VM is gone or removed; the pod object is being deleted (W6).
    Evicting(Evicting),
    /// The pod is being deleted and its VM is being removed.
    Deleting(Deleting),
    /// The final status is decided; the object goes once the server holds it.
    Terminal(Terminal),
    /// The pod object is gone; the entry goes once nothing is out for it.
    Gone(Gone),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    pub message: String,
    /// Bring-up attempts so far (P3 gives up after 20).
    pub attempts: u32,
    pub retry: Retry,
    /// What the failed bring-up was for: a failed wake is retried as a wake.
    #[serde(default)]
    pub purpose: Purpose,
}

/// What starts the next attempt of a failed pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// The create-retry timer.
    Timer,
    /// Only a change of the pod: retrying as it is cannot help, or the attempts ran out.
    OnChange,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creating {
    pub step: CreateStep,
    /// The step's cocoon call; `None` while the step waits for another pod's operation.
    pub op: Option<OpId>,
    /// When the bring-up began (boot duration).
    pub since: Millis,
    /// When the step under way began, for steps whose duration is observed (a pull).
    #[serde(default)]
    pub step_since: Millis,
    pub attempts: u32,
    /// The previous attempt's error: still what the pod shows until this one succeeds.
    pub last_failure: Option<String>,
    /// A delete came while the step was out; the step's outcome hands the pod over to it.
    pub cancel: Option<Object>,
    /// What the bring-up is for.
    #[serde(default)]
    pub purpose: Purpose,
    /// What was made for this bring-up only (a registry import, a peer's staged copy),
    /// removed once the VM is up or the attempt fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<Scratch>,
}

/// A source made for one bring-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Scratch {
    /// A local cocoon snapshot (`<vm>-hibernate-import`).
    Snapshot(String),
    /// A directory under `VK_STAGING_DIR`, by its plain name.
    Staging(String),
}

impl Creating {
    /// A bring-up whose first step's call `op` was just sent at `since`.
    pub fn first(
        step: CreateStep,
        op: OpId,
        since: Millis,
        attempts: u32,
        last_failure: Option<String>,
        purpose: Purpose,
    ) -> Self {
        Creating {
            step,
            op: Some(op),
            since,
            step_since: since,
            attempts,
            last_failure,
            cancel: None,
            purpose,
            scratch: None,
        }
    }
}

/// Why a pod is brought up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A new VM (C3).
    #[default]
    Fresh,
    /// A hibernated pod woken in place (U5).
    Wake,
    /// A new pod restoring a hibernated VM (C11, the restore marker).
    Restore,
}

/// One step of a bring-up; its outcome picks the next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum CreateStep {
    /// C11: does `<vm>:hibernate` exist? Then this pod restores instead of booting fresh.
    CheckEvidence,
    /// T1, T6: a pod asking to be hibernated without a VM here: is `<vm>:hibernate` another
    /// namespace's? Only if not is the pod taken in as hibernated.
    CheckHibernated,
    /// C6 under T8: `fork-<vm>` is inspected (`removing` false), then removed if this pod may
    /// remove it (`removing` true).
    RemoveFork {
        #[serde(default)]
        removing: bool,
    },
    /// C7.2: what the registry holds under the run image's reference, if anything.
    ClassifyImage,
    /// C7.2: the cloud image streamed from the registry into `cocoon image import`.
    ImportCloudImage,
    PullImage,
    Run,
    InspectAfterBoot {
        record: VmRecord,
    },
    InspectSnapshot {
        name: String,
    },
    /// C9: the fork source's VM `vm` saved as `fork-<source>` (see `snapshot.rs`).
    SaveForkSnapshot {
        vm: String,
        save: SaveStep,
    },
    Clone,
    InspectNameTaken,
    /// C8.3: the clone base is not on this node: pull `<repo>:<tag>` from the registry into
    /// the local snapshot `name`.
    PullSnapshot {
        name: String,
        repo: String,
        tag: String,
    },
    /// U6: the local `<vm>` snapshot left by the hibernate, if any.
    InspectLocal {
        name: String,
    },
    /// U6: the registry's `<vm>:hibernate`, to verify the local copy (`local_id`) against.
    VerifyRemote {
        name: String,
        local_id: String,
        local_image: String,
    },
    /// U6: the snapshot copied from the node that hibernated it (`node`), into the staging
    /// directory `staging`.
    PeerRestore {
        name: String,
        node: String,
        staging: String,
    },
    /// U6: `<vm>:hibernate` pulled into `import`.
    PullHibernate {
        name: String,
        import: String,
    },
    /// Another pod of the same fork source is saving `name`: this one clones from it once
    /// that save is done, instead of saving (and replacing) it again.
    AwaitSnapshot {
        name: String,
    },
    /// C14: a step of a managed macOS guest's bring-up (cocoon-macos).
    Macos {
        macos: crate::model::macos::MacosStep,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub vm: Tracked,
    /// Work on the VM after a hint: inspect, restart, removal before an eviction.
    pub task: Option<VmTask>,
    /// What still stands between the VM and lifecycle `ready`: the guest's fix-up, its SAC
    /// static address, its lease (C13, C15, C16). `None`: nothing is owed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Settle>,
}

/// The guest steps after a bring-up, in the order they run. Each holds what the next needs,
/// and the lease wait that ends them says what the bring-up was for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Settle {
    /// B9: a restart found a cloud-hypervisor Windows clone with no fix-up state: whether
    /// `<vm>:hibernate` exists says if it was a wake (a restore) or a fresh clone.
    Classify { op: OpId },
    /// C13: a copied guest is fixed up through `vm exec`, every 3 s within 180 s.
    Fixup(Fixup),
    /// C15: a Windows guest's static addresses are set over its serial console, after the
    /// fix-up that took `attempts` (0: a restart found it done), announced once SAC is done.
    Sac {
        op: OpId,
        wait: IpWait,
        attempts: u32,
    },
    /// C16: `ready` waits for the IP.
    Lease { wait: IpWait },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fixup {
    pub kind: FixupKind,
    pub wait: IpWait,
    /// When the first attempt went out: the 180 s budget runs from here.
    pub since: Millis,
    /// Attempts sent so far.
    pub attempts: u32,
    /// "attempt N: …" of every failed attempt, for `post-clone-errors`.
    pub errors: Vec<String>,
    pub call: Call,
}

/// Which fix-up a copied guest needs (C13): the `kind` label of its metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FixupKind {
    Windows,
    LinuxFc,
    LinuxStatic,
}

impl FixupKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FixupKind::Windows => "windows",
            FixupKind::LinuxFc => "linux_fc",
            FixupKind::LinuxStatic => "linux_static",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmTask {
    pub step: VmStep,
    pub call: Call,
    /// A hint came while this task was out; it is taken up once the task is done, since the
    /// task may have looked at the VM before the change the hint reports.
    pub hint_deferred: bool,
}

/// How a step waits: on its cocoon call, or on a timer before the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "wait", content = "op", rename_all = "snake_case")]
pub enum Call {
    Out(OpId),
    Timer,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum VmStep {
    /// W4/W5: inspect after a hint; `attempt` counts inspects, `first_failure` starts the
    /// recheck budget.
    Recover {
        attempt: u32,
        first_failure: Option<Millis>,
    },
    Restart,
    InspectAfterRestart,
    /// R10: `cocoon-macos vm start` of a dead guest, found by the sweep.
    MacosStart,
    /// `vm rm` before an eviction (restart cooldown, failed restart).
    RemoveForEvict {
        reason: EvictReason,
        message: String,
    },
}

/// Which wait for an IP: a clone waits 45 s for its lease (C16); a run or an adoption waits
/// without a deadline, since `ready` needs an IP on every managed path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IpWait {
    Clone,
    Run,
    Adopt,
    /// A woken VM (U7): like a clone, 45 s, with the wake's metrics and Events.
    Wake,
}

impl IpWait {
    pub fn has_deadline(self) -> bool {
        match self {
            IpWait::Clone | IpWait::Wake => true,
            IpWait::Run | IpWait::Adopt => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IpWait::Clone => "clone",
            IpWait::Run => "run",
            IpWait::Adopt => "adopt",
            IpWait::Wake => "wake",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evicting {
    /// The pod as it ran: a failed eviction keeps all of it (W6).
    pub running: Running,
    pub reason: EvictReason,
    pub message: String,
    /// Delete calls sent so far (W6 sends two at most).
    pub tries: u32,
    /// The delete call out; `None` while the retry timer runs.
    pub delete: Option<OpId>,
    /// A delete of the pod came while the eviction's call was out.
    pub cancel: Option<Object>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hibernating {
    /// The pod as it ran: a failed hibernate goes back to it (U4).
    pub running: Running,
    pub step: HibernateStep,
    pub op: OpId,
    /// When the step under way began (save and push durations).
    pub since: Millis,
    /// Hibernates tried in a row without success, for the retry's backoff.
    pub attempts: u32,
    /// A delete came while the step was out; its outcome hands the pod over to it.
    pub cancel: Option<Object>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum HibernateStep {
    /// B9: the VM found stopped after a restart is booted first (`vm start`), since only a
    /// running VM can be saved.
    Start,
    /// U3, cloud-hypervisor + Windows: the guest gives its lease back (`ipconfig /release`),
    /// best effort.
    ReleaseLease,
    /// U3, cloud-hypervisor + Windows: the NIC is hot-removed, so the snapshot has none.
    DropNic,
    /// The VM saved as `<vm>` (see `snapshot.rs`).
    Save {
        save: SaveStep,
    },
    Push,
    /// `vm rm`: the `id` and `ip` annotations are already withdrawn.
    Remove,
    /// U4: a step failed after the NIC was dropped (or the drop itself failed): the NIC is
    /// put back, the VM inspected for its new MAC and the guest asked to renew its lease, and
    /// then the pod goes back to Running with `failed`.
    RestoreNic {
        stage: NicStage,
        failed: Failure,
    },
}

/// Where a save of a VM into a local snapshot is (F1): `snapshot save` refuses a name that
/// is taken, so its holder is removed and the save tried once more; that second refusal is
/// final. Create (the fork save), hibernate and delete each hold one; `snapshot.rs` runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveStep {
    /// `snapshot save --name <snapshot> -- <vm>`.
    Save,
    /// The snapshot holding the name the save was refused, inspected for its owner (T8).
    InspectHolder,
    /// `snapshot rm` of whatever holds the name the save was refused.
    RemoveHolder,
    /// The second `snapshot save`, whose refusal is final.
    SaveAgain,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NicStage {
    /// `vm net --nics 1`.
    Add,
    /// `vm inspect`: the new NIC's MAC.
    Inspect,
    /// `ipconfig /renew` in the guest.
    Renew,
}

/// Why a hibernate is rolled back: the Warning's reason and the lifecycle message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

/// Why a pod was evicted: the container's terminated reason (S6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvictReason {
    #[serde(rename = "VMGone")]
    VmGone,
    RestartCooldown,
    RestartFailed,
    #[serde(rename = "VMInspectTimeout")]
    VmInspectTimeout,
}

impl EvictReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::VmGone => "VMGone",
            EvictReason::RestartCooldown => "RestartCooldown",
            EvictReason::RestartFailed => "RestartFailed",
            EvictReason::VmInspectTimeout => "VMInspectTimeout",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleting {
    pub vm: Tracked,
    pub wait: DeleteWait,
    /// Failed attempts in a row (of the snapshot or of the removal).
    pub failures: u32,
    pub object: Object,
    /// What runs next, and what the retry timer runs again.
    pub stage: DeleteStage,
    /// When the snapshot step under way began (save and push durations).
    pub since: Millis,
    /// Why the delete is held: the delete-time snapshot failed and the VM is kept (D4).
    pub blocked: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteStage {
    /// Save the VM and push it to `<vm>:latest` first, if the snapshot policy says so (D4).
    Snapshot,
    /// Remove the VM (D5).
    Remove,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "wait", content = "op", rename_all = "snake_case")]
pub enum DeleteWait {
    /// A VM task's call was out when the delete came; its outcome starts the removal.
    Task(OpId),
    /// The VM saved as `<vm>` (see `snapshot.rs`).
    Save(SaveStep, OpId),
    /// The push to `<vm>:latest`.
    Push(OpId),
    /// D9: the push was refused for good; the VM saved under its kept name first.
    Keep(SaveStep, OpId),
    RemoveVm(OpId),
    /// The last attempt failed; the delete-retry timer runs the stage again.
    Retry,
}

/// Whether the pod object still exists in the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Object {
    /// It has a deletion timestamp: vk deletes it once its final status is written.
    Present,
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    pub end: End,
    pub object: ObjectDelete,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum End {
    Succeeded,
    Evicted {
        reason: EvictReason,
        message: String,
    },
}

/// vk's grace-0 delete of the pod object (the delete contract's last step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "delete", content = "op", rename_all = "snake_case")]
pub enum ObjectDelete {
    /// Nobody asked to delete the pod yet (an evicted pod waits for its deletion timestamp).
    NotAsked,
    /// Sent once the server holds the final status.
    Asked,
    Out(OpId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gone {
    /// vk's own delete of the object, still out.
    pub delete: Option<OpId>,
}

impl Phase {
    /// The VM the pod holds, in any phase that has one.
    pub fn vm(&self) -> Option<&Tracked> {
        match self {
            Phase::Running(r) => Some(&r.vm),
            Phase::Evicting(e) => Some(&e.running.vm),
            Phase::Hibernating(h) => Some(&h.running.vm),
            Phase::Deleting(d) => Some(&d.vm),
            Phase::Waiting
            | Phase::Failed(_)
            | Phase::Creating(_)
            | Phase::Hibernated
            | Phase::Terminal(_)
            | Phase::Gone(_) => None,
        }
    }

    pub fn vm_mut(&mut self) -> Option<&mut Tracked> {
        match self {
            Phase::Running(r) => Some(&mut r.vm),
            Phase::Evicting(e) => Some(&mut e.running.vm),
            Phase::Hibernating(h) => Some(&mut h.running.vm),
            Phase::Deleting(d) => Some(&mut d.vm),
            Phase::Waiting
            | Phase::Failed(_)
            | Phase::Creating(_)
            | Phase::Hibernated
            | Phase::Terminal(_)
            | Phase::Gone(_) => None,
        }
    }

    /// The pod object is gone from the API (vk deleted it, or someone did).
    pub fn object_gone(&self) -> bool {
        match self {
            Phase::Gone(_) => true,
            Phase::Deleting(d) => d.object == Object::Gone,
            Phase::Creating(c) => c.cancel == Some(Object::Gone),
            Phase::Evicting(e) => e.cancel == Some(Object::Gone),
            Phase::Hibernating(h) => h.cancel == Some(Object::Gone),
            Phase::Waiting
            | Phase::Failed(_)
            | Phase::Running(_)
            | Phase::Hibernated
            | Phase::Terminal(_) => false,
        }
    }

    /// A delete of the pod is under way (its deletion timestamp was seen, or it is gone).
    pub fn deleting(&self) -> bool {
        match self {
            Phase::Deleting(_) | Phase::Gone(_) => true,
            Phase::Creating(c) => c.cancel.is_some(),
            Phase::Evicting(e) => e.cancel.is_some(),
            Phase::Hibernating(h) => h.cancel.is_some(),
            Phase::Terminal(t) => t.object != ObjectDelete::NotAsked,
            Phase::Waiting | Phase::Failed(_) | Phase::Running(_) | Phase::Hibernated => false,
        }
    }

    /// Status and annotation writes wait: the object is gone or about to go, a call that
    /// decides what the pod shows is out (a removal, an eviction, a cancelled bring-up step).
    pub fn holds_writes(&self) -> bool {
        match self {
            Phase::Gone(_) => true,
            Phase::Creating(c) => c.cancel.is_some(),
            Phase::Evicting(e) => e.delete.is_some() || e.cancel == Some(Object::Gone),
            Phase::Hibernating(h) => h.cancel.is_some(),
            Phase::Deleting(d) => d.object == Object::Gone || d.wait != DeleteWait::Retry,
            Phase::Terminal(t) => matches!(t.object, ObjectDelete::Out(_)),
            Phase::Waiting | Phase::Failed(_) | Phase::Running(_) | Phase::Hibernated => false,
        }
    }

    /// The pod still wants its VM: it is neither being deleted, evicted nor finished.
    pub fn wants_vm(&self) -> bool {
        match self {
            Phase::Waiting | Phase::Failed(_) => true,
            Phase::Creating(c) => c.cancel.is_none(),
            Phase::Running(r) => !matches!(
                r.task,
                Some(VmTask {
                    step: VmStep::RemoveForEvict { .. },
                    ..
                })
            ),
            // A hibernating pod gives its VM up itself, once its state is in the registry.
            Phase::Hibernating(_)
            | Phase::Hibernated
            | Phase::Evicting(_)
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => false,
        }
    }

    /// The attempts so far and the last error of a pod about to try (again): a failed pod's,
    /// else none.
    pub fn prior_failure(&self) -> (u32, Option<String>) {
        match self {
            Phase::Failed(f) => (f.attempts, Some(f.message.clone())),
            Phase::Waiting
            | Phase::Creating(_)
            | Phase::Running(_)
            | Phase::Evicting(_)
            | Phase::Hibernating(_)
            | Phase::Hibernated
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => (0, None),
        }
    }

    /// A short name for logs and test dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Failed(_) => "failed",
            Phase::Creating(_) => "creating",
            Phase::Running(_) => "running",
            Phase::Hibernating(_) => "hibernating",
            Phase::Hibernated => "hibernated",
            Phase::Evicting(_) => "evicting",
            Phase::Deleting(_) => "deleting",
            Phase::Terminal(_) => "terminal",
            Phase::Gone(_) => "gone",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Journals whose states carry `remove_fork` without `removing` still decode; either
    /// stage's `Done` or not-found outcome ends the step the same way.
    #[test]
    fn a_remove_fork_step_without_its_stage_decodes_as_the_inspect() {
        let step: CreateStep = serde_json::from_str(r#"{"step":"remove_fork"}"#).unwrap();
        assert_eq!(step, CreateStep::RemoveFork { removing: false });
        let save: SaveStep = serde_json::from_str(r#""inspect_holder""#).unwrap();
        assert_eq!(save, SaveStep::InspectHolder);
    }
}
