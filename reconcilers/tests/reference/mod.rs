//! A reference model of who may hold a VM, written from the rules (docs/rules.md) and fed only
//! what the core is fed: the pods the API shows, the startup inventory and orphan policy, and
//! what cocoon answered and streamed. It never reads the core's `State`, so it can disagree
//! with it. The property test drives it beside the core through the World's log and checks
//! every action the core emits against it, and the settled world against it at the end.
//!
//! The rules it encodes:
//! - P2, P4: a pod incarnation (UID) is entitled to a VM while the API holds it managed, not
//!   deleting and not finished; a new UID under the same name, a delete, or a complete relist
//!   without it ends the old one.
//! - C2, D5: no VM is made for a pod that is not entitled to one, and never under another
//!   pod's VM name (T1).
//! - P6: a pod re-attached to its VM at startup is not created again while that VM lives.
//! - `vm rm` only for a VM whose pod is no longer entitled (D5, D8), an orphan under the
//!   `destroy` policy (B8), a VM that stopped and then failed to start or stopped again
//!   within 30 s of its restart (W4), or a VM that is already gone (W6). No command a pod
//!   asks for touches another pod's VM (T1).
//! - P2, D8: a pod object is force-deleted only once it is being deleted; W6: a pod is
//!   evicted only when its VM is gone or was seen stopped.
//! - INV-3: at most one VM-changing command (create, start, remove, resize) in flight per pod
//!   and per VM.
//! - B4, B5, B8: each VM listed at startup is claimed by the pod naming it or is an orphan;
//!   an orphan is removed exactly once under `destroy`, never under `alert`/`keep`, and a
//!   claimed VM is never removed as an orphan.
//! - Settled (no faults, retries run out): every entitled managed pod has exactly one running
//!   VM and the API names it (C12.3, W4), unless its eviction failed (W6); no VM is left for a
//!   pod that is not entitled (no leak); the model's VM table is cocoon's.

use std::collections::{BTreeMap, BTreeSet};

use reconcilers::action::{Action, Counter, OpId};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::config::OrphanPolicy;
use reconcilers::event::{CocoonOk, Envelope, Event, KubeErrorKind, VmEventKind};
use reconcilers::keys;
use reconcilers::pod::{PodKey, PodView};
use reconcilers::testkit::World;
use reconcilers::time::Millis;
use reconcilers::vm::{CocoonError, CocoonErrorKind, VmRecord};

/// W4: a VM restarted less than this long ago is removed, not restarted again.
const RESTART_COOLDOWN_MS: Millis = 30_000;

/// One pod incarnation, as the API showed it.
struct Pod {
    key: PodKey,
    vm_name: Option<String>,
    /// The id the API names for it at startup (B4).
    vm_id: Option<String>,
    managed: bool,
    /// A deletion timestamp was seen, or vk's delete of the object went through.
    deleting: bool,
    /// Deleted, replaced by a new UID, or left out of a complete relist.
    gone: bool,
    /// The API shows it `Succeeded` or `Failed`.
    finished: bool,
    /// Evictions (W6) of it that failed.
    evict_failures: u32,
}

impl Pod {
    fn entitled(&self) -> bool {
        self.managed && !self.deleting && !self.gone && !self.finished
    }

