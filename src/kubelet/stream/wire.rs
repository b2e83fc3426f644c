//! The connection after `101 Switching Protocols`. actix-http hands a request that asks for an
//! upgrade its raw bytes as the payload, until the client closes, and sends a streaming body
//! as raw bytes behind the 101; so both directions of the upgraded connection are ordinary
//! streams here, over TLS like any other request.

use std::time::Duration;

use actix_codec::{Decoder, Encoder};
use actix_http::ws::{self, CloseCode, CloseReason, Codec, Frame, Item, Message};
use actix_web::web;
use bytes::{Bytes, BytesMut};
use futures::stream::LocalBoxStream;
use futures::StreamExt;
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
/// Both timeouts of K4: a stream that sees no traffic this long in either direction ends.
pub const IDLE: Duration = Duration::from_secs(30);

/// The response body: whatever is sent on the returned sender, until it is dropped.
pub fn body() -> (
    Outbound,
    impl futures::Stream<Item = Result<Bytes, std::io::Error>> + 'static,
) {
    let (tx, rx) = mpsc::channel::<Bytes>(OUT_QUEUE);
    let body = futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    );
    (tx, body)
}

pub fn raw(payload: web::Payload) -> Inbound {
    payload
        .take_while(|r| std::future::ready(r.is_ok()))
        .filter_map(|r| std::future::ready(r.ok()))
        .boxed_local()
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
pub fn ws_messages(payload: web::Payload, out: Outbound) -> Inbound {
    struct St {
        payload: web::Payload,
        buf: BytesMut,
        codec: Codec,
        partial: Option<BytesMut>,
        out: Outbound,
        done: bool,
    }
    let st = St {
        payload,
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
                Ok(None) => match st.payload.next().await {
                    Some(Ok(b)) => st.buf.extend_from_slice(&b),
                    _ => return None,
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
pub fn ws_accept(req: &actix_web::HttpRequest) -> Result<String, String> {
    ws::verify_handshake(req.head()).map_err(|e| format!("bad WebSocket upgrade: {e}"))?;
    let key = req
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
