//! What the core knows of a Kubernetes pod: the shell translates the API object into this
//! compact view (no managedFields, no resourceVersion), so journals stay small and replay
//! does not depend on server bookkeeping.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::status::PodStatus;
use crate::time::Millis;

/// `namespace/name`. Serialized as that one string, so it can key a JSON map (the State's
/// pod table, which the journal snapshots into every file header).
///
/// One shared allocation holding `namespace`, a NUL and `name`: the pod table and every
/// index key on it, and the reducer clones and compares keys on every event, so a clone is
/// a reference count and a comparison one `memcmp`. Compares like the pair
/// `(namespace, name)` (a NUL sorts below every other byte; a namespace that itself holds a
/// NUL, which Kubernetes never allows, falls back to comparing the pair).
#[derive(Clone)]
pub struct PodKey {
    /// `namespace` NUL `name`.
    joined: Arc<str>,
    /// Length of the namespace.
    ns_len: u32,
    /// The namespace holds a NUL: the joined bytes do not order like the pair.
    ns_nul: bool,
}

impl PodKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        let (namespace, name) = (namespace.as_ref(), name.as_ref());
        let mut joined = String::with_capacity(namespace.len() + 1 + name.len());
        joined.push_str(namespace);
        joined.push('\0');
        joined.push_str(name);
        Self {
            joined: joined.into(),
            ns_len: namespace.len() as u32,
            ns_nul: namespace.contains('\0'),
        }
    }

    #[inline]
    pub fn namespace(&self) -> &str {
        &self.joined[..self.ns_len as usize]
    }

    #[inline]
    pub fn name(&self) -> &str {
        &self.joined[self.ns_len as usize + 1..]
    }
}

impl PartialEq for PodKey {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.ns_len == other.ns_len
            && (Arc::ptr_eq(&self.joined, &other.joined) || self.joined == other.joined)
    }
}

impl Eq for PodKey {}

impl Ord for PodKey {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        if Arc::ptr_eq(&self.joined, &other.joined) && self.ns_len == other.ns_len {
            return Ordering::Equal;
        }
        if self.ns_nul || other.ns_nul {
            return (self.namespace(), self.name()).cmp(&(other.namespace(), other.name()));
        }
        lexicographic(self.joined.as_bytes(), other.joined.as_bytes())
    }
}

/// `a.cmp(b)` for the short keys pods have, eight bytes at a time and inline: the pod
/// table is searched several times per event and a `memcmp` call cost more than the bytes.
#[inline]
fn lexicographic(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let (mut ca, mut cb) = (a[..n].chunks_exact(8), b[..n].chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        let x = u64::from_be_bytes(x.try_into().expect("8 bytes"));
        let y = u64::from_be_bytes(y.try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
    }
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

impl PartialOrd for PodKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for PodKey {
    #[inline]
    fn hash<H: Hasher>(&self, h: &mut H) {
        // The joined bytes and the split point: equal keys hash alike (see `eq`).
        h.write(self.joined.as_bytes());
        h.write_u32(self.ns_len);
    }
}

impl fmt::Debug for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodKey")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .finish()
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.name())
    }
}

impl Serialize for PodKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PodKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        // Neither a namespace nor a pod name can contain '/'.
        match s.split_once('/') {
            Some((ns, name)) if !name.contains('/') => Ok(PodKey::new(ns, name)),
            _ => Err(serde::de::Error::invalid_value(
                serde::de::Unexpected::Str(&s),
                &"namespace/name",
            )),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    pub name: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub resources: Resources,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<OwnerRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Millis>,
    /// D10: the reason of the pod's `DisruptionTarget` condition when it is true: why the
    /// cluster, not the tenant, is deleting it (`DeletionByTaintManager`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Millis>,
    /// `metadata.resourceVersion`, when it is the integer Kubernetes makes it: resource
    /// versions of one resource compare as integers since v1.35.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<u64>,
    /// The status as last seen on the server (only the fields vk owns).
    #[serde(default)]
    pub status: PodStatus,
}

impl PodView {
    pub fn key(&self) -> PodKey {
        PodKey::new(&self.namespace, &self.name)
    }

    pub fn annotation(&self, k: &str) -> Option<&str> {
        self.annotations.get(k).map(String::as_str)
    }

    /// Boolean annotations are on only for the exact string `true`.
    pub fn flag(&self, k: &str) -> bool {
        self.annotation(k) == Some("true")
    }

    /// `cocoonset.cocoonstack.io/generation`; missing or unparsable is 0.
    pub fn generation(&self) -> i64 {
        self.annotation(crate::keys::GENERATION)
            .and_then(|g| g.trim().parse().ok())
            .unwrap_or(0)
    }

    /// A copy of the pod older than `known`, the version a write of vk's own returned: the
    /// watch delivers the versions before that write's after it was answered.
    pub fn older_than(&self, known: Option<u64>) -> bool {
        matches!((self.resource_version, known), (Some(v), Some(k)) if v < k)
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self.status.phase.as_str(), "Succeeded" | "Failed")
    }

    /// The fields whose change makes the framework call UpdatePod (P2); status never does.
    pub fn same_desired(&self, other: &PodView) -> bool {
        self.uid == other.uid
            && self.annotations == other.annotations
            && self.labels == other.labels
            && self.containers == other.containers
            && self.node_selector == other.node_selector
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_key_is_one_string_and_can_key_a_json_map() {
        let k = PodKey::new("default", "web-0");
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"default/web-0\"");
        let map: BTreeMap<PodKey, u8> = [(k.clone(), 1)].into();
        let text = serde_json::to_string(&map).unwrap();
        assert_eq!(text, "{\"default/web-0\":1}");
        let back: BTreeMap<PodKey, u8> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, map);
        assert!(serde_json::from_str::<PodKey>("\"no-slash\"").is_err());
    }

    #[test]
    fn a_pod_key_orders_like_the_namespace_name_pair() {
        let pairs = [
            ("a", "x"),
            ("a-b", "x"),
            ("a", "x-y"),
            ("a", "x/y"),
            ("", "z"),
            ("a\0", "b"),
            ("a", "\0b"),
            ("ab", ""),
            ("a.b", "c"),
            ("default", "pod-00017"),
            ("default", "pod-00107"),
            ("default", "pod-0001"),
            ("defaults", "pod-0001"),
            ("kube-system", "coredns-abcdef-12345"),
            ("kube-system", "coredns-abcdef-12346"),
        ];
        for (n1, m1) in pairs {
            for (n2, m2) in pairs {
                let (k1, k2) = (PodKey::new(n1, m1), PodKey::new(n2, m2));
                assert_eq!(
                    k1.cmp(&k2),
                    (n1, m1).cmp(&(n2, m2)),
                    "{n1:?}/{m1:?} {n2:?}/{m2:?}"
                );
                assert_eq!(k1 == k2, (n1, m1) == (n2, m2));
                assert_eq!((k1.namespace(), k1.name()), (n1, m1));
            }
        }
    }
}
