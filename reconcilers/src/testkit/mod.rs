//! A fake world around the pure core, for scenario tests, property tests, benchmarks and the
//! sample journal: a fake cocoon, a fake API server, a lease table, probes that answer by VM
//! reachability, and timers due by a virtual clock. Like the core it is pure — no I/O, no
//! clock, no randomness — so a test that drives it is as deterministic as `reduce` itself.
//!
//! Actions the core emits wait in `pending` until `settle` executes them (or a test answers
//! one by hand); every outcome returns through `feed`, which stamps, reduces and logs it.

mod api;
mod builders;
mod cocoon;
mod invariants;
pub mod registry;
pub use crate::render;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use api::FakeApi;
pub use builders::{mac_for, pod, vm, PodBuilder, VmBuilder};
pub use cocoon::{verb, FakeCocoon, Fault};

use crate::action::{Action, OpId, ProbeTarget, Timer};
use crate::config::Config;
use crate::event::{CocoonOk, DhcpLease, Envelope, Event, KubeError, KubeOk, SacError};
use crate::pod::{PodKey, PodView};
use crate::reduce;
use crate::state::State;
use crate::time::Millis;
use crate::vm::{CocoonError, VmRecord};

/// Something due at a virtual time.
#[derive(Clone, Debug, PartialEq)]
pub enum Scheduled {
    Timer(Timer),
    Probe {
        key: PodKey,
        seq: u64,
        target: ProbeTarget,
        /// Repeats every `every` ms while it succeeds, reporting nothing (a standing probe).
        every: Option<u64>,
    },
    /// cocoon-net hands out a DHCP lease.
    Lease {
        mac: String,
        ip: String,
    },
}

/// A Kubernetes Event vk recorded on a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub key: PodKey,
    pub kind: String,
    pub reason: String,
    pub message: String,
}

pub struct World {
    pub state: State,
    pub now: Millis,
    pub log: Vec<(Envelope, Vec<Action>)>,
    pub cocoon: FakeCocoon,
    pub registry: registry::FakeRegistry,
    pub api: FakeApi,
    /// The cocoon-net lease table, by MAC.
    pub leases: BTreeMap<String, DhcpLease>,
    /// Auto-DHCP: a running VM with a DHCP NIC gets a lease this many ms later; `None` = off.
    pub dhcp: Option<u64>,
    /// Deliver cocoon's VM event stream.
    pub stream: bool,
    /// VM ids whose guest does not answer probes.
    pub unreachable: BTreeSet<String>,
    /// What the next SAC dialogs answer instead of success, first armed first used.
    pub sac_faults: VecDeque<SacError>,
    /// Counters moved by `Action::Count`, rendered `name{labels}`.
    pub counters: BTreeMap<String, u64>,
    pub events: Vec<Recorded>,
    pub registered: bool,
    pub fatal: Option<String>,
    /// Invariant breaches seen while feeding (see `invariants.rs`).
    pub violations: Vec<String>,
    /// Steps one `settle` may take before it calls the run a livelock.
    pub max_steps: usize,
    /// The VM holder records as the journal keeps them (`hold` actions), which the next
    /// process start hands back (T11).
    pub journaled_holders: crate::holders::Holders,
    pending: VecDeque<Action>,
    scheduled: BTreeMap<(Millis, u64), Scheduled>,
    seq: u64,
    order: u64,
    next_ip: u32,
}

/// Lease lifetime handed out by the fake DHCP server.
const LEASE_MS: Millis = 24 * 3600 * 1000;

impl World {
    pub fn new(config: Config) -> World {
        World {
            state: State::new(config),
            now: 1_777_600_000_000, // 2026-05-01T01:46:40Z: a plausible wall time
            log: Vec::new(),
            cocoon: FakeCocoon::default(),
            registry: registry::FakeRegistry::default(),
            api: FakeApi::new(),
            leases: BTreeMap::new(),
            dhcp: Some(0),
            stream: true,
            unreachable: BTreeSet::new(),
            sac_faults: VecDeque::new(),
            counters: BTreeMap::new(),
            events: Vec::new(),
            registered: false,
            fatal: None,
            violations: Vec::new(),
            max_steps: 100_000,
            journaled_holders: crate::holders::Holders::default(),
            pending: VecDeque::new(),
            scheduled: BTreeMap::new(),
            seq: 0,
            order: 0,
            next_ip: 10,
        }
    }

