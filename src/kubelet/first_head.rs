//! actix-http hands a request to the upgrade service only when its decoder streams the bytes
//! after the head: for `Upgrade: websocket` (and CONNECT). A SPDY/3.1 upgrade, which the
//! apiserver uses for exec and port-forward, carries no body, so actix would read the SPDY
//! frames after it as the next request. So the first request head of each connection is
//! decoded here with actix-http's own codec, bytes untouched: a SPDY upgrade goes to the
//! upgrade service exactly as actix-http hands over a WebSocket one (the request and the
//! connection framed by that codec), and anything else goes on to actix-http with the bytes
//! read so far replayed in front of the connection. Only the first request is looked at, as
//! Kubernetes clients open a new connection for every upgrade.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use actix_codec::{AsyncRead, AsyncWrite, Decoder, Framed, FramedParts, ReadBuf};
use actix_http::h1::{Codec, Message};
use actix_http::{header, Request, ServiceConfig};
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncReadExt;

/// A head longer than this goes on to actix-http undecoded, which refuses it.
const HEAD_LIMIT: usize = 32 * 1024;

pub enum First<T> {
    /// A SPDY upgrade: the request, and the connection after its head.
    Spdy(Request, Framed<T, Codec>),
    /// Anything else, for actix-http to read from its first byte.
    Plain(Replay<T>),
}

fn is_spdy_upgrade(req: &Request) -> bool {
    let spdy = req
        .head()
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().to_ascii_lowercase().starts_with("spdy/"));
    req.upgrade() && spdy
}

/// Reads until the first request head is whole (or cannot be), and says where it goes.
pub async fn read<T>(mut io: T, config: &ServiceConfig) -> First<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut seen = BytesMut::with_capacity(4096);
    loop {
        let mut codec = Codec::new(config.clone());
        let mut rest = seen.clone();
        match codec.decode(&mut rest) {
            Ok(Some(Message::Item(req))) if is_spdy_upgrade(&req) => {
                let framed = Framed::from_parts(FramedParts::with_read_buf(io, codec, rest));
                return First::Spdy(req, framed);
            }
            Ok(None) if seen.len() <= HEAD_LIMIT => {}
            _ => return First::Plain(Replay::new(seen.freeze(), io)),
        }
        match io.read_buf(&mut seen).await {
            Ok(n) if n > 0 => {}
            // Closed or broken before a whole head: actix-http sees the same.
            _ => return First::Plain(Replay::new(seen.freeze(), io)),
        }
    }
}

/// A connection whose first bytes were already read: they are read again, then the rest.
pub struct Replay<T> {
    early: Bytes,
    io: T,
}

impl<T> Replay<T> {
    pub fn new(early: Bytes, io: T) -> Self {
        Self { early, io }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Replay<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.early.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.early.len().min(buf.remaining());
        buf.put_slice(&this.early[..n]);
        this.early.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Replay<T> {
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn first(wire: &'static [u8]) -> First<tokio::io::DuplexStream> {
        let (mut client, server) = tokio::io::duplex(8);
        tokio::spawn(async move {
            client.write_all(wire).await.unwrap();
            // Held open: the reader must not wait for the end of the connection.
            std::future::pending::<()>().await;
        });
        read(server, &ServiceConfig::default()).await
    }

    #[actix_web::test]
    async fn a_spdy_upgrade_is_handed_over_with_the_bytes_after_its_head() {
        let wire = b"POST /exec/ns/p/c?command=ls HTTP/1.1\r\nHost: n\r\nConnection: Upgrade\r\n\
            Upgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n\x80\x03\x00\x01spdy";
        let First::Spdy(req, framed) = first(wire).await else {
            panic!("not handed over as SPDY");
        };
        assert_eq!(req.path(), "/exec/ns/p/c");
        assert_eq!(req.head().headers().get("upgrade").unwrap(), "SPDY/3.1");
        let parts = framed.into_parts();
        let mut after = parts.read_buf.to_vec();
        let mut io = parts.io;
        while after.len() < 8 {
            let mut b = [0u8; 8];
            let n = io.read(&mut b).await.unwrap();
            after.extend_from_slice(&b[..n]);
        }
        assert_eq!(after, b"\x80\x03\x00\x01spdy");
    }

    #[actix_web::test]
    async fn anything_else_is_replayed_byte_for_byte() {
        for wire in [
            &b"GET /pods HTTP/1.1\r\nHost: n\r\n\r\nGET /stats/summary HTTP/1.1\r\n\r\n"[..],
            b"GET /exec/ns/p/c HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            b"POST /exec/ns/p/c HTTP/1.1\r\nUpgrade: SPDY/3.1\r\n\r\n",
            b"not http at all\r\n\r\n",
        ] {
            let First::Plain(mut replay) = first(wire).await else {
                panic!("{:?} was taken for SPDY", String::from_utf8_lossy(wire));
            };
            let mut got = vec![0u8; wire.len()];
            replay.read_exact(&mut got).await.unwrap();
            assert_eq!(got, wire);
        }
    }
}
