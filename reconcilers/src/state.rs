//! The tables the reducer owns. Every map has its removal path: a pod entry goes when the pod
//! is gone from the API and its VM is handled; VM and MAC indexes follow the entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::action::{Action, OpId};
use crate::config::Config;
use crate::event::Lease;
use crate::pod::{PodKey, PodView};
use crate::pod_table::PodTable;
use crate::small_str::SmallStr;
use crate::spec::{SpecError, VmSpec};
use crate::time::Millis;
use crate::vm::VmRecord;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub config: Config,
    /// Time of the event being reduced.
    pub now: Millis,
    pub(crate) next_op: OpId,
    pub pods: PodTable,
    /// Which pod (or orphan) waits for an operation's outcome. Boxed like `pods`: an owner
    /// can hold a whole pushed status, and inline values made every node a large allocation.
    pub(crate) ops: BTreeMap<OpId, Box<OpOwner>>,
    /// Tracked VM id → pod.
    pub vm_ids: BTreeMap<String, PodKey>,
    /// Tracked VM name → pod (stream events may carry only a name).
    pub vm_names: BTreeMap<String, PodKey>,
    /// VMs found at startup that no pod claimed, by name, under `alert`/`keep` (B8): the next
    /// create of that name adopts instead of colliding.
    pub unclaimed: BTreeMap<String, VmRecord>,
    /// `None` until the first `cocoon vm list` completed.
    pub inventory: Option<Vec<VmRecord>>,
    pub relist: Relist,
    /// Startup reconcile done: destructive decisions are allowed from here on.
    pub started: bool,
    /// By MAC.
    pub leases: BTreeMap<SmallStr, Lease>,
    /// The lease file has been read once: until then a cached IP is not evidence of loss.
    #[serde(default)]
    pub leases_seen: bool,
    /// A `vm list` sweep is in flight (R11); `sweep_rearm`: its outcome re-arms the timer.
    #[serde(default)]
    pub sweeping: bool,
    #[serde(default)]
    pub sweep_rearm: bool,
    /// The VM stream closed since it last connected: events may have been missed.
    #[serde(default)]
    pub stream_gap: bool,
    /// DHCP MAC → pod, to route lease changes without scanning pods.
    pub macs: BTreeMap<String, PodKey>,
    /// VM id → time of its last in-place restart (W4 cooldown).
    pub restarts: BTreeMap<String, Millis>,
    /// UIDs vk deleted itself, so a late watch echo does not resurrect the pod.
    pub tombstones: BTreeMap<String, PodKey>,
    #[serde(skip)]
    pub(crate) out: Vec<Action>,
    #[serde(skip)]
    pub(crate) touched: Touched,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relist {
    pub in_progress: bool,
    pub complete_once: bool,
    pub seen: BTreeSet<PodKey>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "owner", rename_all = "snake_case")]