    fn why_not(&self) -> &'static str {
        match (self.gone, self.deleting, self.finished, self.managed) {
            (true, ..) => "gone",
            (_, true, ..) => "deleting",
            (_, _, true, _) => "finished",
            _ => "unmanaged",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    /// The pod incarnation (UID) it was made for or that claimed it at startup.
    Pod(String),
    /// Listed at startup, claimed by no pod (B8).
    Orphan,
}

struct Vm {
    name: String,
    owner: Owner,
    macos: bool,
    /// Cocoon holds it, as far as anything fed to the core says.
    alive: bool,
    /// When a stream event, inspect or list last said it is not running.
    stopped_at: Option<Millis>,
    /// When vk last ran `vm start` on it.
    restart_at: Option<Millis>,
    /// A `vm start` of it failed since it stopped.
    start_failed: bool,
    /// Claimed at startup (B4, B5).
    reattached: bool,
}

struct Call {
    key: Option<PodKey>,
    uid: Option<String>,
    cmd: CocoonCmd,
}

/// A VM `vm list` showed at startup and who claimed it.
pub struct Listed {
    pub id: String,
    pub claimed: bool,
}

pub struct Reference {
    policy: OrphanPolicy,
    pods: BTreeMap<String, Pod>,
    /// The UID the API holds under each key.
    current: BTreeMap<PodKey, String>,
    relisted: Option<BTreeSet<PodKey>>,
    /// By id; cocoon-macos guests by name.
    vms: BTreeMap<String, Vm>,
    pub inventory: Vec<Listed>,
    calls: BTreeMap<OpId, Call>,
    /// vk's deletes of pod objects: the UID and whether it was forced (grace 0).
    deletes: BTreeMap<OpId, (String, bool)>,
    /// Log entries already taken in.
    taken: usize,
    pub violations: Vec<String>,
}

impl Reference {
    pub fn new(policy: OrphanPolicy) -> Self {
        Reference {
            policy,
            pods: BTreeMap::new(),
            current: BTreeMap::new(),
            relisted: None,
            vms: BTreeMap::new(),
            inventory: Vec::new(),
            calls: BTreeMap::new(),
            deletes: BTreeMap::new(),
            taken: 0,
            violations: Vec::new(),
        }
    }

    /// Takes in every log entry not seen yet: the event first (what the core was told), then
    /// the actions the core answered it with, each judged against what the model allows.
    pub fn catch_up(&mut self, w: &World) {
        for (env, actions) in &w.log[self.taken..] {
            self.input(env);
            for a in actions {
                self.judge(env, a);
            }
        }
        self.taken = w.log.len();
    }

    fn input(&mut self, env: &Envelope) {
        let at = env.at;
        match &env.event {
            Event::PodRelistBegin => self.relisted = Some(BTreeSet::new()),
            Event::PodRelistItem { pod } => {
                if let Some(seen) = self.relisted.as_mut() {
                    seen.insert(pod.key());
                }
                self.pod_seen(pod);
            }
            Event::PodRelistEnd => {
                let seen = self.relisted.take().unwrap_or_default();
                let missing: Vec<PodKey> = self
                    .current
                    .keys()
                    .filter(|k| !seen.contains(k))
                    .cloned()
                    .collect();
                for k in missing {
                    self.pod_gone(&k);
                }
            }
            Event::PodApplied { pod } => self.pod_seen(pod),
            Event::PodDeleted { pod } => {
                if let Some(p) = self.pods.get_mut(&pod.uid) {
                    p.gone = true;
                }
                if self.current.get(&pod.key()) == Some(&pod.uid) {
                    self.current.remove(&pod.key());
                }
            }
            Event::VmListed { vms } => self.startup(vms),
            Event::VmStream { kind, vm } => match kind {
                VmEventKind::Deleted => self.vm_gone(&vm.id),
                VmEventKind::Added | VmEventKind::Modified => self.vm_state(vm, at),
            },
            Event::CocoonDone { op, result } => {
                if let Some(call) = self.calls.remove(op) {
                    self.cocoon_done(call, result, at);
                }
            }
            Event::KubeDone { op, result } => {
                let Some((uid, forced)) = self.deletes.remove(op) else {
                    return;
                };
                let Some(p) = self.pods.get_mut(&uid) else {
                    return;
                };
                match result {
                    Ok(_) => p.deleting = true,
                    Err(e) if matches!(e.kind, KubeErrorKind::NotFound) => p.gone = true,
                    Err(_) if !forced => p.evict_failures += 1,
                    Err(_) => {}
                }
            }
            Event::VmListFailed { .. }
            | Event::VmStreamConnected
            | Event::VmStreamClosed { .. }
            | Event::ProbeDone { .. }
            | Event::DhcpLeasesChanged { .. }
            | Event::TimerFired { .. }
            | Event::RegistryDone { .. }
            | Event::DhcpLeaseReleased { .. }
            | Event::SacDone { .. }
            | Event::NodeRegistered
            | Event::Namespace { .. }
            | Event::HoldersRestored { .. } => {}
        }
    }

