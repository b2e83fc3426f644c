//! A fake API server holding the pods of this node. It applies what vk writes the way the
//! real one does for the parts vk touches: status merge patches, annotation merge patches
//! (a null deletes), and deletes with a UID precondition and graceful deletion.

use std::collections::{BTreeMap, VecDeque};

use crate::event::{Event, KubeError, KubeErrorKind, KubeOk};
use crate::pod::{PodKey, PodView};
use crate::status::PodStatus;
use crate::time::Millis;

#[derive(Clone, Debug, Default)]
pub struct FakeApi {
    pub pods: BTreeMap<PodKey, PodView>,
    /// Errors for the next writes of a pod, first armed first used.
    pub faults: BTreeMap<PodKey, VecDeque<KubeErrorKind>>,
    /// Send watch events for what vk's own writes changed (the real watch does).
    pub echo: bool,
    /// Watch events not yet delivered.
    pub watch: VecDeque<Event>,
    /// Status writes accepted, for measuring write economy.
    /// Status-and-annotation patches answered.
    pub writes: u64,
    /// The last resourceVersion a write of vk's gave a pod. Only those writes are versioned:
    /// what a test applies itself carries none, and an unversioned copy never counts as old.
    pub version: u64,
}

impl FakeApi {
    pub fn new() -> Self {
        Self {
            echo: true,
            ..Self::default()
        }
    }

    pub fn fail_next(&mut self, key: &PodKey, kind: KubeErrorKind) {
        self.faults.entry(key.clone()).or_default().push_back(kind);
    }

    /// The UID precondition every write of vk carries.
    fn precondition(&mut self, key: &PodKey, uid: &str) -> Result<(), KubeError> {
        if let Some(kind) = self.faults.get_mut(key).and_then(VecDeque::pop_front) {
            return Err(KubeError {
                kind,
                message: format!("injected {kind:?}"),
            });
        }
        match self.pods.get(key) {
            None => Err(KubeError {
                kind: KubeErrorKind::NotFound,
                message: format!("pods {:?} not found", key.name()),
            }),
            Some(p) if p.uid != uid => Err(KubeError {
                kind: KubeErrorKind::Conflict,
                message: format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    p.uid
                ),
            }),
            Some(_) => Ok(()),
        }
    }

    fn echo(&mut self, key: &PodKey) {
        if self.echo {
            if let Some(p) = self.pods.get(key) {
                self.watch.push_back(Event::PodApplied { pod: p.clone() });
            }
        }
    }

    /// A merge patch of `pods/status`: the status (if any) and annotations in one write, echoed
    /// once by the watch when it changed anything.
    pub fn patch_pod(
        &mut self,
        key: &PodKey,
        uid: &str,
        status: Option<&PodStatus>,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<KubeOk, KubeError> {
        self.precondition(key, uid)?;
        let p = self.pods.get_mut(key).expect("checked");
        let before = (p.status.clone(), p.annotations.clone());
        if let Some(status) = status {
            p.status = status.clone();
        }
        for (k, v) in annotations {
            match v {
                Some(v) => p.annotations.insert(k.clone(), v.clone()),
                None => p.annotations.remove(k),
            };
        }
        let changed = before != (p.status.clone(), p.annotations.clone());
        if changed {
            self.version += 1;
            p.resource_version = Some(self.version);
        }
        let held = p.status.clone();
        let resource_version = p.resource_version;
        self.writes += 1;
        if changed {
            self.echo(key);
        }
        Ok(KubeOk::Status {
            status: Box::new(held),
            resource_version,
        })
    }

    /// Grace 0, or a pod already terminal, goes at once; otherwise the pod only gets a
    /// deletion timestamp and waits for the kubelet (us) to finish it.
    pub fn delete(
        &mut self,
        key: &PodKey,
        uid: &str,
        grace: Option<i64>,
        now: Millis,
    ) -> Result<KubeOk, KubeError> {
        self.precondition(key, uid)?;
        let p = self.pods.get_mut(key).expect("checked");
        if grace == Some(0) || p.is_terminal() {
            let p = self.pods.remove(key).expect("checked");
            self.watch.push_back(Event::PodDeleted { pod: p });
        } else if p.deletion_timestamp.is_none() {
            p.deletion_timestamp = Some(now);
            let p = p.clone();
            self.watch.push_back(Event::PodApplied { pod: p });
        }
        Ok(KubeOk::Done)
    }
}
