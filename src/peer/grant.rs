//! K7.4: a node certificate alone reads nothing. Every kubelet's client certificate is a node
//! certificate, so "a node of the cluster" would hand any tenant's hibernated memory to any
//! host (or anyone holding a kubelet credential). A snapshot is served only to the node that
//! is waking a pod it may be restored into, and the apiserver, not the caller, says which
//! node that is: the request names the pod (namespace, name, UID), the pod must exist under
//! that UID bound to the caller's Node, and the snapshot's owner record must be of the pod's
//! namespace. The plan request pays for that check (one pod GET, one `cocoon snapshot
//! inspect`) and leaves a grant for its slices, bound to the caller, the pod and the snapshot
//! id, which the apiserver confirms again every [`RECHECK`] while slices keep coming.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use super::counters::{PeerCounters, Refusal};

/// How long a grant stands before its next slice asks the apiserver again: a pod deleted or
/// bound elsewhere loses the copy within this long.
pub const RECHECK: Duration = Duration::from_secs(30);
/// A grant no slice used for this long is dropped. Far above the client's 30 s stall
/// timeout, so a restore still running never finds its grant gone.
const IDLE: Duration = Duration::from_secs(600);
/// Grants held at once. Each needs a pod bound to its caller, so this is far above what
/// wakes in flight across the cluster ask of one node; past it a plan is answered 503.
pub const MAX_GRANTS: usize = 1024;
/// The apiserver's answer about the pod, or the plan fails rather than hold its slot.
const POD_LOOKUP: Duration = Duration::from_secs(5);

/// The pod a waking node asks for a snapshot on behalf of. Both ends carry it: the client
/// in every request's query, the server as what it checks with the apiserver.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WakingPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

const Q_NAMESPACE: &str = "namespace";
const Q_POD: &str = "pod";
const Q_UID: &str = "uid";

impl WakingPod {
    /// Non-empty, of Kubernetes' sizes, no control characters: anything else names no pod,
    /// and is refused before the apiserver is asked.
    pub fn valid(&self) -> bool {
        let ok = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && !s.chars().any(|c| c.is_control() || c == '/')
        };
        ok(&self.namespace, 63) && ok(&self.name, 253) && ok(&self.uid, 128)
    }

    pub(super) fn append_to(&self, q: &mut form_urlencoded::Serializer<'_, String>) {
        q.append_pair(Q_NAMESPACE, &self.namespace)
            .append_pair(Q_POD, &self.name)
            .append_pair(Q_UID, &self.uid);
    }

    /// From a request's query (`get` looks a key up); `None` when any part is missing or
    /// invalid.
    pub(super) fn from_query<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<WakingPod> {
        let pod = WakingPod {
            namespace: get(Q_NAMESPACE)?.to_string(),
            name: get(Q_POD)?.to_string(),
            uid: get(Q_UID)?.to_string(),
        };
        pod.valid().then_some(pod)
    }
}

impl std::fmt::Display for WakingPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// What the apiserver says of a pod: its UID and the Node it is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub uid: String,
    pub node: Option<String>,
}

/// The pod by namespace and name; `Ok(None)` when there is none.
pub trait PodLookup: Send + Sync + 'static {
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BoundPod>, String>>;
}

impl PodLookup for kube::Client {
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BoundPod>, String>> {
        Box::pin(async move {
            let api = kube::Api::<Pod>::namespaced(self.clone(), namespace);
            let got = tokio::time::timeout(POD_LOOKUP, api.get_opt(name))
                .await
                .map_err(|_| format!("the apiserver did not answer within {POD_LOOKUP:?}"))?
                .map_err(|e| e.to_string())?;
            Ok(got.map(|p| BoundPod {
                uid: p.metadata.uid.unwrap_or_default(),
                node: p.spec.and_then(|s| s.node_name),
            }))
        })
    }
}

/// Whether a certificate naming host `host` speaks for the Node `node`. N20's rule, which
/// the apiserver enforces on every write the daemon makes: a host acts as `<host>-cocoon`
/// (the DaemonSet's virtual node) or as `<host>` itself (a host without a kubelet).
pub fn acts_as(host: &str, node: &str) -> bool {
    !host.is_empty() && (node == host || node.strip_suffix("-cocoon") == Some(host))
}

/// The namespace a local snapshot's description records as its owner's. Only a record
/// counts: a snapshot without one is a public base (fetched from the registry, never from a
/// peer) or nobody's.
pub fn owner_namespace(description: &str) -> Option<String> {
    use reconcilers::owner::{Owner, DESCRIPTION_PREFIX};
    let record = description.strip_prefix(DESCRIPTION_PREFIX)?;
    Owner::parse(record).map(|o| o.namespace)
}