    fn pod_seen(&mut self, pod: &PodView) {
        let key = pod.key();
        if let Some(old) = self.current.get(&key).filter(|u| **u != pod.uid) {
            if let Some(p) = self.pods.get_mut(old) {
                p.gone = true;
            }
        }
        let p = self.pods.entry(pod.uid.clone()).or_insert_with(|| Pod {
            key: key.clone(),
            vm_name: None,
            vm_id: None,
            managed: false,
            deleting: false,
            gone: false,
            finished: false,
            evict_failures: 0,
        });
        if p.gone {
            return;
        }
        p.vm_name = pod.annotation(keys::VM_NAME).map(str::to_string);
        p.vm_id = pod.annotation(keys::VM_ID).map(str::to_string);
        p.managed = pod.flag(keys::MANAGED);
        p.deleting |= pod.deletion_timestamp.is_some();
        p.finished = matches!(pod.status.phase.as_str(), "Succeeded" | "Failed");
        self.current.insert(key, pod.uid.clone());
    }

    fn pod_gone(&mut self, key: &PodKey) {
        if let Some(uid) = self.current.remove(key) {
            if let Some(p) = self.pods.get_mut(&uid) {
                p.gone = true;
            }
        }
    }

    /// B4, B5, B8: a listed VM belongs to the pod whose VM name it carries (and whose id, if
    /// the pod names one, is the VM's); otherwise it is an orphan.
    fn startup(&mut self, vms: &[VmRecord]) {
        for rec in vms {
            let claimant = self.current.values().find(|uid| {
                let p = &self.pods[*uid];
                p.vm_name.as_deref() == Some(rec.name.as_str())
                    && p.vm_id.as_ref().is_none_or(|id| *id == rec.id)
            });
            let owner = match claimant {
                Some(uid) => Owner::Pod(uid.clone()),
                None => Owner::Orphan,
            };
            self.inventory.push(Listed {
                id: rec.id.clone(),
                claimed: owner != Owner::Orphan,
            });
            let reattached = owner != Owner::Orphan;
            self.vms.insert(
                rec.id.clone(),
                Vm {
                    name: rec.name.clone(),
                    owner,
                    macos: false,
                    alive: true,
                    stopped_at: (!rec.is_running()).then_some(0),
                    restart_at: None,
                    start_failed: false,
                    reattached,
                },
            );
        }
    }

    fn vm_gone(&mut self, id: &str) {
        if let Some(v) = self.vms.get_mut(id) {
            v.alive = false;
        }
    }

    fn vm_state(&mut self, rec: &VmRecord, at: Millis) {
        let Some(v) = self.vms.get_mut(&rec.id) else {
            return;
        };
        if rec.is_running() {
            v.stopped_at = None;
            v.start_failed = false;
        } else {
            v.stopped_at.get_or_insert(at);
        }
    }

    /// The id the model files a VM under, for a command naming it by id or name.
    fn find(&self, r: &str) -> Option<String> {
        if self.vms.contains_key(r) {
            return Some(r.to_string());
        }
        self.vms
            .iter()
            .find(|(_, v)| v.alive && v.name == r)
            .map(|(id, _)| id.clone())
    }

    fn cocoon_done(&mut self, call: Call, result: &Result<CocoonOk, CocoonError>, at: Millis) {
        let not_found = matches!(result, Err(e) if e.kind == CocoonErrorKind::VmNotFound);
        match (&call.cmd, result) {
            (CocoonCmd::VmRun { .. } | CocoonCmd::VmClone { .. }, Ok(CocoonOk::Vm { vm })) => {
                self.made(&call, vm.id.clone(), vm.name.clone(), false, at)
            }
            (CocoonCmd::MacosRun { name, .. }, Ok(_)) => {
                self.made(&call, name.clone(), name.clone(), true, at)
            }
            (CocoonCmd::VmRm { id } | CocoonCmd::MacosRm { name: id }, _)
                if result.is_ok() || not_found =>
            {
                self.vm_gone(id)
            }
            (CocoonCmd::VmStart { id } | CocoonCmd::MacosStart { name: id, .. }, Ok(_)) => {
                if let Some(v) = self.vms.get_mut(id) {
                    v.stopped_at = None;
                    v.start_failed = false;
                }
            }
            (CocoonCmd::VmStart { id } | CocoonCmd::MacosStart { name: id, .. }, Err(_)) => {
                if let Some(v) = self.vms.get_mut(id) {
                    v.start_failed = true;
                }
            }
            (
                CocoonCmd::VmInspect { vm: r } | CocoonCmd::MacosInspect { name: r },
                Ok(CocoonOk::Vm { vm }),
            ) => {
                if let Some(id) = self.find(r) {
                    let mut rec = vm.clone();
                    rec.id = id;
                    self.vm_state(&rec, at);
                }
            }
            (CocoonCmd::VmInspect { vm: r } | CocoonCmd::MacosInspect { name: r }, Err(_))
                if not_found =>
            {
                if let Some(id) = self.find(r) {
                    self.vm_gone(&id);
                }
            }
            (CocoonCmd::VmList, Ok(CocoonOk::Vms { vms })) => self.listed(vms, false, at),
            (CocoonCmd::MacosList, Ok(CocoonOk::Vms { vms })) => self.listed(vms, true, at),
            _ => {}
        }
    }

