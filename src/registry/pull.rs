//! Registry → local: the snapshot import stream and the cloud-image disk stream.
//!
//! Every check of the reader (artifact type, config type and size, layer types, titles,
//! `+zstd` and chunk lists only in v2, sizes of encoded files, sparse records) runs on the
//! manifest and config blob before the first byte goes to the sink. The body then streams
//! blob by blob, one piece at a time, with no prefetch and no parallel decode: memory stays at
//! a few network buffers and one 256 KiB decode buffer whatever the snapshot or chunk size.
//! The one thing an artifact could still make large is a zstd frame's window; that is capped
//! by the pull budget (`SNAPSHOT_PULL_BUDGET_MIB`).

use bytes::Bytes;
use oci_client::Reference;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::blob::VerifiedBlob;
use super::classify::{self, Format, PlannedEntry};
use super::tar_stream;
use super::{ConfigBlob, Registry, RegistryError, Target};

static HEAVY_PULLS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// What a pull wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullOutcome {
    pub digest: String,
    pub format: Format,
    pub snapshot_id: String,
    pub config: ConfigBlob,
    /// Bytes of the tar stream handed to the sink.
    pub bytes: u64,
}

/// cocoon's snapshot names: `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`.
pub fn valid_snapshot_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"._:/-".contains(&c))
}

fn local(e: std::io::Error) -> RegistryError {
    RegistryError::Local(format!("writing the import stream: {e}"))
}

struct Counting<'a, W> {
    w: &'a mut W,
    bytes: u64,
}

impl<W: AsyncWrite + Unpin> Counting<'_, W> {
    async fn put(&mut self, b: &[u8]) -> Result<(), RegistryError> {
        self.w.write_all(b).await.map_err(local)?;
        self.bytes += b.len() as u64;
        Ok(())
    }
}

impl Registry {
    /// Streams `name:tag` as a `cocoon snapshot import` archive named `local_name` into
    /// `import`. On error the sink may hold a prefix of the archive, never a complete one:
    /// the caller must discard it (kill the importer rather than close its input).
    pub async fn pull_snapshot<W: AsyncWrite + Unpin>(
        &self,
        name: &str,
        tag: &str,
        import: W,
        local_name: &str,
    ) -> Result<PullOutcome, RegistryError> {
        self.pull_snapshot_described(name, tag, import, local_name, None)
            .await
    }

    /// [`Registry::pull_snapshot`] whose archive's `snapshot.json` carries `description`
    /// instead of the config's, when given: the owner record comes from the manifest (T5),
    /// never from a config blob.
    pub async fn pull_snapshot_described<W: AsyncWrite + Unpin>(
        &self,
        name: &str,
        tag: &str,
        mut import: W,
        local_name: &str,
        description: Option<&str>,
    ) -> Result<PullOutcome, RegistryError> {
        if !valid_snapshot_name(local_name) {
            return Err(RegistryError::Refused(format!(
                "local snapshot name {local_name:?} is not a cocoon snapshot name"
            )));
        }
        let resolved = self.resolve(name, tag, true).await?;
        let (m, digest) = (resolved.manifest, resolved.digest);
        let format = classify::check_snapshot_manifest(&m).map_err(RegistryError::Refused)?;
        // v2 and index pulls are the heavy ones (decode, several blobs per file): two at a
        // time per node, the others wait here before any byte moves.
        let _slot = if format == Format::V2 || resolved.via_index {
            Some(
                HEAVY_PULLS
                    .acquire()
                    .await
                    .expect("the pull slots are never closed"),
            )
        } else {
            None
        };
        let config = self.fetch_config(name, &m).await?;
        let plan = classify::plan_import(&m, &config).map_err(RegistryError::Refused)?;
        let r = self.blob_ref(name)?;
        let mut out = Counting {
            w: &mut import,
            bytes: 0,
        };
        let envelope = match description {
            Some(d) => ConfigBlob {
                description: d.to_string(),
                ..config.clone()
            }
            .to_envelope(local_name),
            None => config.to_envelope(local_name),
        };
        let mut head = Vec::new();
        tar_stream::write_small_entry(&mut head, "snapshot.json", 0o644, &envelope)
            .await
            .map_err(local)?;
        out.put(&head).await?;
        for entry in &plan.entries {
            self.write_entry(&r, entry, &mut out).await?;
        }
        out.put(&[0u8; 2 * tar_stream::BLOCK as usize]).await?;
        out.w.flush().await.map_err(local)?;
        Ok(PullOutcome {
            digest,
            format,
            snapshot_id: config.snapshot_id.clone(),
            bytes: out.bytes,
            config,
        })
    }

