//! The remotecommand protocol (`v4`/`v5.channel.k8s.io`) over either transport. The command
//! itself is a worker that reads stdin from a channel and reports `exec::Out`; this module
//! only carries bytes between it and the client.
//!
//! SPDY: the client opens one stream per `streamType` (error, stdin, stdout, stderr, resize);
//! the status goes on the error stream, then every stream is finished and the connection
//! said goodbye to, which is what ends kubectl's copies.
//! WebSocket: one byte of channel before each message (0 stdin, 1 stdout, 2 stderr, 3 status,
//! 4 resize, which is dropped); in v5 the client's `[255, 0]` closes stdin; a close frame ends the session.

use std::future::Future;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::mpsc;

use super::exec::{failure, Out};
use super::spdy_frame::Frame;
use super::spdy_session::{Event, Session};
use super::wire::{self, Inbound, Outbound, IDLE as CREATION};

/// The streams the caller asked for in the query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

pub const CH_STDIN: u8 = 0;
pub const CH_STDOUT: u8 = 1;
pub const CH_STDERR: u8 = 2;
pub const CH_ERROR: u8 = 3;
pub const CH_CLOSE: u8 = 255;

/// How often the idle limit is looked at, at the most.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// How often a session with `idle` as its limit looks at it: often enough that the limit
/// bites within half of itself.
fn idle_check(idle: Duration) -> tokio::time::Interval {
    let every = (idle / 2).clamp(Duration::from_millis(10), IDLE_CHECK);
    tokio::time::interval(every)
}

pub type Worker<F> = Box<dyn FnOnce(Option<mpsc::Receiver<Bytes>>, mpsc::Sender<Out>) -> F>;

/// Chunks of the caller's stdin waiting for the command. When they are full the connection
/// is not read until the command takes one: the caller waits, the daemon's memory does not
/// grow (at most this many frames per session).
const STDIN_QUEUE: usize = 64;

/// Hands `data` to the command's stdin, or keeps it in `pending` when the queue is full; the
/// relay then reads nothing more from the caller until it is taken.
fn to_stdin(tx: &Option<mpsc::Sender<Bytes>>, data: Bytes, pending: &mut Option<Bytes>) {
    if let Some(tx) = tx {
        if let Err(mpsc::error::TrySendError::Full(data)) = tx.try_send(data) {
            *pending = Some(data);
        }
    }
}

/// Waits for room in the stdin queue and moves `pending` into it (dropped when the command
/// no longer reads: its stdin is gone).
async fn flush_stdin(tx: &Option<mpsc::Sender<Bytes>>, pending: &mut Option<Bytes>) {
    let Some(tx) = tx else {
        *pending = None;
        return;
    };
    match tx.reserve().await {
        Ok(permit) => {
            if let Some(data) = pending.take() {
                permit.send(data);
            }
        }
        Err(_) => *pending = None,
    }
}

fn idle_status(idle: Duration) -> serde_json::Value {
    tracing::info!(?idle, "exec session idle: ending it");
    failure(format!(
        "vk-cocoon: the stream saw no traffic for {:?} and was closed (VK_EXEC_IDLE_TIMEOUT)",
        idle
    ))
}

#[derive(Default)]
struct Ids {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
}