/// A refusal: what to count, and the 403's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied(pub Refusal, pub String);

impl Denied {
    /// Counted, and logged at debug only: a node that keeps asking must not flood the log,
    /// the counter shows it.
    pub(super) fn answer(self, counters: &PeerCounters, caller: &str) -> (StatusCode, String) {
        counters.refused(self.0);
        tracing::debug!(
            reason = self.0.as_str(),
            caller,
            "peer API refused a snapshot: {}",
            self.1
        );
        (StatusCode::FORBIDDEN, self.1)
    }
}

/// Why a grant could not be decided: the apiserver did not answer.
pub type Unknown = String;

/// The apiserver's half of a grant: `pod` exists under its UID, bound to a Node `caller`
/// acts as.
pub async fn pod_is_callers(
    pods: &dyn PodLookup,
    caller: &str,
    pod: &WakingPod,
) -> Result<Result<(), Denied>, Unknown> {
    let denied = |why: String| Ok(Err(Denied(Refusal::NotTheWakingNode, why)));
    let found = pods
        .pod(&pod.namespace, &pod.name)
        .await
        .map_err(|e| format!("looking up pod {}/{}: {e}", pod.namespace, pod.name))?;
    let Some(found) = found else {
        return denied(format!("there is no pod {}/{}", pod.namespace, pod.name));
    };
    if found.uid != pod.uid {
        return denied(format!(
            "pod {}/{} is not uid {}",
            pod.namespace, pod.name, pod.uid
        ));
    }
    match found.node.as_deref() {
        Some(node) if acts_as(caller, node) => Ok(Ok(())),
        _ => denied(format!(
            "pod {}/{} is not bound to a node {caller} acts as",
            pod.namespace, pod.name
        )),
    }
}

/// The snapshot's half: its owner record is of the pod's namespace.
pub fn snapshot_is_pods(description: &str, name: &str, pod: &WakingPod) -> Result<(), Denied> {
    match owner_namespace(description) {
        Some(ns) if ns == pod.namespace => Ok(()),
        Some(_) => Err(Denied(
            Refusal::ForeignSnapshot,
            format!(
                "snapshot {name} belongs to another namespace than {}",
                pod.namespace
            ),
        )),
        None => Err(Denied(
            Refusal::ForeignSnapshot,
            format!(
                "snapshot {name} carries no owner record; peers serve only a pod's own snapshots"
            ),
        )),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    caller: String,
    pod: WakingPod,
    snapshot_id: String,
}

struct Grant {
    checked: Instant,
    used: Instant,
}

/// What a slice finds for its caller, pod and snapshot.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Confirmed within the recheck interval.
    Granted,
    /// Due for the apiserver again; this slice is the one to ask (the others go on meanwhile).
    Recheck,
    /// No plan granted it, it went idle, or a recheck revoked it.
    None,
}

/// The grants plans left for their slices.
pub struct Grants {
    map: Mutex<HashMap<Key, Grant>>,
    recheck: Duration,
}

impl Default for Grants {
    fn default() -> Self {
        Grants::with_recheck(RECHECK)
    }
}

impl Grants {
    /// Another interval than [`RECHECK`]: for tests that watch a grant revoked.
    pub fn with_recheck(recheck: Duration) -> Grants {
        Grants {
            map: Mutex::default(),
            recheck,
        }
    }

    fn key(caller: &str, pod: &WakingPod, snapshot_id: &str) -> Key {
        Key {
            caller: caller.to_string(),
            pod: pod.clone(),
            snapshot_id: snapshot_id.to_string(),
        }
    }

    /// After a plan passed both halves. `false` when [`MAX_GRANTS`] live grants fill the
    /// table.
    pub fn grant(&self, caller: &str, pod: &WakingPod, snapshot_id: &str, now: Instant) -> bool {
        let mut map = self.map.lock().expect("grants lock");
        let key = Grants::key(caller, pod, snapshot_id);
        if !map.contains_key(&key) && map.len() >= MAX_GRANTS {
            map.retain(|_, g| now.saturating_duration_since(g.used) < IDLE);
            if map.len() >= MAX_GRANTS {
                return false;
            }
        }
        map.insert(
            key,
            Grant {
                checked: now,
                used: now,
            },
        );
        true
    }

    /// A slice's standing; a stale grant is marked checked, so only one slice at a time asks
    /// the apiserver again.
    pub fn standing(
        &self,
        caller: &str,
        pod: &WakingPod,
        snapshot_id: &str,
        now: Instant,
    ) -> Standing {
        let mut map = self.map.lock().expect("grants lock");
        let key = Grants::key(caller, pod, snapshot_id);
        let Some(g) = map.get_mut(&key) else {
            return Standing::None;
        };
        if now.saturating_duration_since(g.used) >= IDLE {
            map.remove(&key);
            return Standing::None;
        }
        g.used = now;
        if now.saturating_duration_since(g.checked) < self.recheck {
            return Standing::Granted;
        }
        g.checked = now;
        Standing::Recheck
    }

