//! Read-side views for the kubelet API and the metrics surfaces. The loop republishes them at
//! most once a second from its State; readers only ever touch these maps, never a lock the loop
//! needs (INV-7).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use reconcilers::State;

/// One tracked VM, as readers need it for stats (M1: only VMs with a known PID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmView {
    pub vm_id: String,
    pub vm_name: String,
    pub namespace: String,
    pub pod: String,
    pub pid: i64,
    pub ip: Option<String>,
    pub backend: String,
    pub unmanaged: bool,
    pub windows: bool,
    /// The record's TAP devices and COW disk path, for the per-VM network and disk series.
    pub taps: Vec<String>,
    pub cow: Option<String>,
}

/// A pod the watch sees on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRow {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
}

#[derive(Clone, Default)]
pub struct Views {
    /// Pod key (`ns/name`) → its VM.
    pub vms: Arc<DashMap<String, VmView>>,
    /// Pod key → the pod, for every pod the watch sees on this node.
    pub pods: Arc<DashMap<String, PodRow>>,
}

const EVERY: Duration = Duration::from_secs(1);

pub struct Publisher {
    views: Views,
    last: Option<Instant>,
    /// A change was held back by the once-a-second limit and must still go out: a reader
    /// must not wait for some unrelated later event to see a pod the loop already has.
    pending: bool,
}

impl Publisher {
    pub fn new(views: Views) -> Self {
        Self {
            views,
            last: None,
            pending: false,
        }
    }

    /// When a held-back publication is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        self.pending
            .then(|| self.last.map_or_else(Instant::now, |t| t + EVERY))
    }

    /// Republishes when the last publication is older than a second, and otherwise
    /// remembers that one is owed (see [`Publisher::due`]).
    pub fn maybe_publish(&mut self, state: &State) {
        // A pod that came or went is published at once: the kubelet API answers 404 for a
        // pod it does not list, and a caller that just saw the pod in the cluster retries
        // nothing. The count is a cheap test; a swap of one pod for another in one step
        // waits for the owed publication.
        let pods_changed = state.pods.len() != self.views.pods.len();
        if !pods_changed && self.last.is_some_and(|t| t.elapsed() < EVERY) {
            self.pending = true;
            return;
        }
        self.publish(state);
    }

    pub fn publish(&mut self, state: &State) {
        self.pending = false;
        self.last = Some(Instant::now());
        let vms = &self.views.vms;
        vms.retain(|k, _| {
            let Some((ns, name)) = k.split_once('/') else {
                return false;
            };
            state
                .pods
                .get(&reconcilers::pod::PodKey::new(ns, name))
                .is_some_and(|e| e.vm().is_some())
        });
        let pods = &self.views.pods;
        pods.retain(|k, _| {
            k.split_once('/').is_some_and(|(ns, name)| {
                state
                    .pods
                    .contains_key(&reconcilers::pod::PodKey::new(ns, name))
            })
        });
        for (key, e) in state.pods.sorted() {
            let row = PodRow {
                namespace: key.namespace().to_string(),
                name: key.name().to_string(),
                uid: e.pod.uid.clone(),
                phase: e.pod.status.phase.to_string(),
            };
            if pods
                .get(&key.to_string())
                .map(|r| *r != row)
                .unwrap_or(true)
            {
                pods.insert(key.to_string(), row);
            }
            let Some(vm) = e.vm() else { continue };
            let view = VmView {
                vm_id: vm.record.id.clone(),
                vm_name: vm.record.name.clone(),
                namespace: key.namespace().to_string(),
                pod: key.name().to_string(),
                pid: vm.record.pid,
                ip: vm.ip.clone(),
                backend: if vm.record.hypervisor.is_empty() {
                    "cloud-hypervisor".into()
                } else {
                    vm.record.hypervisor.clone()
                },
                unmanaged: !vm.managed(),
                windows: e
                    .spec
                    .as_ref()
                    .is_ok_and(|sp| sp.os == reconcilers::spec::Os::Windows),
                taps: vm.record.taps.clone(),
                cow: vm.record.cow.clone(),
            };
            let k = key.to_string();
            if vms.get(&k).map(|v| *v != view).unwrap_or(true) {
                vms.insert(k, view);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_back_publication_is_owed_not_dropped() {
        let state = State::new(reconcilers::Config::default());
        let mut p = Publisher::new(Views::default());
        assert_eq!(p.due(), None);
        p.maybe_publish(&state);
        assert_eq!(p.due(), None, "the first publication goes out at once");
        p.maybe_publish(&state);
        let due = p.due().expect("a second change within the second is owed");
        assert!(due > Instant::now() && due <= Instant::now() + EVERY);
        p.publish(&state);
        assert_eq!(p.due(), None);
    }
}