    async fn write_entry<W: AsyncWrite + Unpin>(
        &self,
        r: &Reference,
        e: &PlannedEntry,
        out: &mut Counting<'_, W>,
    ) -> Result<(), RegistryError> {
        let mut pax: Vec<(&str, String)> = Vec::new();
        if let Some((map, size)) = &e.sparse {
            pax.push((tar_stream::PAX_SPARSE_MAP, map.clone()));
            pax.push((tar_stream::PAX_SPARSE_SIZE, size.to_string()));
        }
        let header = tar_stream::entry_header(&e.name, e.mode, e.size, &pax).map_err(local)?;
        out.put(&header).await?;
        let mut written = 0u64;
        for piece in &e.pieces {
            let mut blob = VerifiedBlob::open(&self.client, r, &piece.blob).await?;
            let mut decoder = if piece.zstd {
                Some(ZstdFrame::new(self.window_log_max)?)
            } else {
                None
            };
            while let Some(b) = blob.next().await? {
                match decoder.as_mut() {
                    None => {
                        written += b.len() as u64;
                        check_room(e, written)?;
                        out.put(&b).await?;
                    }
                    Some(d) => {
                        // One decoded piece at a time: a frame that inflates past the entry's
                        // size is refused having held one piece, not all it inflates to.
                        d.push(b);
                        while let Some(chunk) = d.next_out()? {
                            written += chunk.len() as u64;
                            if written > e.size {
                                self.caps.refused(crate::caps::Cap::RegistryChunk);
                            }
                            check_room(e, written)?;
                            out.put(&chunk).await?;
                        }
                    }
                }
            }
            if let Some(d) = decoder {
                d.finish(&piece.blob.digest)?;
            }
        }
        if written != e.size {
            return Err(RegistryError::Refused(format!(
                "{} reconstructs to {written} bytes, expected {}",
                e.name, e.size
            )));
        }
        let mut pad = Vec::new();
        tar_stream::write_padding(&mut pad, e.size)
            .await
            .map_err(local)?;
        out.put(&pad).await
    }

    /// Streams the disk layers of the cloud image `name:tag`, sorted by title, concatenated,
    /// into `sink` (the input of `cocoon image import`). Indexes are not followed.
    pub async fn pull_cloud_image<W: AsyncWrite + Unpin>(
        &self,
        name: &str,
        tag: &str,
        mut sink: W,
    ) -> Result<u64, RegistryError> {
        let m = self.resolve(name, tag, false).await?.manifest;
        let disks = classify::cloud_disk_layers(&m).map_err(RegistryError::Refused)?;
        let r = self.blob_ref(name)?;
        let mut total = 0u64;
        for d in &disks {
            let mut blob = VerifiedBlob::open(&self.client, &r, d).await?;
            while let Some(b) = blob.next().await? {
                sink.write_all(&b).await.map_err(local)?;
                total += b.len() as u64;
            }
        }
        sink.flush().await.map_err(local)?;
        Ok(total)
    }

    /// A reference into the repository `name`, for blob URLs (which ignore the tag).
    pub(crate) fn blob_ref(&self, name: &str) -> Result<Reference, RegistryError> {
        self.reference(name, &Target::Tag("latest".into()))
    }
}

fn check_room(e: &PlannedEntry, written: u64) -> Result<(), RegistryError> {
    if written > e.size {
        return Err(RegistryError::Refused(format!(
            "{} decodes past its files[].size of {} bytes",
            e.name, e.size
        )));
    }
    Ok(())
}

/// One self-contained zstd frame, decoded as its compressed bytes arrive, at most
/// `DECODE_OUT` bytes at a time.
struct ZstdFrame {
    d: zstd::stream::raw::Decoder<'static>,
    /// The frame has ended; anything after it is an error.
    ended: bool,
    /// Compressed bytes not decoded yet, from `pos`.
    input: Bytes,
    pos: usize,
}

const DECODE_OUT: usize = 256 << 10;

