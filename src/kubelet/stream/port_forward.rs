//! `kubectl port-forward` (K4): the client opens a pair of SPDY streams per connection it
//! forwards, `error` and `data`, tied by `requestID` and naming the `port`; each pair becomes
//! one TCP connection to the pod's own IP. A failure is written on the pair's error stream,
//! which kubectl prints, and the other pairs carry on.
//!
//! Clients that speak WebSocket without SPDY (`v4.channel.k8s.io`, as the Go kubelet serves
//! it) name their ports in the query instead: each port gets a data channel (2i) and an error
//! channel (2i+1), both opened with the port number (two bytes, little-endian), and one
//! connection to the guest for the life of the WebSocket.
//!
//! K12: one session forwards at most [`MAX_PAIRS`] connections at once; a pair over it is
//! refused on its own error stream, and the session's other pairs carry on.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::spdy_frame::{Frame, Headers};
use super::spdy_session::{Closed, Event, Session};
use super::wire::{self, Inbound, Outbound, IDLE};
use crate::metrics::{Cap, Metrics};

/// Connections one port-forward session forwards at once (stream pairs, including those
/// still waiting for their second stream). `kubectl port-forward` opens a pair per local
/// connection: a browser opens six per host, a load test a few dozen. Each pair holds a
/// connection to the guest, a task and up to [`TO_GUEST_QUEUE`] frames; with the node's 32
/// sessions (K4) this bounds the guest connections one node's callers hold to 2048.
pub const MAX_PAIRS: usize = 64;

/// SPDY's RST_STREAM status for a stream the server will not take.
const REFUSED_STREAM: u32 = 3;

const CONNECT: Duration = Duration::from_secs(10);
const CHUNK: usize = 32 * 1024;
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// Bytes for the client on a stream; `fin` ends the stream.
#[derive(Debug, PartialEq)]
pub struct Send {
    pub stream: u32,
    pub data: Bytes,
    pub fin: bool,
}

struct Pair {
    error: Option<u32>,
    data: Option<u32>,
    port: String,
    to_guest: Option<mpsc::Sender<Bytes>>,
    started: bool,
    opened: tokio::time::Instant,
}

impl Default for Pair {
    fn default() -> Self {
        Self {
            error: None,
            data: None,
            port: String::new(),
            to_guest: None,
            started: false,
            opened: tokio::time::Instant::now(),
        }
    }
}

/// Only 1–65535, written as a plain decimal number.
pub fn port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!(
            "invalid port {text:?}: want a number from 1 to 65535"
        )),
    }
}

/// One forwarded connection: bytes from `from_client` go to the guest until the client
/// finishes its data stream; the guest's bytes go back until it closes.
pub async fn forward(
    ip: IpAddr,
    port_text: String,
    data: u32,
    error: u32,
    mut from_client: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Send>,
) {
    let fail = |msg: String| {
        let out = out.clone();
        async move {
            let _ = out
                .send(Send {
                    stream: error,
                    data: Bytes::from(msg),
                    fin: true,
                })
                .await;
            let _ = out
                .send(Send {
                    stream: data,
                    data: Bytes::new(),
                    fin: true,
                })
                .await;
        }
    };
    let port = match port(&port_text) {
        Ok(p) => p,
        Err(e) => return fail(e).await,
    };
    let conn = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect((ip, port))).await;
    let conn = match conn {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return fail(format!("error forwarding port {port} to {ip}: {e}")).await;
        }
        Err(_) => {
            return fail(format!(
                "error forwarding port {port} to {ip}: no answer in {}s",
                CONNECT.as_secs()
            ))
            .await;
        }
    };
    let (mut rd, mut wr) = conn.into_split();
    let to_guest = async move {
        while let Some(b) = from_client.recv().await {
            if wr.write_all(&b).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
        // Keep the write half until the guest is done, so the guest sees a half-close only.
        std::future::pending::<()>().await
    };
    let to_client = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let sent = out
                        .send(Send {
                            stream: data,
                            data: Bytes::copy_from_slice(&buf[..n]),
                            fin: false,
                        })
                        .await;
                    if sent.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = to_guest => {}
        _ = to_client => {}
    }
    for stream in [data, error] {
        let _ = out
            .send(Send {
                stream,
                data: Bytes::new(),
                fin: true,
            })
            .await;
    }
}

