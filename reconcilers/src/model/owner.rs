//! Who owns a snapshot (T5–T8). VM names are global across nodes and namespaces, so a name
//! alone proves nothing about whose machine a snapshot holds: every snapshot the daemon makes
//! carries an owner record (the pod's namespace and name) where every node can read it — in
//! the local snapshot's description and in the registry manifest's annotations — and every
//! clone, pull, push, restore and removal checks it. A snapshot without a record is a public
//! base only when the node's configuration lists its repository (T15); otherwise it is
//! nobody's to use, since nothing says whose machine it holds.
//!
//! Formats, parsed strictly (anything else that claims to be a record is unreadable, and an
//! unreadable record is nobody's to use):
//! - local description: `vk-cocoon owner=<namespace>/<pod>[@<namespace UID>]`;
//! - manifest annotation `cocoonstack.snapshot.owner`: `<namespace>/<pod>[@<namespace UID>]`.
//!
//! The namespace's UID tells a namespace from an earlier one of the same name (deleted and
//! made again): names are reused, UIDs never are. Records written before the UID was known
//! carry none and match by name.

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
    /// The namespace's UID when it was known (T16).
    pub namespace_uid: Option<String>,
}

/// Who asks to use or replace a snapshot: a pod's namespace, and its UID when the node knows
/// it.
#[derive(Clone, Copy, Debug)]
pub struct Tenant<'a> {
    pub namespace: &'a str,
    pub uid: Option<&'a str>,
}

impl<'a> Tenant<'a> {
    /// Whether a record of `namespace` (UID `uid`) is this tenant's: the same name, and the
    /// same namespace, not an earlier one of that name, whenever both UIDs are known.
    pub fn is(&self, namespace: &str, uid: Option<&str>) -> bool {
        self.namespace == namespace
            && match (self.uid, uid) {
                (Some(mine), Some(theirs)) => mine == theirs,
                _ => true,
            }
    }
}

/// A Kubernetes UID as the apiserver writes them (a UUID), checked loosely: lowercase hex
/// digits and dashes.
fn uid_like(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase() || c == b'-')
}

/// What a snapshot says about its owner, read with the node's list of public bases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// No record, and the node lists its repository as a public base (T15): anyone may use
    /// it, no pod replaces or removes it.
    Public,
    /// No record, read under a configuration from before public bases were listed: anyone
    /// may use or replace it, as was decided then (kept so old journals replay as they ran).
    Legacy,
    /// No record and not listed: made before records existed, or by other tools. Nothing
    /// says whose it is, so no pod uses, replaces or removes it until an operator lists it
    /// as public or records its owner.
    Unrecorded,
    Owned(Owner),
    /// Something that claims to be a record but does not parse.
    Unreadable(String),
}

/// T15: which snapshots without an owner record are public bases (`VK_PUBLIC_SNAPSHOTS`).
#[derive(Clone, Copy, Debug)]
pub enum Bases<'a> {
    /// A configuration from before the list: every record-less snapshot counted as public.
    Legacy,
    /// Repository names; a local snapshot `<repo>` or `<repo>:<tag>` is of that repository.
    Listed(&'a [String]),
}

