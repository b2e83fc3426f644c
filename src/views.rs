//! Read-side views for the kubelet API and the metrics surfaces. The loop publishes the pods
//! each step touched before it runs the step's actions; readers only ever touch these maps,
//! never a lock the loop needs (INV-7).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use dashmap::DashMap;
use reconcilers::pod::PodKey;
use reconcilers::status::PodStatus;
use reconcilers::{Action, OpId, State};

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

/// A pod the node tracks, as the kubelet API serves it: what the node last sent, or is
/// sending, of its status and annotations, and otherwise what the loop last saw of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRow {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub status: PodStatus,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
pub struct Views {
    /// Pod key (`ns/name`) → its VM.
    pub vms: Arc<DashMap<String, VmView>>,
    /// Pod key → the pod, for every pod the loop tracks.
    pub pods: Arc<DashMap<String, PodRow>>,
    /// Pod key → the pod object as the watch last delivered it. Kept by the pod watch itself,
    /// before it hands the pod to the loop, so `GET /pods` can serve whole objects without
    /// the journal carrying them.
    pub objects: Arc<DashMap<String, crate::sources::pods::StoredPod>>,
}

/// A status write the loop sent and has not heard back from.
struct Writing {
    op: OpId,
    status: Option<PodStatus>,
    annotations: BTreeMap<String, Option<String>>,
}

pub struct Publisher {
    views: Views,
    /// Each pod's write out: until its outcome, the pod's row shows what is being written
    /// rather than the server's older copy the loop still holds.
    writing: HashMap<PodKey, Writing>,
}

impl Publisher {
    pub fn new(views: Views) -> Self {
        Self {
            views,
            writing: HashMap::new(),
        }
    }

    /// Runs after a step is reduced and before its actions are: the pods it touched (every
    /// pod whose status or annotations an action writes is among them) are published, so the
    /// node's own API serves a pod before the cluster is told it is Ready or which VM it runs
    /// (INV-7). Only those pods are looked at; a pod count that disagrees with the table
    /// (a removal not named as touched) is repaired by a full pass.
    pub fn step(&mut self, state: &State, touched: &[PodKey], actions: &[Action]) {
        for a in actions {
            if let Action::PatchPod {
                op,
                key,
                status,
                annotations,
                ..
            } = a
            {
                let w = Writing {
                    op: *op,
                    status: status.clone(),
                    annotations: annotations.clone(),
                };
                self.writing.insert(key.clone(), w);
            }
        }
        for key in touched {
            self.one(state, key);
        }
        if state.pods.len() != self.views.pods.len() {
            self.publish(state);
        }
    }

    /// Every pod: the rows of pods the loop no longer tracks go, the rest are refreshed.
    pub fn publish(&mut self, state: &State) {
        let tracked = |k: &String| {
            k.split_once('/')
                .is_some_and(|(ns, name)| state.pods.contains_key(&PodKey::new(ns, name)))
        };
        self.views.vms.retain(|k, _| tracked(k));
        self.views.pods.retain(|k, _| tracked(k));
        self.writing.retain(|k, _| state.pods.contains_key(k));
        for (key, _) in state.pods.sorted() {
            self.one(state, key);
        }
    }

