//! The serving side of §7 on `VK_PEER_ADDR`, an actix-web server on a thread of its own
//! like the kubelet API and `/metrics`. K7.1, K7.2: mutual TLS with node certificates only; every
//! request passes the node check before anything runs, and what a caller can make this node
//! spend is capped (connections, handshakes, plan lookups, slice streams). K7.4: a node is
//! served a snapshot only while it wakes a pod the snapshot belongs to (`grant.rs`).
//!
//! A slice answer is sized: its body is the range's bytes followed by their CRC-32C
//! ([`CRC_LEN`] bytes, big-endian), so a body cut anywhere is short of its `Content-Length`
//! and a damaged one fails its checksum.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::body::SizedStream;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{ALLOW, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse, HttpServer};
use anyhow::Context;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use reconcilers::cocoon::CocoonCmd;
use reconcilers::event::CocoonOk;
use reconcilers::vm::CocoonErrorKind;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::counters::{PeerCounters, Refusal};
use super::grant::{self, Denied, Grants, PodLookup, Standing, WakingPod};
use super::plan::{plan_dir, MAX_SLICE};
use super::tls::{node_of_certificate, NodeTls};
use super::{plain_name, CRC_LEN, PLAN_PATH, SLICE_PATH};
use crate::cocoon::CocoonCli;
use crate::metrics::{Cap, Metrics};
use crate::registry::valid_snapshot_name;

/// More concurrent slice streams than this are refused with 503, so that a burst of waking
/// nodes cannot take all of this node's disk bandwidth and descriptors.
pub const MAX_STREAMS: usize = 128;
/// Read size per body chunk: large enough that syscalls do not dominate, small enough that
/// 128 streams stay within a bounded amount of memory.
const READ_CHUNK: usize = 1 << 20;
/// A connection that has not sent its request head by then is dropped.
const HEADER_READ: Duration = Duration::from_secs(10);
/// Plan lookups at once: each asks the apiserver for a pod, starts a `cocoon snapshot
/// inspect` and scans a directory.
pub const MAX_PLANS: usize = 8;
/// Open connections per worker (two workers); past it, new ones wait in the kernel's backlog
/// instead of holding descriptors and memory here.
const MAX_CONNECTIONS: usize = 128;
/// TLS handshakes in progress per worker.
const MAX_HANDSHAKES: usize = 32;
/// A connection that has not completed its handshake by then is dropped.
const HANDSHAKE: Duration = Duration::from_secs(5);
/// An idle kept-alive connection is closed after this long.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// What the server needs of a local cocoon snapshot: where its files are, and whose it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSnapshot {
    pub id: String,
    /// Where the owner record lives (`vk-cocoon owner=<namespace>/<pod>`).
    pub description: String,
}

/// A local cocoon snapshot by name. `Ok(None)` when cocoon does not know the name.
pub trait LocalSnapshots: Send + Sync + 'static {
    fn inspect<'a>(&'a self, name: &'a str)
        -> BoxFuture<'a, Result<Option<LocalSnapshot>, String>>;
}

impl LocalSnapshots for CocoonCli {
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LocalSnapshot>, String>> {
        Box::pin(async move {
            let cmd = CocoonCmd::SnapshotInspect {
                name: name.to_string(),
            };
            match self.call(&cmd).await {
                Ok(CocoonOk::Snapshot { snapshot }) => Ok(Some(LocalSnapshot {
                    id: snapshot.id,
                    description: snapshot.description,
                })),
                Ok(other) => Err(format!("cocoon snapshot inspect answered {other:?}")),
                Err(e) if e.kind == CocoonErrorKind::SnapshotNotFound => Ok(None),
                Err(e) => Err(e.message),
            }
        })
    }
}

/// What the peer API counts: refused callers and, for the caps, `cap_refusals`.
#[derive(Clone)]
pub struct Counting {
    pub metrics: Metrics,
    pub peer: PeerCounters,
}

/// Binds `addr` (`VK_PEER_ADDR`) and serves snapshots stored under `snapshot_root`
/// (`VK_COCOON_SNAPSHOT_DIR`), names resolved by `cocoon snapshot inspect`, to the nodes
/// waking their pods, as `client` (the apiserver) says. A bind failure is returned, naming
/// the address.
pub fn spawn(
    addr: SocketAddr,
    snapshot_root: PathBuf,
    cocoon: CocoonCli,
    client: kube::Client,
    tls: &NodeTls,
    counting: Counting,
) -> anyhow::Result<()> {
    let sources = Sources {
        snapshots: Arc::new(cocoon),
        pods: Arc::new(client),
    };
    Server::bind(addr, snapshot_root, sources, tls, counting)?.spawn()
}

