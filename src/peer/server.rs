//! The serving side of §7 on `VK_PEER_ADDR`. hyper rather than actix-web because each slice
//! ends in an HTTP/1.1 chunked trailer carrying its CRC, which actix-web cannot send.
//!
//! hyper sends trailers only to a request that says `TE: trailers` (RFC 9110 §10.1.4); the
//! client in this module always does.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, ALLOW, CONTENT_TYPE, TRAILER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::event::CocoonOk;
use reconcilers::vm::CocoonErrorKind;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::plan::{plan_dir, MAX_SLICE};
use super::{plain_name, CRC_TRAILER, PLAN_PATH, SLICE_PATH};
use crate::cocoon::CocoonCli;
use crate::registry::valid_snapshot_name;

/// More concurrent slice streams than this are refused with 503, so that a burst of waking
/// nodes cannot take all of this node's disk bandwidth and descriptors.
pub const MAX_STREAMS: usize = 128;
/// Read size per body frame: large enough that syscalls do not dominate, small enough that
/// 128 streams stay within a bounded amount of memory.
const READ_CHUNK: usize = 1 << 20;
/// A connection that has not sent its request head by then is dropped.
const HEADER_READ: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, io::Error>;

/// Name → id of a local cocoon snapshot. `Ok(None)` when cocoon does not know the name.
pub trait SnapshotIds: Send + Sync + 'static {
    fn id_of<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<String>, String>>;
}

impl SnapshotIds for CocoonCli {
    fn id_of<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            let cmd = CocoonCmd::SnapshotInspect {
                name: name.to_string(),
            };
            match self.call(&cmd).await {
                Ok(CocoonOk::Snapshot { snapshot }) => Ok(Some(snapshot.id)),
                Ok(other) => Err(format!("cocoon snapshot inspect answered {other:?}")),
                Err(e) if e.kind == CocoonErrorKind::SnapshotNotFound => Ok(None),
                Err(e) => Err(e.message),
            }
        })
    }
}

/// Binds `addr` (`VK_PEER_ADDR`) and serves snapshots stored under `snapshot_root`
/// (`VK_COCOON_SNAPSHOT_DIR`), names resolved by `cocoon snapshot inspect`. Must be called
/// inside the Tokio runtime. A bind failure is returned, naming the address.
pub fn spawn(
    addr: SocketAddr,
    snapshot_root: PathBuf,
    cocoon: CocoonCli,
) -> anyhow::Result<JoinHandle<()>> {
    Ok(Server::bind(addr, snapshot_root, Arc::new(cocoon))?.spawn())
}

/// A bound, not yet serving, peer endpoint.
pub struct Server {
    listener: std::net::TcpListener,
    state: Arc<State>,
}

struct State {
    root: PathBuf,
    ids: Arc<dyn SnapshotIds>,
    streams: Arc<Semaphore>,
}

impl Server {
    pub fn bind(
        addr: SocketAddr,
        snapshot_root: PathBuf,
        ids: Arc<dyn SnapshotIds>,
    ) -> anyhow::Result<Server> {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("VK_PEER_ADDR: cannot listen on {addr}"))?;
        listener
            .set_nonblocking(true)
            .with_context(|| format!("VK_PEER_ADDR: cannot listen on {addr}"))?;
        Ok(Server {
            listener,
            state: Arc::new(State {
                root: snapshot_root,
                ids,
                streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            }),
        })
    }

    /// Replaces the `MAX_STREAMS` limit.
    pub fn with_stream_limit(mut self, streams: usize) -> Self {
        let state = Arc::get_mut(&mut self.state).expect("not serving yet");
        state.streams = Arc::new(Semaphore::new(streams));
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the handle is aborted.
    pub fn spawn(self) -> JoinHandle<()> {
        let listener = tokio::net::TcpListener::from_std(self.listener)
            .expect("a non-blocking listener registers inside the runtime");
        let state = self.state;
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors, usually: back off instead of spinning.
                        tracing::warn!("peer endpoint: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(route(&state, req).await) }
                    });
                    let served = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    if let Err(e) = served {
                        tracing::debug!(%peer, "peer connection ended: {e}");
                    }
                });
            }
        })
    }
}

async fn route(state: &State, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path != PLAN_PATH && path != SLICE_PATH {
        return text(StatusCode::NOT_FOUND, "no such endpoint");
    }
    if req.method() != Method::GET {
        let mut res = text(StatusCode::METHOD_NOT_ALLOWED, "only GET");
        res.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return res;
    }
    let query = Query::parse(req.uri().query());
    let answer = if path == PLAN_PATH {
        plan(state, &query).await
    } else {
        slice(state, &query).await
    };
    answer.unwrap_or_else(|(status, msg)| text(status, &msg))
}

type Answer = Result<Response<Body>, (StatusCode, String)>;

