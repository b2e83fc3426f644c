//! Local → registry: `cocoon snapshot export`'s tar stream becomes blobs, a config blob and a
//! manifest. Nothing touches the tag until every blob and the config are in the registry and
//! the export has been read to its end; then the manifest is PUT, and the pushing node's name
//! is added by a second, best-effort PUT of the same tag.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::stream;
use oci_client::Reference;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncRead;

use super::classify::{self, Format};
use super::manifest::{ConfigBlob, Descriptor, FileMeta, Manifest};
use super::tar_stream::{self, EntryHeader, TarReader};
use super::{encode, media, oci_error, Registry, RegistryError, Target};
use crate::config::SnapshotTransfer;

/// The writer knobs; all zero selects the v1 format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushKnobs {
    /// zstd level; 0 disables compression.
    pub zstd_level: u32,
    /// Chunk size in MiB; 0 disables chunking.
    pub chunk_size_mib: u32,
    /// Chunks encoded and uploaded at once.
    pub concurrency: u32,
    /// Memory the chunk workers may hold.
    pub memory_budget_mib: u64,
}

impl Default for PushKnobs {
    fn default() -> Self {
        Self {
            zstd_level: 0,
            chunk_size_mib: 0,
            concurrency: 8,
            memory_budget_mib: 9216,
        }
    }
}

impl From<&SnapshotTransfer> for PushKnobs {
    fn from(t: &SnapshotTransfer) -> Self {
        Self {
            zstd_level: t.zstd_level,
            chunk_size_mib: t.chunk_size_mib,
            concurrency: t.concurrency,
            memory_budget_mib: t.memory_budget_mib,
        }
    }
}

/// What a push did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushOutcome {
    /// The digest the tag points at when the push returns (after the from-node re-PUT when
    /// that worked).
    pub digest: String,
    /// The digest of the manifest as first PUT.
    pub pushed_digest: String,
    pub format: Format,
    pub snapshot_id: String,
    pub blobs_uploaded: usize,
    /// Blobs the registry already had (HEAD answered 200).
    pub blobs_present: usize,
    pub bytes_uploaded: u64,
    pub from_node_added: bool,
}

/// Bodies up to this size are hashed in memory (and skipped when present); larger ones stream
/// straight into an upload.
const IN_MEMORY_MAX: u64 = 1 << 20;
/// Read and upload granularity.
pub(crate) const IO_CHUNK: usize = 1 << 20;
/// `snapshot.json` is metadata; a larger one is not cocoon's.
const ENVELOPE_MAX: u64 = 64 << 20;

fn local(what: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Local(format!("{what}: {e}"))
}

pub(crate) fn sha256_hex(h: Sha256) -> String {
    format!("sha256:{:x}", h.finalize())
}

/// `created` annotation: UTC, RFC 3339, whole seconds.
fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The export's first entry, `snapshot.json`: the config blob's starting point.
async fn read_envelope<R: AsyncRead + Unpin>(
    tar: &mut TarReader<R>,
) -> Result<ConfigBlob, RegistryError> {
    let first = tar
        .next_entry()
        .await
        .map_err(|e| local("reading the export", e))?
        .ok_or_else(|| RegistryError::Local("the export is an empty archive".into()))?;
    if first.name != "snapshot.json" {
        return Err(RegistryError::Local(format!(
            "the export starts with {:?}, not snapshot.json",
            first.name
        )));
    }
    let envelope = tar
        .read_body_to_vec(ENVELOPE_MAX)
        .await
        .map_err(|e| local("reading snapshot.json", e))?;
    ConfigBlob::from_envelope(&envelope).map_err(RegistryError::Local)
}

