//! The tables the reducer owns. Every map has its removal path: a pod entry goes when the pod
//! is gone from the API and its VM is handled; VM and MAC indexes follow the entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::action::{Action, OpId};
use crate::config::Config;
use crate::event::DhcpLease;
use crate::pod::PodKey;
use crate::pod_table::PodTable;
use crate::small_str::SmallStr;
use crate::time::Millis;
use crate::vm::VmRecord;
use crate::writer::WriteTurns;

pub use crate::entry::{Agent, Lifecycle, PodEntry, ProbeState, Tracked, VmOwner};
pub use crate::ops::{CocoonOwner, KubeOwner, RegistryOwner};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub config: Config,
    /// Time of the event being reduced.
    pub now: Millis,
    pub(crate) next_op: OpId,
    pub pods: PodTable,
    /// Who waits for each cocoon call. Boxed like `pods`: an owner can be large.
    pub(crate) cocoon_ops: BTreeMap<OpId, Box<CocoonOwner>>,
    /// Who waits for each Kubernetes call.
    pub(crate) kube_ops: BTreeMap<OpId, Box<KubeOwner>>,
    /// Who waits for each registry call.
    #[serde(default)]
    pub(crate) registry_ops: BTreeMap<OpId, Box<RegistryOwner>>,
    /// The MAC of each DHCP lease release out (D6).
    pub(crate) dhcp_release_ops: BTreeMap<OpId, String>,
    /// The pod of each SAC dialog out (C15).
    #[serde(default)]
    pub(crate) sac_ops: BTreeMap<OpId, PodKey>,
    /// Tracked VM id → pod.
    pub vm_ids: BTreeMap<String, PodKey>,
    /// Tracked VM name → pod (stream events may carry only a name).
    pub vm_names: BTreeMap<String, PodKey>,
    /// VMs found at startup that no pod claimed, by name, under `alert`/`keep` (B8): the next
    /// create of that name adopts instead of colliding.
    pub unclaimed: BTreeMap<String, VmRecord>,
    /// T11: the pod each VM on this node is held for, by VM name: recorded when the VM is
    /// asked for, adopted or woken, read back by a restarted process before it decides.
    #[serde(default, skip_serializing_if = "crate::holders::Holders::is_empty")]
    pub holders: crate::holders::Holders,
    /// T16: the UID of each namespace the node has seen, by name, so that records of a
    /// namespace deleted and made again under the same name are not the new one's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespaces: BTreeMap<String, String>,
    /// Every VM cocoon reports on this node, which an unmanaged pod's claim must match (T10).
    #[serde(default, skip_serializing_if = "crate::node_vms::NodeVms::is_empty")]
    pub node_vms: crate::node_vms::NodeVms,
    pub relist: Relist,
    /// Until the startup reconcile, with the first `cocoon vm list` it waits for.
    pub startup: Startup,
    /// cocoon-net's DHCP leases, by MAC.
    pub dhcp_leases: BTreeMap<SmallStr, DhcpLease>,
    pub dhcp_file: DhcpFile,
    pub sweep: Sweep,
    pub stream: StreamState,
    /// DHCP MAC → pod, to route lease changes without scanning pods.
    pub dhcp_macs: BTreeMap<String, PodKey>,
    /// VM id → time of its last in-place restart (W4 cooldown).
    pub restarts: BTreeMap<String, Millis>,
    /// UIDs vk deleted itself, so a late watch echo does not resurrect the pod.
    pub tombstones: BTreeMap<String, PodKey>,
    /// Local snapshots being made, by name: the pod making it and the pods waiting to clone
    /// from it (C9: forks of one source share one fork snapshot; C8.3: clones of one base
    /// share one pull).
    #[serde(default)]
    pub snapshot_claims: BTreeMap<String, SnapshotClaim>,
    /// B1: the cocoon-macos listing the startup reconcile waits for.
    #[serde(
        default,
        skip_serializing_if = "crate::model::macos::Inventory::is_none"
    )]
    pub macos_inventory: crate::model::macos::Inventory,
    /// C14: the VNC displays of cocoon-macos guests no pod names (left alone, so their ports
    /// stay taken); renewed by every cocoon-macos listing.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub macos_foreign: BTreeSet<u16>,
    /// The pods waiting for one of the node's write slots (`Config::write_slots`).
    #[serde(default, skip_serializing_if = "WriteTurns::is_empty")]
    pub(crate) write_turns: WriteTurns,
    #[serde(skip)]
    pub(crate) out: Vec<Action>,
    #[serde(skip)]
    pub(crate) touched: Touched,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A local snapshot one pod is making for others to use too: a fork snapshot it saves, or a
