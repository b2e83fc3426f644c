//! What the core knows of a Kubernetes pod: the shell translates the API object into this
//! compact view (no managedFields, no resourceVersion), so journals stay small and replay
//! does not depend on server bookkeeping.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::status::PodStatus;
use crate::time::Millis;

/// `namespace/name`. Serialized as that one string, so it can key a JSON map (the State's
/// pod table, which the journal snapshots into every file header).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Millis>,
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
}
