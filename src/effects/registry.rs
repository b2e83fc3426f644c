//! The core's registry calls, carried out: inspect a tag, push a local cocoon snapshot
//! (streamed out of `cocoon snapshot export`), pull a tag into a local snapshot (streamed into
//! `cocoon snapshot import`), delete a tag, and copy a hibernate snapshot from the node that
//! pushed it (the peer API) into a staging directory. Every answer returns to the core as the
//! outcome of its call; nothing here decides what happens next.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use reconcilers::action::RegistryCall;
use reconcilers::event::{
    ArtifactKind, RegistryError, RegistryErrorKind, RegistryOk, RemoteSnapshot,
};
use reconcilers::pod::PodKey;

use crate::cocoon::CocoonCli;
use crate::config::SnapshotTransfer;
use crate::registry::{self, cocoon_pipe, PushKnobs, Registry};

pub struct Transfers {
    registry: Registry,
    cocoon: CocoonCli,
    node: String,
    knobs: PushKnobs,
    peers: Peers,
}

/// What a peer restore needs: the API to find a node's address, this node's peer port (every
/// node serves on the same one), `VK_STAGING_DIR`, the per-node limit of 2 at a time, (K7.1)
/// the node credentials, without which no peer is dialed, and (K7.4) the watched pods, whose
/// UID names the pod being woken to the peer.
pub struct Peers {
    pub client: kube::Client,
    pub pods: std::sync::Arc<dashmap::DashMap<String, crate::sources::pods::StoredPod>>,
    pub port: u16,
    pub staging: PathBuf,
    pub limiter: crate::peer::Limiter,
    pub access: Option<PeerAccess>,
}

/// K7.1: how this node dials peers (its node certificate, theirs checked against the cluster
/// CA), and where refusals are counted.
pub struct PeerAccess {
    pub tls: std::sync::Arc<rustls::ClientConfig>,
    pub counters: crate::peer::PeerCounters,
}

impl Transfers {
    /// `base` is `OCI_REGISTRY`; v2 chunks are staged under `staging` while they are compressed
    /// and hashed (one chunk each).
    pub fn new(
        base: &str,
        staging: &Path,
        transfer: &SnapshotTransfer,
        cocoon: CocoonCli,
        node: String,
        (peers, public_bases): (Peers, Vec<String>),
    ) -> Result<Transfers, registry::RegistryError> {
        std::fs::create_dir_all(staging).map_err(|e| {
            registry::RegistryError::Local(format!(
                "cannot create the staging directory {} (VK_STAGING_DIR): {e}",
                staging.display()
            ))
        })?;
        let registry = Registry::from_config(base)?
            .with_public_bases(public_bases)
            .with_spool_dir(staging)
            .with_transfer(transfer)
            .with_caps(cocoon.caps.clone());
        Ok(Transfers {
            registry,
            cocoon,
            node,
            knobs: PushKnobs::from(transfer),
            peers,
        })
    }

    /// `key` is the pod the call is for, when it is for one.
    pub async fn call(
        &self,
        call: &RegistryCall,
        key: Option<&PodKey>,
    ) -> Result<RegistryOk, RegistryError> {
        match call {
            RegistryCall::Inspect { name, tag } => {
                let found = self.registry.inspect(name, tag).await.map_err(to_core)?;
                Ok(RegistryOk::Inspected {
                    snapshot: found.map(remote_to_core),
                })
            }
            RegistryCall::Push {
                snapshot,
                name,
                tag,
                base_image,
                owner,
            } => {
                let meta = cocoon_pipe::PushMeta {
                    base_image: Some(base_image.as_str()).filter(|b| !b.is_empty()),
                    from_node: Some(self.node.as_str()),
                    owner: Some(owner.as_str()),
                };
                let pushed = cocoon_pipe::push_owned_from_cocoon(
                    &self.registry,
                    &self.cocoon,
                    snapshot,
                    name,
                    tag,
                    meta,
                    &self.knobs,
                )
                .await
                .map_err(to_core)?;
                Ok(RegistryOk::Pushed {
                    digest: pushed.digest,
                })
            }
            RegistryCall::Pull {
                name,
                tag,
                local,
                namespace,
                namespace_uid,
            } => {
                let tenant = reconcilers::owner::Tenant {
                    namespace,
                    uid: namespace_uid.as_deref(),
                };
                cocoon_pipe::pull_owned_into_cocoon(
                    &self.registry,
                    &self.cocoon,
                    (name, tag),
                    local,
                    tenant,
                )
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
            RegistryCall::PeerRestore {
                name,
                tag,
                node,
                snapshot_id,
                staging,
            } => {
                let dir = self
                    .peer_restore(key, name, tag, node, (snapshot_id, staging))
                    .await
                    .map_err(|message| RegistryError {
                        kind: RegistryErrorKind::Failed,
                        message,
                    })?;
                Ok(RegistryOk::Staged {
                    dir: dir.display().to_string(),
                })
            }
            RegistryCall::RemoveStaging { staging } => {
                let dir = self.staging_dir(staging).map_err(|message| RegistryError {
                    kind: RegistryErrorKind::Refused,
                    message,
                })?;
                match tokio::fs::remove_dir_all(&dir).await {
                    Ok(()) => Ok(RegistryOk::Deleted),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RegistryOk::Deleted),
                    Err(e) => Err(RegistryError {
                        kind: RegistryErrorKind::Failed,
                        message: format!("remove {}: {e}", dir.display()),
                    }),
                }
            }
        }
    }
}