/// clone base it pulls. The other pods that need it wait instead of making it again (which
/// would replace it under the first pod's clone).
pub struct SnapshotClaim {
    pub maker: PodKey,
    pub how: Making,
    pub waiting: BTreeSet<PodKey>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Making {
    /// `snapshot save` of a fork source (C9).
    ForkSave,
    /// A registry pull of a clone base (C8.3).
    Pull,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relist {
    pub complete_once: bool,
    pub seen: BTreeSet<PodKey>,
}

/// Destructive decisions wait for both the pod relist and `cocoon vm list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "startup", rename_all = "snake_case", from = "StartupWire")]
pub enum Startup {
    /// Before the startup reconcile; `inventory`: the first `cocoon vm list`, once it came.
    Waiting { inventory: Option<Vec<VmRecord>> },
    /// Startup reconcile done: adoption, orphan and delete decisions are allowed. The
    /// inventory went into it and is not kept.
    Started,
}

impl Default for Startup {
    fn default() -> Self {
        Startup::Waiting { inventory: None }
    }
}

/// `Startup` as journals hold it: this shape, or the bare `pending`/`done` of journal format
/// 5, whose inventory sat beside it (a header before startup had none yet).
#[derive(Deserialize)]
#[serde(untagged)]
enum StartupWire {
    Tagged(StartupTagged),
    Bare(StartupBare),
}

#[derive(Deserialize)]
#[serde(tag = "startup", rename_all = "snake_case")]
enum StartupTagged {
    Waiting { inventory: Option<Vec<VmRecord>> },
    Started,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum StartupBare {
    Pending,
    Done,
}

impl From<StartupWire> for Startup {
    fn from(w: StartupWire) -> Self {
        match w {
            StartupWire::Tagged(StartupTagged::Waiting { inventory }) => {
                Startup::Waiting { inventory }
            }
            StartupWire::Tagged(StartupTagged::Started) | StartupWire::Bare(StartupBare::Done) => {
                Startup::Started
            }
            StartupWire::Bare(StartupBare::Pending) => Startup::Waiting { inventory: None },
        }
    }
}

/// Whether the lease file has been read: until then a cached IP is not evidence of loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DhcpFile {
    #[default]
    Unread,
    Read,
}

/// The sweep (R11): its `cocoon vm list` and its `cocoon-macos vm list`, each one at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "SweepWire")]
pub struct Sweep {
    pub cocoon: SweepState,
    #[serde(default, skip_serializing_if = "MacosSweep::is_idle")]
    pub macos: MacosSweep,
}

/// `Sweep` as journals hold it: this shape, or journal format 5's bare `SweepState` (its
/// macOS listing was a separate flag, read as idle).
#[derive(Deserialize)]
#[serde(untagged)]
enum SweepWire {
    Both {
        cocoon: SweepState,
        #[serde(default)]
        macos: MacosSweep,
    },
    Cocoon(SweepState),
}

impl From<SweepWire> for Sweep {
    fn from(w: SweepWire) -> Self {
        match w {
            SweepWire::Both { cocoon, macos } => Sweep { cocoon, macos },
            SweepWire::Cocoon(cocoon) => Sweep {
                cocoon,
                macos: MacosSweep::Idle,
            },
        }
    }
}

/// The sweep's `cocoon-macos vm list` (R10, R11).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MacosSweep {
    #[default]
    Idle,
    Out,
}

impl MacosSweep {
    pub fn is_idle(&self) -> bool {
        *self == MacosSweep::Idle
    }
}

/// The sweep's `cocoon vm list`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "sweep", rename_all = "snake_case")]
pub enum SweepState {
    #[default]
    Idle,
    /// One is out; `rearm`: its outcome re-arms the periodic timer.
    Out { rearm: bool },
}

/// The VM event stream, as far as missed events go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    #[default]
    Connected,
    /// It closed since it last connected: events may have been missed.
    Gap,
}

