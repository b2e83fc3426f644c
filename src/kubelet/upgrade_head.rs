//! actix-http streams the bytes that follow a request head only when the request upgrades to
//! WebSocket: any other `Upgrade` (SPDY/3.1, which the apiserver uses for exec and
//! port-forward) gets no body, and the frames after the head would be parsed as the next
//! request. So the first request head of each connection is looked at before actix reads it:
//! `Upgrade: SPDY/3.1` is retagged as `Upgrade: websocket`, and [`SPDY_MARK`] carries the
//! original value to the handler. A client cannot forge the mark: any it sends is removed.
//! Only the first request of a connection is looked at, as Kubernetes clients open a new
//! connection for every upgrade.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub const SPDY_MARK: &str = "x-vk-cocoon-spdy-upgrade";
/// A head longer than this is passed on untouched; actix refuses heads far smaller anyway.
const HEAD_LIMIT: usize = 32 * 1024;

/// The head with a SPDY upgrade retagged, or unchanged (apart from a forged mark removed).
pub fn retag(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let Some(body) = text.strip_suffix("\r\n\r\n") else {
        return head.to_vec();
    };
    let mut out = String::with_capacity(head.len() + 64);
    let mut spdy = None;
    for (i, line) in body.split("\r\n").enumerate() {
        let header = line.split_once(':').filter(|_| i > 0);
        match header {
            Some((name, _)) if name.trim().eq_ignore_ascii_case(SPDY_MARK) => continue,
            Some((name, value))
                if name.trim().eq_ignore_ascii_case("upgrade")
                    && value.trim().to_ascii_lowercase().starts_with("spdy/") =>
            {
                spdy = Some(value.trim().to_string());
                out.push_str("Upgrade: websocket\r\n");
            }
            _ => {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
    }
    if let Some(v) = spdy {
        out.push_str(&format!("{SPDY_MARK}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// A connection whose first request head passes through [`retag`].
pub struct Retagged<T> {
    io: T,
    head: BytesMut,
    ready: BytesMut,
    passing: bool,
}

impl<T> Retagged<T> {
    pub fn new(io: T) -> Self {
        Self {
            io,
            head: BytesMut::new(),
            ready: BytesMut::new(),
            passing: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Retagged<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.passing {
                return Pin::new(&mut this.io).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 4096];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let got = rb.filled();
                    if got.is_empty() {
                        // The client closed before a whole head: hand on what came.
                        this.passing = true;
                        this.ready = std::mem::take(&mut this.head);
                        if this.ready.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        continue;
                    }
                    this.head.extend_from_slice(got);
                    if let Some(end) = this.head.windows(4).position(|w| w == b"\r\n\r\n") {
                        let rest = this.head.split_off(end + 4);
                        this.ready.extend_from_slice(&retag(&this.head));
                        this.ready.extend_from_slice(&rest);
                        this.head.clear();
                        this.passing = true;
                    } else if this.head.len() > HEAD_LIMIT {
                        this.ready = std::mem::take(&mut this.head);
                        this.passing = true;
                    }
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Retagged<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[test]
    fn a_spdy_upgrade_is_retagged_and_a_forged_mark_dropped() {
        let head = b"POST /exec/ns/p/c?command=ls HTTP/1.1\r\nHost: n\r\nConnection: Upgrade\r\n\
            Upgrade: SPDY/3.1\r\nX-Vk-Cocoon-Spdy-Upgrade: forged\r\n\
            X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";
        let out = String::from_utf8(retag(head)).unwrap();
        assert_eq!(
            out,
            "POST /exec/ns/p/c?command=ls HTTP/1.1\r\nHost: n\r\nConnection: Upgrade\r\n\
             Upgrade: websocket\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
             x-vk-cocoon-spdy-upgrade: SPDY/3.1\r\n\r\n"
        );
        let plain = b"GET /pods HTTP/1.1\r\nHost: n\r\nX-Vk-Cocoon-Spdy-Upgrade: forged\r\n\r\n";
        assert_eq!(retag(plain), b"GET /pods HTTP/1.1\r\nHost: n\r\n\r\n");
        let ws = b"GET /exec HTTP/1.1\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(retag(ws), ws);
    }

    #[tokio::test]
    async fn only_the_first_head_is_touched_and_the_rest_flows_as_sent() {
        let wire = b"POST /x HTTP/1.1\r\nUpgrade: SPDY/3.1\r\n\r\n\x80\x03\x00\x06Upgrade: SPDY/3.1\r\n\r\n";
        let (mut client, server) = tokio::io::duplex(8);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            client.write_all(wire).await.unwrap();
        });
        let mut r = Retagged::new(server);
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(
            got,
            b"POST /x HTTP/1.1\r\nUpgrade: websocket\r\nx-vk-cocoon-spdy-upgrade: SPDY/3.1\r\n\r\n\
              \x80\x03\x00\x06Upgrade: SPDY/3.1\r\n\r\n"
        );
    }
}