/// The snapshot's manifest: its artifact type names the format; `created` and the base image
/// go in its annotations.
fn snapshot_manifest(
    format: Format,
    config: Descriptor,
    layers: Vec<Descriptor>,
    base_image: Option<&str>,
    owner: Option<&str>,
) -> Manifest {
    let mut annotations = BTreeMap::new();
    annotations.insert(media::ANN_CREATED.to_string(), now_rfc3339());
    if let Some(b) = base_image.filter(|b| !b.is_empty()) {
        annotations.insert(media::ANN_BASE_IMAGE.to_string(), b.to_string());
    }
    // T5: in the first manifest the tag ever shows, so no reader sees it without its owner.
    if let Some(o) = owner.filter(|o| !o.is_empty()) {
        annotations.insert(media::ANN_OWNER.to_string(), o.to_string());
    }
    Manifest {
        schema_version: 2,
        media_type: media::OCI_MANIFEST.into(),
        artifact_type: match format {
            Format::V1 => media::SNAPSHOT_V1.into(),
            Format::V2 => media::SNAPSHOT_V2.into(),
        },
        config: Some(config),
        layers,
        manifests: Vec::new(),
        annotations,
    }
}

pub(crate) struct Counters {
    pub uploaded: usize,
    pub present: usize,
    pub bytes: u64,
}