impl State {
    /// T16: the pod `key`'s namespace as records name it: its name, and its UID once seen.
    pub fn tenant<'a>(&'a self, key: &'a PodKey) -> crate::owner::Tenant<'a> {
        let namespace = key.namespace();
        crate::owner::Tenant {
            namespace,
            uid: self.namespaces.get(namespace).map(String::as_str),
        }
    }

    pub fn new(config: Config) -> Self {
        Self {
            config,
            now: 0,
            next_op: 1,
            pods: PodTable::default(),
            namespaces: BTreeMap::new(),
            cocoon_ops: BTreeMap::new(),
            kube_ops: BTreeMap::new(),
            registry_ops: BTreeMap::new(),
            dhcp_release_ops: BTreeMap::new(),
            sac_ops: BTreeMap::new(),
            vm_ids: BTreeMap::new(),
            vm_names: BTreeMap::new(),
            unclaimed: BTreeMap::new(),
            holders: crate::holders::Holders::default(),
            node_vms: crate::node_vms::NodeVms::default(),
            relist: Relist::default(),
            startup: Startup::default(),
            dhcp_leases: BTreeMap::new(),
            dhcp_file: DhcpFile::Unread,
            sweep: Sweep::default(),
            stream: StreamState::Connected,
            dhcp_macs: BTreeMap::new(),
            restarts: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            snapshot_claims: BTreeMap::new(),
            macos_inventory: crate::model::macos::Inventory::None,
            macos_foreign: BTreeSet::new(),
            write_turns: WriteTurns::default(),
            out: Vec::new(),
            touched: Touched::default(),
        }
    }

    pub fn started(&self) -> bool {
        match self.startup {
            Startup::Waiting { .. } => false,
            Startup::Started => true,
        }
    }

    pub(crate) fn emit(&mut self, a: Action) {
        self.effects().emit(a);
    }