/// Chunks from the caller waiting for one pair's guest connection. When they are full the
/// connection is not read until the guest takes one: a caller cannot make the daemon hold
/// what a slow guest does not read (at most this many frames per pair, plus one held).
const TO_GUEST_QUEUE: usize = 64;

/// A chunk that found its pair's queue full, with that queue.
type Held = Option<(mpsc::Sender<Bytes>, Bytes)>;

fn to_guest(tx: &mpsc::Sender<Bytes>, data: Bytes, held: &mut Held) {
    if let Err(mpsc::error::TrySendError::Full(data)) = tx.try_send(data) {
        *held = Some((tx.clone(), data));
    }
}

/// Waits for room in the held chunk's queue and moves it there (dropped when that pair's
/// guest connection is gone).
async fn flush(held: &mut Held) {
    let Some(tx) = held.as_ref().map(|(tx, _)| tx.clone()) else {
        return;
    };
    let permit = tx.reserve().await;
    if let (Ok(permit), Some((_, data))) = (permit, held.take()) {
        permit.send(data);
    }
    *held = None;
}

/// The message a pair over [`MAX_PAIRS`] gets on its error stream, which kubectl prints.
pub fn too_many_pairs() -> String {
    format!(
        "vk-cocoon: this port-forward session already forwards {MAX_PAIRS} connections, the \
         most one session may at once; close some, or start another port-forward"
    )
}

/// A stream the client opened: its place in its pair, whose `requestID` is returned; `None`
/// when the stream is refused (an unknown type, or a new pair over [`MAX_PAIRS`]).
async fn open(
    s: &mut Session,
    pairs: &mut HashMap<String, Pair>,
    stream: u32,
    headers: &Headers,
    metrics: &Metrics,
) -> Result<Option<String>, Closed> {
    let kind = Frame::header(headers, "streamType").unwrap_or_default();
    let request = Frame::header(headers, "requestID").unwrap_or_default();
    let port_text = Frame::header(headers, "port").unwrap_or_default();
    if !matches!(kind, "error" | "data") {
        let refused = Frame::RstStream {
            stream,
            status: REFUSED_STREAM,
        };
        s.send(refused).await?;
        return Ok(None);
    }
    if !pairs.contains_key(request) && pairs.len() >= MAX_PAIRS {
        metrics.cap_refused(Cap::PortForwardStreams);
        tracing::info!(
            max = MAX_PAIRS,
            "port-forward: a connection over the session's cap refused"
        );
        let message = match kind {
            "error" => Bytes::from(too_many_pairs()),
            _ => Bytes::new(),
        };
        s.data(stream, message, true).await?;
        return Ok(None);
    }
    let pair = pairs.entry(request.to_string()).or_default();
    match kind {
        "error" => pair.error = Some(stream),
        _ => pair.data = Some(stream),
    }
    pair.port = port_text.to_string();
    Ok(Some(request.to_string()))
}

/// Serves one port-forward connection over SPDY to the pod at `ip`.
pub async fn spdy(mut s: Session, ip: IpAddr, metrics: Metrics) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut by_stream: HashMap<u32, String> = HashMap::new();
    let (out_tx, mut out_rx) = mpsc::channel::<Send>(16);
    let mut running = FuturesUnordered::new();
    let mut tick = tokio::time::interval(IDLE_CHECK);
    let mut held: Held = None;
    loop {
        tokio::select! {
            ev = s.next(), if held.is_none() => match ev {
                Ok(Event::Opened { stream, headers }) => {
                    let request = match open(&mut s, &mut pairs, stream, &headers, &metrics).await {
                        Ok(Some(request)) => request,
                        Ok(None) => continue,
                        Err(Closed) => return,
                    };
                    by_stream.insert(stream, request.clone());
                    let Some(pair) = pairs.get_mut(&request) else {
                        continue;
                    };
                    if let (Some(error), Some(data), false) = (pair.error, pair.data, pair.started) {
                        let (tx, rx) = mpsc::channel(TO_GUEST_QUEUE);
                        pair.to_guest = Some(tx);
                        pair.started = true;
                        let job = forward(ip, pair.port.clone(), data, error, rx, out_tx.clone());
                        running.push(async move {
                            job.await;
                            request
                        });
                    }
                }
                Ok(Event::Data { stream, data }) => {
                    if let Some(pair) = by_stream.get(&stream).and_then(|r| pairs.get(r)) {
                        if pair.data == Some(stream) {
                            if let Some(tx) = &pair.to_guest {
                                to_guest(tx, data, &mut held);
                            }
                        }
                    }
                }
                Ok(Event::Finished { stream }) => {
                    if let Some(pair) = by_stream.get(&stream).and_then(|r| pairs.get_mut(r)) {
                        if pair.data == Some(stream) {
                            pair.to_guest = None;
                        }
                    }
                }
                Err(_) => return,
            },
            Some(o) = out_rx.recv() => {
                if s.data(o.stream, o.data, o.fin).await.is_err() {
                    return;
                }
            },
            () = flush(&mut held), if held.is_some() => {},
            Some(request) = running.next(), if !running.is_empty() => {
                // Done with: a long forward session opens many pairs and must not keep them.
                if let Some(pair) = pairs.remove(&request) {
                    for id in [pair.error, pair.data].into_iter().flatten() {
                        by_stream.remove(&id);
                    }
                }
            },
            _ = tick.tick() => {
                if s.idle_for() >= IDLE && running.is_empty() {
                    s.go_away().await;
                    return;
                }
                // A pair whose other half never came is given up, as a kubelet does.
                let stale: Vec<String> = pairs
                    .iter()
                    .filter(|(_, p)| !p.started && p.opened.elapsed() >= IDLE)
                    .map(|(r, _)| r.clone())
                    .collect();
                for request in stale {
                    if let Some(pair) = pairs.remove(&request) {
                        for id in [pair.error, pair.data].into_iter().flatten() {
                            by_stream.remove(&id);
                            let _ = s.send(Frame::RstStream { stream: id, status: 5 }).await;
                        }
                    }
                }
            },
        }
    }
}

