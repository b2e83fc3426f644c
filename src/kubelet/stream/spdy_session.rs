//! One SPDY connection, server side: the client opens every stream; each is accepted with a
//! SYN_REPLY as it arrives (the Go client waits for that reply before it writes), pings are
//! answered, and the rest reaches the caller as stream events. There is no flow control:
//! moby/spdystream, the only peer, neither sends nor honours WINDOW_UPDATE.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::spdy_frame::{Codec, Frame, Headers, RST_PROTOCOL_ERROR};
use super::wire::{Inbound, Outbound};

#[derive(Debug, PartialEq)]
pub enum Event {
    Opened {
        stream: u32,
        headers: Headers,
    },
    Data {
        stream: u32,
        data: Bytes,
    },
    /// The client will send nothing more on the stream (FIN, or RST_STREAM).
    Finished {
        stream: u32,
    },
}

pub struct Session {
    inbound: Inbound,
    out: Outbound,
    wrap: fn(Bytes) -> Bytes,
    buf: BytesMut,
    codec: Codec,
    last_stream: u32,
    closed: bool,
    pending_fin: Option<u32>,
    last_seen: std::time::Instant,
    /// Replies and pongs `next` owes the client. `next` must not wait to send them (it is
    /// raced against the session's other work, and a lost reply would hang the client's new
    /// stream), so they queue here and go out before anything else is sent.
    owed: std::collections::VecDeque<Bytes>,
}

/// The client is gone, or broke the protocol: the session is over.
#[derive(Debug)]
pub struct Closed;

impl Session {
    /// `wrap` puts outgoing bytes in whatever carries them (identity on a raw upgrade, a
    /// WebSocket message when SPDY is tunnelled).
    pub fn new(inbound: Inbound, out: Outbound, wrap: fn(Bytes) -> Bytes) -> Self {
        Self {
            inbound,
            out,
            wrap,
            buf: BytesMut::new(),
            codec: Codec::default(),
            last_stream: 0,
            closed: false,
            pending_fin: None,
            last_seen: std::time::Instant::now(),
            owed: std::collections::VecDeque::new(),
        }
    }

    /// The next stream event; `Err` once the connection is over. Cancel-safe: its only wait
    /// is for the client's bytes, which are kept in the session until a whole frame is there.
    pub async fn next(&mut self) -> Result<Event, Closed> {
        loop {
            self.pay_what_is_owed();
            if self.closed {
                return Err(Closed);
            }
            if let Some(stream) = self.pending_fin.take() {
                return Ok(Event::Finished { stream });
            }
            let frame = match self.codec.decode(&mut self.buf) {
                Ok(Some(f)) => f,
                Ok(None) => match self.inbound.next().await {
                    Some(b) => {
                        self.last_seen = std::time::Instant::now();
                        self.buf.extend_from_slice(&b);
                        continue;
                    }
                    None => {
                        self.closed = true;
                        return Err(Closed);
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "SPDY protocol error from a kubelet API client");
                    self.closed = true;
                    let goaway = Frame::GoAway {
                        last_good: self.last_stream,
                        status: RST_PROTOCOL_ERROR,
                    };
                    let bytes = (self.wrap)(self.codec.encode(&goaway));
                    let _ = self.out.try_send(bytes);
                    return Err(Closed);
                }
            };
            match frame {
                Frame::SynStream {
                    stream,
                    fin,
                    headers,
                } => {
                    self.last_stream = self.last_stream.max(stream);
                    self.owe(Frame::SynReply {
                        stream,
                        fin: false,
                        headers: Vec::new(),
                    });
                    self.pay_what_is_owed();
                    if fin {
                        // Rare (a stream opened already finished), but keep the order.
                        self.pending_fin = Some(stream);
                    }
                    return Ok(Event::Opened { stream, headers });
                }
                Frame::Data { stream, fin, data } => {
                    if fin {
                        if !data.is_empty() {
                            self.pending_fin = Some(stream);
                            return Ok(Event::Data { stream, data });
                        }
                        return Ok(Event::Finished { stream });
                    }
                    if !data.is_empty() {
                        return Ok(Event::Data { stream, data });
                    }
                }
                Frame::Headers { stream, fin, .. } if fin => {
                    return Ok(Event::Finished { stream });
                }
                Frame::RstStream { stream, .. } => return Ok(Event::Finished { stream }),
                Frame::Ping { id } => {
                    self.owe(Frame::Ping { id });
                    self.pay_what_is_owed();
                }
                Frame::GoAway { .. } => {
                    self.closed = true;
                    return Err(Closed);
                }
                _ => {}
            }
        }
    }