    /// Stamps the event with the next seq and `now`, reduces it, logs it and takes the
    /// actions in: effects wait in `pending`, timers and probes are scheduled, counters,
    /// Events and logs are recorded at once.
    pub fn feed(&mut self, event: Event) -> Vec<Action> {
        self.seq += 1;
        let env = Envelope {
            seq: self.seq,
            at: self.now,
            event,
        };
        let actions = reduce(&mut self.state, env.clone());
        invariants::check_actions(self, &actions);
        for a in &actions {
            self.take(a.clone());
        }
        invariants::check_in_flight(self);
        self.log.push((env, actions.clone()));
        actions
    }

    fn take(&mut self, a: Action) {
        match a {
            Action::ArmTimer { timer, after_ms } => {
                self.schedule(after_ms, Scheduled::Timer(timer));
            }
            Action::RunProbe {
                key,
                seq,
                target,
                after_ms,
                standing,
            } => {
                // A new probe replaces the agent's earlier one (R1).
                self.scheduled
                    .retain(|_, s| !matches!(s, Scheduled::Probe { key: k, .. } if *k == key));
                let every = standing.then_some(after_ms);
                self.schedule(
                    after_ms,
                    Scheduled::Probe {
                        key,
                        seq,
                        target,
                        every,
                    },
                );
            }
            Action::StopProbe { key } => {
                self.scheduled
                    .retain(|_, s| !matches!(s, Scheduled::Probe { key: k, .. } if *k == key));
            }
            Action::Count { counter } => {
                *self.counters.entry(render::counter(&counter)).or_default() += 1;
            }
            Action::RecordEvent {
                key,
                kind,
                reason,
                message,
                ..
            } => self.events.push(Recorded {
                key,
                kind: format!("{kind:?}"),
                reason,
                message,
            }),
            Action::Abort { message } => self.fatal = Some(message),
            Action::Hold { vm, held } => {
                self.journaled_holders.set(&vm, held);
            }
            Action::Observe { .. } | Action::ObserveCount { .. } | Action::Log { .. } => {}
            other => self.pending.push_back(other),
        }
    }

    fn schedule(&mut self, after_ms: u64, what: Scheduled) {
        self.order += 1;
        let due = self.now + after_ms as Millis;
        self.scheduled.insert((due, self.order), what);
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms as Millis;
    }

    /// Executes pending actions against the fake world and feeds their outcomes back, and
    /// fires whatever is due by `now`, until nothing is left. Panics on a livelock.
    pub fn settle(&mut self) {
        let start = self.log.len();
        for _ in 0..self.max_steps {
            if self.fatal.is_some() {
                return;
            }
            if let Some(a) = self.pending.pop_front() {
                self.execute(a);
            } else if let Some(item) = self.pop_due() {
                self.fire(item);
            } else {
                return;
            }
        }
        let tail: Vec<String> = self.log[start.max(self.log.len().saturating_sub(12))..]
            .iter()
            .map(|(e, _)| render::event(&e.event))
            .collect();
        panic!(
            "settle did not quiesce within {} steps at t={} (livelock?); last events:\n  {}",
            self.max_steps,
            self.now,
            tail.join("\n  ")
        );
    }

    /// Runs the virtual clock forward by `ms`, stopping at every due timer, probe and lease
    /// and settling there, as the real loop would see them.
    pub fn run_for(&mut self, ms: u64) {
        let end = self.now + ms as Millis;
        loop {
            self.settle();
            if self.fatal.is_some() {
                return;
            }
            match self.scheduled.keys().next() {
                Some(&(due, _)) if due <= end => self.now = self.now.max(due),
                _ => {
                    self.now = end;
                    self.settle();
                    return;
                }
            }
        }
    }

