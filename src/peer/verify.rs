//! K7.3: a peer's copy is checked byte for byte against what the registry records before it can
//! become a clone source. The registry holds, per file, the sha256 of the file's body in the
//! export (the `file.sha256` layer annotation, or the layer digest of an uncompressed
//! single-layer file), its length, and for a sparse file the data segments that body is made
//! of. A staged file matches when its segments hash to that digest and every byte outside
//! them reads as zero; a file that does not, or a plan that leaves a file out, fails the
//! restore.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::plan::{data_extents, Plan, PlanFile, Slice};
use crate::registry::{Manifest, RegistryError, RemoteSnapshot};

/// Read size while hashing.
const READ: usize = 1 << 20;

/// What the registry says one file of the snapshot is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDigest {
    /// `sha256:<hex>` of the export body.
    pub sha256: String,
    /// The file's apparent size.
    pub size: u64,
    /// For a sparse file, the data segments the body is made of, in order; `None`: the body
    /// is the whole file.
    pub segments: Option<Vec<Slice>>,
}

/// Every file the registry lists for the snapshot, by name.
pub type Expected = BTreeMap<String, FileDigest>;

#[derive(Deserialize)]
struct Segment {
    o: u64,
    l: u64,
}

/// The expected files of an inspected snapshot tag. A file whose content digest the registry
/// does not record (a compressed or chunked file pushed without the annotation) cannot be
/// checked, so the peer is not used at all.
pub fn expected(remote: &RemoteSnapshot) -> Result<Expected, RegistryError> {
    let config = remote
        .config
        .as_ref()
        .ok_or_else(|| RegistryError::Refused("the tag has no config blob".into()))?;
    let refused = |name: &str, why: String| {
        RegistryError::Refused(format!(
            "file {name:?}: {why}; a peer's copy of it cannot be verified"
        ))
    };
    let mut out = Expected::new();
    for (name, meta) in &config.files {
        let sha256 = content_digest(&remote.manifest, name).map_err(|e| refused(name, e))?;
        let (size, segments) = if meta.sparse_map.is_empty() {
            let body =
                body_size(&remote.manifest, name, meta.size).map_err(|e| refused(name, e))?;
            (body, None)
        } else {
            let segs: Vec<Segment> = serde_json::from_str(&meta.sparse_map)
                .map_err(|e| refused(name, format!("sparse map does not parse: {e}")))?;
            let size = u64::try_from(meta.sparse_size)
                .map_err(|_| refused(name, "negative sparse size".into()))?;
            let segs = segs
                .into_iter()
                .map(|s| Slice {
                    offset: s.o,
                    length: s.l,
                })
                .collect();
            (size, Some(segs))
        };
        out.insert(
            name.clone(),
            FileDigest {
                sha256,
                size,
                segments,
            },
        );
    }
    if out.is_empty() {
        return Err(RegistryError::Refused("the tag lists no files".into()));
    }
    Ok(out)
}

/// The annotation every layer of the file agrees on, else the digest of its one uncompressed
/// layer (which is the body's own).
fn content_digest(m: &Manifest, name: &str) -> Result<String, String> {
    let layers: Vec<_> = m
        .layers
        .iter()
        .filter(|l| l.title() == Some(name))
        .collect();
    let annotated: std::collections::BTreeSet<&str> = layers
        .iter()
        .filter_map(|l| l.annotations.get(crate::registry::media::ANN_FILE_SHA256))
        .map(String::as_str)
        .collect();
    match (annotated.len(), layers.as_slice()) {
        (1, _) => Ok(annotated.into_iter().next().expect("one").to_string()),
        (0, [one])
            if !one
                .media_type
                .ends_with(crate::registry::media::ZSTD_SUFFIX) =>
        {
            Ok(one.digest.clone())
        }
        (0, _) => Err("the registry records no content digest".into()),
        (n, _) => Err(format!("its layers record {n} different content digests")),
    }
}

