//! The v2 writer: files of 1 MiB or more compressed with zstd (one self-contained frame per
//! blob or chunk), files cut at fixed uncompressed offsets when chunking is on and the file is
//! compressed or larger than one chunk. Chunks are encoded and uploaded by a bounded set of
//! workers: workers = min(concurrency, budget / (2 · chunk) − 1), each holding at most one raw
//! and one compressed chunk, so a push never holds more than the memory budget.

use std::io::SeekFrom;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream;
use oci_client::Reference;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::classify::MAX_CHUNKS;
use super::manifest::Descriptor;
use super::push::{chunk_layer, sha256_hex, Counters, PushKnobs, IO_CHUNK};
use super::tar_stream::{EntryHeader, TarReader};
use super::{media, Registry, RegistryError};

const MIB: u64 = 1 << 20;
/// Smaller files are stored as they are even when compression is on.
const COMPRESS_MIN: u64 = MIB;
const MAX_CHUNK_MIB: u32 = 4096;

/// A finished chunk: its index, blob digest, stored size, and whether it was uploaded.
type ChunkResult = Result<(usize, String, u64, bool), RegistryError>;

/// v2 pushes hold a lot of memory and CPU; one at a time per node.
static V2_PUSH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    level: i32,
    chunk: u64,
    workers: usize,
}

impl Plan {
    /// `None` when both knobs are 0 (the v1 writer).
    pub fn from_knobs(k: &PushKnobs) -> Result<Option<Plan>, RegistryError> {
        if k.zstd_level == 0 && k.chunk_size_mib == 0 {
            return Ok(None);
        }
        if k.chunk_size_mib > MAX_CHUNK_MIB {
            return Err(RegistryError::Local(format!(
                "chunk size {} MiB is over the 4096 MiB maximum",
                k.chunk_size_mib
            )));
        }
        let chunk = k.chunk_size_mib as u64 * MIB;
        let workers = if chunk == 0 {
            1
        } else {
            let budget = k.memory_budget_mib.saturating_mul(MIB);
            if budget < 4 * chunk {
                return Err(RegistryError::Local(format!(
                    "memory budget {} MiB is below 4 chunks of {} MiB",
                    k.memory_budget_mib, k.chunk_size_mib
                )));
            }
            (k.concurrency.max(1) as u64).min(budget / (2 * chunk) - 1) as usize
        };
        Ok(Some(Plan {
            level: k.zstd_level as i32,
            chunk,
            workers,
        }))
    }

    fn compresses(&self, size: u64) -> bool {
        self.level > 0 && size >= COMPRESS_MIN
    }

    fn chunks(&self, size: u64) -> bool {
        self.chunk > 0 && (self.compresses(size) || size > self.chunk)
    }

    /// Whether this file is compressed or chunked (else it is stored as in v1).
    pub fn qualifies(&self, size: u64) -> bool {
        self.compresses(size) || self.chunks(size)
    }

    #[cfg(test)]
    fn workers(&self) -> usize {
        self.workers
    }

