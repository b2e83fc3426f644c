//! The connection after `101 Switching Protocols`: the upgrade service owns it (TLS and all),
//! and both directions become ordinary streams here.

use std::future::Future;
use std::time::Duration;

use actix_codec::{AsyncRead, AsyncWrite, Decoder, Encoder, FramedParts};
use actix_http::ws::{self, CloseCode, CloseReason, Codec, Frame, Item, Message};
use actix_http::RequestHead;
use bytes::{Bytes, BytesMut};
use futures::stream::LocalBoxStream;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Client to daemon: the raw bytes, or whole WebSocket data messages; ends when the client
/// closes or breaks the connection.
pub type Inbound = LocalBoxStream<'static, Bytes>;

/// Daemon to client. Bounded, so a client that stops reading slows the guest down instead
/// of the daemon buffering without end.
pub type Outbound = mpsc::Sender<Bytes>;

/// Chunks queued for the client before producers wait.
const OUT_QUEUE: usize = 32;
/// The largest WebSocket message accepted: kubectl writes stdin and port data in chunks of
/// 32 KiB or less.
const MAX_MESSAGE: usize = 1 << 20;
/// K4: the SPDY streams an exec promised must be open by then, a port-forward pair whole, and
/// a port-forward session that sees no traffic this long in either direction ends.
pub const IDLE: Duration = Duration::from_secs(30);
/// Bytes read from the client at a time.
const READ_CHUNK: usize = 32 * 1024;

/// The upgraded connection as its two directions: what the client sends (the bytes already
/// read past the request head first), a sender for what goes to it, and the future that writes
/// those until every sender is dropped, then closes the connection.
pub fn connection<T, C>(parts: FramedParts<T, C>) -> (Inbound, Outbound, impl Future<Output = ()>)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (rd, mut wr) = tokio::io::split(parts.io);
    let early = parts.read_buf.freeze();
    let inbound = futures::stream::once(std::future::ready(early))
        .filter(|b| std::future::ready(!b.is_empty()))
        .chain(futures::stream::unfold(rd, |mut rd| async move {
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => None,
                Ok(_) => Some((buf.freeze(), rd)),
            }
        }))
        .boxed_local();
    let (tx, mut rx) = mpsc::channel::<Bytes>(OUT_QUEUE);
    let pending = parts.write_buf.freeze();
    let writer = async move {
        if !pending.is_empty() && wr.write_all(&pending).await.is_err() {
            return;
        }
        while let Some(b) = rx.recv().await {
            if wr.write_all(&b).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    (inbound, tx, writer)
}

/// One WebSocket frame for the client (a server never masks).
pub fn ws_frame(msg: Message) -> Bytes {
    let mut buf = BytesMut::new();
    // Encoding a message into a growable buffer has no failure case for a server codec.
    let _ = Codec::new().max_size(MAX_MESSAGE).encode(msg, &mut buf);
    buf.freeze()
}

pub fn ws_binary(data: Bytes) -> Bytes {
    ws_frame(Message::Binary(data))
}

pub fn ws_close() -> Bytes {
    ws_frame(Message::Close(Some(CloseReason {
        code: CloseCode::Normal,
        description: None,
    })))
}

/// The data messages of a WebSocket connection, reassembled from fragments. Pings are
/// answered here (kubectl pings every 5 s and gives up after a minute without a pong); a close
/// from the client is answered and ends the stream. A ping yields an empty message.
pub fn ws_messages(raw: Inbound, out: Outbound) -> Inbound {
    struct St {
        raw: Inbound,
        buf: BytesMut,
        codec: Codec,
        partial: Option<BytesMut>,
        out: Outbound,
        done: bool,
    }
    let st = St {
        raw,
        buf: BytesMut::new(),
        codec: Codec::new().max_size(MAX_MESSAGE),
        partial: None,
        out,
        done: false,
    };
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            match st.codec.decode(&mut st.buf) {
                Ok(Some(frame)) => match frame {
                    Frame::Binary(b) | Frame::Text(b) => return Some((b, st)),
                    Frame::Continuation(Item::FirstBinary(b) | Item::FirstText(b)) => {
                        st.partial = Some(BytesMut::from(&b[..]));
                    }
                    Frame::Continuation(Item::Continue(b)) => {
                        if let Some(p) = st.partial.as_mut() {
                            if p.len() + b.len() > MAX_MESSAGE {
                                return None;
                            }
                            p.extend_from_slice(&b);
                        }
                    }
                    Frame::Continuation(Item::Last(b)) => {
                        if let Some(mut p) = st.partial.take() {
                            p.extend_from_slice(&b);
                            return Some((p.freeze(), st));
                        }
                    }
                    Frame::Ping(b) => {
                        let _ = st.out.try_send(ws_frame(Message::Pong(b)));
                        // An empty message: no data, but proof of life for the idle limit.
                        return Some((Bytes::new(), st));
                    }
                    Frame::Pong(_) => {}
                    Frame::Close(_) => {
                        let _ = st.out.try_send(ws_close());
                        return None;
                    }
                },
                Ok(None) => match st.raw.next().await {
                    Some(b) => st.buf.extend_from_slice(&b),
                    None => return None,
                },
                Err(e) => {
                    tracing::debug!(error = %e, "WebSocket protocol error from a kubelet API client");
                    st.done = true;
                    let _ = st.out.try_send(ws_frame(Message::Close(Some(CloseReason {
                        code: CloseCode::Protocol,
                        description: None,
                    }))));
                    return None;
                }
            }
        }
    })
    .boxed_local()
}

/// The `Sec-WebSocket-Accept` answer to a valid WebSocket upgrade request, or why it is not one.
pub fn ws_accept(head: &RequestHead) -> Result<String, String> {
    ws::verify_handshake(head).map_err(|e| format!("bad WebSocket upgrade: {e}"))?;
    let key = head
        .headers()
        .get(actix_web::http::header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes())
        .unwrap_or_default();
    Ok(String::from_utf8_lossy(&ws::hash_key(key)).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame, as a browser or gorilla/websocket writes one.
    pub fn client_frame(opcode: u8, fin: bool, data: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
        assert!(data.len() < 126);
        out.push(0x80 | data.len() as u8);
        out.extend_from_slice(&mask);
        out.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn server_frames_are_unmasked_binary() {
        let f = ws_binary(Bytes::from_static(&[1, b'h', b'i']));
        assert_eq!(&f[..], &[0x82, 3, 1, b'h', b'i']);
        let c = ws_close();
        assert_eq!(&c[..], &[0x88, 2, 0x03, 0xe8]);
    }

    #[test]
    fn client_frames_decode_with_fragments() {
        let mut codec = Codec::new();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&client_frame(0x2, false, b"\x00ab"));
        buf.extend_from_slice(&client_frame(0x0, true, b"cd"));
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Continuation(Item::FirstBinary(Bytes::from_static(
                b"\x00ab"
            ))))
        );
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::Continuation(Item::Last(Bytes::from_static(b"cd"))))
        );
    }
}