impl ZstdFrame {
    fn new(window_log_max: u32) -> Result<Self, RegistryError> {
        let mut d = zstd::stream::raw::Decoder::new()
            .map_err(|e| RegistryError::Local(format!("zstd decoder: {e}")))?;
        d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(window_log_max))
            .map_err(|e| RegistryError::Local(format!("zstd decoder: {e}")))?;
        Ok(Self {
            d,
            ended: false,
            input: Bytes::new(),
            pos: 0,
        })
    }

    /// The next compressed bytes, once the ones before are decoded (`next_out` gave `None`).
    fn push(&mut self, input: Bytes) {
        self.input = input;
        self.pos = 0;
    }

    /// The next decoded piece, or `None` once the pushed bytes are used up and the decoder
    /// holds no more output.
    fn next_out(&mut self) -> Result<Option<Vec<u8>>, RegistryError> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        loop {
            let more = self.pos < self.input.len();
            if more && self.ended {
                return Err(RegistryError::Refused(
                    "bytes after the end of a zstd frame".into(),
                ));
            }
            let mut buf = vec![0u8; DECODE_OUT];
            let mut inb = InBuffer::around(&self.input[self.pos..]);
            let mut outb = OutBuffer::around(&mut buf[..]);
            let hint = self
                .d
                .run(&mut inb, &mut outb)
                .map_err(|e| RegistryError::Refused(format!("zstd frame does not decode: {e}")))?;
            self.pos += inb.pos();
            let n = outb.pos();
            if hint == 0 {
                self.ended = true;
            }
            if n > 0 {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            if !more {
                return Ok(None);
            }
        }
    }

    fn finish(self, digest: &str) -> Result<(), RegistryError> {
        if !self.ended {
            return Err(RegistryError::Refused(format!(
                "blob {digest} ends inside a zstd frame"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        for ok in ["vm-a", "vm-a-hibernate-import", "repo:tag", "a/b.c_d"] {
            assert!(valid_snapshot_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a b", &"a".repeat(64), "a;rm"] {
            assert!(!valid_snapshot_name(bad), "{bad}");
        }
    }

    #[test]
    fn zstd_frames_decode_across_feeds_and_refuse_garbage() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let z = zstd::bulk::compress(&data, 3).unwrap();
        let mut f = ZstdFrame::new(27).unwrap();
        let mut got = Vec::new();
        for part in z.chunks(1000) {
            for c in feed(&mut f, part).unwrap() {
                got.extend_from_slice(&c);
            }
        }
        f.finish("d").unwrap();
        assert_eq!(got, data);
        let mut f = ZstdFrame::new(27).unwrap();
        assert!(feed(&mut f, b"definitely not zstd").is_err());
        // A frame whose window is over the budget is refused, not allocated.
        let big = {
            let mut e = zstd::stream::raw::Encoder::new(3).unwrap();
            use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
            e.set_parameter(zstd::zstd_safe::CParameter::WindowLog(24))
                .unwrap();
            let mut out = vec![0u8; 1 << 20];
            let mut o = OutBuffer::around(&mut out[..]);
            e.run(&mut InBuffer::around(&data), &mut o).unwrap();
            e.finish(&mut o, true).unwrap();
            let n = o.pos();
            out.truncate(n);
            out
        };
        let mut f = ZstdFrame::new(20).unwrap();
        assert!(feed(&mut f, &big).is_err());
        let mut f = ZstdFrame::new(27).unwrap();
        feed(&mut f, &z[..z.len() / 2]).unwrap();
        assert!(f.finish("d").is_err());
    }

    /// Every piece the pushed bytes decode to.
    fn feed(f: &mut ZstdFrame, part: &[u8]) -> Result<Vec<Vec<u8>>, RegistryError> {
        f.push(Bytes::copy_from_slice(part));
        let mut out = Vec::new();
        while let Some(c) = f.next_out()? {
            out.push(c);
        }
        Ok(out)
    }

    #[test]
    fn a_zstd_bomb_comes_out_one_bounded_piece_at_a_time() {
        // 64 MiB of zeros in a few KiB: one push of all of it yields one piece per call.
        let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let mut f = ZstdFrame::new(27).unwrap();
        f.push(Bytes::from(bomb));
        let first = f.next_out().unwrap().expect("a piece");
        assert!(first.len() <= DECODE_OUT);
        let mut total = first.len();
        while let Some(c) = f.next_out().unwrap() {
            assert!(c.len() <= DECODE_OUT);
            total += c.len();
        }
        assert_eq!(total, 64 << 20);
        f.finish("d").unwrap();
    }
}
