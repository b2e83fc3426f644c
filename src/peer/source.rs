//! What a peer restore needs from the registry: the `:hibernate` tag is the identity anchor,
//! so the id to demand from the peer and the `snapshot.json` to write both come from its
//! config blob, the peer to ask from its `from-node` annotation, and (K7.3) what every file the
//! peer sends must hash to from the manifest.

use crate::registry::{ArtifactKind, Registry, RegistryError, RemoteSnapshot};

pub const HIBERNATE_TAG: &str = "hibernate";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HibernateSource {
    /// The config blob's `snapshotId`; the peer's plan must name the same.
    pub snapshot_id: String,
    /// The `snapshot.json` envelope for the staging directory.
    pub snapshot_json: Vec<u8>,
    /// The node that pushed the tag; `None` when the annotation is missing or empty.
    pub from_node: Option<String>,
    /// Every file of the snapshot and its digest.
    pub files: super::verify::Expected,
}

impl HibernateSource {
    /// From an already inspected tag; `local_name` is the snapshot name the envelope carries.
    pub fn from_remote(
        remote: &RemoteSnapshot,
        local_name: &str,
    ) -> Result<HibernateSource, RegistryError> {
        if remote.kind != ArtifactKind::Snapshot {
            return Err(RegistryError::Refused(format!(
                "the {HIBERNATE_TAG} tag holds a {:?}, not a VM snapshot",
                remote.kind
            )));
        }
        let config = remote.config.as_ref().ok_or_else(|| {
            RegistryError::Refused(format!("the {HIBERNATE_TAG} tag has no config blob"))
        })?;
        if config.snapshot_id.is_empty() {
            return Err(RegistryError::Refused(format!(
                "the {HIBERNATE_TAG} config names no snapshotId"
            )));
        }
        Ok(HibernateSource {
            snapshot_id: config.snapshot_id.clone(),
            snapshot_json: config.to_envelope(local_name),
            from_node: remote.from_node.clone().filter(|n| !n.is_empty()),
            files: super::verify::expected(remote)?,
        })
    }
}

/// `vm:hibernate` as a peer-restore source. `Absent` when the tag does not exist.
pub async fn hibernate_source(
    registry: &Registry,
    vm: &str,
    local_name: &str,
) -> Result<HibernateSource, RegistryError> {
    match registry.inspect(vm, HIBERNATE_TAG).await? {
        Some(remote) => HibernateSource::from_remote(&remote, local_name),
        None => Err(RegistryError::Absent(format!("{vm}:{HIBERNATE_TAG}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::manifest::FileMeta;
    use crate::registry::media::ANN_TITLE;
    use crate::registry::{ConfigBlob, Descriptor, Manifest};

    fn remote(kind: ArtifactKind, config: Option<ConfigBlob>) -> RemoteSnapshot {
        let mut layer = Descriptor {
            media_type: "application/vnd.cocoonstack.vm.config+json".into(),
            digest: "sha256:c0".into(),
            size: 2,
            ..Default::default()
        };
        layer
            .annotations
            .insert(ANN_TITLE.into(), "config.json".into());
        RemoteSnapshot {
            digest: "sha256:00".into(),
            kind,
            format: None,
            snapshot_id: String::new(),
            base_image: None,
            from_node: Some("node-a".into()),
            created: None,
            hypervisor: String::new(),
            manifest: Manifest {
                layers: vec![layer],
                ..Default::default()
            },
            config,
        }
    }

    fn config() -> ConfigBlob {
        ConfigBlob {
            snapshot_id: "M4XW2HQ7K3ZT5N6R7P8S9JV2UA".into(),
            hypervisor: "cloud-hypervisor".into(),
            cpu: 2,
            files: [("config.json".to_string(), FileMeta::default())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_snapshot_tag_gives_its_id_envelope_and_node() {
        let s =
            HibernateSource::from_remote(&remote(ArtifactKind::Snapshot, Some(config())), "vm-a")
                .unwrap();
        assert_eq!(s.snapshot_id, "M4XW2HQ7K3ZT5N6R7P8S9JV2UA");
        assert_eq!(s.from_node.as_deref(), Some("node-a"));
        assert_eq!(s.snapshot_json, config().to_envelope("vm-a"));
        assert_eq!(s.files["config.json"].sha256, "sha256:c0");
        let env: serde_json::Value = serde_json::from_slice(&s.snapshot_json).unwrap();
        assert_eq!(env["config"]["id"], "M4XW2HQ7K3ZT5N6R7P8S9JV2UA");
        assert_eq!(env["config"]["name"], "vm-a");
    }

    #[test]
    fn anything_but_a_snapshot_with_an_id_is_refused() {
        let cases = [
            remote(ArtifactKind::CloudImage, None),
            remote(ArtifactKind::Snapshot, None),
            remote(ArtifactKind::Snapshot, Some(ConfigBlob::default())),
        ];
        for r in cases {
            let err = HibernateSource::from_remote(&r, "vm-a").unwrap_err();
            assert!(matches!(err, RegistryError::Refused(_)), "{err}");
        }
    }

    #[test]
    fn an_empty_from_node_is_no_peer() {
        let mut r = remote(ArtifactKind::Snapshot, Some(config()));
        r.from_node = Some(String::new());
        let s = HibernateSource::from_remote(&r, "vm-a").unwrap();
        assert_eq!(s.from_node, None);
    }
}