    pub async fn serialise() -> tokio::sync::MutexGuard<'static, ()> {
        V2_PUSH.lock().await
    }

    /// Pushes one qualifying file; returns its layer descriptors (in file order) and the
    /// chunk list for `files[].chunks` (empty unless two chunks or more).
    pub async fn push_file<R: AsyncRead + Unpin>(
        &self,
        reg: &Registry,
        r: &Reference,
        tar: &mut TarReader<R>,
        h: &EntryHeader,
        layer_type: &str,
        counters: &mut Counters,
    ) -> Result<(Vec<Descriptor>, Vec<String>), RegistryError> {
        let compress = self.compresses(h.size);
        let media_type = if compress {
            format!("{layer_type}{}", media::ZSTD_SUFFIX)
        } else {
            layer_type.to_string()
        };
        if !self.chunks(h.size) {
            let (digest, stored) = self
                .push_compressed_whole(reg, r, tar, h.size, counters)
                .await?;
            return Ok((
                vec![chunk_layer(&media_type, digest, stored, &h.name, None)],
                Vec::new(),
            ));
        }
        let n = h.size.div_ceil(self.chunk) as usize;
        if n > MAX_CHUNKS {
            return Err(RegistryError::Local(format!(
                "{} would need {n} chunks, over the 2^20 cap",
                h.name
            )));
        }
        let permits = Arc::new(Semaphore::new(self.workers));
        let mut tasks: JoinSet<ChunkResult> = JoinSet::new();
        let mut results: Vec<Option<(String, u64)>> = vec![None; n];
        let mut remaining = h.size;
        for i in 0..n {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            // Collect what finished meanwhile, so an upload error stops the read early.
            while let Some(done) = tasks.try_join_next() {
                let (idx, d, s, up) = joined(done)?;
                record(counters, &mut results, idx, d, s, up);
            }
            let len = remaining.min(self.chunk);
            remaining -= len;
            let data = read_exact_body(tar, len as usize).await?;
            let reg = reg.clone();
            let r = r.clone();
            let level = self.level;
            tasks.spawn(async move {
                let _permit = permit;
                let blob = if compress {
                    tokio::task::spawn_blocking(move || zstd::bulk::compress(&data, level))
                        .await
                        .map_err(|e| RegistryError::Local(format!("zstd worker: {e}")))?
                        .map_err(|e| RegistryError::Local(format!("zstd: {e}")))?
                } else {
                    data
                };
                let mut hasher = Sha256::new();
                hasher.update(&blob);
                let digest = sha256_hex(hasher);
                let size = blob.len() as u64;
                let mut c = Counters {
                    uploaded: 0,
                    present: 0,
                    bytes: 0,
                };
                reg.upload_if_missing(
                    &r,
                    &digest,
                    size,
                    stream::iter([Ok(Bytes::from(blob))]),
                    &mut c,
                )
                .await?;
                Ok((i, digest, size, c.uploaded > 0))
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (idx, d, s, up) = joined(done)?;
            record(counters, &mut results, idx, d, s, up);
        }
        let mut descs = Vec::with_capacity(n);
        let mut chunks = Vec::with_capacity(n);
        for (i, res) in results.into_iter().enumerate() {
            let (digest, stored) = res.expect("every chunk task reported");
            let ic = (n >= 2).then_some((i, n));
            descs.push(chunk_layer(
                &media_type,
                digest.clone(),
                stored,
                &h.name,
                ic,
            ));
            chunks.push(digest);
        }
        if n < 2 {
            chunks.clear();
        }
        Ok((descs, chunks))
    }

    /// Compression without chunking: the file streams through one zstd frame into a spool
    /// file, hashed on the way, then HEAD and upload.
    async fn push_compressed_whole<R: AsyncRead + Unpin>(
        &self,
        reg: &Registry,
        r: &Reference,
        tar: &mut TarReader<R>,
        size: u64,
        counters: &mut Counters,
    ) -> Result<(String, u64), RegistryError> {
        use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
        let local =
            |what: &str, e: &dyn std::fmt::Display| RegistryError::Local(format!("{what}: {e}"));
        let std_file = tempfile::tempfile_in(reg.spool_dir())
            .map_err(|e| local("creating a spool file", &e))?;
        let mut file = tokio::fs::File::from_std(std_file);
        let mut enc =
            zstd::stream::raw::Encoder::new(self.level).map_err(|e| local("zstd encoder", &e))?;
        enc.set_pledged_src_size(Some(size))
            .map_err(|e| local("zstd encoder", &e))?;
        let mut hasher = Sha256::new();
        let mut stored = 0u64;
        let mut inbuf = vec![0u8; IO_CHUNK];
        let mut outbuf = vec![0u8; zstd::zstd_safe::CCtx::out_size().max(IO_CHUNK)];
        loop {
            let n = tar
                .read_body(&mut inbuf)
                .await
                .map_err(|e| local("reading the export", &e))?;
            if n == 0 {
                break;
            }
            let mut input = InBuffer::around(&inbuf[..n]);
            while input.pos() < n {
                let mut out = OutBuffer::around(&mut outbuf[..]);
                enc.run(&mut input, &mut out)
                    .map_err(|e| local("zstd", &e))?;
                let w = out.pos();
                hasher.update(&outbuf[..w]);
                file.write_all(&outbuf[..w])
                    .await
                    .map_err(|e| local("writing the spool file", &e))?;
                stored += w as u64;
            }
        }
        loop {
            let mut out = OutBuffer::around(&mut outbuf[..]);
            let left = enc.finish(&mut out, true).map_err(|e| local("zstd", &e))?;
            let w = out.pos();
            hasher.update(&outbuf[..w]);
            file.write_all(&outbuf[..w])
                .await
                .map_err(|e| local("writing the spool file", &e))?;
            stored += w as u64;
            if left == 0 {
                break;
            }
        }
        file.flush()
            .await
            .map_err(|e| local("writing the spool file", &e))?;
        file.seek(SeekFrom::Start(0))
            .await
            .map_err(|e| local("rewinding the spool file", &e))?;
        let digest = sha256_hex(hasher);
        reg.upload_if_missing(r, &digest, stored, super::push::file_stream(file), counters)
            .await?;
        Ok((digest, stored))
    }
}

fn joined(r: Result<ChunkResult, tokio::task::JoinError>) -> ChunkResult {
    r.map_err(|e| RegistryError::Local(format!("chunk worker: {e}")))?
}

fn record(
    c: &mut Counters,
    results: &mut [Option<(String, u64)>],
    i: usize,
    digest: String,
    size: u64,
    uploaded: bool,
) {
    if uploaded {
        c.uploaded += 1;
        c.bytes += size;
    } else {
        c.present += 1;
    }
    results[i] = Some((digest, size));
}

async fn read_exact_body<R: AsyncRead + Unpin>(
    tar: &mut TarReader<R>,
    len: usize,
) -> Result<Vec<u8>, RegistryError> {
    let mut v = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        let n = tar
            .read_body(&mut v[filled..])
            .await
            .map_err(|e| RegistryError::Local(format!("reading the export: {e}")))?;
        if n == 0 {
            return Err(RegistryError::Local(
                "the export ends inside a chunk".into(),
            ));
        }
        filled += n;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(level: u32, chunk: u32, conc: u32, budget: u64) -> PushKnobs {
        PushKnobs {
            zstd_level: level,
            chunk_size_mib: chunk,
            concurrency: conc,
            memory_budget_mib: budget,
        }
    }

    #[test]
    fn zero_knobs_are_v1_and_budgets_bound_the_workers() {
        assert_eq!(Plan::from_knobs(&knobs(0, 0, 8, 9216)).unwrap(), None);
        let p = Plan::from_knobs(&knobs(3, 64, 8, 9216)).unwrap().unwrap();
        assert_eq!(p.workers(), 8);
        // 512 MiB / (2 · 64 MiB) − 1 = 3 workers.
        let p = Plan::from_knobs(&knobs(3, 64, 8, 512)).unwrap().unwrap();
        assert_eq!(p.workers(), 3);
        // Below four chunks: a push error.
        assert!(Plan::from_knobs(&knobs(3, 64, 8, 255)).is_err());
        assert!(Plan::from_knobs(&knobs(0, 4097, 8, 1 << 20)).is_err());
    }

    #[test]
    fn which_files_are_encoded() {
        let zstd_only = Plan::from_knobs(&knobs(3, 0, 8, 9216)).unwrap().unwrap();
        assert!(!zstd_only.qualifies(MIB - 1));
        assert!(zstd_only.qualifies(MIB));
        assert!(!zstd_only.chunks(10 * MIB));
        let chunk_only = Plan::from_knobs(&knobs(0, 4, 8, 9216)).unwrap().unwrap();
        assert!(!chunk_only.qualifies(4 * MIB));
        assert!(chunk_only.qualifies(4 * MIB + 1));
        let both = Plan::from_knobs(&knobs(1, 4, 8, 9216)).unwrap().unwrap();
        assert!(both.chunks(2 * MIB), "a compressed file is always chunked");
        assert!(!both.qualifies(1000));
    }
}