impl<'a> Bases<'a> {
    pub fn of(list: Option<&'a Vec<String>>) -> Bases<'a> {
        match list {
            None => Bases::Legacy,
            Some(l) => Bases::Listed(l),
        }
    }

    /// Whether the local snapshot or repository `name` is a listed public base.
    pub fn lists(self, name: &str) -> bool {
        match self {
            Bases::Legacy => false,
            Bases::Listed(l) => l.iter().any(|b| {
                name == b
                    || name
                        .strip_prefix(b.as_str())
                        .is_some_and(|rest| rest.starts_with(':'))
            }),
        }
    }

    /// What a snapshot called `name` without a record is.
    fn unrecorded(self, name: &str) -> Record {
        match self {
            Bases::Legacy => Record::Legacy,
            Bases::Listed(_) if self.lists(name) => Record::Public,
            Bases::Listed(_) => Record::Unrecorded,
        }
    }
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
    /// The pod `key`, its namespace's UID `namespace_uid` when the node knows it.
    pub fn of(key: &PodKey, namespace_uid: Option<&str>) -> Owner {
        Owner {
            namespace: key.namespace().to_string(),
            pod: key.name().to_string(),
            namespace_uid: namespace_uid.map(str::to_string),
        }
    }

    /// `<namespace>/<pod>[@<uid>]`: the annotation's value and the tail of the description.
    pub fn record(&self) -> String {
        match &self.namespace_uid {
            None => format!("{}/{}", self.namespace, self.pod),
            Some(uid) => format!("{}/{}@{uid}", self.namespace, self.pod),
        }
    }

    /// The local snapshot description that carries this record.
    pub fn description(&self) -> String {
        format!("{DESCRIPTION_PREFIX}{}", self.record())
    }

    /// `<namespace>/<pod>[@<uid>]`, both names valid Kubernetes names, the UID UID-like,
    /// nothing else.
    pub fn parse(record: &str) -> Option<Owner> {
        let (names, uid) = match record.split_once('@') {
            Some((names, uid)) => (names, Some(uid)),
            None => (record, None),
        };
        let (namespace, pod) = names.split_once('/')?;
        let valid = dns_label(namespace) && dns_subdomain(pod) && uid.is_none_or(uid_like);
        valid.then(|| Owner {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            namespace_uid: uid.map(str::to_string),
        })
    }
}

impl Record {
    /// From the local snapshot `name`'s description: a description that does not start with
    /// the prefix is no record at all (a public base may carry any description).
    pub fn from_description(description: &str, name: &str, bases: Bases) -> Record {
        match description.strip_prefix(DESCRIPTION_PREFIX) {
            None => bases.unrecorded(name),
            Some(rest) => match Owner::parse(rest) {
                Some(o) => Record::Owned(o),
                None => Record::Unreadable(description.to_string()),
            },
        }
    }

    /// From the manifest annotation's value in repository `repo`, when the annotation is
    /// there.
    pub fn from_annotation(value: Option<&str>, repo: &str, bases: Bases) -> Record {
        match value {
            None => bases.unrecorded(repo),
            Some(v) => match Owner::parse(v) {
                Some(o) => Record::Owned(o),
                None => Record::Unreadable(v.to_string()),
            },
        }
    }

    /// T6: whether a pod of `namespace` may use (clone, pull, restore) the snapshot `what`;
    /// `Err` says why not, in words for the pod's message, which name no other namespace: a
    /// refusal must not tell a tenant what another namespace keeps.
    pub fn usable_by(&self, tenant: Tenant, what: &str) -> Result<(), String> {
        match self {
            Record::Public | Record::Legacy => Ok(()),
            Record::Owned(o) if tenant.is(&o.namespace, o.namespace_uid.as_deref()) => Ok(()),
            // T16: the same name, another namespace: one deleted and made again.
            Record::Owned(o) if o.namespace == tenant.namespace => Err(format!(
                "{what} belongs to an earlier namespace of this name (deleted and made again)"
            )),
            Record::Owned(_) => Err(format!("{what} belongs to another namespace")),
            Record::Unrecorded => Err(format!("{what} {UNRECORDED}")),
            Record::Unreadable(r) => Err(format!(
                "{what} carries an unreadable owner record {r:?}, so no pod may use it"
            )),
        }
    }

    /// T8, T15: whether a pod of `namespace` may remove or replace the snapshot `what` (a
    /// save, an import or a push over it). A public base never is: it serves every tenant.
    pub fn replaceable_by(&self, tenant: Tenant, what: &str) -> Result<(), String> {
        match self {
            Record::Legacy => Ok(()),
            Record::Public => Err(format!(
                "{what} is a public base, which no pod replaces or removes"
            )),
            Record::Owned(_) | Record::Unrecorded | Record::Unreadable(_) => {
                self.usable_by(tenant, what)
            }
        }
    }
}

/// Why a snapshot without a record is refused, and what lifts the refusal.
const UNRECORDED: &str = "has no owner record and is not a listed public base, so no pod may use \
     or replace it (an operator lists public bases in VK_PUBLIC_SNAPSHOTS or records the owner \
     with `vk-cocoon snapshots own`)";

#[cfg(test)]
mod tests {
    use super::*;

    fn t(namespace: &str) -> Tenant<'_> {
        Tenant {
            namespace,
            uid: None,
        }
    }