    fn made(&mut self, call: &Call, id: String, name: String, macos: bool, at: Millis) {
        let Some(uid) = call.uid.clone() else {
            return;
        };
        let held: Vec<&String> = self
            .vms
            .iter()
            .filter(|(_, v)| v.alive && v.owner == Owner::Pod(uid.clone()))
            .map(|(id, _)| id)
            .collect();
        if !held.is_empty() {
            self.violations.push(format!(
                "at {at}: {name} ({id}) made for pod {uid}, which already holds {held:?}"
            ));
        }
        self.vms.insert(
            id,
            Vm {
                name,
                owner: Owner::Pod(uid),
                macos,
                alive: true,
                stopped_at: None,
                restart_at: None,
                start_failed: false,
                reattached: false,
            },
        );
    }

    /// A complete listing (R11 sweep): a VM it leaves out is gone.
    fn listed(&mut self, vms: &[VmRecord], macos: bool, at: Millis) {
        let ids: BTreeSet<&str> = vms.iter().map(|v| v.id.as_str()).collect();
        for (id, v) in self.vms.iter_mut() {
            if v.macos == macos && v.alive && !ids.contains(id.as_str()) {
                v.alive = false;
            }
        }
        for rec in vms {
            self.vm_state(rec, at);
        }
    }

    fn judge(&mut self, env: &Envelope, a: &Action) {
        match a {
            Action::RunCocoon { op, key, cmd } => {
                let uid = key.as_ref().and_then(|k| self.current.get(k)).cloned();
                self.calls.insert(
                    *op,
                    Call {
                        key: key.clone(),
                        uid: uid.clone(),
                        cmd: cmd.clone(),
                    },
                );
                let why = format!("seq {}: {}", env.seq, reconcilers::render::action(a));
                match cmd {
                    CocoonCmd::VmRun { name, .. }
                    | CocoonCmd::VmClone { name, .. }
                    | CocoonCmd::MacosRun { name, .. } => self.judge_create(&why, key, name),
                    CocoonCmd::VmRm { id } | CocoonCmd::MacosRm { name: id } => {
                        self.judge_remove(&why, key, id, env.at)
                    }
                    CocoonCmd::VmStart { id } | CocoonCmd::MacosStart { name: id, .. } => {
                        self.judge_owner(&why, key, id);
                        if let Some(v) = self.vms.get_mut(id) {
                            v.restart_at = Some(env.at);
                        }
                    }
                    CocoonCmd::VmNet { id, .. } => self.judge_owner(&why, key, id),
                    _ => {}
                }
                self.judge_in_flight(&why, key, cmd);
            }
            Action::DeletePod {
                op,
                uid,
                grace_seconds,
                ..
            } => {
                let forced = *grace_seconds == Some(0);
                self.deletes.insert(*op, (uid.clone(), forced));
                let why = format!("seq {}: {}", env.seq, reconcilers::render::action(a));
                self.judge_delete(&why, uid, forced);
            }
            _ => {}
        }
    }

