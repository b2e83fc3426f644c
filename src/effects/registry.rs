//! The core's registry calls, carried out: inspect a tag, push a local cocoon snapshot
//! (streamed out of `cocoon snapshot export`), pull a tag into a local snapshot (streamed into
//! `cocoon snapshot import`), delete a tag. Every answer returns to the core as the outcome
//! of its call; nothing here decides what happens next.

use std::path::Path;

use reconcilers::action::RegistryCall;
use reconcilers::event::{
    ArtifactKind, RegistryError, RegistryErrorKind, RegistryOk, RemoteSnapshot,
};

use crate::config::SnapshotTransfer;
use crate::effects::cocoon::CocoonCli;
use crate::registry::{self, cocoon_pipe, PushKnobs, Registry};

pub struct Transfers {
    registry: Registry,
    cocoon: CocoonCli,
    node: String,
    knobs: PushKnobs,
}

impl Transfers {
    /// `base` is `OCI_REGISTRY`; v1 blobs are spooled under `staging` while they are hashed.
    pub fn new(
        base: &str,
        staging: &Path,
        transfer: &SnapshotTransfer,
        cocoon: CocoonCli,
        node: String,
    ) -> Result<Transfers, registry::RegistryError> {
        std::fs::create_dir_all(staging).map_err(|e| {
            registry::RegistryError::Local(format!(
                "cannot create the staging directory {} (VK_STAGING_DIR): {e}",
                staging.display()
            ))
        })?;
        let registry = Registry::from_config(base)?
            .with_spool_dir(staging)
            .with_transfer(transfer);
        Ok(Transfers {
            registry,
            cocoon,
            node,
            knobs: PushKnobs::from(transfer),
        })
    }

    pub async fn call(&self, call: &RegistryCall) -> Result<RegistryOk, RegistryError> {
        match call {
            RegistryCall::Inspect { name, tag } => {
                let found = self.registry.inspect(name, tag).await.map_err(to_core)?;
                Ok(RegistryOk::Inspected {
                    snapshot: found.map(|r| RemoteSnapshot {
                        kind: match r.kind {
                            registry::ArtifactKind::CloudImage => ArtifactKind::CloudImage,
                            registry::ArtifactKind::Snapshot => ArtifactKind::Snapshot,
                            registry::ArtifactKind::ContainerImage => ArtifactKind::ContainerImage,
                            registry::ArtifactKind::Index => ArtifactKind::Index,
                            registry::ArtifactKind::Unknown => ArtifactKind::Unknown,
                        },
                        snapshot_id: r.snapshot_id,
                        base_image: r.base_image,
                        from_node: r.from_node,
                        hypervisor: r.hypervisor,
                    }),
                })
            }
            RegistryCall::Push {
                snapshot,
                name,
                tag,
                base_image,
            } => {
                let base = Some(base_image.as_str()).filter(|b| !b.is_empty());
                let pushed = cocoon_pipe::push_from_cocoon(
                    &self.registry,
                    &self.cocoon,
                    snapshot,
                    name,
                    tag,
                    base,
                    Some(self.node.as_str()),
                    &self.knobs,
                )
                .await
                .map_err(to_core)?;
                Ok(RegistryOk::Pushed {
                    digest: pushed.digest,
                })
            }
            RegistryCall::Pull { name, tag, local } => {
                cocoon_pipe::pull_into_cocoon(&self.registry, &self.cocoon, name, tag, local)
                    .await
                    .map_err(to_core)?;
                Ok(RegistryOk::Pulled)
            }
            RegistryCall::PullCloudImage { name, tag, image } => {
                cocoon_pipe::pull_cloud_image_into_cocoon(
                    &self.registry,
                    &self.cocoon,
                    name,
                    tag,
                    image,
                )
                .await
                .map_err(to_core)?;
                Ok(RegistryOk::Pulled)
            }
            RegistryCall::DeleteTag { name, tag } => {
                self.registry.delete_tag(name, tag).await.map_err(to_core)?;
                Ok(RegistryOk::Deleted)
            }
            RegistryCall::PeerRestore { .. } | RegistryCall::RemoveStaging { .. } => {
                Err(RegistryError {
                    kind: RegistryErrorKind::Failed,
                    message: "peer restore is not wired yet".into(),
                })
            }
        }
    }
}

fn to_core(e: registry::RegistryError) -> RegistryError {
    let kind = match &e {
        registry::RegistryError::Absent(_) => RegistryErrorKind::Absent,
        registry::RegistryError::Refused(_) => RegistryErrorKind::Refused,
        registry::RegistryError::Transport(_)
        | registry::RegistryError::Local(_)
        | registry::RegistryError::Cocoon(_) => RegistryErrorKind::Failed,
    };
    RegistryError {
        kind,
        message: e.to_string(),
    }
}

/// The answer to every registry call when `OCI_REGISTRY` is unset. The core only calls the
/// registry when it is set, so this shows up only if that ever changes.
pub fn not_configured(call: &RegistryCall) -> RegistryError {
    RegistryError {
        kind: RegistryErrorKind::NotConfigured,
        message: format!("OCI_REGISTRY is not set, so {call:?} cannot run"),
    }
}
