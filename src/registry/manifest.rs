//! The JSON documents of a snapshot artifact: the OCI manifest (or index), the config blob,
//! and the `snapshot.json` envelope of cocoon's archive that the config blob is made from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::media;

fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    /// Signed so that a negative size in a foreign manifest parses and is then refused.
    pub size: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

impl Descriptor {
    pub fn title(&self) -> Option<&str> {
        self.annotations
            .get(media::ANN_TITLE)
            .map(String::as_str)
            .filter(|t| !t.is_empty())
    }

    /// The shape oci-client wants for blob HEAD/GET.
    pub fn oci(&self) -> oci_client::manifest::OciDescriptor {
        oci_client::manifest::OciDescriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: self.size,
            ..Default::default()
        }
    }
}

/// An image manifest or an index; which one is said by `mediaType` and `manifests`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub media_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub artifact_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    /// Indented, as the writer emits it; only the digest of these bytes matters.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest always serialises")
    }
}

/// `files[name]` of the config blob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileMeta {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mode: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sparse_map: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sparse_size: i64,
    /// Uncompressed length of the tar entry body; the v2 writer sets it for every file.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: i64,
    /// Blob digests in file order, only when the file has two chunks or more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// The config blob (`application/vnd.cocoonstack.snapshot.config.v1+json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigBlob {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schema_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, Empty>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub storage: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nics: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub windows: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileMeta>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
}

impl ConfigBlob {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a config blob always serialises")
    }

    /// From the `snapshot.json` entry of `cocoon snapshot export`: `{"version":1,"config":{…}}`
    /// with snake_case keys. Keys outside the contract are not carried.
    pub fn from_envelope(json: &[u8]) -> Result<ConfigBlob, String> {
        let v: Value = serde_json::from_slice(json)
            .map_err(|e| format!("snapshot.json of the export is not JSON: {e}"))?;
        let version = v.get("version").and_then(Value::as_i64);
        if version != Some(1) {
            return Err(format!(
                "snapshot.json of the export has envelope version {version:?}, want 1"
            ));
        }
        let c: EnvelopeConfig =
            serde_json::from_value(v.get("config").cloned().unwrap_or_default())
                .map_err(|e| format!("snapshot.json config: {e}"))?;
        Ok(ConfigBlob {
            snapshot_id: c.id,
            description: c.description,
            image: c.image,
            image_digest: c.image_digest,
            image_type: c.image_type,
            image_blob_ids: c.image_blob_ids,
            hypervisor: c.hypervisor,
            cpu: c.cpu,
            memory: c.memory,
            storage: c.storage,
            nics: c.nics,
            network: c.network,
            windows: c.windows,
            ..Default::default()
        })
    }

    /// The `snapshot.json` entry for `cocoon snapshot import`, named `local_name`.
    pub fn to_envelope(&self, local_name: &str) -> Vec<u8> {
        let config = EnvelopeConfig {
            cpu: self.cpu,
            memory: self.memory,
            storage: self.storage,
            image: self.image.clone(),
            image_digest: self.image_digest.clone(),
            image_type: self.image_type.clone(),
            network: self.network.clone(),
            windows: self.windows,
            id: self.snapshot_id.clone(),
            name: local_name.to_string(),
            description: self.description.clone(),
            image_blob_ids: self.image_blob_ids.clone(),
            hypervisor: self.hypervisor.clone(),
            nics: self.nics,
        };
        let mut out = serde_json::to_vec_pretty(&Envelope { version: 1, config })
            .expect("envelope serialises");
        out.push(b'\n');
        out
    }
}

#[derive(Serialize)]
struct Envelope {
    version: i64,
    config: EnvelopeConfig,
}

/// The snake_case snapshot record inside `snapshot.json`, limited to the contract's keys.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct EnvelopeConfig {
    #[serde(default, skip_serializing_if = "is_zero")]
    cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    memory: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    storage: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    image_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    network: String,
    #[serde(default, skip_serializing_if = "is_false")]
    windows: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    image_blob_ids: BTreeMap<String, Empty>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    nics: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPORT_ENVELOPE: &str = r#"{
  "config": {
    "cpu": 2,
    "memory": 1073741824,
    "storage": 10737418240,
    "queue_size": 256,
    "image": "ghcr.io/acme/agent:v2",
    "image_digest": "sha256:abcdef12",
    "image_type": "oci",
    "network": "cocoon-dhcp",
    "id": "M4XW2HQ7K3ZT5N6R7P8S9JV2UA",
    "name": "vm-a",
    "image_blob_ids": {"abcdef12": {}},
    "hypervisor": "cloud-hypervisor",
    "nics": 1
  },
  "version": 1
}"#;

    #[test]
    fn config_blob_from_export_envelope_golden() {
        let mut c = ConfigBlob::from_envelope(EXPORT_ENVELOPE.as_bytes()).unwrap();
        c.schema_version = "v1".into();
        c.files.insert(
            "memory-ranges".into(),
            FileMeta {
                mode: 0o640,
                sparse_map: r#"[{"o":0,"l":4096}]"#.into(),
                sparse_size: 1 << 20,
                ..Default::default()
            },
        );
        c.files.insert(
            "config.json".into(),
            FileMeta {
                mode: 0o644,
                ..Default::default()
            },
        );
        let got = String::from_utf8(c.to_bytes()).unwrap();
        let want = concat!(
            r#"{"schemaVersion":"v1","snapshotId":"M4XW2HQ7K3ZT5N6R7P8S9JV2UA","#,
            r#""image":"ghcr.io/acme/agent:v2","imageDigest":"sha256:abcdef12","#,
            r#""imageType":"oci","imageBlobIds":{"abcdef12":{}},"#,
            r#""hypervisor":"cloud-hypervisor","cpu":2,"memory":1073741824,"#,
            r#""storage":10737418240,"nics":1,"network":"cocoon-dhcp","#,
            r#""files":{"config.json":{"mode":420},"memory-ranges":{"mode":416,"#,
            r#""sparseMap":"[{\"o\":0,\"l\":4096}]","sparseSize":1048576}}}"#
        );
        assert_eq!(got, want);
    }

    #[test]
    fn envelope_round_trip_renames_to_the_local_name() {
        let c = ConfigBlob::from_envelope(EXPORT_ENVELOPE.as_bytes()).unwrap();
        let env = String::from_utf8(c.to_envelope("vm-a-hibernate-import")).unwrap();
        let want = r#"{
  "version": 1,
  "config": {
    "cpu": 2,
    "memory": 1073741824,
    "storage": 10737418240,
    "image": "ghcr.io/acme/agent:v2",
    "image_digest": "sha256:abcdef12",
    "image_type": "oci",
    "network": "cocoon-dhcp",
    "id": "M4XW2HQ7K3ZT5N6R7P8S9JV2UA",
    "name": "vm-a-hibernate-import",
    "image_blob_ids": {
      "abcdef12": {}
    },
    "hypervisor": "cloud-hypervisor",
    "nics": 1
  }
}
"#;
        assert_eq!(env, want);
    }

    #[test]
    fn envelope_version_must_be_1() {
        assert!(ConfigBlob::from_envelope(br#"{"version":2,"config":{}}"#).is_err());
        assert!(ConfigBlob::from_envelope(b"not json").is_err());
    }
}