/// The body length: the one uncompressed layer's size, else the config's `size`.
fn body_size(m: &Manifest, name: &str, meta_size: i64) -> Result<u64, String> {
    let layers: Vec<_> = m
        .layers
        .iter()
        .filter(|l| l.title() == Some(name))
        .collect();
    match layers.as_slice() {
        [one]
            if !one
                .media_type
                .ends_with(crate::registry::media::ZSTD_SUFFIX) =>
        {
            u64::try_from(one.size).map_err(|_| "negative layer size".into())
        }
        _ if meta_size > 0 => Ok(meta_size as u64),
        _ => Err("the registry records no size".into()),
    }
}

/// The plan's files the registry lists, each of the size the registry records. A file the
/// registry does not list is not fetched (it is no part of what a pull would give); one the
/// plan lacks, or offers at another size, fails the restore before anything is written.
pub fn select(plan: &Plan, expected: &Expected) -> Result<Vec<PlanFile>, String> {
    let mut out = Vec::with_capacity(expected.len());
    for (name, want) in expected {
        let pf = plan
            .files
            .iter()
            .find(|f| &f.name == name)
            .ok_or_else(|| format!("the peer's plan lacks {name:?}"))?;
        if pf.size != want.size {
            return Err(format!(
                "the peer offers {name:?} with {} bytes, the registry records {}",
                pf.size, want.size
            ));
        }
        out.push(pf.clone());
    }
    Ok(out)
}

/// Checks every staged file in `dir` against the registry's record; the first mismatch is
/// the error.
pub async fn staged(dir: &Path, expected: &Expected) -> Result<(), String> {
    let (dir, expected) = (dir.to_path_buf(), expected.clone());
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        for (name, want) in &expected {
            check_file(&dir.join(name), want).map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| format!("verify task: {e}"))?
}

