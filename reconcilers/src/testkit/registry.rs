//! A fake OCI registry: tags holding snapshots, pushed from and pulled into the fake cocoon's
//! local snapshot store. Failures are queued per call kind.

use crate::owner::{Bases, Record, Tenant};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::action::RegistryCall;
use crate::event::{ArtifactKind, RegistryError, RegistryErrorKind, RegistryOk, RemoteSnapshot};

use super::cocoon::FakeCocoon;

#[derive(Clone, Debug, Default)]
pub struct FakeRegistry {
    /// `name:tag` → what it holds.
    pub tags: BTreeMap<String, Stored>,
    /// Queued failures by call kind (`inspect`, `push`, `pull`, `delete-tag`).
    pub failures: BTreeMap<String, VecDeque<RegistryError>>,
    /// Other nodes' local snapshots a peer restore can copy: node → snapshot name → id.
    pub peers: BTreeMap<String, BTreeMap<String, String>>,
    /// Staging directories a peer restore filled and nothing has removed yet.
    pub staged: BTreeSet<String>,
    pushes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub kind: ArtifactKind,
    pub snapshot_id: String,
    pub hypervisor: String,
    pub image: String,
    pub base_image: Option<String>,
    pub from_node: Option<String>,
    /// The manifest's owner annotation (T5).
    pub owner: Option<String>,
    /// When the tag was pushed (C11.1); the fake's own pushes leave it unknown.
    pub pushed_at: Option<crate::time::Millis>,
}

/// T7, T15, T16: why a pod of `tenant` may not pull (`use_only`) or push over the tag of
/// repository `name`, as the shell's registry client decides.
fn refused(
    stored: &Stored,
    (name, tag): (&str, &str),
    tenant: Tenant,
    bases: Bases,
    use_only: bool,
) -> Option<String> {
    let record = Record::from_annotation(stored.owner.as_deref(), name, bases);
    let what = format!("{name}:{tag}");
    match use_only {
        true => record.usable_by(tenant, &what).err(),
        false => record.replaceable_by(tenant, &what).err(),
    }
}

fn kind(call: &RegistryCall) -> &'static str {
    match call {
        RegistryCall::Inspect { .. } => "inspect",
        RegistryCall::Push { .. } => "push",
        RegistryCall::Pull { .. } => "pull",
        RegistryCall::DeleteTag { .. } => "delete-tag",
        RegistryCall::PullCloudImage { .. } => "pull-cloud-image",
        RegistryCall::PeerRestore { .. } => "peer-restore",
        RegistryCall::RemoveStaging { .. } => "remove-staging",
    }
}

impl FakeRegistry {
    pub fn fail_next(&mut self, call: &str, message: &str) {
        self.failures
            .entry(call.to_string())
            .or_default()
            .push_back(RegistryError {
                kind: RegistryErrorKind::Failed,
                message: message.to_string(),
            });
    }

