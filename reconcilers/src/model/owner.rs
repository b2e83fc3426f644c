//! Who owns a snapshot (T5–T8). VM names are global across nodes and namespaces, so a name
//! alone proves nothing about whose machine a snapshot holds: every snapshot the daemon makes
//! carries an owner record (the pod's namespace and name) where every node can read it — in
//! the local snapshot's description and in the registry manifest's annotations — and every
//! clone, pull, push, restore and removal checks it. A snapshot without a record is a public
//! base (T5).
//!
//! Formats, parsed strictly (anything else that claims to be a record is unreadable, and an
//! unreadable record is nobody's to use):
//! - local description: `vk-cocoon owner=<namespace>/<pod>`;
//! - manifest annotation `cocoonstack.snapshot.owner`: `<namespace>/<pod>`.

use crate::pod::PodKey;

/// What a local description starts with when it carries an owner record.
pub const DESCRIPTION_PREFIX: &str = "vk-cocoon owner=";
/// The manifest annotation holding the owner record.
pub const ANNOTATION: &str = "cocoonstack.snapshot.owner";

/// The pod a snapshot was made for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub namespace: String,
    pub pod: String,
}

/// What a snapshot says about its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// No record: a base the platform published with its own tools.
    Public,
    Owned(Owner),
    /// Something that claims to be a record but does not parse.
    Unreadable(String),
}

/// A Kubernetes namespace: a DNS-1123 label.
fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A pod name: a DNS-1123 subdomain.
fn dns_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
}

impl Owner {
    pub fn of(key: &PodKey) -> Owner {
        Owner {
            namespace: key.namespace().to_string(),
            pod: key.name().to_string(),
        }
    }

    /// `<namespace>/<pod>`: the annotation's value and the tail of the description.
    pub fn record(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }

    /// The local snapshot description that carries this record.
    pub fn description(&self) -> String {
        format!("{DESCRIPTION_PREFIX}{}", self.record())
    }

    /// `<namespace>/<pod>`, both parts valid Kubernetes names, nothing else.
    pub fn parse(record: &str) -> Option<Owner> {
        let (namespace, pod) = record.split_once('/')?;
        (dns_label(namespace) && dns_subdomain(pod)).then(|| Owner {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
        })
    }
}

impl Record {
    /// From a local snapshot's description: a description that does not start with the
    /// prefix is no record at all (a public base may carry any description).
    pub fn from_description(description: &str) -> Record {
        match description.strip_prefix(DESCRIPTION_PREFIX) {
            None => Record::Public,
            Some(rest) => match Owner::parse(rest) {
                Some(o) => Record::Owned(o),
                None => Record::Unreadable(description.to_string()),
            },
        }
    }

    /// From the manifest annotation's value, when the annotation is there.
    pub fn from_annotation(value: Option<&str>) -> Record {
        match value {
            None => Record::Public,
            Some(v) => match Owner::parse(v) {
                Some(o) => Record::Owned(o),
                None => Record::Unreadable(v.to_string()),
            },
        }
    }

    /// T6: whether a pod of `namespace` may use (clone, pull, restore) the snapshot `what`;
    /// `Err` says why not, in words for the pod's message, which name no other namespace: a
    /// refusal must not tell a tenant what another namespace keeps.
    pub fn usable_by(&self, namespace: &str, what: &str) -> Result<(), String> {
        match self {
            Record::Public => Ok(()),
            Record::Owned(o) if o.namespace == namespace => Ok(()),
            Record::Owned(_) => Err(format!("{what} belongs to another namespace")),
            Record::Unreadable(r) => Err(format!(
                "{what} carries an unreadable owner record {r:?}, so no pod may use it"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_parse_strictly() {
        let o = Owner::of(&PodKey::new("team-a", "victim-0"));
        assert_eq!(o.record(), "team-a/victim-0");
        assert_eq!(o.description(), "vk-cocoon owner=team-a/victim-0");
        assert_eq!(
            Record::from_description(&o.description()),
            Record::Owned(o.clone())
        );
        assert_eq!(
            Record::from_annotation(Some("team-a/victim-0")),
            Record::Owned(o)
        );
        assert_eq!(Record::from_description(""), Record::Public);
        assert_eq!(Record::from_description("ubuntu base"), Record::Public);
        assert_eq!(Record::from_annotation(None), Record::Public);
        for bad in [
            "vk-cocoon owner=",
            "vk-cocoon owner=team-a",
            "vk-cocoon owner=team-a/",
            "vk-cocoon owner=/pod",
            "vk-cocoon owner=Team-A/pod",
            "vk-cocoon owner=team-a/pod/x",
            "vk-cocoon owner=team-a/pod ",
            "vk-cocoon owner=team-a/-pod",
        ] {
            assert!(
                matches!(Record::from_description(bad), Record::Unreadable(_)),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Record::from_annotation(Some("")),
            Record::Unreadable(_)
        ));
    }

    #[test]
    fn only_the_owning_namespace_uses_an_owned_snapshot() {
        let owned = Record::from_annotation(Some("team-a/victim"));
        assert!(owned.usable_by("team-a", "x").is_ok());
        let err = owned.usable_by("team-b", "snapshot x").unwrap_err();
        assert_eq!(err, "snapshot x belongs to another namespace");
        assert!(Record::Public.usable_by("team-b", "x").is_ok());
        assert!(Record::from_annotation(Some("bad"))
            .usable_by("team-a", "x")
            .is_err());
    }
}