    fn owe(&mut self, frame: Frame) {
        // Encoded now: header compression is one stream, so frames are encoded in send order.
        let bytes = (self.wrap)(self.codec.encode(&frame));
        self.owed.push_back(bytes);
    }

    /// Sends what is owed as far as the queue to the client has room, without waiting.
    fn pay_what_is_owed(&mut self) {
        while let Some(b) = self.owed.pop_front() {
            match self.out.try_send(b) {
                Ok(()) => {}
                Err(tokio::sync::mpsc::error::TrySendError::Full(b)) => {
                    self.owed.push_front(b);
                    return;
                }
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                    self.owed.clear();
                    return;
                }
            }
        }
    }

    pub async fn send(&mut self, frame: Frame) -> Result<(), Closed> {
        while let Some(b) = self.owed.pop_front() {
            self.out.send(b).await.map_err(|_| Closed)?;
        }
        let bytes = (self.wrap)(self.codec.encode(&frame));
        self.last_seen = std::time::Instant::now();
        self.out.send(bytes).await.map_err(|_| Closed)
    }

    /// How long nothing has gone either way (pings included: Kubernetes clients ping every
    /// few seconds, so only a dead client falls silent).
    pub fn idle_for(&self) -> std::time::Duration {
        self.last_seen.elapsed()
    }

    pub async fn data(&mut self, stream: u32, data: Bytes, fin: bool) -> Result<(), Closed> {
        self.send(Frame::Data { stream, fin, data }).await
    }

    /// Says goodbye; the connection ends when the session and its sender are dropped.
    pub async fn go_away(&mut self) {
        let last_good = self.last_stream;
        let _ = self
            .send(Frame::GoAway {
                last_good,
                status: 0,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A client's new stream is reported even while the queue to the client is full, and its
    /// reply still goes out before anything sent after it.
    #[tokio::test]
    async fn a_full_queue_to_the_client_delays_no_event() {
        let mut client = Codec::default();
        let open = client.encode(&Frame::SynStream {
            stream: 1,
            fin: false,
            headers: vec![("streamtype".into(), "data".into())],
        });
        let inbound: Inbound = futures::stream::iter(vec![open])
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, mut rx) = tokio::sync::mpsc::channel(1);
        out.try_send(Bytes::from_static(b"earlier")).unwrap();
        let mut s = Session::new(inbound, out, |b| b);
        let ev = tokio::time::timeout(std::time::Duration::from_secs(5), s.next())
            .await
            .expect("next waited on the full queue");
        assert!(matches!(ev, Ok(Event::Opened { stream: 1, .. })));
        assert_eq!(&rx.recv().await.unwrap()[..], b"earlier");
        let mut buf = BytesMut::new();
        let (sent, ()) = tokio::join!(s.data(1, Bytes::from_static(b"x"), true), async {
            for _ in 0..2 {
                buf.extend_from_slice(&rx.recv().await.unwrap());
            }
        });
        sent.unwrap();
        let mut reader = Codec::default();
        assert!(matches!(
            reader.decode(&mut buf).unwrap(),
            Some(Frame::SynReply { stream: 1, .. })
        ));
        assert!(matches!(
            reader.decode(&mut buf).unwrap(),
            Some(Frame::Data {
                stream: 1,
                fin: true,
                ..
            })
        ));
    }
}
