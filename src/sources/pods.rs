//! The pod watch (P1): kube-runtime's watcher on `spec.nodeName=<node>` with its backoff. Its
//! relist bracket (Init / InitApply / InitDone) is passed through, so the core can tell "the
//! list is complete" from "still listing". Each object is also kept whole, for `GET /pods`,
//! before the loop hears of it, so the kubelet API never lacks the object of a pod the loop
//! tracks.

use std::collections::HashSet;
use std::sync::Arc;

use dashmap::DashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use reconcilers::Event;

use super::pod_view::pod_view;
use super::EventTx;

fn key(p: &Pod) -> String {
    let meta = &p.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// A watched pod as `GET /pods` serves it, kept as compact JSON: a decoded `Pod` holds every
/// optional field of every nested type and took several times the bytes of its JSON, which at
/// 1,000 pods was most of the daemon's heap. `/pods` is rare; decoding there is cheap enough.
#[derive(Clone)]
pub struct StoredPod {
    uid: Option<String>,
    json: Arc<[u8]>,
}

impl StoredPod {
    fn new(p: &Pod) -> Option<Self> {
        match serde_json::to_vec(p) {
            Ok(json) => Some(Self {
                uid: p.metadata.uid.clone(),
                json: json.into(),
            }),
            // A `Pod` the watch decoded always encodes; were it not to, `/pods` serves the pod
            // from what the node knows of it, as for a pod the watch has not delivered.
            Err(e) => {
                tracing::warn!(error = %e, "a watched pod did not encode; /pods serves the node's view of it");
                None
            }
        }
    }

    /// The pod's UID as the watch delivered it: what a peer restore names the pod by (K7.4).
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    pub fn decode(&self) -> Option<Pod> {
        serde_json::from_slice(&self.json).ok()
    }
}

/// The watch's objects by pod key (`Views::objects`), as the watch last delivered them.
pub struct Objects {
    map: Arc<DashMap<String, StoredPod>>,
    /// Keys seen by the relist under way: what it did not list is gone once it completes.
    relisted: Option<HashSet<String>>,
}

impl Objects {
    pub fn new(map: Arc<DashMap<String, StoredPod>>) -> Self {
        Self {
            map,
            relisted: None,
        }
    }

    fn relist_begin(&mut self) {
        self.relisted = Some(HashSet::new());
    }

    fn applied(&mut self, mut p: Pod) {
        // Who wrote which field is the apiserver's bookkeeping and often half of a pod's
        // bytes: at 1,000 pods it was most of the daemon's heap, and nothing `/pods` serves
        // it to needs it.
        p.metadata.managed_fields = None;
        let k = key(&p);
        if let Some(seen) = self.relisted.as_mut() {
            seen.insert(k.clone());
        }
        match StoredPod::new(&p) {
            Some(stored) => self.map.insert(k, stored),
            None => self.map.remove(&k).map(|(_, v)| v),
        };
    }

    fn relist_end(&mut self) {
        if let Some(seen) = self.relisted.take() {
            self.map.retain(|k, _| seen.contains(k));
        }
    }

    fn deleted(&mut self, p: &Pod) {
        let uid = p.metadata.uid.as_deref();
        self.map
            .remove_if(&key(p), |_, held| held.uid.as_deref() == uid);
    }
}

pub async fn run(client: Client, node: String, tx: EventTx, mut objects: Objects) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(watcher::Event::Init) => {
                objects.relist_begin();
                Event::PodRelistBegin
            }
            Ok(watcher::Event::InitApply(p)) => {
                let pod = pod_view(&p);
                objects.applied(p);
                Event::PodRelistItem { pod }
            }
            Ok(watcher::Event::InitDone) => {
                objects.relist_end();
                Event::PodRelistEnd
            }
            Ok(watcher::Event::Apply(p)) => {
                let pod = pod_view(&p);
                objects.applied(p);
                Event::PodApplied { pod }
            }
            Ok(watcher::Event::Delete(p)) => {
                objects.deleted(&p);
                Event::PodDeleted { pod: pod_view(&p) }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying with backoff");
                continue;
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid}
        }))
        .unwrap()
    }

    #[test]
    fn the_objects_follow_the_watch() {
        let map = Arc::new(DashMap::new());
        let mut o = Objects::new(map.clone());
        o.applied(pod("a", "u1"));
        o.applied(pod("b", "u2"));
        // A delete of an earlier incarnation leaves the current one.
        o.deleted(&pod("a", "u0"));
        assert_eq!(map.len(), 2);
        o.deleted(&pod("a", "u1"));
        assert!(!map.contains_key("default/a"));
        // A relist that no longer lists a pod drops it once complete.
        o.applied(pod("c", "u3"));
        o.relist_begin();
        o.applied(pod("c", "u3"));
        assert_eq!(map.len(), 2, "nothing goes while the relist is under way");
        o.relist_end();
        let left: Vec<String> = map.iter().map(|e| e.key().clone()).collect();
        assert_eq!(left, ["default/c"]);
    }
}