/// Serves one exec over SPDY: waits (at most the creation timeout) for the streams the query
/// promised, then runs `worker` and relays until the command ends, the client goes, or
/// nothing moves for `idle`.
pub async fn spdy<F: Future<Output = ()>>(
    mut s: Session,
    want: Streams,
    idle: Duration,
    worker: Worker<F>,
) {
    let mut ids = Ids::default();
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    let mut in_tx = Some(in_tx);
    let mut pending: Option<Bytes> = None;
    let complete = |ids: &Ids| {
        ids.error.is_some()
            && (!want.stdin || ids.stdin.is_some())
            && (!want.stdout || ids.stdout.is_some())
            && (!want.stderr || ids.stderr.is_some())
    };
    let deadline = tokio::time::sleep(CREATION);
    tokio::pin!(deadline);
    while !complete(&ids) {
        let ev = tokio::select! {
            ev = s.next() => ev,
            _ = &mut deadline => {
                tracing::debug!("exec client did not open its streams in time");
                s.go_away().await;
                return;
            }
        };
        match ev {
            Ok(Event::Opened { stream, headers }) => {
                match Frame::header(&headers, "streamType").unwrap_or_default() {
                    "error" => ids.error = Some(stream),
                    "stdin" => ids.stdin = Some(stream),
                    "stdout" => ids.stdout = Some(stream),
                    "stderr" => ids.stderr = Some(stream),
                    _ => {}
                }
            }
            Ok(Event::Data { stream, data }) if Some(stream) == ids.stdin => {
                to_stdin(&in_tx, data, &mut pending);
                if pending.is_some() {
                    // A queue's worth of stdin before the streams are even open.
                    tracing::debug!("exec client sent too much before opening its streams");
                    s.go_away().await;
                    return;
                }
            }
            Ok(Event::Finished { stream }) if Some(stream) == ids.stdin => in_tx = None,
            Ok(_) => {}
            Err(_) => return,
        }
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(16);
    let job = worker(want.stdin.then_some(in_rx), out_tx);
    tokio::pin!(job);
    let mut job_done = false;
    let mut tick = idle_check(idle);
    let status = loop {
        tokio::select! {
            ev = s.next(), if pending.is_none() => match ev {
                Ok(Event::Data { stream, data }) if Some(stream) == ids.stdin => {
                    to_stdin(&in_tx, data, &mut pending);
                }
                Ok(Event::Finished { stream }) if Some(stream) == ids.stdin => in_tx = None,
                Ok(_) => {}
                Err(_) => return, // The client is gone: dropping `job` kills the command.
            },
            out = out_rx.recv() => match out {
                Some(Out::Stdout(b)) => {
                    if let Some(id) = ids.stdout {
                        if s.data(id, b, false).await.is_err() { return; }
                    }
                }
                Some(Out::Stderr(b)) => {
                    if let Some(id) = ids.stderr {
                        if s.data(id, b, false).await.is_err() { return; }
                    }
                }
                Some(Out::Status(st)) => break st,
                None => break failure("vk-cocoon: the command ended without a status"),
            },
            () = flush_stdin(&in_tx, &mut pending), if pending.is_some() => {}
            _ = &mut job, if !job_done => job_done = true,
            _ = tick.tick() => if s.idle_for() >= idle { break idle_status(idle) },
        }
    };
    for id in [ids.stdout, ids.stderr, ids.stdin].into_iter().flatten() {
        if s.data(id, Bytes::new(), true).await.is_err() {
            return;
        }
    }
    if let Some(id) = ids.error {
        let body = Bytes::from(serde_json::to_vec(&status).unwrap_or_default());
        if s.data(id, body, true).await.is_err() {
            return;
        }
    }
    s.go_away().await;
}

fn channel_message(ch: u8, data: &[u8]) -> Bytes {
    let mut m = BytesMut::with_capacity(data.len() + 1);
    m.put_u8(ch);
    m.put_slice(data);
    wire::ws_binary(m.freeze())
}

/// Serves one exec over a WebSocket channel protocol (`v5` when `close_signal`), until the
/// command ends, the client goes, or nothing moves for `idle`.
pub async fn websocket<F: Future<Output = ()>>(
    mut inbound: Inbound,
    out: Outbound,
    want: Streams,
    close_signal: bool,
    idle: Duration,
    worker: Worker<F>,
) {
    use futures::StreamExt;
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    let mut in_tx = Some(in_tx);
    let mut pending: Option<Bytes> = None;
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(16);
    let job = worker(want.stdin.then_some(in_rx), out_tx);
    tokio::pin!(job);
    let mut job_done = false;
    let mut last_seen = tokio::time::Instant::now();
    let mut tick = idle_check(idle);
    let status = loop {
        tokio::select! {
            msg = inbound.next(), if pending.is_none() => match msg {
                Some(m) => {
                    last_seen = tokio::time::Instant::now();
                    match (m.first().copied(), m.get(1).copied()) {
                        (Some(CH_STDIN), _) => to_stdin(&in_tx, m.slice(1..), &mut pending),
                        (Some(CH_CLOSE), Some(CH_STDIN)) if close_signal => in_tx = None,
                        // Resize: cocoon gives the command no terminal to resize.
                        _ => {}
                    }
                }
                None => return,
            },
            o = out_rx.recv() => {
                last_seen = tokio::time::Instant::now();
                let frame = match o {
                    Some(Out::Stdout(b)) if want.stdout => channel_message(CH_STDOUT, &b),
                    Some(Out::Stderr(b)) if want.stderr => channel_message(CH_STDERR, &b),
                    Some(Out::Status(st)) => break st,
                    Some(_) => continue,
                    None => break failure("vk-cocoon: the command ended without a status"),
                };
                if out.send(frame).await.is_err() {
                    return;
                }
            },
            () = flush_stdin(&in_tx, &mut pending), if pending.is_some() => {}
            _ = &mut job, if !job_done => job_done = true,
            _ = tick.tick() => if last_seen.elapsed() >= idle { break idle_status(idle) },
        }
    };
    let body = serde_json::to_vec(&status).unwrap_or_default();
    if out.send(channel_message(CH_ERROR, &body)).await.is_ok() {
        let _ = out.send(wire::ws_close()).await;
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::super::exec::success;
    use super::super::spdy_frame::Codec;
    use super::*;

    const IDLE: Duration = Duration::from_secs(30);

    /// A worker that holds stdin open and never ends, as `cat` does with a quiet caller.
    fn quiet() -> Worker<impl Future<Output = ()>> {
        Box::new(|stdin, out| async move {
            let _keep = (stdin, out);
            futures::future::pending::<()>().await
        })
    }

    /// The client pings (an empty message each) every `every`, `pings` times, then falls
    /// silent with the connection still open.
    fn pinging(every: Duration, pings: usize) -> Inbound {
        futures::stream::iter(0..pings)
            .then(move |_| async move {
                tokio::time::sleep(every).await;
                Bytes::new()
            })
            .chain(futures::stream::pending())
            .boxed_local()
    }

    #[tokio::test(start_paused = true)]
    async fn pings_keep_a_quiet_session_past_the_idle_limit_and_silence_ends_it() {
        let idle = Duration::from_secs(2);
        let (out, mut rx) = mpsc::channel(64);
        let want = Streams {
            stdin: true,
            stdout: true,
            ..Streams::default()
        };
        let started = tokio::time::Instant::now();
        // Ten pings a second apart: ten seconds with nothing but pings, then silence.
        websocket(
            pinging(Duration::from_secs(1), 10),
            out,
            want,
            true,
            idle,
            quiet(),
        )
        .await;
        let lasted = started.elapsed();
        assert!(lasted >= Duration::from_secs(12), "{lasted:?}");
        assert!(lasted <= Duration::from_secs(14), "{lasted:?}");
        let status = rx.recv().await.unwrap();
        let text = String::from_utf8_lossy(&status);
        assert!(text.contains("saw no traffic for 2s"), "{text}");
        assert_eq!(rx.recv().await.unwrap(), wire::ws_close());
    }

    /// A worker that copies stdin to stdout, then reports success.
    fn echo() -> Worker<impl Future<Output = ()>> {
        Box::new(|stdin, out| async move {
            if let Some(mut rx) = stdin {
                while let Some(b) = rx.recv().await {
                    let _ = out.send(Out::Stdout(b)).await;
                }
            }
            let _ = out.send(Out::Status(success())).await;
        })
    }

    fn frames(client: &mut Codec, wire: &[Bytes]) -> Vec<Frame> {
        let mut buf = BytesMut::new();
        for b in wire {
            buf.extend_from_slice(b);
        }
        let mut out = Vec::new();
        while let Some(f) = client.decode(&mut buf).unwrap() {
            out.push(f);
        }
        out
    }

    #[tokio::test]
    async fn an_spdy_exec_answers_streams_relays_and_ends_with_the_status() {
        let mut client = Codec::default();
        let open = |c: &mut Codec, stream: u32, kind: &str| {
            c.encode(&Frame::SynStream {
                stream,
                fin: false,
                headers: vec![("streamtype".into(), kind.into())],
            })
        };
        let sent = vec![
            open(&mut client, 1, "error"),
            open(&mut client, 3, "stdin"),
            open(&mut client, 5, "stdout"),
            client.encode(&Frame::Ping { id: 1 }),
            client.encode(&Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"typed"),
            }),
        ];
        let inbound: Inbound = futures::stream::iter(sent)
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, mut rx) = mpsc::channel(64);
        let session = Session::new(inbound, out, |b| b);
        let want = Streams {
            stdin: true,
            stdout: true,
            ..Streams::default()
        };
        spdy(session, want, IDLE, echo()).await;
        let mut wire = Vec::new();
        while let Ok(b) = rx.try_recv() {
            wire.push(b);
        }
        let mut server = Codec::default();
        let got = frames(&mut server, &wire);
        let reply = |stream| Frame::SynReply {
            stream,
            fin: false,
            headers: vec![],
        };
        let data = |stream, fin, d: &[u8]| Frame::Data {
            stream,
            fin,
            data: Bytes::copy_from_slice(d),
        };
        let status = serde_json::to_vec(&success()).unwrap();
        assert_eq!(
            got,
            vec![
                reply(1),
                reply(3),
                reply(5),
                Frame::Ping { id: 1 },
                data(5, false, b"typed"),
                data(5, true, b""),
                data(3, true, b""),
                data(1, true, &status),
                Frame::GoAway {
                    last_good: 5,
                    status: 0
                },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn streams_never_opened_end_the_session_after_the_creation_timeout() {
        let mut client = Codec::default();
        let sent = vec![client.encode(&Frame::SynStream {
            stream: 1,
            fin: false,
            headers: vec![("streamtype".into(), "error".into())],
        })];
        let inbound: Inbound = futures::stream::iter(sent)
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, mut rx) = mpsc::channel(64);
        let session = Session::new(inbound, out, |b| b);
        let want = Streams {
            stdout: true,
            ..Streams::default()
        };
        let started = tokio::time::Instant::now();
        spdy(session, want, IDLE, echo()).await;
        assert!(started.elapsed() >= CREATION);
        let mut wire = Vec::new();
        while let Ok(b) = rx.try_recv() {
            wire.push(b);
        }
        let got = frames(&mut Codec::default(), &wire);
        assert!(matches!(got.last(), Some(Frame::GoAway { .. })), "{got:?}");
    }

    #[tokio::test]
    async fn a_v5_websocket_exec_closes_stdin_on_the_signal() {
        let sent = vec![
            Bytes::from_static(b"\x00abc"),
            Bytes::from_static(&[CH_CLOSE, CH_STDIN]),
        ];
        let inbound: Inbound = futures::stream::iter(sent)
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, mut rx) = mpsc::channel(64);
        let want = Streams {
            stdin: true,
            stdout: true,
            ..Streams::default()
        };
        websocket(inbound, out, want, true, IDLE, echo()).await;
        let status = serde_json::to_vec(&success()).unwrap();
        assert_eq!(rx.recv().await.unwrap(), channel_message(CH_STDOUT, b"abc"));
        assert_eq!(rx.recv().await.unwrap(), channel_message(CH_ERROR, &status));
        assert_eq!(rx.recv().await.unwrap(), wire::ws_close());
    }

    /// A command that does not read its stdin holds the caller back: the relay stops reading
    /// the connection once the queue is full, instead of holding whatever the caller sends.
    #[tokio::test]
    async fn stdin_the_command_does_not_take_is_not_read_without_bound() {
        let read = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let counted = read.clone();
        let sent = (0..1000).map(|_| Bytes::from_static(b"\x00x"));
        let inbound: Inbound = futures::stream::iter(sent)
            .inspect(move |_| counted.set(counted.get() + 1))
            .chain(futures::stream::pending())
            .boxed_local();
        let (out, _rx) = mpsc::channel(64);
        let want = Streams {
            stdin: true,
            stdout: true,
            ..Streams::default()
        };
        // Holds stdin without reading it, and never ends.
        let stuck: Worker<_> = Box::new(|stdin, out| async move {
            let _keep = (stdin, out);
            futures::future::pending::<()>().await
        });
        let relay = websocket(inbound, out, want, true, IDLE, stuck);
        let _ = tokio::time::timeout(Duration::from_millis(200), relay).await;
        assert_eq!(
            read.get(),
            STDIN_QUEUE + 1,
            "the queue, and the one chunk held back"
        );
    }
}
