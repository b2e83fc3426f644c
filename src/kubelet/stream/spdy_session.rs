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
        }
    }

    /// The next stream event; `Err` once the connection is over. Cancel-safe: bytes read are
    /// kept in the session until a whole frame is there.
    pub async fn next(&mut self) -> Result<Event, Closed> {
        loop {
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
                    self.send(Frame::SynReply {
                        stream,
                        fin: false,
                        headers: Vec::new(),
                    })
                    .await?;
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
                    let bytes = (self.wrap)(self.codec.encode(&Frame::Ping { id }));
                    let _ = self.out.try_send(bytes);
                }
                Frame::GoAway { .. } => {
                    self.closed = true;
                    return Err(Closed);
                }
                _ => {}
            }
        }
    }

    pub async fn send(&mut self, frame: Frame) -> Result<(), Closed> {
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
