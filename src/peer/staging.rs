//! `VK_STAGING_DIR`: where peer restores assemble a snapshot directory for `--from-dir`.
//! Everything in it is a copy that can be fetched again, so leftovers are simply removed.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Removes every entry under `dir`; a missing `dir` holds nothing. Returns how many top-level
/// entries went and the disk space they held (allocated blocks, not apparent sizes: a staged
/// memory file is mostly holes). Meant for startup, before any restore can be running.
pub fn sweep_staging(dir: &Path) -> io::Result<(usize, u64)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(e),
    };
    let (mut count, mut bytes) = (0, 0);
    for entry in entries {
        let path = entry?.path();
        bytes += disk_usage(&path)?;
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
        count += 1;
    }
    Ok((count, bytes))
}

/// Allocated bytes of `path` and, for a directory, of everything below it; links are not
/// followed.
fn disk_usage(path: &Path) -> io::Result<u64> {
    let meta = std::fs::symlink_metadata(path)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            total += disk_usage(&entry?.path())?;
        }
    }
    Ok(total)
}

/// A staging directory that removes itself unless kept: a restore that fails or is
/// cancelled leaves nothing behind.
pub(super) struct StagingDir {
    path: Option<PathBuf>,
}

impl StagingDir {
    /// `root/leaf`, created fresh: whatever a previous attempt left under that leaf goes first.
    pub(super) async fn create(root: &Path, leaf: &str) -> io::Result<StagingDir> {
        let mut builder = tokio::fs::DirBuilder::new();
        builder.recursive(true).mode(0o750);
        builder.create(root).await?;
        let path = root.join(leaf);
        match tokio::fs::remove_dir_all(&path).await {
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                tokio::fs::remove_file(&path).await?
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        builder.recursive(false).create(&path).await?;
        Ok(StagingDir { path: Some(path) })
    }

    pub(super) fn path(&self) -> &Path {
        self.path.as_deref().expect("present until kept or removed")
    }

    /// Hands the directory to the caller, who removes it after the clone.
    pub(super) fn keep(mut self) -> PathBuf {
        self.path.take().expect("present until kept or removed")
    }

    /// Removes it now, so that a caller sees no staging directory once an error is returned.
    pub(super) async fn remove(mut self) {
        if let Some(p) = self.path.take() {
            if let Err(e) = tokio::fs::remove_dir_all(&p).await {
                tracing::warn!("cannot remove staging dir {}: {e}", p.display());
            }
        }
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        let Some(p) = self.path.take() else { return };
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&p) {
                tracing::warn!("cannot remove staging dir {}: {e}", p.display());
            }
        };
        // Only reached when the restore was cancelled; removal of gigabytes must not block
        // the runtime thread that dropped us.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => drop(h.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_everything_and_counts_disk_usage() {
        let root = tempfile::tempdir().unwrap();
        let staging = root.path().join("staging");
        std::fs::create_dir_all(staging.join("vm-a/sub")).unwrap();
        std::fs::write(staging.join("vm-a/memory-ranges"), vec![7u8; 64 << 10]).unwrap();
        std::fs::write(staging.join("vm-a/sub/x"), b"x").unwrap();
        let sparse = std::fs::File::create(staging.join("loose-file")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::os::unix::fs::symlink(root.path(), staging.join("link")).unwrap();
        let outside = root.path().join("keep-me");
        std::fs::write(&outside, b"k").unwrap();

        let (count, bytes) = sweep_staging(&staging).unwrap();
        assert_eq!(count, 3);
        // 64 KiB of data plus small files and directories, not the 1 GiB apparent size.
        assert!((64 << 10..1 << 20).contains(&bytes), "{bytes}");
        assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
        assert!(outside.exists(), "the symlink was removed, not followed");
    }

    #[test]
    fn a_missing_staging_dir_is_empty() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(sweep_staging(&root.path().join("nope")).unwrap(), (0, 0));
    }

    #[tokio::test]
    async fn a_staging_dir_replaces_a_leftover_and_goes_away_unless_kept() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("vm-a");
        std::fs::create_dir(&leaf).unwrap();
        std::fs::write(leaf.join("stale"), b"old").unwrap();

        let d = StagingDir::create(root.path(), "vm-a").await.unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        d.remove().await;
        assert!(!leaf.exists());

        let d = StagingDir::create(root.path(), "vm-a").await.unwrap();
        let kept = d.keep();
        assert!(kept.is_dir());
    }
}