    #[test]
    fn a_namespace_made_again_under_the_same_name_is_another_tenant() {
        let key = PodKey::new("team-a", "v");
        let o = Owner::of(&key, Some("0a1b-22"));
        assert_eq!(o.record(), "team-a/v@0a1b-22");
        let none = Bases::Listed(&[]);
        let r = Record::from_description(&o.description(), "v", none);
        assert_eq!(r, Record::Owned(o.clone()));
        let same = Tenant {
            namespace: "team-a",
            uid: Some("0a1b-22"),
        };
        let again = Tenant {
            namespace: "team-a",
            uid: Some("9f9f-33"),
        };
        assert!(r.usable_by(same, "x").is_ok());
        assert_eq!(
            r.usable_by(again, "x").unwrap_err(),
            "x belongs to an earlier namespace of this name (deleted and made again)"
        );
        assert!(r.replaceable_by(again, "x").is_err());
        // Either side unknown (a record from before UIDs, a node that cannot read
        // namespaces): the name decides, as before.
        assert!(r.usable_by(t("team-a"), "x").is_ok());
        let old = Record::from_annotation(Some("team-a/v"), "v", none);
        assert!(old.usable_by(again, "x").is_ok());
        for bad in [
            "team-a/v@",
            "team-a/v@ABC",
            "team-a/v@a b",
            "team-a/v@x/y",
            "team-a@1/v",
        ] {
            assert!(
                matches!(
                    Record::from_annotation(Some(bad), "v", none),
                    Record::Unreadable(_)
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn records_round_trip_and_parse_strictly() {
        let o = Owner::of(&PodKey::new("team-a", "victim-0"), None);
        assert_eq!(o.record(), "team-a/victim-0");
        assert_eq!(o.description(), "vk-cocoon owner=team-a/victim-0");
        let none = Bases::Listed(&[]);
        assert_eq!(
            Record::from_description(&o.description(), "v", none),
            Record::Owned(o.clone())
        );
        assert_eq!(
            Record::from_annotation(Some("team-a/victim-0"), "v", none),
            Record::Owned(o)
        );
        assert_eq!(Record::from_description("", "v", none), Record::Unrecorded);
        assert_eq!(
            Record::from_description("ubuntu base", "v", Bases::Legacy),
            Record::Legacy
        );
        assert_eq!(Record::from_annotation(None, "v", none), Record::Unrecorded);
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
                matches!(
                    Record::from_description(bad, "v", none),
                    Record::Unreadable(_)
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Record::from_annotation(Some(""), "v", none),
            Record::Unreadable(_)
        ));
    }

    #[test]
    fn only_listed_repositories_without_a_record_are_public() {
        let list = vec!["ubuntu".to_string(), "bases/win11".to_string()];
        let bases = Bases::Listed(&list);
        for public in ["ubuntu", "ubuntu:24.04", "bases/win11", "bases/win11:v2"] {
            assert_eq!(Record::from_description("", public, bases), Record::Public);
        }
        for not in ["ubuntu-2", "ubuntux:1", "bases", "win11", "x:ubuntu"] {
            assert_eq!(
                Record::from_description("", not, bases),
                Record::Unrecorded,
                "{not}"
            );
        }
        // A record wins over the list: a pod's snapshot is its namespace's.
        assert!(matches!(
            Record::from_description("vk-cocoon owner=team-a/p", "ubuntu", bases),
            Record::Owned(_)
        ));
    }

    #[test]
    fn a_public_base_serves_everyone_and_no_pod_replaces_it() {
        let p = Record::Public;
        assert!(p.usable_by(t("team-b"), "x").is_ok());
        assert_eq!(
            p.replaceable_by(t("team-a"), "snapshot \"ubuntu\"")
                .unwrap_err(),
            "snapshot \"ubuntu\" is a public base, which no pod replaces or removes"
        );
        let u = Record::Unrecorded;
        assert!(u.usable_by(t("team-a"), "x").is_err());
        assert!(u.replaceable_by(t("team-a"), "x").is_err());
        let legacy = Record::Legacy;
        assert!(legacy.usable_by(t("team-b"), "x").is_ok());
        assert!(legacy.replaceable_by(t("team-b"), "x").is_ok());
        let owned = Record::Owned(Owner::of(&PodKey::new("team-a", "v"), None));
        assert!(owned.replaceable_by(t("team-a"), "x").is_ok());
        assert!(owned.replaceable_by(t("team-b"), "x").is_err());
    }

    #[test]
    fn only_the_owning_namespace_uses_an_owned_snapshot() {
        let owned = Record::from_annotation(Some("team-a/victim"), "v", Bases::Legacy);
        assert!(owned.usable_by(t("team-a"), "x").is_ok());
        let err = owned.usable_by(t("team-b"), "snapshot x").unwrap_err();
        assert_eq!(err, "snapshot x belongs to another namespace");
        assert!(Record::Public.usable_by(t("team-b"), "x").is_ok());
        assert!(Record::from_annotation(Some("bad"), "v", Bases::Legacy)
            .usable_by(t("team-a"), "x")
            .is_err());
    }
}
