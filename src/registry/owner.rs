//! T7: the owner record a snapshot's manifest carries (`cocoonstack.snapshot.owner`, see
//! `reconcilers::owner`), checked next to every transfer: a pull for a namespace that does not
//! own the tag, and a push that would replace another namespace's tag, are refused before
//! anything moves. The core decides first; these checks are the shell's own preconditions, so
//! a core that asked wrongly still cannot hand one tenant's machine to another.

use reconcilers::owner::Record;

use super::{media, Manifest, Registry, RegistryError};

/// The owner record `m`, a manifest of repository `name`, carries.
pub fn record_of(m: &Manifest, name: &str, bases: reconcilers::owner::Bases) -> Record {
    let value = m.annotations.get(media::ANN_OWNER).map(String::as_str);
    Record::from_annotation(value, name, bases)
}

/// What a tag holds now, as far as ownership goes.
pub struct Current {
    pub record: Record,
    /// The digest the tag points at, so a transfer can pin what was checked.
    pub digest: String,
}

impl Registry {
    /// The upgrade path of T15: records `owner` (`<namespace>/<pod>`) on `name:tag`, a tag
    /// without a record, by re-PUTting its manifest with the owner annotation; nothing else
    /// changes and no blob moves. A tag that already has a record is left as it is (a
    /// record is never rewritten: it is what keeps tenants apart). Returns the new digest.
    pub async fn record_owner(
        &self,
        name: &str,
        tag: &str,
        owner: &reconcilers::owner::Owner,
    ) -> Result<String, RegistryError> {
        let resolved = self.resolve(name, tag, false).await?;
        let value = resolved.manifest.annotations.get(media::ANN_OWNER);
        if let Some(v) = value {
            return Err(RegistryError::Refused(format!(
                "{name}:{tag} already carries the owner record {v:?}; a record is never rewritten"
            )));
        }
        let r = self.reference(name, &super::reference::Target::Tag(tag.to_string()))?;
        let record = owner.record();
        self.add_annotation(name, &r, &resolved.digest, (media::ANN_OWNER, &record))
            .await
    }

    /// The owner record of `name:tag` now; `None` when the tag does not exist.
    pub async fn current_owner(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<Current>, RegistryError> {
        match self.resolve(name, tag, true).await {
            Ok(r) => Ok(Some(Current {
                record: record_of(&r.manifest, name, self.bases()),
                digest: r.digest,
            })),
            Err(RegistryError::Absent(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// T7, T16: a pull of `name:tag` for a pod of `tenant`.
pub fn check_pull(
    record: &Record,
    tenant: reconcilers::owner::Tenant,
    name: &str,
    tag: &str,
) -> Result<(), RegistryError> {
    record
        .usable_by(tenant, &format!("{name}:{tag}"))
        .map_err(RegistryError::Foreign)
}

/// T7, T15: a push by `owner` (`<namespace>/<pod>`) over what `name:tag` holds now: only an
/// absent tag or one of the pusher's own namespace is replaced; another namespace's, a public
/// base, one without a record and an unreadable one never are.
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
            .replaceable_by(
                reconcilers::owner::Tenant {
                    namespace: &pusher.namespace,
                    uid: pusher.namespace_uid.as_deref(),
                },
                &format!("{name}:{tag}"),
            )
            .map_err(|why| RegistryError::Foreign(format!("{why}; it is not replaced"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::owner::{Bases, Tenant};

    fn t(namespace: &str) -> Tenant<'_> {
        Tenant {
            namespace,
            uid: None,
        }
    }

    #[test]
    fn pulls_and_pushes_stay_inside_the_owning_namespace() {
        let owned = Record::from_annotation(Some("team-a/victim"), "v", Bases::Listed(&[]));
        assert!(check_pull(&owned, t("team-a"), "v", "latest").is_ok());
        assert!(check_pull(&Record::Public, t("team-b"), "base", "latest").is_ok());
        match check_pull(&owned, t("team-b"), "v", "hibernate") {
            Err(RegistryError::Foreign(m)) => {
                assert_eq!(m, "v:hibernate belongs to another namespace")
            }
            other => panic!("{other:?}"),
        }
        assert!(check_push(None, "team-b/x", "v", "latest").is_ok());
        for never in [Record::Public, Record::Unrecorded] {
            assert!(matches!(
                check_push(Some(&never), "team-b/x", "v", "latest"),
                Err(RegistryError::Foreign(_))
            ));
        }
        assert!(matches!(
            check_pull(&Record::Unrecorded, t("team-a"), "v", "latest"),
            Err(RegistryError::Foreign(_))
        ));
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