    pub fn exec(
        &mut self,
        call: &RegistryCall,
        cocoon: &mut FakeCocoon,
        node: &str,
        bases: Bases,
    ) -> Result<RegistryOk, RegistryError> {
        if let Some(err) = self
            .failures
            .get_mut(kind(call))
            .and_then(|q| q.pop_front())
        {
            return Err(err);
        }
        match call {
            RegistryCall::Inspect { name, tag } => Ok(RegistryOk::Inspected {
                snapshot: self
                    .tags
                    .get(&format!("{name}:{tag}"))
                    .map(|t| RemoteSnapshot {
                        kind: t.kind,
                        snapshot_id: t.snapshot_id.clone(),
                        base_image: t.base_image.clone(),
                        from_node: t.from_node.clone(),
                        hypervisor: t.hypervisor.clone(),
                        owner: t.owner.clone(),
                        pushed_at: t.pushed_at,
                    }),
            }),
            RegistryCall::Push {
                snapshot,
                name,
                tag,
                base_image,
                owner,
            } => {
                let pusher = crate::owner::Owner::parse(owner).unwrap_or_else(|| {
                    panic!("the core pushed with an owner record that does not parse: {owner:?}")
                });
                let tenant = Tenant {
                    namespace: &pusher.namespace,
                    uid: pusher.namespace_uid.as_deref(),
                };
                if let Some(why) = self
                    .tags
                    .get(&format!("{name}:{tag}"))
                    .and_then(|t| refused(t, (name, tag), tenant, bases, false))
                {
                    return Err(RegistryError {
                        kind: RegistryErrorKind::Foreign,
                        message: why,
                    });
                }
                let Some(local) = cocoon.snapshots.get(snapshot) else {
                    return Err(RegistryError {
                        kind: RegistryErrorKind::Failed,
                        message: format!("export: snapshot {snapshot:?} not found"),
                    });
                };
                self.pushes += 1;
                let stored = Stored {
                    kind: ArtifactKind::Snapshot,
                    snapshot_id: local.id.clone(),
                    hypervisor: local.hypervisor.clone(),
                    image: local.image.clone(),
                    base_image: Some(base_image.clone()).filter(|b| !b.is_empty()),
                    from_node: Some(node.to_string()),
                    owner: Some(owner.clone()),
                    pushed_at: None,
                };
                self.tags.insert(format!("{name}:{tag}"), stored);
                Ok(RegistryOk::Pushed {
                    digest: format!("sha256:{:064x}", self.pushes),
                })
            }
            RegistryCall::Pull {
                name,
                tag,
                local,
                namespace,
                namespace_uid,
            } => {
                let tenant = Tenant {
                    namespace,
                    uid: namespace_uid.as_deref(),
                };
                match self.tags.get(&format!("{name}:{tag}")) {
                    Some(t) if refused(t, (name, tag), tenant, bases, true).is_some() => {
                        Err(RegistryError {
                            kind: RegistryErrorKind::Foreign,
                            message: refused(t, (name, tag), tenant, bases, true)
                                .unwrap_or_default(),
                        })
                    }
                    Some(t) => {
                        cocoon.snapshots.remove(local);
                        cocoon.add_snapshot(local, &t.hypervisor, &t.image);
                        if let Some(o) = &t.owner {
                            cocoon.describe(
                                local,
                                &format!("{}{o}", crate::owner::DESCRIPTION_PREFIX),
                            );
                        }
                        Ok(RegistryOk::Pulled)
                    }
                    None => Err(RegistryError {
                        kind: RegistryErrorKind::Absent,
                        message: format!("{name}:{tag}: manifest unknown"),
                    }),
                }
            }
            RegistryCall::PullCloudImage { name, tag, image } => {
                match self.tags.get(&format!("{name}:{tag}")) {
                    Some(t) if t.kind == ArtifactKind::CloudImage => {
                        cocoon.images.insert(image.clone());
                        Ok(RegistryOk::Pulled)
                    }
                    Some(_) => Err(RegistryError {
                        kind: RegistryErrorKind::Refused,
                        message: format!("{name}:{tag} is not a cloud image"),
                    }),
                    None => Err(RegistryError {
                        kind: RegistryErrorKind::Absent,
                        message: format!("{name}:{tag}: manifest unknown"),
                    }),
                }
            }
            RegistryCall::DeleteTag { name, tag } => {
                self.tags.remove(&format!("{name}:{tag}"));
                Ok(RegistryOk::Deleted)
            }
            // Like the daemon: the registry's config must still name `snapshot_id`, and the
            // peer's copy must be that snapshot.
            RegistryCall::PeerRestore {
                name,
                tag,
                node,
                snapshot_id,
                staging,
            } => {
                let tagged = self
                    .tags
                    .get(&format!("{name}:{tag}"))
                    .is_some_and(|t| &t.snapshot_id == snapshot_id);
                let held = self
                    .peers
                    .get(node)
                    .and_then(|snaps| snaps.get(name))
                    .is_some_and(|id| id == snapshot_id);
                match (tagged, held) {
                    (true, true) => {
                        self.staged.insert(staging.clone());
                        Ok(RegistryOk::Staged {
                            dir: format!("/var/lib/cocoon/vk-staging/{staging}"),
                        })
                    }
                    (false, _) => Err(RegistryError {
                        kind: RegistryErrorKind::Failed,
                        message: format!("{name}:{tag} no longer holds snapshot {snapshot_id}"),
                    }),
                    (true, false) => Err(RegistryError {
                        kind: RegistryErrorKind::Failed,
                        message: format!("peer {node}: snapshot {name} is not {snapshot_id} (404)"),
                    }),
                }
            }
            RegistryCall::RemoveStaging { staging } => {
                self.staged.remove(staging);
                Ok(RegistryOk::Deleted)
            }
        }
    }
}