pub enum OpOwner {
    /// The pod's one VM operation (its `busy.op`).
    Vm {
        key: PodKey,
    },
    /// The pod's one status-and-annotations write.
    Write {
        key: PodKey,
        /// The status pushed, if any, to tell an echo that differs from it (the server
        /// changed it) from a desired status that moved on while the write was in flight.
        status: Option<crate::status::PodStatus>,
        annotations: BTreeMap<String, Option<String>>,
    },
    Delete {
        key: PodKey,
    },
    /// The eviction delete (W6); on success the pod turns Failed with this reason.
    Evict {
        key: PodKey,
        reason: String,
        message: String,
    },
    /// The B3 watcher of a VM record left `creating`.
    StaleCreate {
        id: String,
        name: String,
        attempt: u32,
        call: crate::stale_create::Call,
    },
    /// The periodic `vm list` comparison (R11).
    Sweep,
    /// A lease release (D6).
    LeaseRelease {
        mac: String,
    },
    /// Fire-and-forget work whose outcome is only logged (orphan removal, snapshot cleanup).
    Detached {
        what: String,
        /// Once this succeeds, the DHCP lease of this MAC is released (D6, B8 destroy).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        release: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodEntry {
    pub pod: PodView,
    pub spec: Result<VmSpec, SpecError>,
    pub vm: Option<Tracked>,
    pub busy: Option<Busy>,
    pub intent: Intent,
    pub probe: ProbeState,
    pub started_at: Option<Millis>,
    pub ready_changed_at: Option<Millis>,
    /// The last create/update error, shown as `ProviderFailed`.
    pub failure: Option<String>,
    /// Create failures that retry no more until the pod changes.
    pub permanent_failure: bool,
    pub attempts: u32,
    pub terminal: Option<Terminal>,
    pub deleting: bool,
    /// The pod object is gone from the API; only VM cleanup remains.
    pub gone: bool,
    /// The pod object was deleted by vk (evict or final delete) and needs no more writes.
    pub deleted_by_us: bool,
    /// Waiting for a DHCP lease before lifecycle `ready` (`Some(op name)`).
    pub ip_wait: Option<IpWait>,
    /// The status-and-annotations write in flight (one at a time: what it lacks goes next).
    pub write_op: Option<OpId>,
    pub kube_failures: u32,
    pub delete_op: Option<OpId>,
    pub evict_tries: u32,
    /// Kubernetes writes of this pod wait for a retry timer.
    pub kube_backoff: bool,
    /// A write was refused as superseded (404/409/422): this incarnation gets no more writes.
    pub superseded: bool,
    /// A status we pushed whose echo still differed: not pushed again until it changes.
    pub echo_mismatch: Option<crate::status::PodStatus>,
    pub delete_failures: u32,
    /// A VM stream hint arrived while an operation was in flight; it is taken up after.
    #[serde(default)]
    pub hint_pending: bool,
    /// A new incarnation under the same name, taken in once this one is collected.
    pub successor: Option<PodView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracked {
    pub record: VmRecord,
    pub ip: Option<String>,
    /// Unmanaged pods: the VM is only what the annotations say.
    pub unmanaged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpWait {
    pub op: String,
    pub deadline: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    /// `None` while the step waits on a timer rather than a call.
    pub op: Option<OpId>,
    pub step: Step,
    pub since: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    RemoveFork,
    PullImage,
    Run,
    InspectAfterBoot {
        record: VmRecord,
    },
    InspectSnapshot {
        name: String,
    },
    InspectForkSource,
    /// `again`: the name was taken and its holder removed; a second refusal is final.
    SaveForkSnapshot {
        vm: String,
        again: bool,
    },
    /// F1: `snapshot save` replaces a taken name — remove the holder, then save once more.
    RemoveTakenFork {
        vm: String,
    },
    Clone,
    InspectNameTaken,
    RemoveVm,
    /// W4/W5: inspect after a stream hint.
    Recover {
        attempt: u32,
        first_failure: Option<Millis>,
        delay_ms: u64,
    },
    Restart,
    InspectAfterRestart,
    RemoveForEvict {
        reason: String,
        message: String,
    },
    StaleCreate,
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

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeState {
    pub active: bool,
    /// Id of the probe whose result is awaited; older results are stale.
    pub seq: u64,
    pub ready: bool,
    pub failures: u32,
    /// The next not-ready wait, in µs.
    pub backoff_us: u64,
    /// Started, and neither a success nor the first-result bound is in yet (R2: the first
    /// probe's result is part of the first status published for a VM, so Running-not-ready
    /// is not written only to be rewritten a moment later).
    #[serde(default)]
    pub awaiting_first: bool,
    /// When the agent started, to bound `awaiting_first`.
    #[serde(default)]
    pub started_at: Millis,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Terminal {
    Evicted { reason: String, message: String },
    Succeeded,
}

impl State {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            now: 0,
            next_op: 1,
            pods: PodTable::default(),
            ops: BTreeMap::new(),
            vm_ids: BTreeMap::new(),
            vm_names: BTreeMap::new(),
            unclaimed: BTreeMap::new(),
            inventory: None,
            relist: Relist::default(),
            started: false,
            leases: BTreeMap::new(),
            leases_seen: false,
            sweeping: false,
            sweep_rearm: false,
            stream_gap: false,
            macs: BTreeMap::new(),
            restarts: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            out: Vec::new(),
            touched: Touched::default(),
        }
    }

    pub(crate) fn emit(&mut self, a: Action) {
        self.effects().emit(a);
    }

    pub(crate) fn new_op(&mut self, owner: OpOwner) -> OpId {
        self.effects().new_op(owner)
    }

    fn effects(&mut self) -> Effects<'_> {
        Effects {
            next_op: &mut self.next_op,
            ops: &mut self.ops,
            out: &mut self.out,
        }
    }

    /// A pod's entry together with what publishing it reads and writes, found with one
    /// lookup: publishing runs for every touched pod after every event.
    pub(crate) fn publishing(&mut self, key: &PodKey) -> Option<Publish<'_>> {
        let entry = self.pods.get_mut(key)?;
        Some(Publish {
            config: &self.config,
            started: self.started,
            entry,
            fx: Effects {
                next_op: &mut self.next_op,
                ops: &mut self.ops,
                out: &mut self.out,
            },
        })
    }

    /// Operations whose outcome has not come back yet.
    pub fn pending_ops(&self) -> usize {
        self.ops.len()
    }
}

/// Pods the event being reduced changed, to publish once its handler is done (see `reduce`).
/// Usually one or two keys, so a Vec, sorted and deduplicated when taken, not a set.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Touched(Vec<PodKey>);

impl Touched {
    pub(crate) fn insert(&mut self, key: &PodKey) {
        // Handlers often touch the same pod several times in a row; skip the clone then.
        if self.0.last() != Some(key) {
            self.0.push(key.clone());
        }
    }