/// One file against its record.
pub fn check_file(path: &Path, want: &FileDigest) -> Result<(), String> {
    let io = |e: std::io::Error| format!("read {}: {e}", path.display());
    let f = File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    if size != want.size {
        return Err(format!("{size} bytes, the registry records {}", want.size));
    }
    let whole = [Slice {
        offset: 0,
        length: size,
    }];
    let segments = want.segments.as_deref().unwrap_or(&whole);
    check_segments(segments, size)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; READ];
    for s in segments {
        let mut at = s.offset;
        while at < s.end() {
            let n = (s.end() - at).min(READ as u64) as usize;
            f.read_exact_at(&mut buf[..n], at).map_err(io)?;
            h.update(&buf[..n]);
            at += n as u64;
        }
    }
    let got = format!("sha256:{:x}", h.finalize());
    if got != want.sha256 {
        return Err(format!(
            "content digest {got}, the registry records {}",
            want.sha256
        ));
    }
    if want.segments.is_some() {
        zeros_outside(&f, segments, &mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Segments in order, not overlapping, inside the file.
fn check_segments(segments: &[Slice], size: u64) -> Result<(), String> {
    let mut end = 0;
    for s in segments {
        let inside = s.offset.checked_add(s.length).is_some_and(|e| e <= size);
        if s.offset < end || !inside {
            return Err(format!(
                "the registry's sparse map has segment {}+{} out of order or outside {size} bytes",
                s.offset, s.length
            ));
        }
        end = s.end();
    }
    Ok(())
}

/// Every data extent of `f` outside `segments` reads as zeros: nothing was added in the holes.
fn zeros_outside(f: &File, segments: &[Slice], buf: &mut [u8]) -> Result<(), String> {
    let (_, extents) = data_extents(f).map_err(|e| e.to_string())?;
    for e in extents {
        for gap in gaps_within(e, segments) {
            let mut at = gap.offset;
            while at < gap.end() {
                let n = (gap.end() - at).min(buf.len() as u64) as usize;
                f.read_exact_at(&mut buf[..n], at)
                    .map_err(|e| e.to_string())?;
                if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
                    return Err(format!(
                        "byte {} is data where the registry records a hole",
                        at + i as u64
                    ));
                }
                at += n as u64;
            }
        }
    }
    Ok(())
}

/// The parts of `range` no segment covers; `segments` sorted and disjoint.
fn gaps_within(range: Slice, segments: &[Slice]) -> Vec<Slice> {
    let mut out = Vec::new();
    let mut at = range.offset;
    for s in segments {
        if s.end() <= at {
            continue;
        }
        if s.offset >= range.end() {
            break;
        }
        if s.offset > at {
            out.push(Slice {
                offset: at,
                length: s.offset - at,
            });
        }
        at = s.end();
    }
    if at < range.end() {
        out.push(Slice {
            offset: at,
            length: range.end() - at,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::manifest::FileMeta;
    use crate::registry::media::{ANN_FILE_SHA256, ANN_TITLE};
    use crate::registry::{ConfigBlob, Descriptor};
    use std::path::PathBuf;

    const MIB: u64 = 1 << 20;

    fn s(offset: u64, length: u64) -> Slice {
        Slice { offset, length }
    }

    fn sha(parts: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        format!("sha256:{:x}", h.finalize())
    }

    #[test]
    fn gaps_are_what_no_segment_covers() {
        let segs = [s(10, 10), s(30, 5)];
        assert_eq!(
            gaps_within(s(0, 40), &segs),
            vec![s(0, 10), s(20, 10), s(35, 5)]
        );
        assert_eq!(gaps_within(s(12, 5), &segs), vec![]);
        assert_eq!(gaps_within(s(15, 20), &segs), vec![s(20, 10)]);
        assert_eq!(gaps_within(s(0, 5), &[]), vec![s(0, 5)]);
    }

    /// A sparse file: data at 0..4 KiB and at 2 MiB..2 MiB+100, 4 MiB long.
    fn sparse_file(dir: &Path) -> (PathBuf, FileDigest) {
        let p = dir.join("memory-ranges");
        let f = File::create(&p).unwrap();
        f.set_len(4 * MIB).unwrap();
        f.write_all_at(&[7u8; 4096], 0).unwrap();
        f.write_all_at(&[9u8; 100], 2 * MIB).unwrap();
        let want = FileDigest {
            sha256: sha(&[&[7u8; 4096], &[9u8; 100]]),
            size: 4 * MIB,
            segments: Some(vec![s(0, 4096), s(2 * MIB, 100)]),
        };
        (p, want)
    }

    #[test]
    fn the_registry_record_accepts_the_true_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (p, want) = sparse_file(dir.path());
        check_file(&p, &want).unwrap();
        let whole = dir.path().join("config.json");
        std::fs::write(&whole, b"{\"a\":1}").unwrap();
        let want = FileDigest {
            sha256: sha(&[b"{\"a\":1}"]),
            size: 7,
            segments: None,
        };
        check_file(&whole, &want).unwrap();
    }

    #[test]
    fn a_flipped_byte_a_filled_hole_or_another_size_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (p, want) = sparse_file(dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[8u8], 2 * MIB + 50).unwrap();
        let err = check_file(&p, &want).unwrap_err();
        assert!(err.contains("content digest"), "{err}");

        let (p, want) = sparse_file(dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[1u8], 3 * MIB).unwrap();
        let err = check_file(&p, &want).unwrap_err();
        assert!(err.contains("where the registry records a hole"), "{err}");

        let (p, want) = sparse_file(dir.path());
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(5 * MIB)
            .unwrap();
        let err = check_file(&p, &want).unwrap_err();
        assert!(err.contains("bytes, the registry records"), "{err}");
    }

    fn remote(layers: Vec<Descriptor>, files: Vec<(&str, FileMeta)>) -> RemoteSnapshot {
        RemoteSnapshot {
            digest: "sha256:00".into(),
            kind: crate::registry::ArtifactKind::Snapshot,
            format: None,
            snapshot_id: "ID".into(),
            base_image: None,
            from_node: Some("node-a".into()),
            created: None,
            hypervisor: String::new(),
            manifest: Manifest {
                layers,
                ..Default::default()
            },
            config: Some(ConfigBlob {
                snapshot_id: "ID".into(),
                files: files.into_iter().map(|(n, m)| (n.to_string(), m)).collect(),
                ..Default::default()
            }),
        }
    }

    fn layer(
        title: &str,
        media_type: &str,
        digest: &str,
        size: i64,
        ann: Option<&str>,
    ) -> Descriptor {
        let mut d = Descriptor {
            media_type: media_type.into(),
            digest: digest.into(),
            size,
            ..Default::default()
        };
        d.annotations.insert(ANN_TITLE.into(), title.into());
        if let Some(a) = ann {
            d.annotations.insert(ANN_FILE_SHA256.into(), a.into());
        }
        d
    }

    #[test]
    fn the_record_comes_from_annotations_or_an_uncompressed_layer() {
        let sparse = FileMeta {
            sparse_map: r#"[{"o":0,"l":4096},{"o":8192,"l":10}]"#.into(),
            sparse_size: 65536,
            ..Default::default()
        };
        let chunked = FileMeta {
            size: 300,
            ..Default::default()
        };
        let r = remote(
            vec![
                layer(
                    "config.json",
                    "application/vnd.cocoonstack.vm.config+json",
                    "sha256:c",
                    7,
                    None,
                ),
                layer(
                    "memory-ranges",
                    "application/vnd.cocoonstack.vm.memory",
                    "sha256:m",
                    4106,
                    None,
                ),
                layer(
                    "disk.raw",
                    "application/vnd.cocoonstack.disk.raw+zstd",
                    "sha256:z1",
                    50,
                    Some("sha256:d"),
                ),
                layer(
                    "disk.raw",
                    "application/vnd.cocoonstack.disk.raw+zstd",
                    "sha256:z2",
                    50,
                    Some("sha256:d"),
                ),
            ],
            vec![
                ("config.json", FileMeta::default()),
                ("memory-ranges", sparse),
                ("disk.raw", chunked),
            ],
        );
        let e = expected(&r).unwrap();
        assert_eq!(
            e["config.json"],
            FileDigest {
                sha256: "sha256:c".into(),
                size: 7,
                segments: None
            }
        );
        assert_eq!(e["memory-ranges"].size, 65536);
        assert_eq!(
            e["memory-ranges"].segments,
            Some(vec![s(0, 4096), s(8192, 10)])
        );
        assert_eq!(
            e["disk.raw"],
            FileDigest {
                sha256: "sha256:d".into(),
                size: 300,
                segments: None
            }
        );
    }

    #[test]
    fn a_compressed_file_without_its_digest_or_with_two_is_not_verifiable() {
        let meta = FileMeta {
            size: 300,
            ..Default::default()
        };
        let plain = remote(
            vec![layer(
                "disk.raw",
                "application/vnd.cocoonstack.disk.raw+zstd",
                "sha256:z",
                50,
                None,
            )],
            vec![("disk.raw", meta.clone())],
        );
        assert!(matches!(expected(&plain), Err(RegistryError::Refused(_))));
        let split = remote(
            vec![
                layer(
                    "disk.raw",
                    "application/vnd.cocoonstack.disk.raw",
                    "sha256:a",
                    150,
                    Some("sha256:x"),
                ),
                layer(
                    "disk.raw",
                    "application/vnd.cocoonstack.disk.raw",
                    "sha256:b",
                    150,
                    Some("sha256:y"),
                ),
            ],
            vec![("disk.raw", meta)],
        );
        let err = expected(&split).unwrap_err().to_string();
        assert!(err.contains("2 different"), "{err}");
    }

    #[test]
    fn the_plan_must_offer_every_listed_file_at_its_size() {
        let want: Expected = [(
            "m".to_string(),
            FileDigest {
                sha256: "sha256:x".into(),
                size: 10,
                segments: None,
            },
        )]
        .into();
        let file = |name: &str, size| PlanFile {
            name: name.into(),
            size,
            slices: vec![],
        };
        let plan = |files| Plan {
            snapshot_id: "ID".into(),
            files,
        };
        let got = select(&plan(vec![file("m", 10), file("extra", 5)]), &want).unwrap();
        assert_eq!(got, vec![file("m", 10)]);
        assert!(select(&plan(vec![file("m", 11)]), &want).is_err());
        assert!(select(&plan(vec![file("other", 10)]), &want).is_err());
    }
}
