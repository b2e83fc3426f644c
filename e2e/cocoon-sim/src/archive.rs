//! The snapshot archive (CLI-9) as a stream: `snapshot.json` first, then one flat entry per
//! data file. A file with holes travels as its data segments only, with its layout in the PAX
//! records `COCOON.sparse.map` / `COCOON.sparse.size`. Both directions move bounded chunks, so
//! a snapshot of any size costs the same memory.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::error::{fail, Context, Error, Result};
use crate::sparse::{self, Segment, SegmentReader, CHUNK};

pub const ENVELOPE: &str = "snapshot.json";
const SPARSE_MAP: &str = "COCOON.sparse.map";
const SPARSE_SIZE: &str = "COCOON.sparse.size";
/// Largest body a ustar size field holds (11 octal digits); beyond it PAX `size` is needed.
const USTAR_MAX: u64 = 0o77_777_777_777;
/// `snapshot.json` is read whole, so it gets the same cap a registry reader puts on it.
const ENVELOPE_MAX: u64 = 64 << 20;

/// The regular files of a snapshot directory, in a stable order.
pub fn data_files(dir: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).ctx(format!("read {}", dir.display()))? {
        let e = e?;
        if !e.file_type()?.is_file() {
            continue;
        }
        match e.file_name().to_str() {
            Some(n) if n != ENVELOPE => v.push(n.to_string()),
            _ => {}
        }
    }
    v.sort();
    Ok(v)
}

fn header(size: u64, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(mtime);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// Header, exactly `size` body bytes from `body`, padding to the next block.
fn put_entry<W: Write>(
    b: &mut tar::Builder<W>,
    name: &str,
    mut h: tar::Header,
    body: &mut impl Read,
    size: u64,
    buf: &mut [u8],
) -> io::Result<()> {
    h.set_path(name)?;
    h.set_cksum();
    let out = b.get_mut();
    out.write_all(h.as_bytes())?;
    let mut done = 0u64;
    while done < size {
        let n = ((size - done) as usize).min(buf.len());
        let got = body.read(&mut buf[..n])?;
        if got == 0 {
            return Err(sparse::unexpected_eof(format!(
                "{name}: file shrank while it was being exported"
            )));
        }
        out.write_all(&buf[..got])?;
        done += got as u64;
    }
    let pad = (512 - size % 512) % 512;
    out.write_all(&[0u8; 512][..pad as usize])
}

fn put_file<W: Write>(
    b: &mut tar::Builder<W>,
    dir: &Path,
    name: &str,
    mtime: u64,
    buf: &mut [u8],
) -> io::Result<()> {
    let f = File::open(dir.join(name))?;
    let size = f.metadata()?.len();
    let segments = sparse::data_segments(&f)?;
    let holes = sparse::has_holes(&segments, size);
    let (segments, body) = if holes {
        let body = segments.iter().map(|s| s.len).sum();
        (segments, body)
    } else {
        (
            vec![Segment {
                offset: 0,
                len: size,
            }],
            size,
        )
    };
    let mut pax: Vec<(&str, String)> = Vec::new();
    if holes {
        pax.push((SPARSE_MAP, serde_json::to_string(&segments)?));
        pax.push((SPARSE_SIZE, size.to_string()));
    }
    if body > USTAR_MAX {
        pax.push(("size", body.to_string()));
    }
    b.append_pax_extensions(pax.iter().map(|(k, v)| (*k, v.as_bytes())))?;
    let mut h = header(body, mtime);
    if body > USTAR_MAX {
        h.set_size(0);
    }
    put_entry(b, name, h, &mut SegmentReader::new(f, segments), body, buf)
}

/// Writes the whole archive to `sink` and returns it, end-of-archive marker included.
pub fn write<W: Write>(
    sink: W,
    envelope: &[u8],
    dir: &Path,
    files: &[String],
    mtime: u64,
) -> io::Result<W> {
    let mut b = tar::Builder::new(sink);
    let mut buf = vec![0u8; CHUNK];
    put_entry(
        &mut b,
        ENVELOPE,
        header(envelope.len() as u64, mtime),
        &mut &envelope[..],
        envelope.len() as u64,
        &mut buf,
    )?;
    for name in files {
        put_file(&mut b, dir, name, mtime, &mut buf)?;
    }
    b.into_inner()
}

/// Remembers whether the stream ran dry, which tells a clean end-of-archive marker apart from
/// a stream cut at an entry boundary.
struct EofProbe<R> {
    inner: R,
    eof: bool,
}

impl<R: Read> Read for EofProbe<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.inner.read(buf);
        match &r {
            Ok(0) if !buf.is_empty() => self.eof = true,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => self.eof = true,
            _ => {}
        }
        r
    }
}

