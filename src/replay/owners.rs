//! `--html`: which pod each event and action concerns, for every pod at once. `Focus` answers
//! the same question for one pod; asking it once per pod would cost pods × events.
//!
//! A pod is its key and UID: a pod deleted and created again under the same name is another
//! pod, and a timer or outcome of the old one still lands on the old one's row.

use std::collections::HashMap;

use reconcilers::pod::{PodKey, PodView};
use reconcilers::{Action, Event, OpId, State, Timer};

use super::focus::timer_key;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The node's own work: vm list, sweeps, relists, startup.
    Node,
    Pod {
        key: PodKey,
        uid: String,
    },
}

impl Owner {
    pub fn key(&self) -> Option<&PodKey> {
        match self {
            Owner::Node => None,
            Owner::Pod { key, .. } => Some(key),
        }
    }
}

#[derive(Default)]
pub struct Owners {
    /// Outcomes name only their op: whoever's action started it owns the outcome.
    ops: HashMap<OpId, Owner>,
    /// The latest UID under each key, for the events and actions that carry none.
    uids: HashMap<PodKey, String>,
    /// From each pod's `vm.cocoonstack.io/name`: stream events can precede the VM's indexing.
    vm_names: HashMap<String, PodKey>,
}

fn timer_uid(t: &Timer) -> Option<&str> {
    match t {
        Timer::CreateRetry { uid, .. }
        | Timer::Recheck { uid, .. }
        | Timer::IpWait { uid, .. }
        | Timer::RenewNudge { uid, .. }
        | Timer::PostCloneRetry { uid, .. }
        | Timer::KubeRetry { uid, .. }
        | Timer::DeleteRetry { uid, .. }
        | Timer::EvictRetry { uid, .. }
        | Timer::HibernateRetry { uid, .. } => Some(uid),
        Timer::StaleCreate { .. } | Timer::Sweep => None,
    }
}

impl Owners {
    fn pod(&self, key: &PodKey, uid: Option<&str>) -> Owner {
        let uid = uid
            .or_else(|| self.uids.get(key).map(String::as_str))
            .unwrap_or_default();
        Owner::Pod {
            key: key.clone(),
            uid: uid.to_string(),
        }
    }

    fn seen(&mut self, pod: &PodView) -> Owner {
        let key = pod.key();
        if let Some(n) = pod.annotation(reconcilers::keys::VM_NAME) {
            self.vm_names.insert(n.to_string(), key.clone());
        }
        self.uids.insert(key.clone(), pod.uid.clone());
        self.pod(&key, Some(&pod.uid))
    }

    fn named_vm(&self, name: &str, before: &State) -> Option<PodKey> {
        before
            .vm_names
            .get(name)
            .or_else(|| self.vm_names.get(name))
            .cloned()
    }

    /// Judged before the event is reduced, against the state it meets.
    pub fn event(&mut self, e: &Event, before: &State) -> Owner {
        let key = match e {
            Event::PodRelistItem { pod }
            | Event::PodApplied { pod }
            | Event::PodDeleted { pod } => return self.seen(pod),
            Event::ProbeDone { key, .. } => Some(key.clone()),
            Event::TimerFired { timer } => {
                if let (Some(key), uid) = (timer_key(timer), timer_uid(timer)) {
                    return self.pod(key, uid);
                }
                match timer {
                    Timer::StaleCreate { name, .. } => self.named_vm(name, before),
                    _ => None,
                }
            }
            Event::CocoonDone { op, .. }
            | Event::KubeDone { op, .. }
            | Event::RegistryDone { op, .. }
            | Event::DhcpLeaseReleased { op, .. }
            | Event::SacDone { op, .. } => {
                return self.ops.remove(op).unwrap_or(Owner::Node);
            }
            Event::DhcpLeasesChanged { upsert, remove } => {
                // A lease belongs to the pod whose VM holds its MAC; a table of many is the node's.
                let macs = upsert.iter().map(|l| l.mac.as_str());
                let mut keys = macs
                    .chain(remove.iter().map(|m| m.as_str()))
                    .map(|m| before.dhcp_macs.get(m));
                match keys.next() {
                    Some(Some(first)) if keys.all(|k| k == Some(first)) => Some(first.clone()),
                    _ => None,
                }
            }
            Event::VmStream { vm, .. } => before
                .vm_ids
                .get(&vm.id)
                .cloned()
                .or_else(|| self.named_vm(&vm.name, before)),
            _ => None,
        };
        key.map_or(Owner::Node, |k| self.pod(&k, None))
    }

    /// An action that names no pod (a count, a log line, a detached cocoon call) belongs with
    /// the event that caused it.
    pub fn action(&mut self, a: &Action, event: &Owner) -> Owner {
        let (key, uid, op) = match a {
            Action::RunCocoon { op, key, .. } | Action::CallRegistry { op, key, .. } => {
                (key.as_ref(), None, Some(*op))
            }
            Action::PatchPod { op, key, uid, .. } | Action::DeletePod { op, key, uid, .. } => {
                (Some(key), Some(uid.as_str()), Some(*op))
            }
            Action::RunSac { op, key, .. } => (Some(key), None, Some(*op)),
            Action::ReleaseDhcpLease { op, .. } => (None, None, Some(*op)),
            Action::RecordEvent { key, uid, .. } => (Some(key), Some(uid.as_str()), None),
            Action::RunProbe { key, .. } | Action::StopProbe { key } => (Some(key), None, None),
            Action::ArmTimer { timer, .. } => (timer_key(timer), timer_uid(timer), None),
            _ => (None, None, None),
        };
        let owner = match key {
            Some(k) if event.key() == Some(k) && uid.is_none() => event.clone(),
            Some(k) => self.pod(k, uid),
            None => event.clone(),
        };
        if let Some(op) = op {
            self.ops.insert(op, owner.clone());
        }
        owner
    }
}
