//! What the daemon keeps of a cocoon child's output. A `vm exec` carries a guest's output,
//! and a guest is a tenant's: it may print without end for as long as the call's timeout
//! lets it. So stdout is kept up to `MAX_STDOUT` and a child that passes it is killed (a
//! cut-off answer is no answer), and of stderr, which is log lines then the final error that
//! classifies the failure, only the last `STDERR_KEEP` bytes are kept while the rest is
//! drained and dropped. Every call that hits either cap counts one
//! `cocoon_vk_cap_refusals_total{cap="guest_output"}`.

use tokio::io::{AsyncRead, AsyncReadExt};

pub use crate::caps::CapCount;

/// The largest stdout kept: far above any `vm list` or record cocoon prints.
pub const MAX_STDOUT: usize = 16 << 20;
/// The tail of stderr kept: the error line and the log lines just before it.
pub const STDERR_KEEP: usize = 64 << 10;

/// A child's output as kept.
#[derive(Debug, Default)]
pub struct Captured {
    pub stdout: Vec<u8>,
    /// The last `stderr_keep` bytes of stderr.
    pub stderr: Vec<u8>,
    /// Stdout passed its cap: reading stopped there, and the child must be killed.
    pub stdout_over: bool,
    /// Older stderr was dropped to keep the tail.
    pub stderr_trimmed: bool,
}

impl Captured {
    pub fn capped(&self) -> bool {
        self.stdout_over || self.stderr_trimmed
    }
}

/// Reads both pipes to their end, or stdout until it passes `max_stdout`.
pub async fn read<O, E>(
    stdout: Option<O>,
    stderr: Option<E>,
    max_stdout: usize,
    stderr_keep: usize,
) -> std::io::Result<Captured>
where
    O: AsyncRead + Unpin,
    E: AsyncRead + Unpin,
{
    let mut out = Captured::default();
    let (mut o, mut e) = (stdout, stderr);
    let mut obuf = vec![0u8; 8192];
    let mut ebuf = vec![0u8; 8192];
    while o.is_some() || e.is_some() {
        tokio::select! {
            r = read_some(&mut o, &mut obuf), if o.is_some() => match r? {
                0 => o = None,
                n if out.stdout.len() + n > max_stdout => {
                    out.stdout_over = true;
                    return Ok(out);
                }
                n => out.stdout.extend_from_slice(&obuf[..n]),
            },
            r = read_some(&mut e, &mut ebuf), if e.is_some() => match r? {
                0 => e = None,
                n => {
                    out.stderr.extend_from_slice(&ebuf[..n]);
                    // Trimmed in batches, so a chatty stderr is not shifted on every read.
                    if out.stderr.len() > 2 * stderr_keep {
                        let over = out.stderr.len() - stderr_keep;
                        out.stderr.drain(..over);
                        out.stderr_trimmed = true;
                    }
                }
            },
        }
    }
    if out.stderr.len() > stderr_keep {
        let over = out.stderr.len() - stderr_keep;
        out.stderr.drain(..over);
        out.stderr_trimmed = true;
    }
    Ok(out)
}

async fn read_some<R: AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer that never stops: the reader must stop it at the cap.
    async fn endless(mut w: tokio::io::DuplexStream) {
        let chunk = vec![b'x'; 4096];
        while w.write_all(&chunk).await.is_ok() {}
    }

    #[tokio::test]
    async fn a_stdout_without_end_stops_at_the_cap() {
        let (r, w) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(endless(w));
        let none: Option<tokio::io::Empty> = None;
        let got = read(Some(r), none, 1 << 20, 1024).await.unwrap();
        assert!(got.stdout_over);
        assert!(got.stdout.len() <= 1 << 20, "{}", got.stdout.len());
        assert!(got.capped());
        drop(got);
        // The reader's end is gone with `got`'s pipe: the writer fails and ends.
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn a_stderr_without_end_keeps_only_its_tail() {
        let (r, mut w) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(async move {
            for _ in 0..2000 {
                w.write_all(&[b'y'; 1024]).await.unwrap();
            }
            w.write_all(b"\nError: vm not found\n").await.unwrap();
        });
        let out: Option<tokio::io::Empty> = Some(tokio::io::empty());
        let got = read(out, Some(r), 1 << 20, 4096).await.unwrap();
        writer.await.unwrap();
        assert!(!got.stdout_over);
        assert!(got.stderr_trimmed);
        assert_eq!(got.stderr.len(), 4096);
        assert!(got.stderr.ends_with(b"Error: vm not found\n"));
    }

    #[tokio::test]
    async fn output_under_the_caps_is_kept_whole() {
        let got = read(
            Some(&b"{\"id\":\"a\"}"[..]),
            Some(&b"log\n"[..]),
            1024,
            1024,
        )
        .await
        .unwrap();
        assert_eq!(got.stdout, b"{\"id\":\"a\"}");
        assert_eq!(got.stderr, b"log\n");
        assert!(!got.capped());
    }
}