/// Where the server learns what it checks: the local snapshots, and (K7.4) the pods.
pub struct Sources {
    pub snapshots: Arc<dyn LocalSnapshots>,
    pub pods: Arc<dyn PodLookup>,
}

/// A bound, not yet serving, peer endpoint.
pub struct Server {
    listener: std::net::TcpListener,
    tls: Option<rustls::ServerConfig>,
    state: State,
}

/// Who may call: node certificates, or (protocol tests only) anyone over plain HTTP, taken
/// for the node named.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Callers {
    Nodes,
    #[cfg(test)]
    As(String),
}

/// The node the caller's certificate names, once the node check passed.
#[derive(Clone)]
struct Caller(String);

struct State {
    root: PathBuf,
    snapshots: Arc<dyn LocalSnapshots>,
    pods: Arc<dyn PodLookup>,
    grants: Grants,
    streams: Arc<Semaphore>,
    plans: Arc<Semaphore>,
    callers: Callers,
    counting: Counting,
}

/// The verified client certificate of a connection, kept for the node check.
#[derive(Clone)]
struct ClientCert(Vec<u8>);

impl Server {
    pub fn bind(
        addr: SocketAddr,
        snapshot_root: PathBuf,
        sources: Sources,
        tls: &NodeTls,
        counting: Counting,
    ) -> anyhow::Result<Server> {
        let config = tls.server_config_counting(counting.peer.clone())?;
        let mut server = Server::bind_with(addr, snapshot_root, sources, counting)?;
        server.tls = Some(config);
        Ok(server)
    }

    /// Plain HTTP, every caller taken for node `caller`: for the protocol tests, which tamper
    /// with the bytes on the wire.
    #[cfg(test)]
    pub(super) fn bind_plain(
        addr: SocketAddr,
        snapshot_root: PathBuf,
        sources: Sources,
        caller: &str,
    ) -> anyhow::Result<Server> {
        let counting = Counting {
            metrics: Metrics::new(),
            peer: PeerCounters::new(),
        };
        let mut server = Server::bind_with(addr, snapshot_root, sources, counting)?;
        server.state.callers = Callers::As(caller.to_string());
        Ok(server)
    }

    fn bind_with(
        addr: SocketAddr,
        snapshot_root: PathBuf,
        sources: Sources,
        counting: Counting,
    ) -> anyhow::Result<Server> {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("VK_PEER_ADDR: cannot listen on {addr}"))?;
        Ok(Server {
            listener,
            tls: None,
            state: State {
                root: snapshot_root,
                snapshots: sources.snapshots,
                pods: sources.pods,
                grants: Grants::default(),
                streams: Arc::new(Semaphore::new(MAX_STREAMS)),
                plans: Arc::new(Semaphore::new(MAX_PLANS)),
                callers: Callers::Nodes,
                counting,
            },
        })
    }

    /// Replaces the `MAX_PLANS` limit.
    pub fn with_plan_limit(mut self, plans: usize) -> Self {
        self.state.plans = Arc::new(Semaphore::new(plans));
        self
    }

    /// Replaces the grants' [`grant::RECHECK`] interval.
    pub fn with_grant_recheck(mut self, recheck: Duration) -> Self {
        self.state.grants = Grants::with_recheck(recheck);
        self
    }

    /// Replaces the `MAX_STREAMS` limit.
    pub fn with_stream_limit(mut self, streams: usize) -> Self {
        self.state.streams = Arc::new(Semaphore::new(streams));
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves for the life of the process, on a thread of its own (actix's server is not
    /// `Send`, and a burst of slices must not compete with the loop's runtime).
    pub fn spawn(self) -> anyhow::Result<()> {
        let addr = self.local_addr()?;
        let (listener, tls, state) = (self.listener, self.tls, web::Data::new(self.state));
        std::thread::Builder::new()
            .name("peer-api".into())
            .spawn(move || {
                let served = serve(listener, tls, state);
                if let Err(e) = actix_web::rt::System::new().block_on(served) {
                    tracing::error!(%addr, error = %e, "peer API listener failed");
                }
            })
            .context("cannot start the peer API thread")?;
        Ok(())
    }
}

async fn serve(
    listener: std::net::TcpListener,
    tls: Option<rustls::ServerConfig>,
    state: web::Data<State>,
) -> io::Result<()> {
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(actix_web::middleware::from_fn(only_nodes))
            .service(endpoint(PLAN_PATH).route(web::get().to(plan)))
            .service(endpoint(SLICE_PATH).route(web::get().to(slice)))
            .default_service(web::to(|| async {
                text(StatusCode::NOT_FOUND, "no such endpoint")
            }))
    })
    .workers(2)
    .disable_signals()
    .on_connect(remember_client_cert)
    .max_connections(MAX_CONNECTIONS)
    .max_connection_rate(MAX_HANDSHAKES)
    .tls_handshake_timeout(HANDSHAKE)
    .keep_alive(KEEP_ALIVE)
    .client_request_timeout(HEADER_READ);
    match tls {
        Some(config) => server.listen_rustls_0_23(listener, config)?,
        None => server.listen(listener)?,
    }
    .run()
    .await
}

