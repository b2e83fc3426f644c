//! The temp file a v1 blob goes through: its digest must be known before the HEAD and the
//! upload, and the export can be read only once. Hashing and writing run on two blocking threads
//! fed through short queues, so reading the export, hashing and writing overlap; the upload
//! reads the file back on another blocking thread, a few chunks ahead of the socket. The file
//! is unlinked from the start: nothing is left behind, whatever happens to the process.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use bytes::{Bytes, BytesMut};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::push::{sha256_hex, IO_CHUNK};
use super::tar_stream::TarReader;
use super::RegistryError;

/// Chunks in flight between the stages: 4 MiB of buffers at most.
const QUEUE: usize = 4;

fn local(what: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Local(format!("{what}: {e}"))
}

/// Copies the current entry body into a new unlinked file in `dir`; returns it with the
/// body's sha256.
pub async fn spool_body<R: AsyncRead + Unpin>(
    dir: &Path,
    tar: &mut TarReader<R>,
) -> Result<(std::fs::File, String), RegistryError> {
    let file = tempfile::tempfile_in(dir)
        .map_err(|e| local(&format!("creating a spool file in {}", dir.display()), e))?;
    // Hashing and writing each take a core's worth of time per GiB; on separate threads
    // they overlap instead of adding up.
    let (hash_tx, mut hash_rx) = mpsc::channel::<Bytes>(QUEUE);
    let (tx, mut rx) = mpsc::channel::<Bytes>(QUEUE);
    let hasher = tokio::task::spawn_blocking(move || {
        let mut h = Sha256::new();
        while let Some(b) = hash_rx.blocking_recv() {
            h.update(&b);
        }
        sha256_hex(h)
    });
    let writer = tokio::task::spawn_blocking(move || {
        let mut file = file;
        while let Some(b) = rx.blocking_recv() {
            file.write_all(&b)?;
        }
        file.flush()?;
        Ok::<_, std::io::Error>(file)
    });
    let read = async {
        loop {
            // Full chunks only: a pipe hands over 64 KiB at a time, and a queue of small
            // pieces would cost a buffer and a wake-up each.
            let mut buf = BytesMut::zeroed(IO_CHUNK);
            let mut n = 0;
            while n < buf.len() {
                let got = tar
                    .read_body(&mut buf[n..])
                    .await
                    .map_err(|e| local("reading the export", e))?;
                if got == 0 {
                    break;
                }
                n += got;
            }
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            let b = buf.freeze();
            if hash_tx.send(b.clone()).await.is_err() || tx.send(b).await.is_err() {
                // The writer stopped; its error is reported below.
                return Ok(());
            }
        }
    };
    let read_result: Result<(), RegistryError> = read.await;
    drop(tx);
    drop(hash_tx);
    let written = writer
        .await
        .map_err(|e| local("spool writer", e))?
        .map_err(|e| local("writing the spool file", e));
    let digest = hasher.await.map_err(|e| local("spool hasher", e))?;
    read_result?;
    Ok((written?, digest))
}

/// The spooled file from its start, as an upload body.
pub fn file_body(
    file: std::fs::File,
) -> impl futures::Stream<Item = oci_client::errors::Result<Bytes>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(QUEUE);
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        if let Err(e) = file.seek(SeekFrom::Start(0)) {
            let _ = tx.blocking_send(Err(e));
            return;
        }
        loop {
            let mut buf = BytesMut::zeroed(IO_CHUNK);
            let mut filled = 0;
            while filled < buf.len() {
                match file.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
            if filled == 0 {
                return;
            }
            buf.truncate(filled);
            // The upload was dropped: stop reading.
            if tx.blocking_send(Ok(buf.freeze())).is_err() {
                return;
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|r| {
            (
                r.map_err(oci_client::errors::OciDistributionError::from),
                rx,
            )
        })
    })
}