    /// C2, D5, T1, P6.
    fn judge_create(&mut self, why: &str, key: &Option<PodKey>, name: &str) {
        let Some(k) = key else {
            return self.violations.push(format!("{why}: a VM made for no pod"));
        };
        let Some(p) = self.current.get(k).map(|u| &self.pods[u]) else {
            return self.violations.push(format!(
                "{why}: a VM made for {k}, which the API does not hold"
            ));
        };
        if !p.entitled() {
            self.violations.push(format!(
                "{why}: a VM made for {k}, which is {}",
                p.why_not()
            ));
        }
        if p.vm_name.as_deref() != Some(name) {
            self.violations
                .push(format!("{why}: {k} names VM {:?}, not {name:?}", p.vm_name));
        }
        let uid = self.current[k].clone();
        let reattached = self
            .vms
            .iter()
            .find(|(_, v)| v.alive && v.reattached && v.owner == Owner::Pod(uid.clone()));
        if let Some((id, _)) = reattached {
            self.violations.push(format!(
                "{why}: {k} was re-attached to {id} at startup and is created again"
            ));
        }
    }

    /// D5, D8, B8, W4, W6, T1.
    fn judge_remove(&mut self, why: &str, key: &Option<PodKey>, id: &str, now: Millis) {
        self.judge_owner(why, key, id);
        let Some(v) = self.vms.get(id) else {
            // D2: a deleted macOS pod's guest is removed by name even when none was tracked.
            let ok = key
                .as_ref()
                .is_some_and(|k| self.current.get(k).is_none_or(|u| !self.pods[u].entitled()));
            if !ok {
                self.violations
                    .push(format!("{why}: removes a VM nothing reported"));
            }
            return;
        };
        let owner = match &v.owner {
            Owner::Pod(uid) => Some(&self.pods[uid]),
            Owner::Orphan => None,
        };
        let released = match owner {
            Some(p) => !p.entitled(),
            None => self.policy == OrphanPolicy::Destroy && key.is_none(),
        };
        let crashed = v.stopped_at.is_some()
            && (v.start_failed
                || v.restart_at
                    .is_some_and(|t| now.saturating_sub(t) < RESTART_COOLDOWN_MS));
        if !(released || crashed || !v.alive) {
            let whose = match owner {
                Some(p) => format!("pod {} still entitled to it", p.key),
                None => format!("an orphan under {:?}", self.policy),
            };
            self.violations
                .push(format!("{why}: removes a running VM of {whose}"));
        }
    }

    /// T1: a command a pod asks for touches only that pod's VM.
    fn judge_owner(&mut self, why: &str, key: &Option<PodKey>, id: &str) {
        let Some(Owner::Pod(uid)) = self.vms.get(id).map(|v| &v.owner) else {
            return;
        };
        let holder = &self.pods[uid].key;
        if let Some(k) = key.as_ref().filter(|k| *k != holder) {
            self.violations
                .push(format!("{why}: asked for {k}, but the VM is {holder}'s"));
        }
    }

    /// P2, D8: a pod object is force-deleted (grace 0) only once it is being deleted. W6: it
    /// is evicted (deleted without grace) only when its VM is gone or was seen stopped.
    fn judge_delete(&mut self, why: &str, uid: &str, forced: bool) {
        let Some(p) = self.pods.get(uid) else {
            return self
                .violations
                .push(format!("{why}: deletes a pod the API never showed"));
        };
        if forced {
            if !(p.deleting || p.gone) {
                self.violations
                    .push(format!("{why}: force-deletes a pod nobody deleted"));
            }
            return;
        }
        let running = self.vms.iter().find(|(_, v)| {
            v.alive && v.stopped_at.is_none() && v.owner == Owner::Pod(uid.to_string())
        });
        if let Some((id, _)) = running {
            self.violations
                .push(format!("{why}: evicts a pod whose VM {id} runs"));
        }
    }

    /// INV-3.
    fn judge_in_flight(&mut self, why: &str, key: &Option<PodKey>, cmd: &CocoonCmd) {
        let Some(target) = self.vm_changed(cmd) else {
            return;
        };
        let mut same_pod = 0;
        let mut same_vm = 0;
        for c in self.calls.values() {
            let Some(t) = self.vm_changed(&c.cmd) else {
                continue;
            };
            same_pod += usize::from(key.is_some() && c.key == *key);
            same_vm += usize::from(t == target);
        }
        if same_pod > 1 || same_vm > 1 {
            self.violations.push(format!(
                "{why}: {same_pod} VM operations in flight for the pod, {same_vm} for VM {target}"
            ));
        }
    }