    /// Startup as the shell does it: a complete pod relist and one `cocoon vm list`, then
    /// settle. `pods` and `vms` join whatever the fake API and cocoon already hold.
    pub fn start(&mut self, pods: Vec<PodView>, vms: Vec<VmRecord>) {
        self.start_unsettled(pods, vms);
        self.settle();
    }

    /// A new process on the same host one second later: cocoon's VMs, the API's pods, the
    /// lease file and the journal's holder records carry over, the rest starts afresh.
    /// Nothing is started yet.
    pub fn restarted(self) -> World {
        let mut w = World::new(self.state.config.clone());
        w.dhcp = self.dhcp;
        w.stream = self.stream;
        w.api.echo = self.api.echo;
        w.now = self.now + 1000;
        w.cocoon = self.cocoon;
        w.cocoon.stream.clear();
        w.api.pods = self.api.pods;
        w.leases = self.leases;
        w.journaled_holders = self.journaled_holders;
        w
    }

    /// `start` without the settle, for tests that answer each effect by hand.
    pub fn start_unsettled(&mut self, pods: Vec<PodView>, vms: Vec<VmRecord>) {
        // The shell reads the records back from its journal before any other event.
        if !self.journaled_holders.is_empty() {
            let holders = self.journaled_holders.clone();
            self.feed(Event::HoldersRestored {
                holders,
                problem: None,
            });
        }
        for p in pods {
            self.api.pods.insert(p.key(), p);
        }
        for v in vms {
            self.cocoon.add_vm(v);
        }
        self.relist();
        let vms = self.cocoon.vms.values().cloned().collect();
        self.feed(Event::VmListed { vms });
    }

    /// A watch relist bracket over what the API holds now.
    pub fn relist(&mut self) {
        self.feed(Event::PodRelistBegin);
        let pods: Vec<PodView> = self.api.pods.values().cloned().collect();
        for pod in pods {
            self.feed(Event::PodRelistItem { pod });
        }
        self.feed(Event::PodRelistEnd);
    }

    /// Creates or updates the pod on the API server and feeds the watch event. An update of
    /// the same UID keeps what the server holds beyond the spec: status, and annotations the
    /// new object does not mention.
    pub fn apply(&mut self, mut pod: PodView) -> Vec<Action> {
        let key = pod.key();
        if let Some(old) = self.api.pods.get(&key).filter(|o| o.uid == pod.uid) {
            pod.status = old.status.clone();
            for (k, v) in &old.annotations {
                pod.annotations
                    .entry(k.clone())
                    .or_insert_with(|| v.clone());
            }
            pod.deletion_timestamp = pod.deletion_timestamp.or(old.deletion_timestamp);
        }
        self.api.pods.insert(key, pod.clone());
        self.feed(Event::PodApplied { pod })
    }

    /// Sets (`Some`) or removes (`None`) an annotation on the server copy and feeds the watch.
    pub fn annotate(&mut self, key: &PodKey, k: &str, v: Option<&str>) -> Vec<Action> {
        let Some(p) = self.api.pods.get_mut(key) else {
            return Vec::new();
        };
        match v {
            Some(v) => p.annotations.insert(k.into(), v.into()),
            None => p.annotations.remove(k),
        };
        let pod = p.clone();
        self.feed(Event::PodApplied { pod })
    }

    /// `kubectl delete pod`: a graceful delete sets the deletion timestamp.
    pub fn delete_pod(&mut self, key: &PodKey) -> Vec<Action> {
        let now = self.now;
        let Some(p) = self.api.pods.get_mut(key) else {
            return Vec::new();
        };
        p.deletion_timestamp.get_or_insert(now);
        let pod = p.clone();
        self.feed(Event::PodApplied { pod })
    }

