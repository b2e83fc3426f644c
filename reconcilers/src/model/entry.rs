//! What the core knows of one pod: the pod as the API shows it, its decoded spec, its phase,
//! its lifecycle intent, its probe agent and its writer.

use serde::{Deserialize, Serialize};

use crate::moments::Moments;
use crate::phase::Phase;
use crate::pod::PodView;
use crate::spec::{SpecError, VmSpec};
use crate::time::Millis;
use crate::vm::VmRecord;
use crate::writer::Writer;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodEntry {
    pub pod: PodView,
    pub spec: Result<VmSpec, SpecError>,
    pub phase: Phase,
    pub intent: Intent,
    pub probe: ProbeState,
    pub started_at: Option<Millis>,
    pub ready_changed_at: Option<Millis>,
    pub writer: Writer,
    /// A new incarnation under the same name, taken in once this one is collected.
    pub successor: Option<PodView>,
    /// The guest fix-up of the VM the pod holds, as `post-clone-state` shows it (C13);
    /// `None`: vk has no word on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_clone: Option<PostClone>,
    /// M6: the moments of this incarnation a user waits between.
    #[serde(default, skip_serializing_if = "Moments::is_empty")]
    pub moments: Moments,
}

/// The fix-up's progress as the pod's annotations carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PostClone {
    Running,
    Done,
    /// Exhausted: the command a person can run (`hint`, base64) and what each attempt said.
    Failed {
        hint: Option<String>,
        errors: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    pub record: VmRecord,
    pub ip: Option<String>,
    pub owner: VmOwner,
}

/// Who runs the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmOwner {
    /// vk created or adopted it and manages its life.
    Vk,
    /// An unmanaged pod brings its own VM: vk only probes what its annotations say (C5).
    Pod,
}

impl Tracked {
    pub fn managed(&self) -> bool {
        match self.owner {
            VmOwner::Vk => true,
            VmOwner::Pod => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    Creating,
    Ready,
    Hibernating,
    Hibernated,
    Failed,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Creating => "creating",
            Lifecycle::Ready => "ready",
            Lifecycle::Hibernating => "hibernating",
            Lifecycle::Hibernated => "hibernated",
            Lifecycle::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Lifecycle::Creating,
            "ready" => Lifecycle::Ready,
            "hibernating" => Lifecycle::Hibernating,
            "hibernated" => Lifecycle::Hibernated,
            "failed" => Lifecycle::Failed,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub state: Option<Lifecycle>,
    pub generation: i64,
    pub message: Option<String>,
}

/// The pod's probe agent: which result is awaited and the debounced readiness (R3, R4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeState {
    pub agent: Agent,
    /// Id of the probe whose result is awaited; older results are stale.
    pub seq: u64,
    pub ready: bool,
    pub failures: u32,
    /// Not-ready waits so far since the agent started or last flipped.
    pub waits: u32,
    /// When the agent started, to bound the wait for its first result.
    pub started_at: Millis,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Agent {
    #[default]
    Stopped,
    /// Started; neither a success nor the first-result bound is in yet (R2: the first probe's
    /// result is part of the first status published for a VM, so Running-not-ready is not
    /// written only to be rewritten a moment later).
    AwaitingFirst,
    Running,
}

impl PodEntry {
    pub fn new(pod: PodView) -> Self {
        let spec = crate::spec::decode(&pod);
        let intent = Intent::seeded(&pod);
        Self {
            pod,
            spec,
            phase: Phase::Waiting,
            intent,
            probe: ProbeState::default(),
            started_at: None,
            ready_changed_at: None,
            writer: Writer::default(),
            successor: None,
            post_clone: None,
            moments: Moments::default(),
        }
    }

    pub fn managed(&self) -> bool {
        self.spec.as_ref().map(|s| s.managed).unwrap_or(false)
    }

    pub fn vm_name(&self) -> Option<&str> {
        self.spec.as_ref().ok().map(|s| s.vm_name.as_str())
    }

    pub fn vm(&self) -> Option<&Tracked> {
        self.phase.vm()
    }
}

impl Intent {
    /// Seeded from the annotations already on the pod (L1), so a restart neither rewinds nor
    /// rewrites what the previous process said.
    pub fn seeded(pod: &PodView) -> Self {
        use crate::keys;
        Self {
            state: pod
                .annotation(keys::LIFECYCLE_STATE)
                .and_then(Lifecycle::parse),
            generation: pod
                .annotation(keys::LIFECYCLE_GENERATION)
                .and_then(|g| g.parse().ok())
                .unwrap_or(0),
            message: pod.annotation(keys::LIFECYCLE_MESSAGE).map(str::to_string),
        }
    }
}
