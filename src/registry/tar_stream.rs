//! Just enough tar for cocoon's snapshot archives, streamed: a reader that yields regular
//! entries (with their PAX records) without buffering bodies, and the headers the writer
//! puts in front of each body it streams.

use std::collections::BTreeMap;
use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const BLOCK: u64 = 512;
/// Extended headers are metadata; a larger one is a broken or hostile archive.
const MAX_META_BYTES: u64 = 1 << 20;
pub const PAX_SPARSE_MAP: &str = "COCOON.sparse.map";
pub const PAX_SPARSE_SIZE: &str = "COCOON.sparse.size";

/// A regular entry whose body is next in the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    pub name: String,
    pub mode: u32,
    pub size: u64,
    pub pax: BTreeMap<String, String>,
}

pub fn padding(size: u64) -> u64 {
    (BLOCK - size % BLOCK) % BLOCK
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

pub struct TarReader<R> {
    inner: R,
    /// Body bytes of the current entry not yet consumed, then its padding.
    remaining: u64,
    pad: u64,
    done: bool,
    /// The sha256 of the current entry's body so far, while bodies are hashed.
    body_hash: Option<sha2::Sha256>,
    hashing: bool,
}

impl<R: AsyncRead + Unpin> TarReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            remaining: 0,
            pad: 0,
            done: false,
            body_hash: None,
            hashing: false,
        }
    }

    /// Every entry body read from now on is hashed as it passes (K7.3: the per-file digest a
    /// peer restore checks its copy against).
    pub fn hash_bodies(&mut self) {
        self.hashing = true;
    }

    /// `sha256:<hex>` of the current entry's body, once it has been read to its end.
    pub fn take_body_digest(&mut self) -> Option<String> {
        use sha2::Digest as _;
        if self.remaining != 0 {
            return None;
        }
        self.body_hash
            .take()
            .map(|h| format!("sha256:{:x}", h.finalize()))
    }

    /// The next regular entry; `None` at the end-of-archive marker. Non-regular entries are
    /// skipped. The previous entry's body must have been read to its end.
    pub async fn next_entry(&mut self) -> io::Result<Option<EntryHeader>> {
        if self.remaining != 0 {
            return Err(bad("tar body not consumed before the next header"));
        }
        self.skip(self.pad).await?;
        self.pad = 0;
        if self.done {
            return Ok(None);
        }
        let mut pax: BTreeMap<String, String> = BTreeMap::new();
        let mut long_name: Option<String> = None;
        loop {
            let mut block = [0u8; BLOCK as usize];
            self.inner
                .read_exact(&mut block)
                .await
                .map_err(|e| eof_is_truncation(e, "tar header"))?;
            if block.iter().all(|&b| b == 0) {
                self.done = true;
                return Ok(None);
            }
            let h = tar::Header::from_byte_slice(&block);
            check_checksum(h, &block)?;
            let kind = h.entry_type();
            let meta = kind.is_pax_local_extensions() || kind.is_gnu_longname();
            let size = match pax.get("size").filter(|_| !meta) {
                Some(s) => s
                    .parse::<u64>()
                    .map_err(|_| bad(format!("PAX size {s:?}")))?,
                None => h.entry_size()?,
            };
            if meta {
                if size > MAX_META_BYTES {
                    return Err(bad(format!("tar extended header of {size} bytes")));
                }
                let body = self.read_small(size).await?;
                if kind.is_gnu_longname() {
                    let n = body.split(|&b| b == 0).next().unwrap_or_default();
                    long_name = Some(String::from_utf8_lossy(n).into_owned());
                } else {
                    for ext in tar::PaxExtensions::new(&body) {
                        let ext = ext.map_err(|e| bad(format!("PAX record: {e}")))?;
                        let k = ext.key().map_err(|e| bad(format!("PAX key: {e}")))?;
                        let v = ext.value().map_err(|e| bad(format!("PAX value: {e}")))?;
                        pax.insert(k.to_string(), v.to_string());
                    }
                }
                continue;
            }
            if !(kind.is_file() || kind.is_contiguous()) {
                // Directories, links, global PAX headers, GNU sparse maps: skipped whole.
                self.skip(size + padding(size)).await?;
                pax.clear();
                long_name = None;
                continue;
            }
            let name = match (pax.remove("path"), long_name.take()) {
                (Some(p), _) => p,
                (None, Some(n)) => n,
                (None, None) => String::from_utf8_lossy(&h.path_bytes()).into_owned(),
            };
            let name = name.strip_prefix("./").unwrap_or(&name).to_string();
            self.remaining = size;
            self.pad = padding(size);
            self.body_hash = self.hashing.then(<sha2::Sha256 as sha2::Digest>::new);
            return Ok(Some(EntryHeader {
                name,
                mode: h.mode().unwrap_or(0o640),
                size,
                pax,
            }));
        }
    }

    /// Reads up to `buf.len()` bytes of the current body; 0 once it is consumed.
    pub async fn read_body(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.remaining as usize);
        let n = self.inner.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(bad("tar stream ends inside an entry body"));
        }
        self.remaining -= n as u64;
        if let Some(h) = &mut self.body_hash {
            sha2::Digest::update(h, &buf[..n]);
        }
        Ok(n)
    }

    pub async fn read_small(&mut self, size: u64) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; size as usize];
        self.inner
            .read_exact(&mut v)
            .await
            .map_err(|e| eof_is_truncation(e, "tar body"))?;
        self.skip(padding(size)).await?;
        Ok(v)
    }

    /// Reads the whole current body, refusing one larger than `cap`.
    pub async fn read_body_to_vec(&mut self, cap: u64) -> io::Result<Vec<u8>> {
        if self.remaining > cap {
            return Err(bad(format!(
                "tar entry of {} bytes exceeds {cap}",
                self.remaining
            )));
        }
        let size = self.remaining;
        self.remaining = 0;
        self.pad = 0;
        let body = self.read_small(size).await?;
        if let Some(h) = &mut self.body_hash {
            sha2::Digest::update(h, &body);
        }
        Ok(body)
    }

    /// Reads past the end-of-archive marker to the end of the stream, so that whatever
    /// produces it is seen to finish (and can report a failure) before the caller commits.
    pub async fn drain(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        while self.inner.read(&mut buf).await? != 0 {}
        Ok(())
    }

    async fn skip(&mut self, mut n: u64) -> io::Result<()> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let want = buf.len().min(n as usize);
            let got = self.inner.read(&mut buf[..want]).await?;
            if got == 0 {
                return Err(bad("tar stream ends early"));
            }
            n -= got as u64;
        }
        Ok(())
    }
}