impl Transfers {
    /// Only a plain name under `VK_STAGING_DIR` is ever written or removed.
    fn staging_dir(&self, leaf: &str) -> Result<PathBuf, String> {
        if !crate::peer::plain_name(leaf) {
            return Err(format!("staging name {leaf:?} is not a plain name"));
        }
        Ok(self.peers.staging.join(leaf))
    }

    /// U6: the registry's `<name>:<tag>` must still be `snapshot_id` (its config is what the
    /// staged `snapshot.json` is written from), then `node`'s copy is fetched for the pod
    /// `key` wakes.
    async fn peer_restore(
        &self,
        key: Option<&PodKey>,
        name: &str,
        tag: &str,
        node: &str,
        (snapshot_id, staging): (&str, &str),
    ) -> Result<PathBuf, String> {
        self.staging_dir(staging)?;
        let pod = self.waking_pod(key)?;
        let Some(access) = &self.peers.access else {
            return Err(
                "the peer API is off on this node (VK_PEER_CA_FILE and VK_PEER_CERT unset)".into(),
            );
        };
        if tag != crate::peer::HIBERNATE_TAG {
            return Err(format!(
                "peer restore of {name}:{tag}: only hibernate snapshots are served"
            ));
        }
        let source = crate::peer::hibernate_source(&self.registry, name, name)
            .await
            .map_err(|e| format!("{name}:{tag}: {e}"))?;
        if source.snapshot_id != snapshot_id {
            return Err(format!(
                "{name}:{tag} now holds snapshot {}, not {snapshot_id}",
                source.snapshot_id
            ));
        }
        let ip = node_ip(&self.peers.client, node).await?;
        let peer = match ip {
            std::net::IpAddr::V4(v4) => format!("https://{v4}:{}", self.peers.port),
            std::net::IpAddr::V6(v6) => format!("https://[{v6}]:{}", self.peers.port),
        };
        let req = crate::peer::RestoreRequest {
            peer,
            transport: crate::peer::Transport::Tls(access.tls.clone()),
            files: source.files,
            snapshot_name: name.to_string(),
            snapshot_id: snapshot_id.to_string(),
            pod,
            staging_root: self.peers.staging.clone(),
            leaf: staging.to_string(),
            snapshot_json: source.snapshot_json,
            timeouts: crate::peer::Timeouts::default(),
        };
        let restored = self.peers.limiter.restore(req).await;
        if let Err(e @ crate::peer::PeerError::Altered(_)) = &restored {
            access.counters.refused(crate::peer::Refusal::AlteredBytes);
            tracing::warn!(%node, vm = %name, "peer restore refused: {e}");
        }
        restored.map_err(|e| format!("peer {node}: {e}"))
    }
}

impl Transfers {
    /// K7.4: the pod a peer restore is for, by the UID the watch delivered, which is what the
    /// peer checks with the apiserver; the core names the pod of every wake.
    fn waking_pod(&self, key: Option<&PodKey>) -> Result<crate::peer::WakingPod, String> {
        let key = key.ok_or("a peer restore names no pod, and peers serve only a pod's wake")?;
        let uid = self
            .peers
            .pods
            .get(&format!("{}/{}", key.namespace(), key.name()))
            .and_then(|p| p.uid().map(str::to_string))
            .ok_or_else(|| format!("pod {key} is not in the pod watch"))?;
        Ok(crate::peer::WakingPod {
            namespace: key.namespace().to_string(),
            name: key.name().to_string(),
            uid,
        })
    }
}

/// The node's `InternalIP`: where its peer API listens.
async fn node_ip(client: &kube::Client, node: &str) -> Result<std::net::IpAddr, String> {
    let n = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|e| format!("node {node}: {e}"))?;
    n.status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok())
        .ok_or_else(|| format!("node {node} has no InternalIP"))
}

fn to_core(e: registry::RegistryError) -> RegistryError {
    let kind = match &e {
        registry::RegistryError::Absent(_) => RegistryErrorKind::Absent,
        registry::RegistryError::Refused(_) => RegistryErrorKind::Refused,
        registry::RegistryError::Transport(_)
        | registry::RegistryError::Local(_)
        | registry::RegistryError::Cocoon(_) => RegistryErrorKind::Failed,
        registry::RegistryError::Foreign(_) => RegistryErrorKind::Foreign,
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

/// The core's view of an inspected tag.
fn remote_to_core(r: registry::RemoteSnapshot) -> RemoteSnapshot {
    RemoteSnapshot {
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
        owner: r
            .manifest
            .annotations
            .get(registry::media::ANN_OWNER)
            .cloned(),
        pushed_at: r.created.as_deref().and_then(rfc3339_millis),
    }
}

/// An RFC 3339 time as milliseconds since the epoch; `None` when it does not parse.
fn rfc3339_millis(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}