    /// A recheck that did not confirm the pod: the grant goes.
    pub fn revoke(&self, caller: &str, pod: &WakingPod, snapshot_id: &str) {
        let mut map = self.map.lock().expect("grants lock");
        map.remove(&Grants::key(caller, pod, snapshot_id));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().expect("grants lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> WakingPod {
        WakingPod {
            namespace: "team-a".into(),
            name: "victim".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn a_host_acts_as_itself_and_its_cocoon_node_only() {
        assert!(acts_as("node-a", "node-a"));
        assert!(acts_as("node-a", "node-a-cocoon"));
        assert!(!acts_as("", "-cocoon") && !acts_as("", ""));
        for other in [
            "node-b",
            "node-b-cocoon",
            "node-a-cocoon-cocoon",
            "xnode-a",
            "node-a-",
            "",
        ] {
            assert!(!acts_as("node-a", other), "{other}");
        }
    }

    #[test]
    fn only_an_owner_record_of_the_pod_s_namespace_counts() {
        let p = pod();
        assert_eq!(
            snapshot_is_pods("vk-cocoon owner=team-a/victim", "vm", &p),
            Ok(())
        );
        assert_eq!(
            snapshot_is_pods("vk-cocoon owner=team-a/other-pod", "vm", &p),
            Ok(())
        );
        for d in [
            "vk-cocoon owner=team-b/victim",
            "",
            "ubuntu base",
            "vk-cocoon owner=team-a",
        ] {
            let err = snapshot_is_pods(d, "vm", &p).unwrap_err();
            assert_eq!(err.0, Refusal::ForeignSnapshot, "{d:?}");
        }
    }

    #[test]
    fn a_pod_claim_needs_all_three_parts() {
        let q = |pairs: &'static [(&'static str, &'static str)]| {
            WakingPod::from_query(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v))
        };
        assert_eq!(
            q(&[("namespace", "team-a"), ("pod", "victim"), ("uid", "u-1")]),
            Some(pod())
        );
        assert_eq!(q(&[("namespace", "team-a"), ("pod", "victim")]), None);
        assert_eq!(
            q(&[("namespace", ""), ("pod", "victim"), ("uid", "u")]),
            None
        );
        assert_eq!(
            q(&[("namespace", "a/b"), ("pod", "victim"), ("uid", "u")]),
            None
        );
        assert_eq!(q(&[]), None);
    }

    #[test]
    fn a_grant_is_the_caller_s_for_that_pod_and_snapshot_and_is_rechecked() {
        let g = Grants::default();
        let t0 = Instant::now();
        assert!(g.grant("node-b", &pod(), "ID", t0));
        assert_eq!(g.standing("node-b", &pod(), "ID", t0), Standing::Granted);
        assert_eq!(g.standing("node-c", &pod(), "ID", t0), Standing::None);
        assert_eq!(g.standing("node-b", &pod(), "OTHER", t0), Standing::None);
        let other_uid = WakingPod {
            uid: "u-2".into(),
            ..pod()
        };
        assert_eq!(g.standing("node-b", &other_uid, "ID", t0), Standing::None);
        // Past the recheck interval one slice asks again, the next ones go on.
        let later = t0 + RECHECK;
        assert_eq!(g.standing("node-b", &pod(), "ID", later), Standing::Recheck);
        assert_eq!(g.standing("node-b", &pod(), "ID", later), Standing::Granted);
        g.revoke("node-b", &pod(), "ID");
        assert_eq!(g.standing("node-b", &pod(), "ID", later), Standing::None);
        // An idle grant is gone.
        assert!(g.grant("node-b", &pod(), "ID", t0));
        assert_eq!(
            g.standing("node-b", &pod(), "ID", t0 + IDLE),
            Standing::None
        );
    }

    #[test]
    fn the_table_is_bounded_and_makes_room_from_idle_grants() {
        let g = Grants::default();
        let t0 = Instant::now();
        for i in 0..MAX_GRANTS {
            assert!(g.grant("node-b", &pod(), &format!("ID{i}"), t0));
        }
        assert!(!g.grant("node-b", &pod(), "ONE-MORE", t0));
        // A grant already held is renewed, not added.
        assert!(g.grant("node-b", &pod(), "ID0", t0));
        assert!(g.grant("node-b", &pod(), "ONE-MORE", t0 + IDLE));
        assert_eq!(g.len(), 1);
    }
}
