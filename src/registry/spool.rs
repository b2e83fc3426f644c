//! A v2 chunk's temp file (at most one chunk) as an upload body: read back on a blocking
//! thread, a few chunks ahead of the socket.

use std::io::{Read, Seek, SeekFrom};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::push::IO_CHUNK;

/// Chunks read ahead of the socket: 4 MiB of buffers at most.
const QUEUE: usize = 4;

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