    fn effects(&mut self) -> Effects<'_> {
        Effects {
            next_op: &mut self.next_op,
            kube_ops: &mut self.kube_ops,
            out: &mut self.out,
        }
    }

    pub(crate) fn next_op(&mut self) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        id
    }

    /// T11: records (or clears) who VM `name` is held for, and journals the change.
    pub(crate) fn hold(&mut self, name: &str, held: Option<crate::holders::Held>) {
        if self.holders.set(name, held.clone()) {
            self.emit(Action::Hold {
                vm: name.to_string(),
                held,
            });
        }
    }

    /// Sends a cocoon command and remembers who waits for its outcome. A command that makes
    /// a VM for a pod records the pod as its holder first (T11), so a create that commits
    /// while the process is down is still known to be that pod's.
    pub(crate) fn run_cocoon(
        &mut self,
        owner: CocoonOwner,
        key: Option<PodKey>,
        cmd: crate::cocoon::CocoonCmd,
    ) -> OpId {
        // The record stays when it is another namespace's pod's, or when there is none and the
        // node already has a VM of that name: cocoon then answers "name taken", and that VM is
        // not made this pod's by its asking.
        if let (Some(key), Some(name)) = (&key, cmd.makes_vm()) {
            let keep = match self.holders.get(name) {
                Some(h) => !h.holder.of_tenant(self.tenant(key)),
                None => self.node_vms.has_name(name),
            };
            let uid = self.pods.get(key).map(|e| e.pod.uid.clone());
            if let (false, Some(uid)) = (keep, uid) {
                let held = crate::holders::Held {
                    holder: crate::holders::Holder::of(key, &uid, self.tenant(key)),
                    id: None,
                    kept: false,
                };
                self.hold(name, Some(held));
            }
        }
        let op = self.next_op();
        self.cocoon_ops.insert(op, Box::new(owner));
        self.emit(Action::RunCocoon { op, key, cmd });
        op
    }

    /// Sends a registry call and remembers who waits for its outcome.
    pub(crate) fn call_registry(
        &mut self,
        owner: RegistryOwner,
        key: Option<PodKey>,
        call: crate::action::RegistryCall,
    ) -> OpId {
        let op = self.next_op();
        self.registry_ops.insert(op, Box::new(owner));
        self.emit(Action::CallRegistry { op, key, call });
        op
    }

    pub(crate) fn kube_op(&mut self, owner: KubeOwner) -> OpId {
        self.effects().kube_op(owner)
    }

    /// The pod an event names, if vk knows it.
    pub(crate) fn pod(&self, key: &PodKey) -> Option<&PodEntry> {
        self.pods.get(key)
    }

    /// A pod's entry together with what publishing it reads and writes, found with one
    /// lookup: publishing runs for every touched pod after every event.
    pub(crate) fn publishing(&mut self, key: &PodKey) -> Option<Publish<'_>> {
        let started = self.started();
        let entry = self.pods.get_mut(key)?;
        Some(Publish {
            config: &self.config,
            started,
            entry,
            turns: &mut self.write_turns,
            fx: Effects {
                next_op: &mut self.next_op,
                kube_ops: &mut self.kube_ops,
                out: &mut self.out,
            },
        })
    }

    /// Operations whose outcome has not come back yet.
    pub fn pending_ops(&self) -> usize {
        self.cocoon_ops.len()
            + self.kube_ops.len()
            + self.registry_ops.len()
            + self.dhcp_release_ops.len()
            + self.sac_ops.len()
    }

    /// Who waits for a cocoon call, if it is still out.
    pub fn cocoon_owner(&self, op: OpId) -> Option<&CocoonOwner> {
        self.cocoon_ops.get(&op).map(|o| &**o)
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

/// The effect log of the event being reduced, borrowed apart from the pod table so an entry
/// and the log can be used together.
pub(crate) struct Effects<'a> {
    next_op: &'a mut OpId,
    kube_ops: &'a mut BTreeMap<OpId, Box<KubeOwner>>,
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

    /// The pods' status-and-annotation writes out (each holds one of the node's write slots).
    pub(crate) fn writes_out(&self) -> usize {
        writes_out(self.kube_ops)
    }

    /// Sends a registry call and remembers who waits for its outcome.
    pub(crate) fn kube_op(&mut self, owner: KubeOwner) -> OpId {
        let id = *self.next_op;
        *self.next_op += 1;
        self.kube_ops.insert(id, Box::new(owner));
        id
    }
}

/// One touched pod being published: its entry, the settings publishing reads, the log.
pub(crate) struct Publish<'a> {
    pub config: &'a Config,
    pub started: bool,
    pub entry: &'a mut PodEntry,
    pub turns: &'a mut WriteTurns,
    pub fx: Effects<'a>,
}

pub(crate) fn writes_out(kube_ops: &BTreeMap<OpId, Box<KubeOwner>>) -> usize {
    let writes = kube_ops.values().filter(|o| match o.as_ref() {
        KubeOwner::Write { .. } => true,
        KubeOwner::DeleteObject { .. } | KubeOwner::Evict { .. } => false,
    });
    writes.count()
}
