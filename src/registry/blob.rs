//! Blob GET with the integrity rules of a pull: the sha256 is checked over the streamed bytes
//! (oci-client's verifying stream) and the length must be exactly the descriptor's size. The
//! last piece of every blob is held back until the digest has been checked, so a corrupted blob
//! never reaches the sink whole: the consumer sees an error while the entry is still short.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use oci_client::errors::DigestError;
use oci_client::Reference;

use super::manifest::Descriptor;
use super::{oci_error, RegistryError};

pub struct VerifiedBlob {
    stream: BoxStream<'static, std::io::Result<Bytes>>,
    digest: String,
    expected: u64,
    seen: u64,
    held: Option<Bytes>,
    verified: bool,
}

impl VerifiedBlob {
    pub async fn open(
        client: &oci_client::Client,
        r: &Reference,
        desc: &Descriptor,
    ) -> Result<VerifiedBlob, RegistryError> {
        let sized = client.pull_blob_stream(r, &desc.oci()).await.map_err(|e| {
            match oci_error(&format!("GET blob {}", desc.digest), e) {
                // A blob the manifest names but the registry lacks is a broken artifact,
                // not an absent tag.
                RegistryError::Absent(m) => RegistryError::Transport(m),
                e => e,
            }
        })?;
        if let Some(len) = sized.content_length {
            if len != desc.size as u64 {
                return Err(RegistryError::Refused(format!(
                    "blob {} is served with {len} bytes, the manifest says {}",
                    desc.digest, desc.size
                )));
            }
        }
        Ok(VerifiedBlob {
            stream: sized.stream,
            digest: desc.digest.clone(),
            expected: desc.size as u64,
            seen: 0,
            held: None,
            verified: false,
        })
    }

    /// The next piece of the blob; `None` once all of it has been returned and verified.
    pub async fn next(&mut self) -> Result<Option<Bytes>, RegistryError> {
        loop {
            if self.verified {
                return Ok(self.held.take());
            }
            match self.stream.next().await {
                Some(Ok(b)) => {
                    if b.is_empty() {
                        continue;
                    }
                    self.seen += b.len() as u64;
                    if self.seen > self.expected {
                        return Err(RegistryError::Refused(format!(
                            "blob {} is longer than its descriptor size {}",
                            self.digest, self.expected
                        )));
                    }
                    if let Some(prev) = self.held.replace(b) {
                        return Ok(Some(prev));
                    }
                }
                Some(Err(e)) => {
                    let digest_error = e
                        .get_ref()
                        .is_some_and(|inner| inner.downcast_ref::<DigestError>().is_some());
                    let msg = format!("blob {}: {e}", self.digest);
                    return Err(if digest_error {
                        RegistryError::Refused(msg)
                    } else {
                        RegistryError::Transport(msg)
                    });
                }
                None => {
                    if self.seen != self.expected {
                        return Err(RegistryError::Refused(format!(
                            "blob {} ended after {} of {} bytes",
                            self.digest, self.seen, self.expected
                        )));
                    }
                    self.verified = true;
                }
            }
        }
    }
}
