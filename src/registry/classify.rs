//! What a manifest is (first match wins: cloud image, snapshot, container image, index), and
//! the fail-closed reader rules that turn a snapshot
//! manifest plus its config blob into an import plan before a single byte is streamed.

use std::collections::{BTreeMap, HashMap};

use super::manifest::{ConfigBlob, Descriptor, Manifest};
use super::media;
use super::reference::valid_digest;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArtifactKind {
    CloudImage,
    Snapshot,
    ContainerImage,
    Index,
    Unknown,
}

/// First match wins.
pub fn classify(m: &Manifest) -> ArtifactKind {
    let at = m.artifact_type.as_str();
    if at == media::OS_IMAGE || at == media::WINDOWS_IMAGE {
        return ArtifactKind::CloudImage;
    }
    if at == media::SNAPSHOT_V1 || at == media::SNAPSHOT_V2 {
        return ArtifactKind::Snapshot;
    }
    let config_type = m.config.as_ref().map(|c| c.media_type.as_str());
    if config_type == Some(media::OCI_IMAGE_CONFIG)
        || config_type == Some(media::DOCKER_IMAGE_CONFIG)
    {
        return ArtifactKind::ContainerImage;
    }
    if m.media_type == media::OCI_INDEX || m.media_type == media::DOCKER_LIST {
        return ArtifactKind::Index;
    }
    ArtifactKind::Unknown
}

/// The child an index resolves to: `linux/amd64`, else the first whose architecture is known.
pub fn index_child(index: &Manifest) -> Option<&Descriptor> {
    let is = |d: &&Descriptor, arch: &str, os: Option<&str>| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.architecture == arch && os.is_none_or(|o| p.os == o))
    };
    index
        .manifests
        .iter()
        .find(|d| is(d, "amd64", Some("linux")))
        .or_else(|| {
            index.manifests.iter().find(|d| {
                d.platform
                    .as_ref()
                    .is_none_or(|p| p.architecture != "unknown")
            })
        })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    V1,
    V2,
}

impl Format {
    pub fn of(m: &Manifest) -> Option<Format> {
        match m.artifact_type.as_str() {
            media::SNAPSHOT_V1 => Some(Format::V1),
            media::SNAPSHOT_V2 => Some(Format::V2),
            _ => None,
        }
    }

    pub fn config_version(self) -> &'static str {
        match self {
            Format::V1 => "v1",
            Format::V2 => "v2",
        }
    }
}

/// One piece of an entry body: a blob, decoded when it is a zstd frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub blob: Descriptor,
    pub zstd: bool,
}

/// One tar entry of the import stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEntry {
    pub name: String,
    pub mode: u32,
    /// `COCOON.sparse.map` and `COCOON.sparse.size`.
    pub sparse: Option<(String, u64)>,
    /// Entry body length: the layer size for a plain file, `files[].size` for an encoded one.
    pub size: u64,
    pub pieces: Vec<Piece>,
    /// At least one piece is compressed or the file is chunked.
    pub encoded: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportPlan {
    pub format: Format,
    pub entries: Vec<PlannedEntry>,
}

/// Readers cap the config blob at 64 MiB.
pub const MAX_CONFIG_BYTES: i64 = 64 << 20;
/// Sanity cap on the chunks of one file.
pub const MAX_CHUNKS: usize = 1 << 20;
const DEFAULT_MODE: u32 = 0o640;

/// Checks that must pass before the config blob is even fetched.
pub fn check_snapshot_manifest(m: &Manifest) -> Result<Format, String> {
    if classify(m) != ArtifactKind::Snapshot {
        return Err(format!(
            "not a snapshot (artifactType {:?}, mediaType {:?})",
            m.artifact_type, m.media_type
        ));
    }
    let format = Format::of(m).expect("classified as snapshot");
    let Some(config) = &m.config else {
        return Err("snapshot manifest has no config descriptor".into());
    };
    if config.media_type != media::SNAPSHOT_CONFIG {
        return Err(format!(
            "config media type {:?}, want {}",
            config.media_type,
            media::SNAPSHOT_CONFIG
        ));
    }
    check_blob_ref(config)?;
    if config.size > MAX_CONFIG_BYTES {
        return Err(format!(
            "config blob of {} bytes exceeds the 64 MiB cap",
            config.size
        ));
    }
    for l in &m.layers {
        check_blob_ref(l)?;
        let base = l
            .media_type
            .strip_suffix(media::ZSTD_SUFFIX)
            .unwrap_or(&l.media_type);
        if !media::SNAPSHOT_LAYER_TYPES.contains(&base) {
            return Err(format!(
                "layer {} has media type {:?}, not a snapshot layer type",
                l.digest, l.media_type
            ));
        }
        if l.media_type.ends_with(media::ZSTD_SUFFIX) && format == Format::V1 {
            return Err(format!(
                "layer {} is zstd-compressed in a v1 snapshot",
                l.digest
            ));
        }
        match l.title() {
            None => return Err(format!("layer {} has no title annotation", l.digest)),
            Some(t) => check_file_name(t)?,
        }
    }
    Ok(format)
}