    /// The VM name a command creates, starts, resizes or removes.
    fn vm_changed(&self, cmd: &CocoonCmd) -> Option<String> {
        let by_id = |id: &str| {
            self.vms
                .get(id)
                .map_or_else(|| id.to_string(), |v| v.name.clone())
        };
        match cmd {
            CocoonCmd::VmRun { name, .. }
            | CocoonCmd::VmClone { name, .. }
            | CocoonCmd::MacosRun { name, .. }
            | CocoonCmd::MacosStart { name, .. }
            | CocoonCmd::MacosRm { name } => Some(name.clone()),
            CocoonCmd::VmRm { id } | CocoonCmd::VmStart { id } | CocoonCmd::VmNet { id, .. } => {
                Some(by_id(id))
            }
            _ => None,
        }
    }

    /// The settled world against the model: no VM leaked, every entitled pod holds exactly
    /// one VM and the API names it, the model's VM table is cocoon's, and each VM listed at
    /// startup was handled once (B8).
    pub fn settled(&self, w: &World) -> Result<(), String> {
        let held: BTreeSet<String> = w
            .cocoon
            .vms
            .keys()
            .chain(w.cocoon.macos.keys())
            .cloned()
            .collect();
        let alive: BTreeSet<String> = self
            .vms
            .iter()
            .filter(|(_, v)| v.alive)
            .map(|(id, _)| id.clone())
            .collect();
        if held != alive {
            return Err(format!("cocoon holds {held:?}, the model {alive:?}"));
        }
        for id in &held {
            let v = &self.vms[id];
            match &v.owner {
                Owner::Pod(uid) if !self.pods[uid].entitled() => {
                    let p = &self.pods[uid];
                    return Err(format!(
                        "VM {id} ({}) leaked: pod {} {uid} is {}",
                        v.name,
                        p.key,
                        p.why_not()
                    ));
                }
                Owner::Orphan if self.policy == OrphanPolicy::Destroy => {
                    return Err(format!("orphan {id} kept under destroy"));
                }
                Owner::Pod(_) | Owner::Orphan => {}
            }
        }
        for (k, pod) in &w.api.pods {
            let Some(p) = self.pods.get(&pod.uid).filter(|p| p.entitled()) else {
                continue;
            };
            let mine: Vec<&String> = held
                .iter()
                .filter(|id| self.vms[*id].owner == Owner::Pod(pod.uid.clone()))
                .collect();
            let running = |id: &str| {
                w.cocoon
                    .vms
                    .get(id)
                    .or_else(|| w.cocoon.macos.get(id))
                    .is_some_and(|v| v.is_running())
            };
            match mine.as_slice() {
                [id] if !running(id) => return Err(format!("{k} holds {id}, which is stopped")),
                [id] if pod.annotation(keys::VM_ID) == Some(id.as_str()) => {}
                [id] => {
                    return Err(format!(
                        "{k} holds {id} but the API names {:?}",
                        pod.annotation(keys::VM_ID)
                    ))
                }
                [] if p.evict_failures >= 2 => {}
                _ => return Err(format!("{k} ({}) holds VMs {mine:?}", pod.uid)),
            }
        }
        for l in &self.inventory {
            let orphan_rms = w
                .log
                .iter()
                .flat_map(|(_, a)| a)
                .filter(|a| {
                    matches!(a, Action::RunCocoon { key: None, cmd: CocoonCmd::VmRm { id }, .. } if *id == l.id)
                })
                .count();
            let owed = usize::from(!l.claimed && self.policy == OrphanPolicy::Destroy);
            if orphan_rms != owed {
                return Err(format!(
                    "VM {} listed at startup (claimed: {}): removed as an orphan {orphan_rms} times",
                    l.id, l.claimed
                ));
            }
        }
        let orphans = self.inventory.iter().filter(|l| !l.claimed).count();
        let alerts = w
            .log
            .iter()
            .flat_map(|(_, a)| a)
            .filter(|a| {
                matches!(
                    a,
                    Action::Count {
                        counter: Counter::OrphanVm
                    }
                )
            })
            .count();
        let owed = if self.policy == OrphanPolicy::Alert {
            orphans
        } else {
            0
        };
        if alerts != owed {
            return Err(format!(
                "{orphans} orphans under {:?} counted {alerts} times",
                self.policy
            ));
        }
        Ok(())
    }
}