    fn one(&mut self, state: &State, key: &PodKey) {
        let k = key.to_string();
        let Some(e) = state.pods.get(key) else {
            self.views.pods.remove(&k);
            self.views.vms.remove(&k);
            self.writing.remove(key);
            return;
        };
        if self
            .writing
            .get(key)
            .is_some_and(|w| e.writer.out() != Some(w.op))
        {
            self.writing.remove(key);
        }
        let writing = self.writing.get(key);
        let status = writing
            .and_then(|w| w.status.as_ref())
            .unwrap_or(&e.pod.status);
        let pending = writing.map(|w| &w.annotations).filter(|a| !a.is_empty());
        let same = self.views.pods.get(&k).is_some_and(|r| {
            r.uid == e.pod.uid
                && r.status == *status
                && match pending {
                    None => r.annotations == e.pod.annotations,
                    Some(p) => r.annotations == with_pending(&e.pod.annotations, p),
                }
        });
        if !same {
            let row = PodRow {
                namespace: key.namespace().to_string(),
                name: key.name().to_string(),
                uid: e.pod.uid.clone(),
                status: status.clone(),
                annotations: match pending {
                    None => e.pod.annotations.clone(),
                    Some(p) => with_pending(&e.pod.annotations, p),
                },
            };
            self.views.pods.insert(k.clone(), row);
        }
        let Some(vm) = e.vm() else {
            self.views.vms.remove(&k);
            return;
        };
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
        if self.views.vms.get(&k).map(|v| *v != view).unwrap_or(true) {
            self.views.vms.insert(k, view);
        }
    }
}

/// The pod's annotations once a write of `pending` (`None`: remove the key) lands.
fn with_pending(
    held: &BTreeMap<String, String>,
    pending: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, String> {
    let mut out = held.clone();
    for (k, v) in pending {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::event::KubeOk;
    use reconcilers::keys::LIFECYCLE_STATE;
    use reconcilers::{reduce_touching, Envelope, Event};

    struct Run {
        state: State,
        views: Views,
        publisher: Publisher,
        seq: u64,
    }

    impl Run {
        /// One step as the loop takes it: reduced, then published, and only then would its
        /// actions run; the caller sees the views as they stand at that moment.
        fn step(&mut self, event: Event) -> Vec<Action> {
            self.seq += 1;
            let envelope = Envelope {
                seq: self.seq,
                at: 1_000_000 + self.seq as i64,
                event,
            };
            let (actions, touched) = reduce_touching(&mut self.state, envelope);
            self.publisher.step(&self.state, &touched, &actions);
            actions
        }

        fn row(&self, key: &str) -> Option<PodRow> {
            self.views.pods.get(key).map(|r| r.value().clone())
        }
    }

    fn run() -> Run {
        let views = Views::default();
        Run {
            state: State::new(reconcilers::Config::default()),
            publisher: Publisher::new(views.clone()),
            views,
            seq: 0,
        }
    }

    #[test]
    fn what_a_step_writes_is_published_before_it_goes_out() {
        let mut r = run();
        let pod = reconcilers::testkit::pod("default", "a")
            .managed()
            .run("ghcr.io/acme/base:1")
            .build();
        r.step(Event::PodRelistBegin);
        r.step(Event::PodRelistItem { pod: pod.clone() });
        let seen = r
            .row("default/a")
            .expect("a pod is listed as soon as it is seen");
        assert_eq!(seen.uid, pod.uid);
        r.step(Event::PodRelistEnd);
        let actions = r.step(Event::VmListed { vms: Vec::new() });
        let (op, annotations) = actions
            .iter()
            .find_map(|a| match a {
                Action::PatchPod {
                    op, annotations, ..
                } => Some((*op, annotations.clone())),
                _ => None,
            })
            .expect("the bring-up writes the pod's lifecycle");
        let creating = annotations[LIFECYCLE_STATE].clone();
        let row = r.row("default/a").unwrap();
        assert_eq!(
            row.annotations.get(LIFECYCLE_STATE),
            creating.as_ref(),
            "the row shows the write the step is about to send"
        );

        // An unrelated event while the write is out keeps showing it.
        r.step(Event::NodeRegistered);
        assert_eq!(r.row("default/a").unwrap(), row);

        r.step(Event::KubeDone {
            op,
            result: Ok(KubeOk::Done),
        });
        assert_eq!(
            r.row("default/a").unwrap().annotations.get(LIFECYCLE_STATE),
            creating.as_ref(),
            "once written, the loop's own copy holds it"
        );
        assert!(r.publisher.writing.is_empty());

        r.step(Event::PodDeleted { pod });
        assert_eq!(r.state.pods.len(), r.views.pods.len());
    }
}