fn eof_is_truncation(e: io::Error, what: &str) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        bad(format!("tar stream ends inside a {what}"))
    } else {
        e
    }
}

fn check_checksum(h: &tar::Header, block: &[u8; BLOCK as usize]) -> io::Result<()> {
    let want = h.cksum()?;
    let got: u32 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as u32
            }
        })
        .sum();
    if want != got {
        return Err(bad("tar header checksum mismatch"));
    }
    Ok(())
}

/// Limits of the plain ustar fields; beyond them the value travels in a PAX record.
const USTAR_MAX_SIZE: u64 = (1 << 33) - 1;
const USTAR_MAX_NAME: usize = 100;

/// The header blocks (a PAX header when needed, then the ustar header) for a regular entry.
pub fn entry_header(
    name: &str,
    mode: u32,
    size: u64,
    extra_pax: &[(&str, String)],
) -> io::Result<Vec<u8>> {
    let mut records: Vec<(&str, String)> = extra_pax.to_vec();
    if size > USTAR_MAX_SIZE {
        records.push(("size", size.to_string()));
    }
    if name.len() >= USTAR_MAX_NAME {
        records.push(("path", name.to_string()));
    }
    let mut out = Vec::with_capacity(3 * BLOCK as usize);
    if !records.is_empty() {
        let mut body = Vec::new();
        for (k, v) in &records {
            body.extend_from_slice(&pax_record(k, v));
        }
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        set_name(&mut h, "PaxHeader")?;
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        let pad = padding(body.len() as u64) as usize;
        out.extend_from_slice(&body);
        out.resize(out.len() + pad, 0);
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(size.min(USTAR_MAX_SIZE));
    h.set_mtime(0);
    let short: String = name.chars().take(USTAR_MAX_NAME - 1).collect();
    set_name(
        &mut h,
        if name.len() >= USTAR_MAX_NAME {
            &short
        } else {
            name
        },
    )?;
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    Ok(out)
}

fn set_name(h: &mut tar::Header, name: &str) -> io::Result<()> {
    let field = &mut h.as_old_mut().name;
    if name.len() >= field.len() {
        return Err(bad(format!("tar name {name:?} too long")));
    }
    field.fill(0);
    field[..name.len()].copy_from_slice(name.as_bytes());
    Ok(())
}

/// `"<len> <key>=<value>\n"`, where `<len>` counts the whole record including itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len.to_string().len() + rest != len {
        len = len.to_string().len() + rest;
    }
    format!("{len} {key}={value}\n").into_bytes()
}

/// Writes a whole small entry (header, body, padding).
pub async fn write_small_entry<W: AsyncWrite + Unpin>(
    w: &mut W,
    name: &str,
    mode: u32,
    body: &[u8],
) -> io::Result<()> {
    w.write_all(&entry_header(name, mode, body.len() as u64, &[])?)
        .await?;
    w.write_all(body).await?;
    write_padding(w, body.len() as u64).await
}

pub async fn write_padding<W: AsyncWrite + Unpin>(w: &mut W, size: u64) -> io::Result<()> {
    let pad = padding(size) as usize;
    if pad > 0 {
        w.write_all(&[0u8; BLOCK as usize][..pad]).await?;
    }
    Ok(())
}

