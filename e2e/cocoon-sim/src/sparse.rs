//! Sparse files: where the data is (SEEK_DATA/SEEK_HOLE), hole-preserving copies, and bounded
//! streaming of data segments, so snapshot bytes never have to sit in memory.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Large enough to keep syscalls few, small enough that RSS stays flat for any file size.
pub const CHUNK: usize = 256 << 10;

/// One data segment, spelled as in the `COCOON.sparse.map` PAX record.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    #[serde(rename = "o")]
    pub offset: u64,
    #[serde(rename = "l")]
    pub len: u64,
}

fn seek(f: &File, at: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek(2) on a descriptor we own; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        return Ok(None);
    }
    Err(e)
}

/// The file's data segments in order. A filesystem without hole reporting answers with one
/// segment covering the whole file, which is still correct, just not sparse.
pub fn data_segments(f: &File) -> io::Result<Vec<Segment>> {
    let size = f.metadata()?.len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < size {
        let Some(start) = seek(f, at, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(f, start, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        if end <= start {
            break;
        }
        out.push(Segment {
            offset: start,
            len: end - start,
        });
        at = end;
    }
    Ok(out)
}

/// True when the segments leave part of a file of `size` bytes as holes.
pub fn has_holes(segments: &[Segment], size: u64) -> bool {
    segments.iter().map(|s| s.len).sum::<u64>() < size
}

/// Copies `len` bytes at `off` from `src` to the same offset in `dst`, in the kernel when it can.
fn copy_range(src: &File, dst: &File, off: u64, len: u64, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut done = 0u64;
    let mut kernel = true;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        if kernel {
            let mut off_in = (off + done) as libc::loff_t;
            let mut off_out = off_in;
            // SAFETY: copy_file_range(2) between two descriptors we own, explicit offsets.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            if n > 0 {
                done += n as u64;
                continue;
            }
            if n == 0 {
                return Err(unexpected_eof("source shrank while copying"));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => {
                    kernel = false
                }
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
            continue;
        }
        if buf.is_empty() {
            buf.resize(CHUNK, 0);
        }
        let n = want.min(buf.len());
        let got = src.read_at(&mut buf[..n], off + done)?;
        if got == 0 {
            return Err(unexpected_eof("source shrank while copying"));
        }
        dst.write_all_at(&buf[..got], off + done)?;
        done += got as u64;
    }
    Ok(())
}

/// Copies `src` to a new `dst` of the same logical size, writing only its data segments, so
/// holes stay holes.
pub fn copy(src: &Path, dst: &Path) -> io::Result<()> {
    let s = File::open(src)?;
    let size = s.metadata()?.len();
    let d = File::create(dst)?;
    let mut buf = Vec::new();
    for seg in data_segments(&s)? {
        copy_range(&s, &d, seg.offset, seg.len, &mut buf)?;
    }
    d.set_len(size)?;
    Ok(())
}

pub fn unexpected_eof(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, msg.into())
}

/// Reads the listed segments of a file back to back: the body of a sparse tar entry. A file
/// that shrinks underneath fails the read instead of yielding a short entry.
pub struct SegmentReader {
    file: File,
    segments: Vec<Segment>,
    index: usize,
    done: u64,
}

impl SegmentReader {
    pub fn new(file: File, segments: Vec<Segment>) -> SegmentReader {
        SegmentReader {
            file,
            segments,
            index: 0,
            done: 0,
        }
    }
}

impl Read for SegmentReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(seg) = self.segments.get(self.index) {
            if self.done == seg.len {
                self.index += 1;
                self.done = 0;
                continue;
            }
            if buf.is_empty() {
                return Ok(0);
            }
            let n = ((seg.len - self.done) as usize).min(buf.len());
            let got = self.file.read_at(&mut buf[..n], seg.offset + self.done)?;
            if got == 0 {
                return Err(unexpected_eof("file shrank while it was being read"));
            }
            self.done += got as u64;
            return Ok(got);
        }
        Ok(0)
    }
}

/// Copies exactly `len` bytes from `r` into `dst` at `off`. Returns how many arrived when the
/// reader ends early, so the caller can say how short the stream was.
pub fn copy_exact_at(
    r: &mut impl Read,
    dst: &File,
    off: u64,
    len: u64,
    buf: &mut Vec<u8>,
) -> io::Result<u64> {
    if buf.is_empty() {
        buf.resize(CHUNK, 0);
    }
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(buf.len());
        let got = match r.read(&mut buf[..n]) {
            Ok(0) => return Ok(done),
            Ok(g) => g,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dst.write_all_at(&buf[..got], off + done)?;
        done += got as u64;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cocoon-sim-sparse-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    #[test]
    fn copy_keeps_data_and_holes() {
        let src = tmp("src");
        let mut f = File::create(&src).unwrap();
        f.write_all(&[7u8; 4096]).unwrap();
        f.write_all_at(&[9u8; 8192], 1 << 20).unwrap();
        f.set_len(4 << 20).unwrap();
        let segs = data_segments(&f).unwrap();
        assert_eq!(segs.first().map(|s| s.offset), Some(0));
        assert!(has_holes(&segs, 4 << 20));
        let dst = tmp("dst");
        copy(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        assert_eq!(data_segments(&File::open(&dst).unwrap()).unwrap(), segs);
        let mut body = Vec::new();
        SegmentReader::new(File::open(&src).unwrap(), segs.clone())
            .read_to_end(&mut body)
            .unwrap();
        assert_eq!(body.len() as u64, segs.iter().map(|s| s.len).sum::<u64>());
        let _ = std::fs::remove_dir_all(src.parent().unwrap());
    }
}