fn bad(msg: impl Into<String>) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, msg.into())
}

async fn plan(state: &State, q: &Query) -> Answer {
    let name = q.get("name").ok_or_else(|| bad("name is required"))?;
    if !valid_snapshot_name(name) {
        return Err(bad(format!("{name:?} is not a snapshot name")));
    }
    let id = match state.ids.id_of(name).await {
        Ok(Some(id)) => id,
        Ok(None) => return Err((StatusCode::NOT_FOUND, format!("no local snapshot {name:?}"))),
        Err(e) => {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("resolve snapshot {name:?}: {e}"),
            ))
        }
    };
    // The id becomes a path component; cocoon's ids are plain, anything else is a fault here.
    if !plain_name(&id) {
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("snapshot {name:?} resolved to unusable id {id:?}"),
        ));
    }
    let dir = state.root.join(&id);
    let planned = tokio::task::spawn_blocking(move || plan_dir(&dir, &id))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let plan = planned.map_err(|e| {
        let status = match e.kind() {
            // Known to cocoon but not in its store directory: deleted meanwhile.
            io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, format!("plan snapshot {name:?}: {e}"))
    })?;
    let json = serde_json::to_vec(&plan).expect("a plan always serialises");
    Ok(Response::builder()
        .header(CONTENT_TYPE, "application/json")
        .body(full(json))
        .expect("static response parts"))
}

async fn slice(state: &State, q: &Query) -> Answer {
    let id = q.get("id").ok_or_else(|| bad("id is required"))?;
    let file = q.get("file").ok_or_else(|| bad("file is required"))?;
    let offset = q.number("offset")?;
    let length = q.number("length")?;
    if !plain_name(id) || !plain_name(file) {
        return Err(bad("id and file must be plain names"));
    }
    if length == 0 || length > MAX_SLICE || offset.checked_add(length).is_none() {
        return Err(bad(format!(
            "length must be within 1..={MAX_SLICE} and offset+length must not overflow"
        )));
    }
    let permit = state.streams.clone().try_acquire_owned().map_err(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many slice streams".to_string(),
        )
    })?;
    let path = state.root.join(id).join(file);
    let mut f = open_regular(&path).await.map_err(|e| {
        let status = match e.kind() {
            io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, format!("{id}/{file}: {e}"))
    })?;
    f.seek(io::SeekFrom::Start(offset))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let reader = SliceReader {
        file: f.take(length),
        left: length,
        crc: 0,
        what: format!("{id}/{file}@{offset}+{length}"),
        _permit: permit,
    };
    let frames = futures::stream::unfold(Some(reader), |r| async move {
        let mut r = r?;
        let frame = r.next_frame().await;
        let more = matches!(&frame, Ok(f) if f.is_data());
        Some((frame, more.then_some(r)))
    });
    Ok(Response::builder()
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(TRAILER, CRC_TRAILER)
        .body(StreamBody::new(frames).boxed())
        .expect("static response parts"))
}

async fn open_regular(path: &Path) -> io::Result<tokio::fs::File> {
    let f = tokio::fs::File::open(path).await?;
    if !f.metadata().await?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// One slice being streamed; holds its stream slot until the body ends or is dropped.
struct SliceReader {
    file: tokio::io::Take<tokio::fs::File>,
    left: u64,
    crc: u32,
    what: String,
    _permit: OwnedSemaphorePermit,
}

impl SliceReader {
    /// The next data frame, or the CRC trailer once `length` bytes are out. An error makes
    /// hyper drop the connection before the last chunk: the client sees a truncated body.
    async fn next_frame(&mut self) -> io::Result<Frame<Bytes>> {
        if self.left == 0 {
            let mut trailers = HeaderMap::new();
            let crc = HeaderValue::from_str(&format!("{:x}", self.crc))
                .expect("hex digits are a header value");
            trailers.insert(CRC_TRAILER, crc);
            return Ok(Frame::trailers(trailers));
        }
        let mut buf = BytesMut::with_capacity(self.left.min(READ_CHUNK as u64) as usize);
        let n = match self.file.read_buf(&mut buf).await {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} bytes short", self.left),
            )),
            other => other,
        }
        .inspect_err(|e| tracing::warn!("peer slice {} cut short: {e}", self.what))?;
        self.left -= n as u64;
        self.crc = crc32c::crc32c_append(self.crc, &buf);
        Ok(Frame::data(buf.freeze()))
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(full(format!("{msg}\n")))
        .expect("static response parts")
}

/// The decoded query string; the first of repeated keys wins.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Query {
        Query(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, key: &str) -> Result<u64, (StatusCode, String)> {
        let v = self
            .get(key)
            .ok_or_else(|| bad(format!("{key} is required")))?;
        v.parse()
            .map_err(|_| bad(format!("{key}={v:?} is not a byte count")))
    }
}
