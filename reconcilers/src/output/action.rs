//! Every effect the core asks for. Those with an outcome carry an `OpId` that comes back in
//! `Event::CocoonDone` / `Event::KubeDone`; timers and probes come back as their own events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cocoon::CocoonCmd;
use crate::labels::{
    EvidenceVerdict, HibernatePhase, IpWaitResult, LeaseReleaseResult, LifecycleOp,
    LifecycleReason, LifecycleResult, Outcome, PostCloneKind, ResumeOp, StaleCreateOutcome,
    VerifyResult,
};
use crate::pod::PodKey;
use crate::status::PodStatus;

pub type OpId = u64;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Timer {
    /// Re-attempt a failed create (framework backoff, P3).
    CreateRetry { key: PodKey, uid: String },
    /// Re-inspect a VM whose inspect was inconclusive (W4 inline retry, W5 deferred recheck).
    Recheck { key: PodKey, uid: String },
    /// The wait for a clone's DHCP lease ran out (C16).
    IpWait { key: PodKey, uid: String },
    /// U7: a cloud-hypervisor Windows guest woken with a fresh NIC and still without a lease
    /// is nudged once (`ipconfig /renew`).
    RenewNudge { key: PodKey, uid: String },
    /// The next attempt of a guest fix-up (C13: every 3 s).
    PostCloneRetry { key: PodKey, uid: String },
    /// Retry a Kubernetes write that failed with a transient error.
    KubeRetry { key: PodKey, uid: String },
    /// Retry a failed VM removal of a pod being deleted.
    DeleteRetry { key: PodKey, uid: String },
    /// Try a failed hibernate again while `hibernate=true` remains (U4).
    HibernateRetry {
        key: PodKey,
        uid: String,
        attempt: u32,
    },
    /// Retry the eviction delete (W6: 2 tries).
    EvictRetry { key: PodKey, uid: String },
    /// Compare `cocoon vm list` with the tracked VMs (R11).
    Sweep,
    /// Look again at a VM record left `creating` (B3 watcher).
    StaleCreate {
        id: String,
        name: String,
        attempt: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum ProbeCheck {
    Icmp,
    Tcp { port: u16 },
    SshBanner,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTarget {
    /// `None`: no IP resolved yet; the probe fails with "waiting for dhcp lease" (R5).
    pub ip: Option<String>,
    #[serde(flatten)]
    pub check: ProbeCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// Who reports an Event (E1, E2): the daemon's own component, or the pod controller that
/// reports each create, update and delete outcome as `<node>/pod-controller`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventSource {
    #[default]
    Vk,
    PodController,
}

impl EventSource {
    pub fn is_vk(&self) -> bool {
        *self == EventSource::Vk
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// The counters of M3 that decisions move, each label one of its vocabulary's values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum Counter {
    PodLifecycle {
        op: LifecycleOp,
        result: LifecycleResult,
        reason: LifecycleReason,
    },
    OrphanVm,
    VmInspectTransientFail,
    PodEvictFailure,
    ReconcileAdoptByName,
    StaleCreateReconcile {
        outcome: StaleCreateOutcome,
    },
    WakeIpWait {
        result: IpWaitResult,
    },
    SnapshotPull {
        result: Outcome,
    },
    CloneFromDir {
        result: Outcome,
    },
    StartupResume {
        op: ResumeOp,
    },
    LeaseRelease {
        result: LeaseReleaseResult,
    },
    /// An operation's outcome the core could not place (a contract mismatch or a core bug).
    UnexpectedOutcome,
    SnapshotSave {
        result: Outcome,
    },
    /// D9: a deleted VM's state kept on the node because its push was refused.
    SnapshotKept,
    SnapshotPush {
        result: Outcome,
    },
    Hibernate {
        phase: HibernatePhase,
        result: Outcome,
    },
    Wake {
        result: Outcome,
    },
    SnapshotVerify {
        result: VerifyResult,
    },
    HibernateEvidence {
        verdict: EvidenceVerdict,
    },
    SnapshotPeerRestore {
        result: Outcome,
    },
    WakeRenewNudge {
        result: Outcome,
    },
    /// C13, C15: `kind` is the fix-up's kind, or `sac`.
    PostClone {
        kind: PostCloneKind,
        result: Outcome,
    },
}

/// Histograms of counts rather than durations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum CountHistogram {
    /// C13: the attempts a fix-up used.
    PostCloneRetryAttempts { result: Outcome },
}

/// C15: one static NIC for the SAC dialog. `position` is the NIC's index in the VM record;
/// the shell maps it to the interface number SAC lists in that position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SacNic {
    pub position: u32,
    pub ip: String,
    /// Dotted quad.
    pub mask: String,
    pub gateway: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum Histogram {
    VmBootDuration {
        mode: String,
        backend: String,
    },
    SnapshotSaveDuration,
    SnapshotPushDuration,
    SnapshotPullDuration,
    SnapshotPeerRestoreDuration,
    /// M6: one stage of a pod's start-up, each observed once per incarnation.
    PodStartup {
        stage: StartupStage,
    },
    /// M6: a VM event that changed a pod's status, until the server took that status.
    VmEventToStatus,
}

/// M6: the stages of a pod's start-up, each from the moment before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartupStage {
    /// First seen → VM created.
    VmCreated,
    /// VM created → the first probe that succeeded.
    FirstProbeOk,
    /// First probe ok → the status with ready=true written.
    ReadyPushed,
    /// First seen → the status with ready=true written.
    Total,
}

impl StartupStage {
    pub fn as_str(self) -> &'static str {
        match self {
            StartupStage::VmCreated => "vm_created",
            StartupStage::FirstProbeOk => "first_probe_ok",
            StartupStage::ReadyPushed => "ready_pushed",
            StartupStage::Total => "total",
        }
    }
}

/// A call to the OCI registry (`OCI_REGISTRY`); `name` is the repository below the base.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum RegistryCall {
    /// What `<name>:<tag>` holds (its snapshot id, base image, pushing node), or that it is
    /// absent; the outcome is `RegistryOk::Inspected`.
    Inspect { name: String, tag: String },
    /// Streams `cocoon snapshot export <snapshot>` to `<name>:<tag>`, recording `base_image`,
    /// this node and the owner record `owner` (`<namespace>/<pod>`, T5) in the manifest. T7:
    /// a tag whose manifest another namespace owns is not replaced (`RegistryErrorKind::Foreign`).
    Push {
        snapshot: String,
        name: String,
        tag: String,
        base_image: String,
        owner: String,
    },
    /// Streams `<name>:<tag>` into `cocoon snapshot import --name <local>`, replacing any
    /// local snapshot of that name, with the manifest's owner record as its description. T7:
    /// a tag another namespace than `namespace` owns is refused (`RegistryErrorKind::Foreign`).
    Pull {
        name: String,
        tag: String,
        local: String,
        namespace: String,
        /// T16: the namespace's UID when the node knows it, so a record of an earlier
        /// namespace of the same name is refused too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace_uid: Option<String>,
    },
    /// C7.2: streams the cloud image `<name>:<tag>` into `cocoon image import <image>`.
    PullCloudImage {
        name: String,
        tag: String,
        image: String,
    },
    /// Deletes the tag; an absent tag counts as deleted.
    DeleteTag { name: String, tag: String },
    /// U6: copies the snapshot `name` from the peer `node` (the node that pushed
    /// `<name>:<tag>`) into the staging directory `staging` (a plain name under
    /// `VK_STAGING_DIR`), checking that the peer's copy is `snapshot_id` and writing the
    /// snapshot's description from the registry's config of that tag; the outcome is
    /// `RegistryOk::Staged` with the directory to clone from.
    PeerRestore {
        name: String,
        tag: String,
        node: String,
        snapshot_id: String,
        staging: String,
    },
    /// Removes the staging directory `staging` (a plain name under `VK_STAGING_DIR`); an
    /// absent one counts as removed.
    RemoveStaging { staging: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Run one cocoon CLI command; the outcome returns as `Event::CocoonDone`.
    RunCocoon {
        op: OpId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<PodKey>,
        cmd: CocoonCmd,
    },
    /// Call the OCI registry; the outcome returns as `Event::RegistryDone`.
    CallRegistry {
        op: OpId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<PodKey>,
        call: RegistryCall,
    },
    /// One merge patch of `pods/status` bound to `uid`, carrying the status when it differs
    /// from the server's and the annotations that differ (`None` deletes a key). The status
    /// subresource takes annotations (not labels, also under NodeRestriction), so a pod's
    /// status and annotations change in one write, atomically.
    PatchPod {
        op: OpId,
        key: PodKey,
        uid: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<PodStatus>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        annotations: BTreeMap<String, Option<String>>,
    },
    /// Delete the pod object with a UID precondition; `grace_seconds: Some(0)` forces it.
    DeletePod {
        op: OpId,
        key: PodKey,
        uid: String,
        grace_seconds: Option<i64>,
    },
    /// D6: `DELETE /v1/leases/<mac>` on cocoon-net's control socket; the outcome returns as
    /// `Event::DhcpLeaseReleased`.
    ReleaseDhcpLease {
        op: OpId,
        mac: String,
    },
    RecordEvent {
        key: PodKey,
        uid: String,
        kind: EventType,
        reason: String,
        message: String,
        #[serde(default, skip_serializing_if = "EventSource::is_vk")]
        source: EventSource,
    },
    /// Run probe `seq` after `after_ms`; the result returns as `Event::ProbeDone`.
    RunProbe {
        key: PodKey,
        seq: u64,
        target: ProbeTarget,
        after_ms: u64,
        /// A Ready pod's steady schedule (R3): probe again every `after_ms` while the guest
        /// answers, and report only the first failure, which ends the loop. A guest that
        /// keeps answering then costs no event at all.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        standing: bool,
    },
    StopProbe {
        key: PodKey,
    },
    ArmTimer {
        timer: Timer,
        after_ms: u64,
    },
    Count {
        counter: Counter,
    },
    Observe {
        histogram: Histogram,
        millis: u64,
    },
    ObserveCount {
        histogram: CountHistogram,
        count: u64,
    },
    /// C15: set the static addresses of a Windows guest over its serial console (the SAC
    /// dialog); the outcome returns as `Event::SacDone`.
    RunSac {
        op: OpId,
        key: PodKey,
        vm_id: String,
        /// How many NICs SAC must list before any is set.
        nic_count: u32,
        nics: Vec<SacNic>,
    },
    Log {
        level: Level,
        message: String,
    },
    /// T11: VM `vm` is now held for `held` (`None`: the record is dropped). Nothing to do
    /// outside the journal, which is where a restarted process reads the records back.
    Hold {
        vm: String,
        held: Option<crate::holders::Held>,
    },
    /// Startup reconcile is complete: register the node and start serving.
    RegisterNode,
    /// Startup cannot continue (B1, B2): exit non-zero without registering the node.
    Abort {
        message: String,
    },
}