    /// The cluster deletes the pod for `reason` (a `DisruptionTarget` condition, then the
    /// deletion timestamp), as the taint manager does.
    pub fn evict_pod(&mut self, key: &PodKey, reason: &str) -> Vec<Action> {
        let now = self.now;
        let Some(p) = self.api.pods.get_mut(key) else {
            return Vec::new();
        };
        p.disruption = Some(reason.to_string());
        p.deletion_timestamp.get_or_insert(now);
        let pod = p.clone();
        self.feed(Event::PodApplied { pod })
    }

    /// The pod object disappears from the API (force delete by someone else).
    pub fn remove_pod(&mut self, key: &PodKey) -> Vec<Action> {
        match self.api.pods.remove(key) {
            Some(pod) => self.feed(Event::PodDeleted { pod }),
            None => Vec::new(),
        }
    }

    pub fn set_lease(&mut self, mac: &str, ip: &str) -> Vec<Action> {
        let mac = mac.to_ascii_lowercase();
        let lease = DhcpLease {
            mac: mac.as_str().into(),
            ip: ip.into(),
            expiry: self.now + LEASE_MS,
        };
        self.leases.insert(mac, lease.clone());
        // As the shell's lease-file source sends it: the changed row only.
        self.feed(Event::DhcpLeasesChanged {
            upsert: vec![lease],
            remove: Vec::new(),
        })
    }

    pub fn drop_lease(&mut self, mac: &str) -> Vec<Action> {
        let mac = mac.to_ascii_lowercase();
        self.leases.remove(&mac);
        self.feed(Event::DhcpLeasesChanged {
            upsert: Vec::new(),
            remove: vec![mac.into()],
        })
    }

    /// The first lease event after a (re)start: the whole table as upserts.
    pub fn feed_lease_table(&mut self) -> Vec<Action> {
        let upsert = self.leases.values().cloned().collect();
        self.feed(Event::DhcpLeasesChanged {
            upsert,
            remove: Vec::new(),
        })
    }

    /// The VMM of `id` dies; the stream reports it.
    pub fn crash(&mut self, id: &str) -> Vec<Action> {
        self.cocoon.crash(id);
        self.deliver_stream()
    }

    /// The VM of `id` is removed behind vk's back; the stream reports it.
    pub fn vanish(&mut self, id: &str) -> Vec<Action> {
        self.cocoon.vanish(id);
        self.deliver_stream()
    }

