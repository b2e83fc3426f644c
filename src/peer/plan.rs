//! The plan a peer answers for one snapshot: each regular file of its directory, its apparent
//! size, and the byte ranges worth sending. Holes are never sent; the receiver recreates them
//! by truncating each file to its size before any data arrives.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

/// A hole this small rides along as zeros: one more request costs more than the bytes.
pub const MERGE_HOLE: u64 = 4 << 20;
/// The largest slice, which is also the checksum unit: a corrupted slice costs at most this
/// much to notice, and no stream holds a peer's slot for longer than this takes.
pub const MAX_SLICE: u64 = 256 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub snapshot_id: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub files: Vec<PlanFile>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFile {
    pub name: String,
    /// Apparent size; the file is truncated to it, so trailing holes need no slice.
    pub size: u64,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub slices: Vec<Slice>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub offset: u64,
    pub length: u64,
}

impl Slice {
    pub(super) fn end(&self) -> u64 {
        self.offset + self.length
    }
}

/// Go peers encode an empty list as `null`.
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// The plan for the snapshot stored in `dir`, files in name order so that two plans of the
/// same directory are equal. A directory without regular files is not a snapshot.
pub fn plan_dir(dir: &Path, snapshot_id: &str) -> io::Result<Plan> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // DirEntry::file_type does not follow links: a symlink could point outside the store.
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name().into_string().map_err(|n| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file name {n:?} in {} is not UTF-8", dir.display()),
            )
        })?;
        let f = File::open(entry.path())?;
        let (size, extents) = data_extents(&f)?;
        files.push(PlanFile {
            name,
            size,
            slices: slices(&extents),
        });
    }
    if files.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot directory {} has no regular files", dir.display()),
        ));
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Plan {
        snapshot_id: snapshot_id.to_string(),
        files,
    })
}

/// The file's size and its data extents as the filesystem reports them.
pub fn data_extents(f: &File) -> io::Result<(u64, Vec<Slice>)> {
    let size = f.metadata()?.len();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match seek(f, pos, libc::SEEK_DATA) {
            Ok(d) => d,
            // No data at or after `pos`: the rest is a hole.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        // A file that grows while it is scanned is cut at the size read first.
        let hole = seek(f, data, libc::SEEK_HOLE)?.min(size);
        out.push(Slice {
            offset: data,
            length: hole - data,
        });
        pos = hole;
    }
    Ok((size, out))
}

fn seek(f: &File, pos: u64, whence: libc::c_int) -> io::Result<u64> {
    let pos = libc::off_t::try_from(pos)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset beyond off_t"))?;
    // SAFETY: lseek only moves the offset of a descriptor `f` keeps open; it touches no memory.
    let r = unsafe { libc::lseek(f.as_raw_fd(), pos, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// Extents (in file order) merged across holes of at most `MERGE_HOLE`, then cut into slices
/// of at most `MAX_SLICE`.
pub fn slices(extents: &[Slice]) -> Vec<Slice> {
    let mut merged: Vec<Slice> = Vec::new();
    for e in extents.iter().filter(|e| e.length > 0) {
        match merged.last_mut() {
            Some(last) if e.offset.saturating_sub(last.end()) <= MERGE_HOLE => {
                last.length = e.end().max(last.end()) - last.offset;
            }
            _ => merged.push(*e),
        }
    }
    let mut out = Vec::new();
    for m in merged {
        let mut offset = m.offset;
        while offset < m.end() {
            let length = (m.end() - offset).min(MAX_SLICE);
            out.push(Slice { offset, length });
            offset += length;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    const MIB: u64 = 1 << 20;

    fn s(offset: u64, length: u64) -> Slice {
        Slice { offset, length }
    }

    #[test]
    fn a_hole_of_at_most_4_mib_is_merged_a_larger_one_is_not() {
        let got = slices(&[s(0, MIB), s(5 * MIB, MIB), s(10 * MIB + 1, MIB)]);
        // 1 MiB .. 5 MiB is a 4 MiB hole (merged); 6 MiB .. 10 MiB + 1 is one byte more.
        assert_eq!(got, vec![s(0, 6 * MIB), s(10 * MIB + 1, MIB)]);
    }

    #[test]
    fn merging_chains_across_several_small_holes() {
        let got = slices(&[s(0, 4096), s(MIB, 4096), s(3 * MIB, 4096), s(100 * MIB, 1)]);
        assert_eq!(got, vec![s(0, 3 * MIB + 4096), s(100 * MIB, 1)]);
    }

    #[test]
    fn slices_are_capped_at_256_mib() {
        let got = slices(&[s(MIB, 600 * MIB)]);
        assert_eq!(
            got,
            vec![
                s(MIB, 256 * MIB),
                s(257 * MIB, 256 * MIB),
                s(513 * MIB, 88 * MIB)
            ]
        );
        // The cap applies after merging.
        let got = slices(&[s(0, 200 * MIB), s(202 * MIB, 100 * MIB)]);
        assert_eq!(got, vec![s(0, 256 * MIB), s(256 * MIB, 46 * MIB)]);
    }

    #[test]
    fn no_extents_no_slices() {
        assert!(slices(&[]).is_empty());
        assert!(slices(&[s(7, 0)]).is_empty());
    }

    #[test]
    fn extents_come_from_the_filesystem_and_skip_holes() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("disk.raw")).unwrap();
        f.set_len(64 * MIB).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        f.write_all_at(&[2u8; 8192], 20 * MIB).unwrap();
        let (size, extents) = data_extents(&f).unwrap();
        assert_eq!(size, 64 * MIB);
        assert_eq!(extents, vec![s(0, 4096), s(20 * MIB, 8192)]);
    }

    #[test]
    fn the_plan_lists_regular_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("state.json"), b"{}").unwrap();
        std::fs::write(p.join("config.json"), b"{\"a\":1}").unwrap();
        File::create(p.join("empty")).unwrap();
        let mut m = File::create(p.join("memory-ranges")).unwrap();
        m.write_all(&[9u8; 4096]).unwrap();
        m.set_len(32 * MIB).unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p.join("link")).unwrap();

        let plan = plan_dir(p, "ID").unwrap();
        let names: Vec<&str> = plan.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["config.json", "empty", "memory-ranges", "state.json"]
        );
        assert_eq!(plan.files[0].slices, vec![s(0, 7)]);
        assert_eq!(plan.files[1].size, 0);
        assert!(plan.files[1].slices.is_empty());
        assert_eq!(plan.files[2].size, 32 * MIB);
        assert_eq!(plan.files[2].slices, vec![s(0, 4096)]);
    }

    #[test]
    fn a_directory_without_files_has_no_plan() {
        let dir = tempfile::tempdir().unwrap();
        assert!(plan_dir(dir.path(), "ID").is_err());
    }

    #[test]
    fn the_wire_form_is_camel_case_and_tolerates_null_lists() {
        let plan = Plan {
            snapshot_id: "ID".into(),
            files: vec![PlanFile {
                name: "m".into(),
                size: 10,
                slices: vec![s(0, 4)],
            }],
        };
        assert_eq!(
            serde_json::to_string(&plan).unwrap(),
            r#"{"snapshotId":"ID","files":[{"name":"m","size":10,"slices":[{"offset":0,"length":4}]}]}"#
        );
        let p: Plan = serde_json::from_str(
            r#"{"snapshotId":"ID","files":[{"name":"e","size":0,"slices":null}]}"#,
        )
        .unwrap();
        assert!(p.files[0].slices.is_empty());
    }
}
