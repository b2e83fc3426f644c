//! Who holds each VM on this node (T11). A VM name says nothing about whose machine it is:
//! any tenant may write any name on its pod. So the core records, by VM name, the pod (its
//! UID, namespace and name) that a VM was made, cloned, woken or adopted for, at the moment it
//! asks cocoon for it, and every later decision that hands a VM to a pod — the startup claim,
//! an orphan kept under `alert`/`keep`, a create that committed while the process was down,
//! the VM found after "name already exists", a macOS guest — reads that record, never the
//! name alone.
//!
//! The table is state, so every journal header carries it, and each change goes out as an
//! [`crate::action::Action::Hold`] line; a restarted process reads both back from its journal
//! and hands the table to the core as its first event, before any decision is made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pod::PodKey;

/// The pod a VM is held for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    pub uid: String,
    pub namespace: String,
    pub pod: String,
    /// T16: the namespace's UID when the node knew it, so that a namespace deleted and made
    /// again under the same name is not the holder's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_uid: Option<String>,
}

/// One record: the holder, and the VM's id once cocoon has named it (`None` while the create
/// that makes it is out).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Held {
    #[serde(flatten)]
    pub holder: Holder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// D10: the holder was deleted by an eviction its tenant did not ask for, and the VM is
    /// kept for the next pod of its namespace that names it; no orphan policy removes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

/// What the record lets a pod do with a VM it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The record names this very pod.
    Holder,
    /// The record names another pod of the same namespace (a successor: a StatefulSet's or a
    /// controller's replacement, a pod made again after a keep-on-delete).
    Namespace,
    /// No record for this VM: made before records existed, or the records were lost.
    Unrecorded,
    /// The record names a pod of another namespace.
    Refused,
}

impl Holder {
    /// The pod `key` (UID `uid`) of `tenant`, the pod's namespace as the node knows it.
    pub fn of(key: &PodKey, uid: &str, tenant: crate::owner::Tenant) -> Holder {
        Holder {
            uid: uid.to_string(),
            namespace: key.namespace().to_string(),
            pod: key.name().to_string(),
            namespace_uid: tenant.uid.map(str::to_string),
        }
    }

    /// Whether the holder is a pod of `tenant`'s namespace (T16: not of an earlier namespace
    /// of the same name).
    pub fn of_tenant(&self, tenant: crate::owner::Tenant) -> bool {
        tenant.is(&self.namespace, self.namespace_uid.as_deref())
    }
}

/// The records, by VM name (cocoon keeps names unique on a host).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Holders(BTreeMap<String, Held>);

impl Holders {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, name: &str) -> Option<&Held> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Held)> {
        self.0.iter()
    }

    /// The record of VM `name` with id `id`: one made for another VM of that name (its id
    /// differs) is no record of this one.
    pub fn of_vm(&self, name: &str, id: &str) -> Option<&Holder> {
        self.0
            .get(name)
            .filter(|h| h.id.as_deref().is_none_or(|i| i == id))
            .map(|h| &h.holder)
    }

    /// Sets or clears a record; whether anything changed.
    pub fn set(&mut self, name: &str, held: Option<Held>) -> bool {
        match held {
            Some(h) if self.0.get(name) == Some(&h) => false,
            Some(h) => {
                self.0.insert(name.to_string(), h);
                true
            }
            None => self.0.remove(name).is_some(),
        }
    }
}

impl FromIterator<(String, Held)> for Holders {
    fn from_iter<I: IntoIterator<Item = (String, Held)>>(iter: I) -> Self {
        Holders(iter.into_iter().collect())
    }
}

/// T11, T16: what `record` lets the pod `key` (UID `uid`) of `tenant` do with the VM.
pub fn grant(
    record: Option<&Holder>,
    (key, uid): (&PodKey, &str),
    tenant: crate::owner::Tenant,
) -> Grant {
    match record {
        None => Grant::Unrecorded,
        Some(h) if h.namespace != key.namespace() || !h.of_tenant(tenant) => Grant::Refused,
        Some(h) if h.uid == uid => Grant::Holder,
        Some(_) => Grant::Namespace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(ns: &str, pod: &str, uid: &str, id: Option<&str>) -> Held {
        Held {
            holder: Holder {
                uid: uid.into(),
                namespace: ns.into(),
                pod: pod.into(),
                namespace_uid: None,
            },
            id: id.map(str::to_string),
            kept: false,
        }
    }

    #[test]
    fn a_record_of_another_vm_of_the_same_name_is_no_record() {
        let mut t = Holders::default();
        assert!(t.set("x", Some(held("a", "p", "u1", Some("V1")))));
        assert!(t.of_vm("x", "V1").is_some());
        assert!(t.of_vm("x", "V2").is_none());
        assert!(!t.set("x", Some(held("a", "p", "u1", Some("V1")))));
        assert!(t.set("x", Some(held("a", "p", "u1", None))));
        assert!(t.of_vm("x", "V2").is_some());
        assert!(t.set("x", None));
        assert!(!t.set("x", None));
    }

    #[test]
    fn only_the_holder_and_its_namespace_are_granted() {
        let h = held("a", "p", "u1", None).holder;
        let same = PodKey::new("a", "p");
        let successor = PodKey::new("a", "q");
        let other = PodKey::new("b", "p");
        let t = |ns| crate::owner::Tenant {
            namespace: ns,
            uid: None,
        };
        assert_eq!(grant(Some(&h), (&same, "u1"), t("a")), Grant::Holder);
        assert_eq!(grant(Some(&h), (&same, "u2"), t("a")), Grant::Namespace);
        assert_eq!(
            grant(Some(&h), (&successor, "u3"), t("a")),
            Grant::Namespace
        );
        assert_eq!(grant(Some(&h), (&other, "u1"), t("b")), Grant::Refused);
        assert_eq!(grant(None, (&other, "u1"), t("b")), Grant::Unrecorded);
    }

    #[test]
    fn a_namespace_made_again_under_the_same_name_holds_nothing() {
        let key = PodKey::new("a", "q");
        let first = crate::owner::Tenant {
            namespace: "a",
            uid: Some("ns-1"),
        };
        let again = crate::owner::Tenant {
            namespace: "a",
            uid: Some("ns-2"),
        };
        let h = Holder::of(&PodKey::new("a", "p"), "u1", first);
        assert_eq!(grant(Some(&h), (&key, "u2"), first), Grant::Namespace);
        assert_eq!(grant(Some(&h), (&key, "u2"), again), Grant::Refused);
        // A record from before namespace UIDs were known: the name decides.
        let old = held("a", "p", "u1", None).holder;
        assert_eq!(grant(Some(&old), (&key, "u2"), again), Grant::Namespace);
    }

    #[test]
    fn the_table_reads_back_from_its_json() {
        let t: Holders = [("x".to_string(), held("a", "p", "u1", Some("V1")))]
            .into_iter()
            .collect();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"x":{"uid":"u1","namespace":"a","pod":"p","id":"V1"}}"#
        );
        assert_eq!(serde_json::from_str::<Holders>(&json).unwrap(), t);
    }
}