fn remember_client_cert(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    let Some(tls) = conn.downcast_ref::<Tls>() else {
        return;
    };
    if let Some(cert) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
        ext.insert(ClientCert(cert.to_vec()));
    }
}

/// K7.1: a request from anything but another node is answered 401 before any route runs.
async fn only_nodes(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let state = req.app_data::<web::Data<State>>().cloned();
    let caller = match state.as_ref().map(|s| &s.callers) {
        None => Err((Refusal::NotANode, "the peer API has no state".to_string())),
        #[cfg(test)]
        Some(Callers::As(node)) => Ok(node.clone()),
        Some(Callers::Nodes) => match req.conn_data::<ClientCert>() {
            None => Err((
                Refusal::NoCertificate,
                "a node certificate signed by the cluster CA is required".to_string(),
            )),
            Some(ClientCert(der)) => node_of_certificate(der).map_err(|e| (Refusal::NotANode, e)),
        },
    };
    match caller {
        Ok(node) => {
            req.extensions_mut().insert(Caller(node));
            Ok(next.call(req).await?.map_into_left_body())
        }
        Err((why, msg)) => {
            if let Some(s) = &state {
                s.counting.peer.refused(why);
            }
            tracing::debug!(reason = why.as_str(), "peer API refused a caller: {msg}");
            let res = text(StatusCode::UNAUTHORIZED, &msg);
            Ok(req.into_response(res).map_into_right_body())
        }
    }
}

/// A path that answers GET only: any other method is 405 naming it.
fn endpoint(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(|| async {
        let mut res = text(StatusCode::METHOD_NOT_ALLOWED, "only GET");
        res.headers_mut().insert(
            ALLOW,
            actix_web::http::header::HeaderValue::from_static("GET"),
        );
        res
    }))
}

type Answer<T = HttpResponse> = Result<T, (StatusCode, String)>;

fn answer(a: Answer) -> HttpResponse {
    a.unwrap_or_else(|(status, msg)| text(status, &msg))
}

fn bad(msg: impl Into<String>) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// The caller the node check put on the request; a route never runs without one.
fn caller_of(req: &HttpRequest) -> String {
    req.extensions()
        .get::<Caller>()
        .map(|c| c.0.clone())
        .unwrap_or_default()
}

async fn plan(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let caller = caller_of(&req);
    answer(plan_of(&state, &caller, &Query::parse(req.query_string())).await)
}

async fn slice(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let caller = caller_of(&req);
    answer(slice_of(&state, &caller, &Query::parse(req.query_string())).await)
}

/// K7.4: the pod the request is made for; a request naming none is refused.
fn waking_pod(state: &State, caller: &str, q: &Query) -> Result<WakingPod, (StatusCode, String)> {
    WakingPod::from_query(|k| q.get(k)).ok_or_else(|| {
        let why = "name the pod this node wakes (namespace, pod, uid): snapshots are served \
                   only to the node waking their pod";
        Denied(Refusal::NoGrant, why.into()).answer(&state.counting.peer, caller)
    })
}