/// The end-of-archive marker: two zero blocks.
pub async fn write_end<W: AsyncWrite + Unpin>(w: &mut W) -> io::Result<()> {
    w.write_all(&[0u8; 2 * BLOCK as usize]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        assert_eq!(pax_record("a", "b"), b"6 a=b\n");
        let r = pax_record(PAX_SPARSE_SIZE, "1073741824");
        let s = String::from_utf8(r.clone()).unwrap();
        let len: usize = s.split(' ').next().unwrap().parse().unwrap();
        assert_eq!(len, r.len());
        // Crossing a digit boundary: 5 + 1 + 3 = 9 would make the record 10 long.
        let r = pax_record("k", "12345");
        assert_eq!(r.len(), 11);
        assert_eq!(r, b"11 k=12345\n");
    }

    async fn entries(bytes: &[u8]) -> Vec<(EntryHeader, Vec<u8>)> {
        let mut r = TarReader::new(bytes);
        let mut out = Vec::new();
        while let Some(h) = r.next_entry().await.unwrap() {
            let mut body = Vec::new();
            let mut buf = [0u8; 3];
            loop {
                let n = r.read_body(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&buf[..n]);
            }
            out.push((h, body));
        }
        r.drain().await.unwrap();
        out
    }

    #[tokio::test]
    async fn written_entries_read_back_with_pax_records() {
        let mut w = Vec::new();
        write_small_entry(&mut w, "snapshot.json", 0o644, b"{}")
            .await
            .unwrap();
        let long = "x".repeat(150);
        let hdr = entry_header(
            &long,
            0o600,
            5,
            &[
                (PAX_SPARSE_MAP, "[{\"o\":0,\"l\":5}]".into()),
                (PAX_SPARSE_SIZE, "4096".into()),
            ],
        )
        .unwrap();
        w.extend_from_slice(&hdr);
        w.extend_from_slice(b"hello");
        write_padding(&mut w, 5).await.unwrap();
        write_end(&mut w).await.unwrap();
        let got = entries(&w).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.name, "snapshot.json");
        assert_eq!(got[0].0.mode, 0o644);
        assert_eq!(got[0].1, b"{}");
        assert_eq!(got[1].0.name, long);
        assert_eq!(got[1].0.mode, 0o600);
        assert_eq!(got[1].0.pax[PAX_SPARSE_SIZE], "4096");
        assert_eq!(got[1].0.pax[PAX_SPARSE_MAP], "[{\"o\":0,\"l\":5}]");
        assert_eq!(got[1].1, b"hello");
    }

    #[tokio::test]
    async fn reads_what_the_tar_crate_writes_and_skips_non_regular_entries() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        b.append_data(&mut h, "dir/", &[][..]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(3);
        h.set_mode(0o640);
        b.append_data(&mut h, "cow.raw", &b"abc"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let got = entries(&bytes).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.name, "cow.raw");
        assert_eq!(got[0].1, b"abc");
        // Go's and the tar crate's readers accept what the writer emits, sparse records kept.
        let mut w = Vec::new();
        w.extend_from_slice(
            &entry_header("m", 0o640, 2, &[(PAX_SPARSE_SIZE, "9".into())]).unwrap(),
        );
        w.extend_from_slice(b"zz");
        write_padding(&mut w, 2).await.unwrap();
        write_end(&mut w).await.unwrap();
        let mut ar = tar::Archive::new(&w[..]);
        let mut es = ar.entries().unwrap();
        let mut e = es.next().unwrap().unwrap();
        let exts: Vec<_> = e
            .pax_extensions()
            .unwrap()
            .unwrap()
            .map(|x| x.unwrap().key().unwrap().to_string())
            .collect();
        assert_eq!(exts, [PAX_SPARSE_SIZE]);
        let mut s = String::new();
        std::io::Read::read_to_string(&mut e, &mut s).unwrap();
        assert_eq!(s, "zz");
    }

    #[tokio::test]
    async fn truncation_and_corruption_are_errors() {
        let mut w = Vec::new();
        write_small_entry(&mut w, "a", 0o644, b"12345")
            .await
            .unwrap();
        let mut r = TarReader::new(&w[..w.len() - 400]);
        r.next_entry().await.unwrap();
        let mut buf = [0u8; 10];
        assert!(r.read_body(&mut buf).await.is_ok());
        let mut cut = w.clone();
        cut.truncate(600);
        let mut r = TarReader::new(&cut[..]);
        r.next_entry().await.unwrap();
        let mut buf = [0u8; 10];
        r.read_body(&mut buf).await.unwrap();
        // The body is there but the next header is not.
        assert!(r.next_entry().await.is_err());
        let mut flipped = w.clone();
        flipped[10] ^= 0xff;
        assert!(TarReader::new(&flipped[..]).next_entry().await.is_err());
    }
}