    /// Effects waiting to be executed, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &Action> {
        self.pending.iter()
    }

    pub fn scheduled(&self) -> impl Iterator<Item = (&(Millis, u64), &Scheduled)> {
        self.scheduled.iter()
    }

    fn take_pending(&mut self, op: OpId) -> Option<Action> {
        let i = self.pending.iter().position(|a| op_of(a) == Some(op))?;
        self.pending.remove(i)
    }

    /// Answers pending cocoon call `op` by hand (the fake cocoon is not consulted).
    pub fn cocoon_done(&mut self, op: OpId, result: Result<CocoonOk, CocoonError>) -> Vec<Action> {
        if self.take_pending(op).is_none() {
            panic!("no pending effect #{op}");
        }
        self.feed(Event::CocoonDone { op, result })
    }

    /// Answers pending Kubernetes write `op` by hand (the fake API is not consulted).
    pub fn kube_done(&mut self, op: OpId, result: Result<KubeOk, KubeError>) -> Vec<Action> {
        if self.take_pending(op).is_none() {
            panic!("no pending effect #{op}");
        }
        self.feed(Event::KubeDone { op, result })
    }

    /// Answers pending lease release `op` by hand (cocoon-net is not consulted).
    pub fn lease_released(&mut self, op: OpId, result: Result<(), String>) -> Vec<Action> {
        if self.take_pending(op).is_none() {
            panic!("no pending effect #{op}");
        }
        self.feed(Event::DhcpLeaseReleased { op, result })
    }

    /// Executes pending effect `op` against the fake world, as `settle` would.
    pub fn exec_op(&mut self, op: OpId) {
        match self.take_pending(op) {
            Some(a) => self.execute(a),
            None => panic!("no pending effect #{op}"),
        }
    }

    /// Fires the first scheduled timer that `pick` accepts, early if need be.
    pub fn fire_timer(&mut self, pick: impl Fn(&Timer) -> bool) -> Option<Vec<Action>> {
        let k = *self
            .scheduled
            .iter()
            .find(|(_, s)| matches!(s, Scheduled::Timer(t) if pick(t)))?
            .0;
        let Some(Scheduled::Timer(timer)) = self.scheduled.remove(&k) else {
            unreachable!()
        };
        Some(self.feed(Event::TimerFired { timer }))
    }

    /// Answers the pod's scheduled probe by hand.
    pub fn answer_probe(&mut self, key: &PodKey, ok: bool) -> Option<Vec<Action>> {
        let k = *self
            .scheduled
            .iter()
            .find(|(_, s)| matches!(s, Scheduled::Probe { key: k, .. } if k == key))?
            .0;
        let Some(Scheduled::Probe { key, seq, .. }) = self.scheduled.remove(&k) else {
            unreachable!()
        };
        let detail = if ok { "reachable" } else { "unreachable" }.to_string();
        Some(self.feed(Event::ProbeDone {
            key,
            seq,
            ok,
            detail,
        }))
    }

    fn pop_due(&mut self) -> Option<Scheduled> {
        let (&k, _) = self.scheduled.iter().next()?;
        (k.0 <= self.now).then(|| self.scheduled.remove(&k).expect("present"))
    }

    fn fire(&mut self, item: Scheduled) {
        match item {
            Scheduled::Timer(timer) => {
                self.feed(Event::TimerFired { timer });
            }
            Scheduled::Probe {
                key,
                seq,
                target,
                every,
            } => {
                let ok = self.reachable(&target);
                // A standing probe that succeeds says nothing and runs again (as the shell's).
                if let (true, Some(every)) = (ok, every) {
                    let again = Scheduled::Probe {
                        key,
                        seq,
                        target,
                        every: Some(every),
                    };
                    return self.schedule(every, again);
                }
                let detail = match (&target.ip, ok) {
                    (None, _) => "waiting for dhcp lease",
                    (_, true) => "reachable",
                    (_, false) => "unreachable",
                };
                self.feed(Event::ProbeDone {
                    key,
                    seq,
                    ok,
                    detail: detail.into(),
                });
            }
            Scheduled::Lease { mac, ip } => {
                self.set_lease(&mac, &ip);
            }
        }
    }

    /// The IP a VM answers on: its static IP, else its DHCP lease.
    pub fn vm_ip(&self, vm: &VmRecord) -> Option<String> {
        vm.static_ip.clone().or_else(|| {
            let mac = vm.mac.as_ref()?.to_ascii_lowercase();
            self.leases.get(&mac).map(|l| l.ip.to_string())
        })
    }

    fn reachable(&self, target: &ProbeTarget) -> bool {
        let Some(ip) = &target.ip else { return false };
        let macos = self.cocoon.macos.values().filter(|v| v.pid > 0);
        self.cocoon.vms.values().chain(macos).any(|v| {
            v.is_running()
                && !self.unreachable.contains(&v.id)
                && !self.cocoon.unfixed.contains(&v.id)
                && self.vm_ip(v).as_ref() == Some(ip)
        })
    }

    fn execute(&mut self, a: Action) {
        let now = self.now;
        match a {
            Action::RunCocoon { op, cmd, .. } => {
                let result = self.cocoon.exec(&cmd);
                self.feed(Event::CocoonDone { op, result });
            }
            Action::PatchPod {
                op,
                key,
                uid,
                status,
                annotations,
            } => {
                let result = self
                    .api
                    .patch_pod(&key, &uid, status.as_ref(), &annotations);
                self.feed(Event::KubeDone { op, result });
            }
            Action::DeletePod {
                op,
                key,
                uid,
                grace_seconds,
            } => {
                let result = self.api.delete(&key, &uid, grace_seconds, now);
                self.feed(Event::KubeDone { op, result });
            }
            Action::CallRegistry { op, call, .. } => {
                let node = self.state.config.node_name.clone();
                let bases = self.state.config.bases();
                let result = self.registry.exec(&call, &mut self.cocoon, &node, bases);
                self.feed(Event::RegistryDone { op, result });
            }
            Action::RunSac { op, .. } => {
                let result = self.sac_faults.pop_front().map_or(Ok(()), Err);
                self.feed(Event::SacDone { op, result });
            }
            Action::RegisterNode => {
                self.registered = true;
                self.feed(Event::NodeRegistered);
            }
            // cocoon-net drops the row and rewrites the file, which the lease source reports.
            Action::ReleaseDhcpLease { op, mac } => {
                self.feed(Event::DhcpLeaseReleased { op, result: Ok(()) });
                if self.leases.contains_key(&mac) {
                    self.drop_lease(&mac);
                }
            }
            other => self.take(other),
        }
        self.deliver_watch();
        self.hand_out_leases();
        self.deliver_stream();
    }

    fn deliver_watch(&mut self) {
        while let Some(ev) = self.api.watch.pop_front() {
            self.feed(ev);
        }
    }

    fn deliver_stream(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while let Some((kind, vm)) = self.cocoon.stream.pop_front() {
            if self.stream {
                out.extend(self.feed(Event::VmStream { kind, vm }));
            }
        }
        out
    }

    /// Auto-DHCP: every running VM with a DHCP NIC and no lease (granted or on its way)
    /// gets the next address.
    fn hand_out_leases(&mut self) {
        let Some(delay) = self.dhcp else { return };
        let promised: BTreeSet<String> = self
            .scheduled
            .values()
            .filter_map(|s| match s {
                Scheduled::Lease { mac, .. } => Some(mac.clone()),
                _ => None,
            })
            .collect();
        let want: Vec<String> = self
            .cocoon
            .vms
            .values()
            .chain(self.cocoon.macos.values())
            .filter(|v| v.is_running() && v.static_ip.is_none())
            .filter(|v| !self.cocoon.unfixed.contains(&v.id))
            .filter_map(|v| v.mac.clone())
            .filter(|m| !self.leases.contains_key(m) && !promised.contains(m))
            .collect();
        for mac in want {
            self.next_ip += 1;
            let ip = format!("10.88.{}.{}", self.next_ip / 250, self.next_ip % 250);
            if delay == 0 {
                self.set_lease(&mac, &ip);
            } else {
                self.schedule(delay, Scheduled::Lease { mac, ip });
            }
        }
    }
}

