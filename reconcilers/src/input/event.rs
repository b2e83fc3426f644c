//! Every input of the core. The shell stamps each with a sequence number and the wall time it
//! captured; nothing else about time or the world reaches a decision.

use serde::{Deserialize, Serialize};

use crate::action::{OpId, Timer};
use crate::pod::{PodKey, PodView};
use crate::small_str::SmallStr;
use crate::status::PodStatus;
use crate::time::Millis;
use crate::vm::{CocoonError, VmRecord};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub seq: u64,
    pub at: Millis,
    pub event: Event,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum VmEventKind {
    Added,
    Modified,
    Deleted,
}

/// One row of the cocoon-net lease file, already validated by the shell. The texts are
/// short and inline ([`SmallStr`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DhcpLease {
    /// Lowercase, colon-separated.
    pub mac: SmallStr,
    pub ip: SmallStr,
    pub expiry: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CocoonOk {
    Done,
    Vm { vm: VmRecord },
    Vms { vms: Vec<VmRecord> },
    Snapshot { snapshot: SnapshotInfo },
    StaleCreate { outcome: StaleOutcome },
}

/// What `vm reconcile-stale-create` did with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StaleOutcome {
    Collected,
    Busy,
    NotCreating,
    NotFound,
}

impl StaleOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            StaleOutcome::Collected => "collected",
            StaleOutcome::Busy => "busy",
            StaleOutcome::NotCreating => "not-creating",
            StaleOutcome::NotFound => "not-found",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "collected" => StaleOutcome::Collected,
            "busy" => StaleOutcome::Busy,
            "not-creating" => StaleOutcome::NotCreating,
            "not-found" => StaleOutcome::NotFound,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// The snapshot's description: where its owner record lives (T5, `owner.rs`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// The kinds of artifact a registry tag can hold, as the snapshot contract classifies them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    #[default]
    Snapshot,
    CloudImage,
    ContainerImage,
    Index,
    Unknown,
}

/// What a registry tag holds, as far as decisions go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSnapshot {
    /// What the tag holds (classified by its manifest).
    #[serde(default)]
    pub kind: ArtifactKind,
    /// cocoon's snapshot id at export: the identity a local copy is verified against.
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_node: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    /// The manifest's owner annotation as it stands (T5, `owner.rs`); `None`: no record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When it was pushed, from the manifest's `org.opencontainers.image.created` (C11.1);
    /// `None` when it has none or it does not parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed_at: Option<crate::time::Millis>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RegistryOk {
    /// `None`: the tag is absent (a 404, never a transport error).
    Inspected {
        snapshot: Option<RemoteSnapshot>,
    },
    Pushed {
        digest: String,
    },
    Pulled,
    Deleted,
    /// A peer's snapshot copied into the staging directory `dir`, ready for
    /// `vm clone --from-dir`.
    Staged {
        dir: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistryErrorKind {
    /// The tag does not exist (a pull or push of a missing source).
    Absent,
    /// `OCI_REGISTRY` is not set.
    NotConfigured,
    /// The artifact breaks the snapshot contract; nothing was imported.
    Refused,
    /// The registry or cocoon could not be reached or failed mid-stream.
    Failed,
    /// T7: the tag holds a snapshot another namespace owns: a pull for this namespace, or a
    /// push that would replace it, is refused before anything moves. Retrying never helps.
    Foreign,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryError {
    pub kind: RegistryErrorKind,
    pub message: String,
}

/// Where the SAC dialog failed (C15): each stage has its Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SacStage {
    Dial,
    Enum,
    Set,
    Verify,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SacError {
    pub stage: SacStage,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KubeErrorKind {
    NotFound,
    /// 409: the UID precondition failed or the object changed.
    Conflict,
    /// 422.
    Invalid,
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeError {
    pub kind: KubeErrorKind,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KubeOk {
    Done,
    /// A status write answered with the pod's status as the server now holds it.
    Status {
        status: Box<PodStatus>,
        /// The pod's resourceVersion after the write.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resource_version: Option<u64>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The pod watcher started a (re)list: `Init`.
    PodRelistBegin,
    /// One pod of the relist: `InitApply`.
    PodRelistItem {
        pod: PodView,
    },
    /// The relist is complete: `InitDone`. A known pod not seen since the begin is gone.
    PodRelistEnd,
    PodApplied {
        pod: PodView,
    },
    PodDeleted {
        pod: PodView,
    },
    /// `cocoon vm list` completed.
    VmListed {
        vms: Vec<VmRecord>,
    },
    VmListFailed {
        error: CocoonError,
    },
    VmStreamConnected,
    VmStream {
        kind: VmEventKind,
        vm: VmRecord,
    },
    VmStreamClosed {
        clean: bool,
        error: Option<String>,
    },
    ProbeDone {
        key: PodKey,
        /// The `seq` of the `RunProbe` this answers.
        seq: u64,
        ok: bool,
        detail: String,
    },
    /// The lease file changed, as a diff against the table the shell sent before: new or
    /// changed rows and the MACs that disappeared. The first after a start is the whole table.
    DhcpLeasesChanged {
        upsert: Vec<DhcpLease>,
        remove: Vec<SmallStr>,
    },
    TimerFired {
        timer: Timer,
    },
    CocoonDone {
        op: OpId,
        result: Result<CocoonOk, CocoonError>,
    },
    KubeDone {
        op: OpId,
        result: Result<KubeOk, KubeError>,
    },
    RegistryDone {
        op: OpId,
        result: Result<RegistryOk, RegistryError>,
    },
    /// The outcome of `Action::ReleaseDhcpLease` (`Err`: why it failed).
    DhcpLeaseReleased {
        op: OpId,
        result: Result<(), String>,
    },
    /// The outcome of `Action::RunSac`.
    SacDone {
        op: OpId,
        result: Result<(), SacError>,
    },
    /// The node object is registered; pods may now be reported against it.
    NodeRegistered,
    /// T16: a namespace as the apiserver has it (listed or changed): its name and UID. A
    /// deleted namespace sends nothing: its UID stays known, so its records stay another's
    /// when the name comes back.
    Namespace {
        name: String,
        uid: String,
    },
    /// T11: the VM holder records the process found in its journal, sent before any other
    /// event; `problem` says why they may be incomplete (no journal, a damaged one).
    HoldersRestored {
        holders: crate::holders::Holders,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        problem: Option<String>,
    },
}
