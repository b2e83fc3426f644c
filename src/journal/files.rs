//! Names of the rotated files: `<path>` is being written, `<path>.1` is the newest full one,
//! `<path>.<n>` the oldest kept.

use std::path::{Path, PathBuf};

/// `rotated_path(p, 0)` is `p` itself.
pub fn rotated_path(path: &Path, k: u64) -> PathBuf {
    if k == 0 {
        return path.to_path_buf();
    }
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{k}"));
    PathBuf::from(s)
}

/// The files of the journal at `path` that exist, oldest first: what `replay` wants.
pub fn existing(path: &Path, files: u32) -> Vec<PathBuf> {
    (0..files as u64)
        .rev()
        .map(|k| rotated_path(path, k))
        .filter(|p| p.exists())
        .collect()
}