/// The benchmark workload: `pods` managed pods created, brought to Ready and deleted, with
/// every outcome supplied by the fake world. Returns the envelopes as the core saw them.
pub fn create_ready_delete(pods: usize) -> Vec<Envelope> {
    let mut w = World::new(Config::default());
    w.start(vec![], vec![]);
    for i in 0..pods {
        w.apply(
            pod("bench", &format!("p{i}"))
                .managed()
                .run("ubuntu:24.04")
                .build(),
        );
    }
    w.run_for(2_000);
    let ready = w
        .api
        .pods
        .values()
        .filter(|p| {
            p.status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .count();
    assert_eq!(
        ready, pods,
        "every pod reaches Ready before the delete phase"
    );
    let keys: Vec<_> = w.api.pods.keys().cloned().collect();
    for k in &keys {
        w.delete_pod(k);
    }
    w.run_for(2_000);
    assert!(
        w.api.pods.is_empty() && w.state.pods.is_empty(),
        "every pod deleted"
    );
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    w.log.into_iter().map(|(e, _)| e).collect()
}

/// The op id an effect reports back under.
pub fn op_of(a: &Action) -> Option<OpId> {
    match a {
        Action::RunCocoon { op, .. }
        | Action::CallRegistry { op, .. }
        | Action::PatchPod { op, .. }
        | Action::ReleaseDhcpLease { op, .. }
        | Action::RunSac { op, .. }
        | Action::DeletePod { op, .. } => Some(*op),
        _ => None,
    }
}
