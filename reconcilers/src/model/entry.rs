//! What the core knows of one pod: the pod as the API shows it, its decoded spec, its phase,
//! what its lifecycle annotation needs beyond the phase, its probe agent and its writer.

use serde::{Deserialize, Serialize};

use crate::model::lifecycle::Sticky;
use crate::moments::Moments;
use crate::phase::{Phase, Settle};
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
    /// What the lifecycle annotation needs that the phase cannot tell; the journal's
    /// `intent` of format 5 and before is read into it.
    #[serde(alias = "intent", default)]
    pub sticky: Sticky,
    pub probe: ProbeState,
    pub started_at: Option<Millis>,
    pub ready_changed_at: Option<Millis>,
    pub writer: Writer,
    /// A new incarnation under the same name, taken in once this one is collected.
    pub successor: Option<PodView>,
    /// How the guest fix-up of the VM the pod holds ended (C13); `None`: it did not end
    /// (it runs, as `Running.settle` says, or vk has no word on it). `post_clone()` is what
    /// `post-clone-state` shows.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "fixup_end"
    )]
    pub post_clone: Option<FixupEnd>,
    /// M6: the moments of this incarnation a user waits between.
    #[serde(default, skip_serializing_if = "Moments::is_empty")]
    pub moments: Moments,
}

/// The fix-up's progress as the pod's annotations carry it (`post-clone-state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostClone<'a> {
    Running,
    Done,
    /// Exhausted: the command a person can run (`hint`, base64) and what each attempt said.
    Failed {
        hint: Option<&'a str>,
        errors: &'a str,
    },
}

/// How a fix-up ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FixupEnd {
    Done,
    Failed {
        hint: Option<String>,
        errors: String,
    },
}

/// `post_clone` as journals hold it; format 5 also kept `running`, which `Running.settle`
/// says instead.
fn fixup_end<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<FixupEnd>, D::Error> {
    #[derive(Deserialize)]
    #[serde(tag = "state", rename_all = "snake_case")]
    enum Wire {
        Running,
        Done,
        Failed {
            hint: Option<String>,
            errors: String,
        },
    }
    Ok(match Option::<Wire>::deserialize(d)? {
        None | Some(Wire::Running) => None,
        Some(Wire::Done) => Some(FixupEnd::Done),
        Some(Wire::Failed { hint, errors }) => Some(FixupEnd::Failed { hint, errors }),
    })
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
        let sticky = Sticky::seeded(&pod);
        Self {
            pod,
            spec,
            phase: Phase::Waiting,
            sticky,
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

    /// What `post-clone-state` says: `running` while the fix-up step is under way, else how
    /// it ended, if vk knows.
    pub fn post_clone(&self) -> Option<PostClone<'_>> {
        let settle = match &self.phase {
            Phase::Running(r) => r.settle.as_ref(),
            Phase::Evicting(e) => e.running.settle.as_ref(),
            Phase::Hibernating(h) => h.running.settle.as_ref(),
            Phase::Waiting
            | Phase::Failed(_)
            | Phase::Creating(_)
            | Phase::Hibernated
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => None,
        };
        if let Some(Settle::Fixup(_)) = settle {
            return Some(PostClone::Running);
        }
        self.post_clone.as_ref().map(|end| match end {
            FixupEnd::Done => PostClone::Done,
            FixupEnd::Failed { hint, errors } => PostClone::Failed {
                hint: hint.as_deref(),
                errors,
            },
        })
    }
}