impl Registry {
    /// Pushes the tar stream of `cocoon snapshot export` as `name:tag`. `export` is read to its
    /// end (past the end-of-archive marker) before the manifest is written, so a reader that
    /// reports the exporter's failure at EOF keeps the tag untouched.
    #[allow(clippy::too_many_arguments)]
    pub async fn push_snapshot<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        tag: &str,
        export: R,
        base_image: Option<&str>,
        from_node: Option<&str>,
        knobs: &PushKnobs,
    ) -> Result<PushOutcome, RegistryError> {
        self.push_snapshot_owned(name, tag, export, base_image, from_node, None, knobs)
            .await
    }

    /// [`Registry::push_snapshot`], the manifest carrying the owner record `owner`
    /// (`<namespace>/<pod>`, T5) when there is one.
    #[allow(clippy::too_many_arguments)]
    pub async fn push_snapshot_owned<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        tag: &str,
        export: R,
        base_image: Option<&str>,
        from_node: Option<&str>,
        owner: Option<&str>,
        knobs: &PushKnobs,
    ) -> Result<PushOutcome, RegistryError> {
        let target = Self::target(tag)?;
        let Target::Tag(tag) = target else {
            return Err(RegistryError::Refused(format!(
                "push needs a tag, not the digest {tag}"
            )));
        };
        let encoder = encode::Plan::from_knobs(knobs)?;
        let _one_v2_push = match encoder {
            Some(_) => Some(encode::Plan::serialise().await),
            None => None,
        };
        let r = self.reference(name, &Target::Tag(tag.clone()))?;
        let mut tar = TarReader::new(export);
        let mut config = read_envelope(&mut tar).await?;
        let mut counters = Counters {
            uploaded: 0,
            present: 0,
            bytes: 0,
        };
        let (layers, files, format) = self
            .push_files(&r, &mut tar, encoder.as_ref(), &mut counters)
            .await?;
        config.schema_version = format.config_version().into();
        config.files = files;
        let config_bytes = config.to_bytes();
        let config_digest = self
            .push_bytes(&r, Bytes::from(config_bytes.clone()), &mut counters)
            .await?;
        let config_desc = Descriptor {
            media_type: media::SNAPSHOT_CONFIG.into(),
            digest: config_digest,
            size: config_bytes.len() as i64,
            ..Default::default()
        };
        let manifest = snapshot_manifest(format, config_desc, layers, base_image, owner);
        let pushed_digest = self.put_manifest(&r, manifest.to_bytes()).await?;
        let mut outcome = PushOutcome {
            digest: pushed_digest.clone(),
            pushed_digest,
            format,
            snapshot_id: config.snapshot_id.clone(),
            blobs_uploaded: counters.uploaded,
            blobs_present: counters.present,
            bytes_uploaded: counters.bytes,
            from_node_added: false,
        };
        if let Some(node) = from_node.filter(|n| !n.is_empty()) {
            match self
                .add_annotation(
                    name,
                    &r,
                    &outcome.pushed_digest,
                    (media::ANN_FROM_NODE, node),
                )
                .await
            {
                Ok(d) => {
                    outcome.digest = d;
                    outcome.from_node_added = true;
                }
                Err(e) => tracing::warn!(
                    reference = %r,
                    error = %e,
                    "could not add the from-node annotation; peers cannot restore this snapshot"
                ),
            }
        }
        Ok(outcome)
    }

    /// Every file of the export after `snapshot.json`, each as one blob (v1) or as the chunks
    /// of its encoding (v2): the manifest's layers, the config's file table and the format
    /// that turned out.
    async fn push_files<R: AsyncRead + Unpin>(
        &self,
        r: &Reference,
        tar: &mut TarReader<R>,
        encoder: Option<&encode::Plan>,
        counters: &mut Counters,
    ) -> Result<(Vec<Descriptor>, BTreeMap<String, FileMeta>, Format), RegistryError> {
        let mut layers: Vec<Descriptor> = Vec::new();
        let mut files: BTreeMap<String, FileMeta> = BTreeMap::new();
        let mut encoded_any = false;
        tar.hash_bodies();
        while let Some(h) = tar
            .next_entry()
            .await
            .map_err(|e| local("reading the export", e))?
        {
            classify::check_file_name(&h.name)
                .map_err(|e| RegistryError::Local(format!("the export holds {e}")))?;
            if files.contains_key(&h.name) {
                return Err(RegistryError::Local(format!(
                    "the export holds {:?} twice",
                    h.name
                )));
            }
            let mut meta = file_meta(&h)?;
            let layer_type = media::layer_type(&h.name);
            let first_layer = layers.len();
            match encoder.filter(|p| p.qualifies(h.size)) {
                Some(plan) => {
                    let (descs, chunks) = plan
                        .push_file(self, r, tar, &h, layer_type, counters)
                        .await?;
                    meta.size = h.size as i64;
                    meta.chunks = chunks;
                    layers.extend(descs);
                    encoded_any = true;
                }
                None => {
                    let digest = self.push_body(r, tar, h.size, counters).await?;
                    if encoder.is_some() {
                        meta.size = h.size as i64;
                    }
                    layers.push(layer(layer_type, digest, h.size, &h.name));
                }
            }
            let body = tar.take_body_digest().ok_or_else(|| {
                RegistryError::Local(format!("{}: the body was not read to its end", h.name))
            })?;
            for l in &mut layers[first_layer..] {
                l.annotations
                    .insert(media::ANN_FILE_SHA256.to_string(), body.clone());
            }
            files.insert(h.name.clone(), meta);
        }
        tar.drain()
            .await
            .map_err(|e| local("reading the export to its end", e))?;
        let format = if encoded_any { Format::V2 } else { Format::V1 };
        if format == Format::V1 {
            // A v1 push stays byte-identical to the legacy writer even when knobs are set.
            for m in files.values_mut() {
                m.size = 0;
            }
        }
        Ok((layers, files, format))
    }

    /// Re-reads the manifest `digest`, sets one annotation (everything else kept as it is)
    /// and PUTs it under `r`: the from-node a push adds, or the owner an operator records.
    pub(super) async fn add_annotation(
        &self,
        name: &str,
        r: &Reference,
        digest: &str,
        (key, value): (&str, &str),
    ) -> Result<String, RegistryError> {
        let by_digest = self.reference(name, &Target::Digest(digest.to_string()))?;
        let (_, raw, _) = self.get_manifest(&by_digest).await?;
        let mut v: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| RegistryError::Refused(format!("manifest read back: {e}")))?;
        let obj = v
            .as_object_mut()
            .ok_or_else(|| RegistryError::Refused("manifest read back is not an object".into()))?;
        let ann = obj
            .entry("annotations")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        let ann = ann.as_object_mut().ok_or_else(|| {
            RegistryError::Refused("manifest annotations are not an object".into())
        })?;
        ann.insert(key.into(), value.into());
        let body = serde_json::to_vec_pretty(&v).expect("a JSON value serialises");
        self.put_manifest(r, body).await
    }

    /// PUT the manifest bytes under `r`; returns their digest.
    async fn put_manifest(&self, r: &Reference, body: Vec<u8>) -> Result<String, RegistryError> {
        let mut h = Sha256::new();
        h.update(&body);
        let digest = sha256_hex(h);
        self.client
            .push_manifest_raw(
                r,
                body,
                reqwest::header::HeaderValue::from_static(media::OCI_MANIFEST),
            )
            .await
            .map_err(|e| oci_error(&format!("PUT manifest {r}"), e))?;
        Ok(digest)
    }

    /// HEAD, then upload unless present. Small blobs only (config, small files).
    pub(crate) async fn push_bytes(
        &self,
        r: &Reference,
        data: Bytes,
        counters: &mut Counters,
    ) -> Result<String, RegistryError> {
        let mut h = Sha256::new();
        h.update(&data);
        let digest = sha256_hex(h);
        let size = data.len() as u64;
        self.upload_if_missing(r, &digest, size, stream::iter([Ok(data)]), counters)
            .await?;
        Ok(digest)
    }

    /// One tar entry body as one blob: a small one hashed in memory, HEAD, then uploaded
    /// unless present; a large one streamed into the registry as it is read.
    async fn push_body<R: AsyncRead + Unpin>(
        &self,
        r: &Reference,
        tar: &mut TarReader<R>,
        size: u64,
        counters: &mut Counters,
    ) -> Result<String, RegistryError> {
        if size <= IN_MEMORY_MAX {
            let body = tar
                .read_body_to_vec(IN_MEMORY_MAX)
                .await
                .map_err(|e| local("reading the export", e))?;
            return self.push_bytes(r, Bytes::from(body), counters).await;
        }
        self.stream_body(r, tar, size, counters).await
    }

    pub(crate) async fn upload_if_missing<S>(
        &self,
        r: &Reference,
        digest: &str,
        size: u64,
        body: S,
        counters: &mut Counters,
    ) -> Result<(), RegistryError>
    where
        S: futures::Stream<Item = oci_client::errors::Result<Bytes>> + Send + 'static,
    {
        self.client
            .store_auth_if_needed(r.resolve_registry(), &self.auth.get().await)
            .await;
        let present = self
            .client
            .blob_exists(r, digest)
            .await
            .map_err(|e| oci_error(&format!("HEAD blob {digest}"), e))?;
        if present {
            counters.present += 1;
            return Ok(());
        }
        self.client
            .push_blob_stream(r, body, digest, Some(size))
            .await
            .map_err(|e| oci_error(&format!("upload blob {digest}"), e))?;
        counters.uploaded += 1;
        counters.bytes += size;
        Ok(())
    }
}

