//! A large blob streamed from the export straight into the registry: an upload session is
//! opened (`POST`), the body goes out in one `PATCH` while it is hashed, and the session is
//! closed with `PUT ?digest=`. Nothing is staged on disk and the export is read once, so a
//! blob of many GiB costs a few MiB of buffers. The price is the HEAD before the upload: the
//! digest is known only at the end, so a blob the registry already holds is sent again (the
//! registry keeps one copy).

use bytes::{Bytes, BytesMut};
use oci_client::Reference;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::push::{sha256_hex, Counters, IO_CHUNK};
use super::tar_stream::TarReader;
use super::{Registry, RegistryError};

/// Chunks between the export and the socket (and the hasher): 4 MiB of buffers at most.
const QUEUE: usize = 4;

fn transport(what: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Transport(format!("{what}: {e}"))
}

impl Registry {
    /// Uploads the current entry body (`size` bytes) of `tar` as one blob of `r`'s repository
    /// and answers its digest.
    pub(crate) async fn stream_body<R: AsyncRead + Unpin>(
        &self,
        r: &Reference,
        tar: &mut TarReader<R>,
        size: u64,
        counters: &mut Counters,
    ) -> Result<String, RegistryError> {
        let start = format!(
            "{}://{}/v2/{}/blobs/uploads/",
            self.scheme(),
            self.base.host,
            r.repository()
        );
        let opened = self
            .authorized(self.http.post(&start), r, &format!("POST {start}"))
            .await?
            .header(reqwest::header::CONTENT_LENGTH, 0)
            .send()
            .await
            .map_err(|e| transport(&format!("POST {start}"), e))?;
        let session = self.session_url(&start, opened, 202).await?;

        let (body_tx, mut body_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(QUEUE);
        let (hash_tx, mut hash_rx) = mpsc::channel::<Bytes>(QUEUE);
        // Hashing takes a core's worth of time per GiB: on its own thread it overlaps the upload.
        let hasher = tokio::task::spawn_blocking(move || {
            let mut h = Sha256::new();
            while let Some(b) = hash_rx.blocking_recv() {
                h.update(&b);
            }
            sha256_hex(h)
        });
        let body = futures::stream::poll_fn(move |cx| body_rx.poll_recv(cx));
        let patch = self
            .authorized(self.http.patch(&session), r, &format!("PATCH {session}"))
            .await?
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, size)
            .body(reqwest::Body::wrap_stream(body))
            .send();
        let feed = async move {
            let mut sent = 0u64;
            loop {
                let mut buf = BytesMut::zeroed(IO_CHUNK);
                let mut n = 0;
                while n < buf.len() {
                    let got = match tar.read_body(&mut buf[n..]).await {
                        Ok(got) => got,
                        Err(e) => {
                            let msg = format!("reading the export: {e}");
                            // The upload must not complete with a short body.
                            let _ = body_tx.send(Err(std::io::Error::other(msg.clone()))).await;
                            return Err(RegistryError::Local(msg));
                        }
                    };
                    if got == 0 {
                        break;
                    }
                    n += got;
                }
                if n == 0 {
                    return Ok(sent);
                }
                buf.truncate(n);
                sent += n as u64;
                let b = buf.freeze();
                if hash_tx.send(b.clone()).await.is_err() || body_tx.send(Ok(b)).await.is_err() {
                    // The request ended early; its error is the one reported.
                    return Ok(sent);
                }
            }
        };
        let (patched, fed) = tokio::join!(patch, feed);
        let sent = fed?;
        let patched = patched.map_err(|e| transport(&format!("PATCH {session}"), e))?;
        let digest = hasher
            .await
            .map_err(|e| RegistryError::Local(format!("hashing the blob: {e}")))?;
        if sent != size {
            return Err(RegistryError::Local(format!(
                "the export's entry held {sent} bytes, its header said {size}"
            )));
        }
        let session = self.session_url(&session, patched, 202).await?;
        let sep = if session.contains('?') { '&' } else { '?' };
        let close = format!("{session}{sep}digest={digest}");
        let closed = self
            .authorized(self.http.put(&close), r, &format!("PUT {close}"))
            .await?
            .header(reqwest::header::CONTENT_LENGTH, 0)
            .send()
            .await
            .map_err(|e| transport(&format!("PUT {close}"), e))?;
        let status = closed.status().as_u16();
        if status != 201 {
            let body = closed.text().await.unwrap_or_default();
            return Err(RegistryError::Transport(format!(
                "PUT {close}: HTTP {status} {body}"
            )));
        }
        counters.uploaded += 1;
        counters.bytes += size;
        Ok(digest)
    }

    /// The upload session's next URL from a `Location` header (relative ones resolved
    /// against `base`), when the answer has the expected status.
    async fn session_url(
        &self,
        base: &str,
        res: reqwest::Response,
        want: u16,
    ) -> Result<String, RegistryError> {
        let status = res.status().as_u16();
        let location = res
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match (status == want, location) {
            (true, Some(loc)) => reqwest::Url::parse(base)
                .and_then(|b| b.join(&loc))
                .map(|u| u.to_string())
                .map_err(|e| transport(&format!("upload session URL {loc:?}"), e)),
            (true, None) => Err(RegistryError::Transport(format!(
                "{base}: HTTP {status} without a Location"
            ))),
            (false, _) => {
                let body = res.text().await.unwrap_or_default();
                Err(RegistryError::Transport(format!(
                    "{base}: HTTP {status} {body}"
                )))
            }
        }
    }
}