    /// The touched pods in key order, each once: the order their actions come out in.
    pub(crate) fn take(&mut self) -> Vec<PodKey> {
        let mut keys = std::mem::take(&mut self.0);
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// The effect log of the event being reduced: new operations and their owners, and the
/// actions. Borrowed apart from the pod table, so an entry and the log can be used together.
pub(crate) struct Effects<'a> {
    next_op: &'a mut OpId,
    ops: &'a mut BTreeMap<OpId, Box<OpOwner>>,
    out: &'a mut Vec<Action>,
}

impl Effects<'_> {
    pub(crate) fn emit(&mut self, a: Action) {
        // Most events emit one to three actions. Left to itself the Vec's first allocation
        // holds four (1,152 bytes), and glibc consolidates all its fast bins before serving
        // any request of 1 KiB or more: that cost more than the rest of a typical event.
        // Three (864 bytes) stay under the threshold.
        if self.out.capacity() == 0 {
            self.out.reserve_exact(3);
        }
        self.out.push(a);
    }

    pub(crate) fn new_op(&mut self, owner: OpOwner) -> OpId {
        let id = *self.next_op;
        *self.next_op += 1;
        self.ops.insert(id, Box::new(owner));
        id
    }
}

/// One touched pod being published: its entry, the settings publishing reads, the log.
pub(crate) struct Publish<'a> {
    pub config: &'a Config,
    pub started: bool,
    pub entry: &'a mut PodEntry,
    pub fx: Effects<'a>,
}

impl PodEntry {
    pub fn new(pod: PodView) -> Self {
        let spec = crate::spec::decode(&pod);
        let intent = Intent::seeded(&pod);
        Self {
            pod,
            spec,
            vm: None,
            busy: None,
            intent,
            probe: ProbeState::default(),
            started_at: None,
            ready_changed_at: None,
            failure: None,
            permanent_failure: false,
            attempts: 0,
            terminal: None,
            deleting: false,
            gone: false,
            deleted_by_us: false,
            ip_wait: None,
            write_op: None,
            kube_failures: 0,
            hint_pending: false,
            delete_op: None,
            evict_tries: 0,
            kube_backoff: false,
            superseded: false,
            echo_mismatch: None,
            delete_failures: 0,
            successor: None,
        }
    }

    pub fn managed(&self) -> bool {
        self.spec.as_ref().map(|s| s.managed).unwrap_or(false)
    }

    pub fn vm_name(&self) -> Option<&str> {
        self.spec.as_ref().ok().map(|s| s.vm_name.as_str())
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