fn check_blob_ref(d: &Descriptor) -> Result<(), String> {
    if d.size < 0 {
        return Err(format!("blob {} has a negative size", d.digest));
    }
    if !valid_digest(&d.digest) {
        return Err(format!("blob digest {:?} is not sha256:<64 hex>", d.digest));
    }
    Ok(())
}

/// Entry names are flat file names; anything that could leave the snapshot directory or
/// shadow the envelope is refused.
pub fn check_file_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name == "snapshot.json"
        || name.contains('/')
        || name.contains('\0')
    {
        return Err(format!(
            "file name {name:?} is not a plain snapshot file name"
        ));
    }
    Ok(())
}

/// The import plan: entries in first-appearance order of their titles, each with its mode,
/// sparse records, size and the blobs that make its body.
pub fn plan_import(m: &Manifest, config: &ConfigBlob) -> Result<ImportPlan, String> {
    let format = check_snapshot_manifest(m)?;
    if !config.schema_version.is_empty() && config.schema_version != format.config_version() {
        return Err(format!(
            "config schemaVersion {:?} disagrees with artifactType {}",
            config.schema_version, m.artifact_type
        ));
    }
    if config.schema_version.is_empty() && format == Format::V2 {
        return Err("v2 snapshot config has no schemaVersion".into());
    }
    let mut order: Vec<&str> = Vec::new();
    let mut by_title: HashMap<&str, Vec<&Descriptor>> = HashMap::new();
    for l in &m.layers {
        let t = l.title().expect("checked");
        let v = by_title.entry(t).or_default();
        if v.is_empty() {
            order.push(t);
        }
        v.push(l);
    }
    let by_digest: BTreeMap<&str, &Descriptor> =
        m.layers.iter().map(|l| (l.digest.as_str(), l)).collect();
    let mut entries = Vec::with_capacity(order.len());
    for title in order {
        let meta = config.files.get(title).cloned().unwrap_or_default();
        let layers = &by_title[title];
        if !meta.chunks.is_empty() && format == Format::V1 {
            return Err(format!("file {title:?} lists chunks in a v1 snapshot"));
        }
        if meta.chunks.len() > MAX_CHUNKS {
            return Err(format!("file {title:?} has more than 2^20 chunks"));
        }
        let pieces: Vec<Piece> = if meta.chunks.is_empty() {
            if layers.len() != 1 {
                return Err(format!(
                    "file {title:?} has {} layers but no chunk list",
                    layers.len()
                ));
            }
            vec![piece(layers[0])]
        } else {
            let mut v = Vec::with_capacity(meta.chunks.len());
            for d in &meta.chunks {
                let blob = by_digest
                    .get(d.as_str())
                    .ok_or_else(|| format!("chunk {d} of {title:?} is not a layer"))?;
                v.push(piece(blob));
            }
            v
        };
        let encoded = !meta.chunks.is_empty() || pieces.iter().any(|p| p.zstd);
        let size = if encoded {
            if meta.size <= 0 {
                return Err(format!(
                    "encoded file {title:?} has no positive files[].size"
                ));
            }
            if pieces.iter().all(|p| !p.zstd) {
                let sum: i64 = pieces.iter().map(|p| p.blob.size).sum();
                if sum != meta.size {
                    return Err(format!(
                        "chunks of {title:?} add up to {sum} bytes, files[].size says {}",
                        meta.size
                    ));
                }
            }
            meta.size as u64
        } else {
            pieces[0].blob.size as u64
        };
        let sparse = if meta.sparse_map.is_empty() {
            None
        } else {
            if meta.sparse_size <= 0 {
                return Err(format!(
                    "file {title:?} has a sparse map but no positive sparseSize"
                ));
            }
            Some((meta.sparse_map.clone(), meta.sparse_size as u64))
        };
        let mode = match meta.mode {
            0 => DEFAULT_MODE,
            m if (0..=0o7777).contains(&m) => m as u32,
            m => return Err(format!("file {title:?} has mode {m:o}, not tar mode bits")),
        };
        entries.push(PlannedEntry {
            name: title.to_string(),
            mode,
            sparse,
            size,
            pieces,
            encoded,
        });
    }
    Ok(ImportPlan { format, entries })
}

