//! flock(2)-based locks and write-then-rename, so concurrent CLI invocations and guests never
//! see torn files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

static DURABLE: AtomicBool = AtomicBool::new(true);

/// Zero-boot mode answers as fast as it can: files are still replaced atomically, so no
/// reader sees a torn one, but nothing waits for the disk.
pub fn set_durable(on: bool) {
    DURABLE.store(on, Ordering::Relaxed);
}

pub struct Lock {
    _file: File,
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o644)
        .open(path)
}

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(err),
        }
    }
}

pub fn exclusive(path: &Path) -> io::Result<Lock> {
    let file = open_lock_file(path)?;
    flock(&file, libc::LOCK_EX)?;
    Ok(Lock { _file: file })
}

pub fn shared(path: &Path) -> io::Result<Lock> {
    let file = open_lock_file(path)?;
    flock(&file, libc::LOCK_SH)?;
    Ok(Lock { _file: file })
}

/// `None` while another process holds the lock: used to tell a live create from a dead one.
pub fn try_exclusive(path: &Path) -> io::Result<Option<Lock>> {
    let file = open_lock_file(path)?;
    Ok(flock(&file, libc::LOCK_EX | libc::LOCK_NB)?.then_some(Lock { _file: file }))
}

/// Complete content to a sibling temp file, mode 0644, then rename over `path`: readers see
/// the old or the new document, never a partial one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        crate::ids::new_id()
    ));
    let res = (|| {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if DURABLE.load(Ordering::Relaxed) {
            f.sync_data()?;
        }
        fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}