/// Where a stream ended early, worded as cocoon's tar extraction reports it: a plain entry's
/// short body surfaces only when the reader skips to the next header, a sparse one's while its
/// segments are copied. `Marker` is the simulator's own refusal: Go's tar reader accepts a
/// stream that ends at an entry boundary, which would hide a truncation.
enum Cut<'a> {
    Header,
    Body { name: &'a str, sparse: bool },
    Marker(&'a str),
}

fn truncated(cut: Cut<'_>) -> Error {
    Error::Msg(match cut {
        Cut::Header | Cut::Body { sparse: false, .. } => {
            "extract archive: tar next: unexpected EOF".into()
        }
        Cut::Body { name, sparse: true } => {
            format!("extract archive: extract sparse {name}: unexpected EOF")
        }
        Cut::Marker(detail) => format!(
            "extract archive: tar next: unexpected EOF (archive truncated: {detail}; nothing was imported)"
        ),
    })
}

fn is_truncation(m: &str) -> bool {
    m.starts_with("extract archive:") && m.contains("unexpected EOF")
}

/// The first two bytes decide gzip or plain tar; they are handed back in front of the rest.
pub fn open(mut src: Box<dyn Read>) -> Result<Box<dyn Read>> {
    let mut magic = [0u8; 2];
    let mut got = 0;
    while got < magic.len() {
        match src.read(&mut magic[got..]) {
            Ok(0) => return fail("peek archive header: EOF"),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from(e).wrap("peek archive header")),
        }
    }
    let whole = io::Cursor::new(magic).chain(src);
    if magic == [0x1f, 0x8b] {
        return Ok(Box::new(flate2::read::GzDecoder::new(whole)));
    }
    Ok(Box::new(whole))
}

#[derive(Default)]
struct SparsePax {
    map: Option<String>,
    size: Option<String>,
}

fn sparse_pax(e: &mut tar::Entry<'_, impl Read>) -> io::Result<SparsePax> {
    let mut p = SparsePax::default();
    if let Some(exts) = e.pax_extensions()? {
        for ext in exts {
            let ext = ext?;
            match ext.key() {
                Ok(SPARSE_MAP) => p.map = ext.value().ok().map(String::from),
                Ok(SPARSE_SIZE) => p.size = ext.value().ok().map(String::from),
                _ => {}
            }
        }
    }
    Ok(p)
}

/// The data segments of a sparse entry, checked against its logical size and body length.
fn layout(name: &str, p: &SparsePax, body: u64) -> Result<Option<(Vec<Segment>, u64)>> {
    let (map, size) = match (&p.map, &p.size) {
        (None, None) => return Ok(None),
        (Some(m), Some(s)) => (m, s),
        _ => {
            return fail(format!(
                "{name}: {SPARSE_MAP} and {SPARSE_SIZE} must come together"
            ))
        }
    };
    let bad = |why: &str| fail(format!("{name}: invalid {SPARSE_MAP}: {why}"));
    let Ok(size) = size.trim().parse::<u64>() else {
        return fail(format!("{name}: invalid {SPARSE_SIZE} {size:?}"));
    };
    let segments: Vec<Segment> = match serde_json::from_str(map) {
        Ok(s) => s,
        Err(e) => return bad(&e.to_string()),
    };
    let mut end = 0u64;
    let mut total = 0u64;
    for s in &segments {
        let Some(seg_end) = s.offset.checked_add(s.len) else {
            return bad("segment overflows");
        };
        if s.offset < end {
            return bad("segments overlap or are out of order");
        }
        if seg_end > size {
            return bad("segment beyond the logical size");
        }
        end = seg_end;
        total += s.len;
    }
    if total != body {
        return bad(&format!(
            "segments hold {total} bytes, the entry body {body}"
        ));
    }
    Ok(Some((segments, size)))
}

