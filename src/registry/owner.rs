//! T7: the owner record a snapshot's manifest carries (`cocoonstack.snapshot.owner`, see
//! `reconcilers::owner`), checked next to every transfer: a pull for a namespace that does not
//! own the tag, and a push that would replace another namespace's tag, are refused before
//! anything moves. The core decides first; these checks are the shell's own preconditions, so
//! a core that asked wrongly still cannot hand one tenant's machine to another.

use reconcilers::owner::Record;

use super::{media, Manifest, Registry, RegistryError};

/// The owner record `m` carries (none: a public base).
pub fn record_of(m: &Manifest) -> Record {
    Record::from_annotation(m.annotations.get(media::ANN_OWNER).map(String::as_str))
}

/// What a tag holds now, as far as ownership goes.
pub struct Current {
    pub record: Record,
    /// The digest the tag points at, so a transfer can pin what was checked.
    pub digest: String,
}

impl Registry {
    /// The owner record of `name:tag` now; `None` when the tag does not exist.
    pub async fn current_owner(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<Current>, RegistryError> {
        match self.resolve(name, tag, true).await {
            Ok(r) => Ok(Some(Current {
                record: record_of(&r.manifest),
                digest: r.digest,
            })),
            Err(RegistryError::Absent(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// T7: a pull of `name:tag` for a pod of `namespace`.
pub fn check_pull(
    record: &Record,
    namespace: &str,
    name: &str,
    tag: &str,
) -> Result<(), RegistryError> {
    record
        .usable_by(namespace, &format!("{name}:{tag}"))
        .map_err(RegistryError::Foreign)
}

/// T7: a push by `owner` (`<namespace>/<pod>`) over what `name:tag` holds now: another
/// namespace's snapshot (or an unreadable record) is never replaced; a public or absent tag,
/// or one of the pusher's own namespace, may be.
pub fn check_push(
    current: Option<&Record>,
    owner: &str,
    name: &str,
    tag: &str,
) -> Result<(), RegistryError> {
    let Some(pusher) = reconcilers::owner::Owner::parse(owner) else {
        return Err(RegistryError::Refused(format!(
            "push of {name}:{tag}: {owner:?} is not an owner record <namespace>/<pod>"
        )));
    };
    match current {
        None => Ok(()),
        Some(record) => record
            .usable_by(&pusher.namespace, &format!("{name}:{tag}"))
            .map_err(|why| RegistryError::Foreign(format!("{why}; it is not replaced"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_and_pushes_stay_inside_the_owning_namespace() {
        let owned = Record::from_annotation(Some("team-a/victim"));
        assert!(check_pull(&owned, "team-a", "v", "latest").is_ok());
        assert!(check_pull(&Record::Public, "team-b", "base", "latest").is_ok());
        match check_pull(&owned, "team-b", "v", "hibernate") {
            Err(RegistryError::Foreign(m)) => {
                assert_eq!(m, "v:hibernate belongs to another namespace")
            }
            other => panic!("{other:?}"),
        }
        assert!(check_push(None, "team-b/x", "v", "latest").is_ok());
        assert!(check_push(Some(&Record::Public), "team-b/x", "v", "latest").is_ok());
        assert!(check_push(Some(&owned), "team-a/other", "v", "latest").is_ok());
        assert!(matches!(
            check_push(Some(&owned), "team-b/x", "v", "hibernate"),
            Err(RegistryError::Foreign(_))
        ));
        assert!(matches!(
            check_push(None, "no-slash", "v", "latest"),
            Err(RegistryError::Refused(_))
        ));
    }
}