fn piece(d: &Descriptor) -> Piece {
    Piece {
        blob: d.clone(),
        zstd: d.media_type.ends_with(media::ZSTD_SUFFIX),
    }
}

/// Disk layers of a cloud image, sorted by title (byte order, stable).
pub fn cloud_disk_layers(m: &Manifest) -> Result<Vec<Descriptor>, String> {
    if classify(m) != ArtifactKind::CloudImage {
        return Err(format!(
            "not a cloud image (artifactType {:?})",
            m.artifact_type
        ));
    }
    let mut disks: Vec<Descriptor> = m
        .layers
        .iter()
        .filter(|l| media::CLOUD_DISK_TYPES.contains(&l.media_type.as_str()))
        .cloned()
        .collect();
    for d in &disks {
        check_blob_ref(d)?;
    }
    if disks.is_empty() {
        return Err("cloud image has no disk layer".into());
    }
    disks.sort_by(|a, b| {
        a.title()
            .unwrap_or("")
            .as_bytes()
            .cmp(b.title().unwrap_or("").as_bytes())
    });
    Ok(disks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::manifest::FileMeta;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn layer(mt: &str, c: char, size: i64, title: Option<&str>) -> Descriptor {
        let mut d = Descriptor {
            media_type: mt.into(),
            digest: digest(c),
            size,
            ..Default::default()
        };
        if let Some(t) = title {
            d.annotations.insert(media::ANN_TITLE.into(), t.into());
        }
        d
    }

    fn snapshot(at: &str, layers: Vec<Descriptor>) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: media::OCI_MANIFEST.into(),
            artifact_type: at.into(),
            config: Some(Descriptor {
                media_type: media::SNAPSHOT_CONFIG.into(),
                digest: digest('c'),
                size: 10,
                ..Default::default()
            }),
            layers,
            ..Default::default()
        }
    }

    fn v1_config() -> ConfigBlob {
        ConfigBlob {
            schema_version: "v1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn classification_first_match_wins() {
        let mut m = snapshot(media::SNAPSHOT_V1, vec![]);
        assert_eq!(classify(&m), ArtifactKind::Snapshot);
        m.artifact_type = media::SNAPSHOT_V2.into();
        assert_eq!(classify(&m), ArtifactKind::Snapshot);
        m.artifact_type = media::OS_IMAGE.into();
        assert_eq!(classify(&m), ArtifactKind::CloudImage);
        m.artifact_type = media::WINDOWS_IMAGE.into();
        assert_eq!(classify(&m), ArtifactKind::CloudImage);
        m.artifact_type = String::new();
        assert_eq!(classify(&m), ArtifactKind::Unknown);
        m.config.as_mut().unwrap().media_type = media::OCI_IMAGE_CONFIG.into();
        assert_eq!(classify(&m), ArtifactKind::ContainerImage);
        m.config.as_mut().unwrap().media_type = media::DOCKER_IMAGE_CONFIG.into();
        assert_eq!(classify(&m), ArtifactKind::ContainerImage);
        let idx = Manifest {
            schema_version: 2,
            media_type: media::DOCKER_LIST.into(),
            ..Default::default()
        };
        assert_eq!(classify(&idx), ArtifactKind::Index);
        // An artifact type outranks the index media type.
        let idx = Manifest {
            media_type: media::OCI_INDEX.into(),
            artifact_type: media::SNAPSHOT_V1.into(),
            ..idx
        };
        assert_eq!(classify(&idx), ArtifactKind::Snapshot);
    }

    #[test]
    fn index_prefers_linux_amd64_then_a_known_architecture() {
        let child = |arch: &str, os: &str, c: char| Descriptor {
            media_type: media::OCI_MANIFEST.into(),
            digest: digest(c),
            size: 1,
            platform: Some(crate::registry::manifest::Platform {
                architecture: arch.into(),
                os: os.into(),
                variant: String::new(),
            }),
            ..Default::default()
        };
        let idx = Manifest {
            schema_version: 2,
            media_type: media::OCI_INDEX.into(),
            manifests: vec![
                child("unknown", "unknown", 'a'),
                child("arm64", "linux", 'b'),
                child("amd64", "linux", 'c'),
            ],
            ..Default::default()
        };
        assert_eq!(index_child(&idx).unwrap().digest, digest('c'));
        let idx = Manifest {
            manifests: idx.manifests[..2].to_vec(),
            ..idx
        };
        assert_eq!(index_child(&idx).unwrap().digest, digest('b'));
    }

    #[test]
    fn v1_plan_keeps_first_appearance_order_modes_and_sparse_records() {
        let m = snapshot(
            media::SNAPSHOT_V1,
            vec![
                layer(media::VM_CONFIG, '1', 5, Some("config.json")),
                layer(media::VM_MEMORY, '2', 4096, Some("memory-ranges")),
                layer(media::DISK_QCOW2, '3', 7, Some("overlay.qcow2")),
            ],
        );
        let mut c = v1_config();
        c.files.insert(
            "memory-ranges".into(),
            FileMeta {
                mode: 0o600,
                sparse_map: "[]".into(),
                sparse_size: 1 << 30,
                ..Default::default()
            },
        );
        let p = plan_import(&m, &c).unwrap();
        let names: Vec<_> = p.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["config.json", "memory-ranges", "overlay.qcow2"]);
        assert_eq!(p.entries[0].mode, 0o640);
        assert_eq!(p.entries[1].mode, 0o600);
        assert_eq!(p.entries[1].sparse, Some(("[]".into(), 1 << 30)));
        assert_eq!(p.entries[1].size, 4096);
        assert!(!p.entries[2].encoded);
    }

    fn refused(m: &Manifest, c: &ConfigBlob) -> String {
        plan_import(m, c).expect_err("the reader must refuse")
    }

    #[test]
    fn reader_refuses_contract_violations() {
        let ok = || layer(media::VM_STATE, '1', 5, Some("state.json"));
        // Bad media type: `.part` and Windows disks are not snapshot layers.
        for mt in [
            "application/vnd.cocoonstack.disk.qcow2.part",
            "application/vnd.cocoonstack.windows.disk.raw",
            "application/x-unknown",
        ] {
            let m = snapshot(media::SNAPSHOT_V1, vec![ok(), layer(mt, '2', 1, Some("x"))]);
            assert!(refused(&m, &v1_config()).contains("media type"));
        }
        // Missing title.
        let m = snapshot(
            media::SNAPSHOT_V1,
            vec![layer(media::VM_STATE, '1', 5, None)],
        );
        assert!(refused(&m, &v1_config()).contains("title"));
        // +zstd in v1.
        let m = snapshot(
            media::SNAPSHOT_V1,
            vec![layer(
                "application/vnd.cocoonstack.vm.memory+zstd",
                '1',
                5,
                Some("m"),
            )],
        );
        assert!(refused(&m, &v1_config()).contains("zstd"));
        // Chunks in v1.
        let m = snapshot(media::SNAPSHOT_V1, vec![ok()]);
        let mut c = v1_config();
        c.files.insert(
            "state.json".into(),
            FileMeta {
                chunks: vec![digest('1'), digest('1')],
                size: 10,
                ..Default::default()
            },
        );
        assert!(refused(&m, &c).contains("chunks"));
        // Oversize config.
        let mut m = snapshot(media::SNAPSHOT_V1, vec![ok()]);
        m.config.as_mut().unwrap().size = MAX_CONFIG_BYTES + 1;
        assert!(refused(&m, &v1_config()).contains("64 MiB"));
        // Wrong config media type.
        let mut m = snapshot(media::SNAPSHOT_V1, vec![ok()]);
        m.config.as_mut().unwrap().media_type = media::OCI_IMAGE_CONFIG.into();
        assert!(plan_import(&m, &v1_config()).is_err());
        // Negative size, malformed digest.
        let m = snapshot(
            media::SNAPSHOT_V1,
            vec![layer(media::VM_STATE, '1', -1, Some("s"))],
        );
        assert!(refused(&m, &v1_config()).contains("negative"));
        let mut bad = ok();
        bad.digest = "sha256:1234".into();
        assert!(refused(&snapshot(media::SNAPSHOT_V1, vec![bad]), &v1_config()).contains("digest"));
        // Titles that would escape the snapshot directory or shadow the envelope.
        for t in ["../x", "a/b", "snapshot.json", ".."] {
            let m = snapshot(
                media::SNAPSHOT_V1,
                vec![layer(media::VM_STATE, '1', 1, Some(t))],
            );
            assert!(refused(&m, &v1_config()).contains("file name"), "{t}");
        }
        // Sparse map without a size.
        let m = snapshot(media::SNAPSHOT_V1, vec![ok()]);
        let mut c = v1_config();
        c.files.insert(
            "state.json".into(),
            FileMeta {
                sparse_map: "[]".into(),
                ..Default::default()
            },
        );
        assert!(refused(&m, &c).contains("sparse"));
        // Config version disagreeing with the artifact type.
        let m = snapshot(media::SNAPSHOT_V1, vec![ok()]);
        let c = ConfigBlob {
            schema_version: "v2".into(),
            ..Default::default()
        };
        assert!(refused(&m, &c).contains("schemaVersion"));
        // Not a snapshot at all.
        let m = snapshot(media::OS_IMAGE, vec![ok()]);
        assert!(refused(&m, &v1_config()).contains("not a snapshot"));
        // Two layers with one title and no chunk list.
        let m = snapshot(
            media::SNAPSHOT_V1,
            vec![ok(), layer(media::VM_STATE, '2', 5, Some("state.json"))],
        );
        assert!(refused(&m, &v1_config()).contains("no chunk list"));
    }

    #[test]
    fn v2_plan_orders_chunks_by_the_config_and_needs_sizes() {
        let zmem = "application/vnd.cocoonstack.vm.memory+zstd";
        let m = snapshot(
            media::SNAPSHOT_V2,
            vec![
                layer(media::VM_CONFIG, '1', 5, Some("config.json")),
                layer(zmem, '3', 40, Some("memory-ranges")),
                layer(zmem, '2', 50, Some("memory-ranges")),
            ],
        );
        let mut c = ConfigBlob {
            schema_version: "v2".into(),
            ..Default::default()
        };
        c.files.insert(
            "memory-ranges".into(),
            FileMeta {
                size: 3 << 20,
                chunks: vec![digest('2'), digest('3')],
                ..Default::default()
            },
        );
        let p = plan_import(&m, &c).unwrap();
        let mem = &p.entries[1];
        assert!(mem.encoded);
        assert_eq!(mem.size, 3 << 20);
        let order: Vec<_> = mem.pieces.iter().map(|p| p.blob.digest.clone()).collect();
        assert_eq!(order, [digest('2'), digest('3')]);
        c.files.get_mut("memory-ranges").unwrap().size = 0;
        assert!(refused(&m, &c).contains("size"));
        c.files.get_mut("memory-ranges").unwrap().size = 1;
        c.files.get_mut("memory-ranges").unwrap().chunks[0] = digest('9');
        assert!(refused(&m, &c).contains("not a layer"));
    }

    #[test]
    fn cloud_image_disks_sorted_by_title() {
        let mut m = snapshot(
            media::OS_IMAGE,
            vec![
                layer(
                    "application/vnd.cocoonstack.disk.qcow2.part",
                    '2',
                    5,
                    Some("disk.qcow2.part.01"),
                ),
                layer("text/plain", '9', 5, Some("SHA256SUMS")),
                layer(
                    "application/vnd.cocoonstack.disk.qcow2.part",
                    '1',
                    5,
                    Some("disk.qcow2.part.00"),
                ),
            ],
        );
        let d = cloud_disk_layers(&m).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].digest, digest('1'));
        m.layers.retain(|l| l.media_type == "text/plain");
        assert!(cloud_disk_layers(&m).is_err());
    }
}