async fn plan_of(state: &State, caller: &str, q: &Query) -> Answer {
    let name = q.get("name").ok_or_else(|| bad("name is required"))?;
    if !valid_snapshot_name(name) {
        return Err(bad(format!("{name:?} is not a snapshot name")));
    }
    let pod = waking_pod(state, caller, q)?;
    let _slot = state.plans.clone().try_acquire_owned().map_err(|_| {
        state.counting.metrics.cap_refused(Cap::PeerRequests);
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("more than {MAX_PLANS} plan requests at once; retry later"),
        )
    })?;
    let LocalSnapshot { id, .. } = granted_snapshot(state, caller, &pod, name).await?;
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
    if !state
        .grants
        .grant(caller, &pod, &plan.snapshot_id, Instant::now())
    {
        state.counting.metrics.cap_refused(Cap::PeerRequests);
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{} snapshot grants held; retry later", grant::MAX_GRANTS),
        ));
    }
    let json = serde_json::to_vec(&plan).expect("a plan always serialises");
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "application/json"))
        .body(json))
}

/// K7.4, for a plan: the pod is the caller's to wake (the apiserver's word) and the
/// snapshot is of its namespace (the owner record). The pod is asked first, so a caller
/// without a grant learns nothing of what this node keeps.
async fn granted_snapshot(
    state: &State,
    caller: &str,
    pod: &WakingPod,
    name: &str,
) -> Result<LocalSnapshot, (StatusCode, String)> {
    let refused = |d: Denied| d.answer(&state.counting.peer, caller);
    grant::pod_is_callers(state.pods.as_ref(), caller, pod)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?
        .map_err(refused)?;
    let found = match state.snapshots.inspect(name).await {
        Ok(Some(found)) => found,
        Ok(None) => return Err((StatusCode::NOT_FOUND, format!("no local snapshot {name:?}"))),
        Err(e) => {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("resolve snapshot {name:?}: {e}"),
            ))
        }
    };
    grant::snapshot_is_pods(&found.description, name, pod).map_err(refused)?;
    Ok(found)
}

/// K7.4, for a slice: the grant its plan left, confirmed with the apiserver again when due.
async fn slice_granted(state: &State, caller: &str, pod: &WakingPod, id: &str) -> Answer<()> {
    let refused = |d: Denied| d.answer(&state.counting.peer, caller);
    match state.grants.standing(caller, pod, id, Instant::now()) {
        Standing::Granted => Ok(()),
        Standing::None => Err(refused(Denied(
            Refusal::NoGrant,
            format!("no grant of snapshot {id} to {caller} for pod {pod}: ask for its plan first"),
        ))),
        Standing::Recheck => match grant::pod_is_callers(state.pods.as_ref(), caller, pod).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(d)) => {
                state.grants.revoke(caller, pod, id);
                Err(refused(d))
            }
            Err(e) => {
                state.grants.revoke(caller, pod, id);
                Err((StatusCode::INTERNAL_SERVER_ERROR, e))
            }
        },
    }
}

async fn slice_of(state: &State, caller: &str, q: &Query) -> Answer {
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
    let pod = waking_pod(state, caller, q)?;
    slice_granted(state, caller, &pod, id).await?;
    let permit = state.streams.clone().try_acquire_owned().map_err(|_| {
        state.counting.metrics.cap_refused(Cap::PeerRequests);
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
    let chunks = futures::stream::unfold(Some(reader), |r| async move {
        let mut r = r?;
        let chunk = r.next_chunk().await;
        let more = matches!(&chunk, Ok(Chunk::Data(_)));
        Some((chunk.map(Chunk::into_bytes), more.then_some(r)))
    });
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "application/octet-stream"))
        .body(SizedStream::new(length + CRC_LEN as u64, chunks)))
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

enum Chunk {
    Data(Bytes),
    Crc(u32),
}

impl Chunk {
    fn into_bytes(self) -> Bytes {
        match self {
            Chunk::Data(b) => b,
            Chunk::Crc(crc) => Bytes::copy_from_slice(&crc.to_be_bytes()),
        }
    }
}

impl SliceReader {
    /// The next piece of the range, or its CRC once `length` bytes are out. An error makes
    /// actix drop the connection: the client sees a body short of its length.
    async fn next_chunk(&mut self) -> io::Result<Chunk> {
        if self.left == 0 {
            return Ok(Chunk::Crc(self.crc));
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
        Ok(Chunk::Data(buf.freeze()))
    }
}

fn text(status: StatusCode, msg: &str) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header((CONTENT_TYPE, "text/plain; charset=utf-8"))
        .body(format!("{msg}\n"))
}

/// The decoded query string; the first of repeated keys wins.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Query {
        Query(form_urlencoded::parse(q.as_bytes()).into_owned().collect())
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