/// The `port` query values (each may list several, comma-separated), as a kubelet reads them.
pub fn query_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "port" {
            for p in v.split(',') {
                ports.push(port(p)?);
            }
        }
    }
    match ports.len() {
        0 => Err("query parameter \"port\" is required".into()),
        // Channel numbers are one byte: two per port.
        n if n > 127 => Err(format!("{n} ports asked for; at most 127")),
        _ => Ok(ports),
    }
}

fn channel_message(ch: u8, data: &[u8]) -> Bytes {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(ch);
    m.extend_from_slice(data);
    wire::ws_binary(Bytes::from(m))
}

/// Serves one port-forward over the WebSocket channel protocol.
pub async fn websocket(mut inbound: Inbound, out: Outbound, ip: IpAddr, ports: Vec<u16>) {
    let (out_tx, mut out_rx) = mpsc::channel::<Send>(16);
    let mut guests = Vec::new();
    let mut running = FuturesUnordered::new();
    for (i, p) in ports.iter().enumerate() {
        let (data, error) = (2 * i as u8, 2 * i as u8 + 1);
        for ch in [data, error] {
            if out
                .send(channel_message(ch, &p.to_le_bytes()))
                .await
                .is_err()
            {
                return;
            }
        }
        let (tx, rx) = mpsc::channel(TO_GUEST_QUEUE);
        guests.push(tx);
        running.push(forward(
            ip,
            p.to_string(),
            data.into(),
            error.into(),
            rx,
            out_tx.clone(),
        ));
    }
    let mut last_seen = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(IDLE_CHECK);
    let mut held: Held = None;
    loop {
        tokio::select! {
            m = inbound.next(), if held.is_none() => match m {
                Some(m) => {
                    last_seen = tokio::time::Instant::now();
                    if let Some(&ch) = m.first() {
                        if ch % 2 == 0 {
                            if let Some(tx) = guests.get(usize::from(ch / 2)) {
                                to_guest(tx, m.slice(1..), &mut held);
                            }
                        }
                    }
                }
                None => return,
            },
            Some(s) = out_rx.recv() => {
                last_seen = tokio::time::Instant::now();
                // A channel cannot be closed in this protocol: an end is simply no more data.
                if !s.data.is_empty()
                    && out.send(channel_message(s.stream as u8, &s.data)).await.is_err()
                {
                    return;
                }
            },
            Some(()) = running.next(), if !running.is_empty() => {},
            () = flush(&mut held), if held.is_some() => {},
            _ = tick.tick() => if last_seen.elapsed() >= IDLE {
                let _ = out.send(wire::ws_close()).await;
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// A guest port that answers one connection with `echo:` and what it read to the end.
    async fn echo_guest() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            c.read_to_end(&mut buf).await.unwrap();
            c.write_all(&[b"echo:".as_slice(), &buf].concat())
                .await
                .unwrap();
        });
        addr
    }

    #[test]
    fn only_real_port_numbers_are_dialled() {
        assert_eq!(port("8080"), Ok(8080));
        assert_eq!(port("1"), Ok(1));
        assert_eq!(port("65535"), Ok(65535));
        for bad in ["0", "65536", "-1", "+80", "", "80a", " 80"] {
            assert!(port(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn an_spdy_pair_becomes_one_connection_to_the_guest() {
        use super::super::spdy_frame::Codec;
        use super::super::wire::Inbound;
        use bytes::BytesMut;

        let addr = echo_guest().await;
        let mut client = Codec::default();
        let port = addr.port().to_string();
        let open = |c: &mut Codec, stream: u32, kind: &str| {
            c.encode(&Frame::SynStream {
                stream,
                fin: false,
                headers: vec![
                    ("streamtype".into(), kind.into()),
                    ("port".into(), port.clone()),
                    ("requestid".into(), "0".into()),
                ],
            })
        };
        let sent = vec![
            open(&mut client, 1, "error"),
            open(&mut client, 3, "data"),
            client.encode(&Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"hi"),
            }),
        ];
        let (in_tx, in_rx) = mpsc::unbounded_channel::<Bytes>();
        for b in sent {
            in_tx.send(b).unwrap();
        }
        let inbound: Inbound =
            futures::stream::unfold(
                in_rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            )
            .boxed_local();
        let (out, mut rx) = mpsc::channel(64);
        let session = Session::new(inbound, out, |b| b);
        let run = spdy(session, addr.ip(), Metrics::new());
        let read = async {
            let mut reader = Codec::default();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            while got.len() < 5 {
                buf.extend_from_slice(&rx.recv().await.unwrap());
                while let Some(f) = reader.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            drop(in_tx); // the client leaves; the session ends
            got
        };
        let ((), got) = tokio::join!(run, read);
        let data = |stream, fin, d: &'static [u8]| Frame::Data {
            stream,
            fin,
            data: Bytes::from_static(d),
        };
        assert_eq!(
            got[2..],
            [
                data(3, false, b"echo:hi"),
                data(3, true, b""),
                data(1, true, b"")
            ]
        );
    }

    /// A session with [`MAX_PAIRS`] pairs waiting for their data streams: one more pair is
    /// refused on its own streams (the message on its error stream), and an unknown stream
    /// type takes no place.
    #[tokio::test(start_paused = true)]
    async fn a_pair_over_the_cap_is_refused_on_its_own_error_stream() {
        use super::super::spdy_frame::Codec;
        use bytes::BytesMut;

        let mut client = Codec::default();
        let open = |c: &mut Codec, stream: u32, kind: &str, request: usize| {
            c.encode(&Frame::SynStream {
                stream,
                fin: false,
                headers: vec![
                    ("streamtype".into(), kind.into()),
                    ("port".into(), "80".into()),
                    ("requestid".into(), request.to_string()),
                ],
            })
        };
        let (in_tx, in_rx) = mpsc::unbounded_channel::<Bytes>();
        let mut stream = 1;
        for request in 0..MAX_PAIRS {
            in_tx
                .send(open(&mut client, stream, "error", request))
                .unwrap();
            stream += 2;
        }
        let odd = stream;
        in_tx.send(open(&mut client, odd, "resize", 9999)).unwrap();
        let (over_error, over_data) = (odd + 2, odd + 4);
        in_tx
            .send(open(&mut client, over_error, "error", MAX_PAIRS))
            .unwrap();
        in_tx
            .send(open(&mut client, over_data, "data", MAX_PAIRS))
            .unwrap();
        let inbound: Inbound =
            futures::stream::unfold(
                in_rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            )
            .boxed_local();
        let (out, mut rx) = mpsc::channel(256);
        let metrics = Metrics::new();
        let session = Session::new(inbound, out, |b| b);
        let run = spdy(session, "127.0.0.1".parse().unwrap(), metrics.clone());
        let read = async {
            let mut reader = Codec::default();
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            while got.len() < 3 {
                buf.extend_from_slice(&rx.recv().await.unwrap());
                while let Some(f) = reader.decode(&mut buf).unwrap() {
                    if !matches!(f, Frame::SynReply { .. }) {
                        got.push(f);
                    }
                }
            }
            drop(in_tx);
            got
        };
        let ((), got) = tokio::join!(run, read);
        assert_eq!(
            got,
            [
                Frame::RstStream {
                    stream: odd,
                    status: REFUSED_STREAM
                },
                Frame::Data {
                    stream: over_error,
                    fin: true,
                    data: Bytes::from(too_many_pairs())
                },
                Frame::Data {
                    stream: over_data,
                    fin: true,
                    data: Bytes::new()
                },
            ]
        );
        let refused = metrics
            .cap_refusals
            .with_label_values(&["port_forward_streams"])
            .get();
        assert_eq!(refused, 2);
    }

    #[test]
    fn ports_come_from_the_query() {
        assert_eq!(
            query_ports("port=80&port=8080,9090"),
            Ok(vec![80, 8080, 9090])
        );
        assert!(query_ports("").is_err());
        assert!(query_ports("port=0").is_err());
        assert!(query_ports("port=http").is_err());
    }

    #[tokio::test]
    async fn the_websocket_channels_carry_each_port() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).await.unwrap();
            c.write_all(&[b"echo:".as_slice(), &buf].concat())
                .await
                .unwrap();
        });
        let (in_tx, in_rx) = mpsc::unbounded_channel::<Bytes>();
        let inbound: Inbound =
            futures::stream::unfold(
                in_rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            )
            .boxed_local();
        let (out, mut got) = mpsc::channel(16);
        let port = addr.port();
        let session = tokio::task::LocalSet::new();
        session
            .run_until(async move {
                let task = tokio::task::spawn_local(websocket(inbound, out, addr.ip(), vec![port]));
                let p = port.to_le_bytes();
                assert_eq!(got.recv().await.unwrap(), channel_message(0, &p));
                assert_eq!(got.recv().await.unwrap(), channel_message(1, &p));
                in_tx.send(Bytes::from_static(b"\x00ping")).unwrap();
                assert_eq!(got.recv().await.unwrap(), channel_message(0, b"echo:ping"));
                drop(in_tx);
                task.await.unwrap();
            })
            .await;
    }

    #[tokio::test]
    async fn bytes_go_both_ways_and_a_refused_port_is_reported() {
        let addr = echo_guest().await;
        let (to_guest, rx) = mpsc::channel(1);
        let (out, mut got) = mpsc::channel(8);
        to_guest.try_send(Bytes::from_static(b"ping")).unwrap();
        drop(to_guest);
        forward(addr.ip(), addr.port().to_string(), 3, 1, rx, out).await;
        let mut seen = Vec::new();
        while let Some(s) = got.recv().await {
            seen.push(s);
        }
        assert_eq!(
            seen,
            vec![
                Send {
                    stream: 3,
                    data: Bytes::from_static(b"echo:ping"),
                    fin: false
                },
                Send {
                    stream: 3,
                    data: Bytes::new(),
                    fin: true
                },
                Send {
                    stream: 1,
                    data: Bytes::new(),
                    fin: true
                },
            ]
        );

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let (_tx, rx) = mpsc::channel(1);
        let (out, mut got) = mpsc::channel(8);
        forward(addr.ip(), port.to_string(), 3, 1, rx, out).await;
        let first = got.recv().await.unwrap();
        assert_eq!(first.stream, 1);
        assert!(
            String::from_utf8_lossy(&first.data).contains("error forwarding port"),
            "{first:?}"
        );
    }

    /// A guest that does not read holds the caller back: once its queue and the socket's
    /// buffers are full, the relay stops reading the caller instead of keeping what it sends.
    #[tokio::test]
    async fn what_a_guest_does_not_read_is_not_held_without_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (c, _) = listener.accept().await.unwrap();
            // Holds the connection open and never reads from it.
            let _c = c;
            std::future::pending::<()>().await
        });
        const CHUNKS: usize = 2000;
        let read = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let counted = read.clone();
        let chunk = Bytes::from([vec![0u8], vec![7u8; 64 * 1024]].concat());
        let inbound: Inbound = futures::stream::iter(std::iter::repeat_n(chunk, CHUNKS))
            .inspect(move |_| counted.set(counted.get() + 1))
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, mut got) = mpsc::channel(16);
        tokio::spawn(async move { while got.recv().await.is_some() {} });
        let relay = websocket(inbound, out, addr.ip(), vec![addr.port()]);
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), relay).await;
        assert!(
            read.get() < CHUNKS / 2,
            "{} of {CHUNKS} 64 KiB chunks read for a guest that reads nothing",
            read.get()
        );
    }
}