fn store_entry(
    e: &mut tar::Entry<'_, impl Read>,
    name: &str,
    dir: &Path,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let body = e.size();
    let pax = sparse_pax(e).ctx(format!("read archive: {name}"))?;
    let layout = layout(name, &pax, body)?;
    let sparse = layout.is_some();
    let path = dir.join(name);
    let f = File::create(&path).ctx(format!("create {}", path.display()))?;
    let (segments, size) = layout.unwrap_or((
        vec![Segment {
            offset: 0,
            len: body,
        }],
        body,
    ));
    for s in &segments {
        let got = sparse::copy_exact_at(e, &f, s.offset, s.len, buf)
            .ctx(format!("read archive: {name}"))?;
        if got < s.len {
            return Err(truncated(Cut::Body { name, sparse }));
        }
    }
    f.set_len(size)?;
    Ok(())
}

/// Streams an archive into `dir` (which must exist) and returns the envelope bytes. `check`
/// vets the envelope as soon as it arrives, so a bad archive fails before its data is copied.
pub fn read(
    src: Box<dyn Read>,
    dir: &Path,
    check: impl Fn(&[u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    let mut ar = tar::Archive::new(EofProbe {
        inner: src,
        eof: false,
    });
    let mut envelope = None;
    let mut buf = Vec::new();
    let res = (|| {
        for entry in ar.entries().ctx("read archive")? {
            let mut e = entry.ctx("read archive")?;
            if !matches!(
                e.header().entry_type(),
                tar::EntryType::Regular | tar::EntryType::Continuous
            ) {
                continue;
            }
            let path = e.path().ctx("read archive")?.into_owned();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(String::from) else {
                continue;
            };
            if name != ENVELOPE {
                store_entry(&mut e, &name, dir, &mut buf)?;
                continue;
            }
            let size = e.size();
            if size > ENVELOPE_MAX {
                return fail(format!("{ENVELOPE} is {size} bytes, over {ENVELOPE_MAX}"));
            }
            let mut meta = Vec::with_capacity(size as usize);
            (&mut e)
                .take(size)
                .read_to_end(&mut meta)
                .ctx("read archive")?;
            if (meta.len() as u64) < size {
                return Err(truncated(Cut::Body {
                    name: ENVELOPE,
                    sparse: false,
                }));
            }
            check(&meta)?;
            envelope = Some(meta);
        }
        Ok(())
    })();
    let mut probe = ar.into_inner();
    if let Err(e) = res {
        return Err(match e {
            Error::Msg(m) if probe.eof && !is_truncation(&m) => truncated(Cut::Header),
            other => other,
        });
    }
    if probe.eof {
        return Err(truncated(Cut::Marker("no end-of-archive marker")));
    }
    // The reader stopped at the marker's first zero block; the second must follow in full.
    let mut second = [0u8; 512];
    let mut got = 0;
    while got < second.len() {
        match probe.read(&mut second[got..]) {
            Ok(0) => return Err(truncated(Cut::Marker("end-of-archive marker cut short"))),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) if probe.eof => {
                return Err(truncated(Cut::Marker("end-of-archive marker cut short")))
            }
            Err(e) => return Err(Error::from(e).wrap("read archive")),
        }
    }
    if second.iter().any(|b| *b != 0) {
        return fail("read archive: invalid tar header after a zero block");
    }
    // Whatever follows the marker is padding; reading it to the end also lets gzip check its
    // trailer, and the writer never sees its pipe closed early.
    io::copy(&mut probe.inner, &mut io::sink()).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            truncated(Cut::Marker("stream cut after the end-of-archive marker"))
        } else {
            Error::from(e).wrap("read archive")
        }
    })?;
    match envelope {
        Some(m) => Ok(m),
        None => fail("invalid snapshot archive: snapshot.json not found"),
    }
}

/// The source of `snapshot import`: the named file, or stdin.
pub fn source(path: Option<&String>) -> Result<Box<dyn Read>> {
    Ok(match path {
        Some(p) => Box::new(BufReader::with_capacity(
            CHUNK,
            File::open(p).ctx("open archive")?,
        )),
        None => Box::new(io::stdin().lock()),
    })
}