fn layer(media_type: &str, digest: String, size: u64, title: &str) -> Descriptor {
    let mut d = Descriptor {
        media_type: media_type.to_string(),
        digest,
        size: size as i64,
        ..Default::default()
    };
    d.annotations
        .insert(media::ANN_TITLE.to_string(), title.to_string());
    d
}

pub(crate) fn chunk_layer(
    media_type: &str,
    digest: String,
    size: u64,
    title: &str,
    index_count: Option<(usize, usize)>,
) -> Descriptor {
    let mut d = layer(media_type, digest, size, title);
    if let Some((i, n)) = index_count {
        d.annotations
            .insert(media::ANN_CHUNK_INDEX.to_string(), i.to_string());
        d.annotations
            .insert(media::ANN_CHUNK_COUNT.to_string(), n.to_string());
    }
    d
}

/// `files[name]` from the entry's header: mode bits and the sparse PAX records.
fn file_meta(h: &EntryHeader) -> Result<FileMeta, RegistryError> {
    let mut m = FileMeta {
        mode: (h.mode & 0o7777) as i64,
        ..Default::default()
    };
    if let Some(map) = h.pax.get(tar_stream::PAX_SPARSE_MAP) {
        m.sparse_map = map.clone();
        let size = h.pax.get(tar_stream::PAX_SPARSE_SIZE).ok_or_else(|| {
            RegistryError::Local(format!("{} has a sparse map but no sparse size", h.name))
        })?;
        m.sparse_size = size
            .parse()
            .map_err(|_| RegistryError::Local(format!("{}: sparse size {size:?}", h.name)))?;
    }
    Ok(m)
}
