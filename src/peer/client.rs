//! The waking side of §7: copy a snapshot's files from the peer that hibernated it into a
//! fresh staging directory, every slice length- and CRC-checked (the CRC-32C follows each
//! slice's bytes in its body), holes kept as holes. Over mutual TLS with a node of the
//! cluster (K7.1), every request naming the pod being woken (K7.4: the peer serves nothing
//! else), and every file checked against the registry's digests before the directory is
//! handed out (K7.3).

use std::fmt;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Frame, Incoming};
use hyper::header::HOST;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use super::grant::WakingPod;
use super::plan::{Plan, PlanFile, Slice};
use super::schedule::Schedule;
use super::staging::StagingDir;
use super::verify::{self, Expected};
use super::{plain_name, CRC_LEN, PLAN_PATH, SLICE_PATH};
use crate::registry::valid_snapshot_name;

/// Streams in flight for one restore: enough to fill a node's NIC.
pub const MAX_STREAMS: usize = 32;
/// Streams in flight per file: disjoint sequential writers on one inode beat many
/// interleaved ones.
pub const STREAMS_PER_FILE: usize = 8;
/// Peer restores one node runs at a time; two already saturate disk and NIC.
pub const MAX_RESTORES: usize = 2;
/// Zero-elision granule and write size: finer granules cost more than they save.
const ZERO_RUN: usize = 1 << 20;
/// A plan is a few lines per file; anything this large is not one.
const MAX_PLAN_BYTES: usize = 16 << 20;
/// How much of an error answer ends up in the error message.
const MAX_ERROR_BODY: usize = 512;
/// cocoon keeps it next to the data files; the restore writes its own from the registry.
const ENVELOPE: &str = "snapshot.json";

/// §7's client deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect.
    pub dial: Duration,
    /// From sending a request to its response head.
    pub response_header: Duration,
    /// No body bytes for this long fails the transfer.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            dial: Duration::from_secs(3),
            response_header: Duration::from_secs(10),
            stall: Duration::from_secs(30),
        }
    }
}

/// How the peer is reached.
#[derive(Clone, Debug)]
pub enum Transport {
    /// K7.1: mutual TLS with a node of the cluster.
    Tls(Arc<rustls::ClientConfig>),
    /// Plain HTTP, for the protocol tests that tamper with the bytes on the wire.
    #[cfg(test)]
    Plain,
}

#[derive(Clone, Debug)]
pub struct RestoreRequest {
    /// `https://<node InternalIP>:<peer port>` (`http://` with [`Transport::Plain`]).
    pub peer: String,
    pub transport: Transport,
    /// The peer's local snapshot name (the VM name for a hibernation).
    pub snapshot_name: String,
    /// The registry config's `snapshotId`; the peer must offer exactly this snapshot.
    pub snapshot_id: String,
    /// K7.4: the pod this node wakes; the peer checks with the apiserver that it is bound
    /// here and serves the snapshot only if it is the pod's namespace's.
    pub pod: WakingPod,
    /// `VK_STAGING_DIR`; on the filesystem of cocoon's data dir, since clone hard-links.
    pub staging_root: PathBuf,
    /// The staging directory's name under `staging_root`; an existing one is replaced.
    pub leaf: String,
    /// The `snapshot.json` envelope, made from the registry config.
    pub snapshot_json: Vec<u8>,
    /// K7.3: every file the registry lists and its digest; only these are fetched, and each
    /// must match.
    pub files: Expected,
    pub timeouts: Timeouts,
}

/// Why a peer restore failed; the caller falls back to the registry either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// The request cannot be carried out as given (URL, names).
    Invalid(String),
    /// No connection, or no response head in time.
    Unreachable(String),
    /// The peer answered something other than 200.
    Status {
        what: String,
        status: u16,
        body: String,
    },
    /// The plan does not parse, or names files or ranges that cannot be written safely.
    Protocol(String),
    /// The peer holds a different snapshot under that name.
    IdMismatch { expected: String, offered: String },
    /// No body bytes within the stall timeout.
    Stalled(String),
    /// The body ended before its length, or the connection broke mid-body.
    Truncated(String),
    /// The checksum after the data is missing or does not match the bytes received.
    Checksum(String),
    /// The staging directory could not be written.
    Local(String),
    /// K7.3: a file the peer sent does not match the registry's digest.
    Altered(String),
}

impl PeerError {
    /// A short label for metrics and events.
    pub fn kind(&self) -> &'static str {
        match self {
            PeerError::Invalid(_) => "invalid",
            PeerError::Unreachable(_) => "unreachable",
            PeerError::Status { .. } => "status",
            PeerError::Protocol(_) => "protocol",
            PeerError::IdMismatch { .. } => "id_mismatch",
            PeerError::Stalled(_) => "stalled",
            PeerError::Truncated(_) => "truncated",
            PeerError::Checksum(_) => "checksum",
            PeerError::Local(_) => "local",
            PeerError::Altered(_) => "altered",
        }
    }
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerError::Invalid(m) => write!(f, "peer restore request invalid: {m}"),
            PeerError::Unreachable(m) => write!(f, "peer unreachable: {m}"),
            PeerError::Status { what, status, body } => {
                write!(f, "peer answered {status} to {what}: {}", body.trim_end())
            }
            PeerError::Protocol(m) => write!(f, "peer protocol violation: {m}"),
            PeerError::IdMismatch { expected, offered } => write!(
                f,
                "peer offers snapshot id {offered}, the registry names {expected}"
            ),
            PeerError::Stalled(m) => write!(f, "peer stream stalled: {m}"),
            PeerError::Truncated(m) => write!(f, "peer stream truncated: {m}"),
            PeerError::Checksum(m) => write!(f, "peer slice checksum: {m}"),
            PeerError::Local(m) => write!(f, "staging: {m}"),
            PeerError::Altered(m) => write!(
                f,
                "the peer's copy does not match the registry, refused: {m}"
            ),
        }
    }
}

impl std::error::Error for PeerError {}

/// At most `n` peer restores at a time on this node (`MAX_RESTORES` per §7).
#[derive(Clone, Debug)]
pub struct Limiter(Arc<Semaphore>);

/// A restore slot, given back when dropped.
pub struct RestorePermit {
    _slot: OwnedSemaphorePermit,
}

impl Limiter {
    pub fn new(n: usize) -> Limiter {
        Limiter(Arc::new(Semaphore::new(n)))
    }

    pub fn per_node() -> Limiter {
        Limiter::new(MAX_RESTORES)
    }

    pub async fn acquire(&self) -> RestorePermit {
        let slot = self.0.clone().acquire_owned().await;
        RestorePermit {
            _slot: slot.expect("the limiter is never closed"),
        }
    }

    pub fn try_acquire(&self) -> Option<RestorePermit> {
        let slot = self.0.clone().try_acquire_owned().ok()?;
        Some(RestorePermit { _slot: slot })
    }

    /// `restore` once a slot is free.
    pub async fn restore(&self, req: RestoreRequest) -> Result<PathBuf, PeerError> {
        let _slot = self.acquire().await;
        restore(req).await
    }
}

/// Copies the peer's snapshot into `staging_root/leaf` and returns that directory, ready for
/// `cocoon vm clone --from-dir`; the caller removes it after the clone. On failure nothing is
/// left under `staging_root/leaf`.
pub async fn restore(req: RestoreRequest) -> Result<PathBuf, PeerError> {
    if !valid_snapshot_name(&req.snapshot_name) {
        return Err(PeerError::Invalid(format!(
            "{:?} is not a snapshot name",
            req.snapshot_name
        )));
    }
    if req.snapshot_id.is_empty() || req.snapshot_json.is_empty() {
        return Err(PeerError::Invalid(
            "the registry's snapshot id and snapshot.json are both required".into(),
        ));
    }
    if !plain_name(&req.leaf) {
        return Err(PeerError::Invalid(format!(
            "staging leaf {:?} is not a plain name",
            req.leaf
        )));
    }
    if !req.pod.valid() {
        return Err(PeerError::Invalid(format!(
            "the waking pod {} is not a pod's namespace, name and uid",
            req.pod
        )));
    }
    let peer = Arc::new(Peer::parse(
        &req.peer,
        req.transport,
        req.timeouts,
        req.pod,
    )?);
    let plan = fetch_plan(&peer, &req.snapshot_name).await?;
    check_plan(&plan, &req.snapshot_id)?;
    let wanted = verify::select(&plan, &req.files).map_err(PeerError::Altered)?;
    let staging = StagingDir::create(&req.staging_root, &req.leaf)
        .await
        .map_err(|e| {
            PeerError::Local(format!(
                "create {}: {e}",
                req.staging_root.join(&req.leaf).display()
            ))
        })?;
    let filled = match fill(&peer, &plan.snapshot_id, wanted, &staging).await {
        Ok(()) => verify::staged(staging.path(), &req.files)
            .await
            .map_err(PeerError::Altered),
        Err(e) => Err(e),
    };
    let done = match filled {
        Ok(()) => write_envelope(staging.path(), req.snapshot_json).await,
        Err(e) => Err(e),
    };
    match done {
        Ok(()) => Ok(staging.keep()),
        Err(e) => {
            staging.remove().await;
            Err(e)
        }
    }
}

/// The registry's files into the (empty) staging directory.
async fn fill(
    peer: &Arc<Peer>,
    snapshot_id: &str,
    wanted: Vec<PlanFile>,
    staging: &StagingDir,
) -> Result<(), PeerError> {
    let dir = staging.path().to_path_buf();
    let wanted: Vec<PlanFile> = wanted.into_iter().filter(|f| f.name != ENVELOPE).collect();
    let created = {
        let (dir, wanted) = (dir.clone(), wanted.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<Vec<Arc<File>>> {
            wanted
                .iter()
                .map(|pf| {
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o640)
                        .open(dir.join(&pf.name))?;
                    // Unwritten ranges must read back as zeros: zero runs are skipped.
                    f.set_len(pf.size)?;
                    Ok(Arc::new(f))
                })
                .collect()
        })
        .await
    };
    let files = created
        .map_err(|e| PeerError::Local(e.to_string()))?
        .map_err(|e| PeerError::Local(format!("create files in {}: {e}", dir.display())))?;

    let mut schedule = Schedule::new(wanted.iter().map(|f| f.slices.clone()).collect());
    let mut running: JoinSet<(usize, Result<(), PeerError>)> = JoinSet::new();
    loop {
        while let Some((i, slice)) = schedule.next() {
            let job = SliceJob {
                peer: peer.clone(),
                id: snapshot_id.to_string(),
                name: wanted[i].name.clone(),
                file: files[i].clone(),
                slice,
            };
            running.spawn(async move { (i, job.run().await) });
        }
        let outcome = match running.join_next().await {
            None => break,
            Some(Ok((i, Ok(())))) => {
                schedule.done(i);
                continue;
            }
            Some(Ok((_, Err(e)))) => e,
            Some(Err(e)) => PeerError::Local(format!("slice task: {e}")),
        };
        running.shutdown().await;
        return Err(outcome);
    }
    Ok(())
}

/// `snapshot.json`, from the registry's config, once every file checked out.
async fn write_envelope(dir: &std::path::Path, snapshot_json: Vec<u8>) -> Result<(), PeerError> {
    let envelope = dir.join(ENVELOPE);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&envelope)
            .and_then(|mut f| f.write_all(&snapshot_json))
            .map_err(|e| PeerError::Local(format!("write {}: {e}", envelope.display())))
    })
    .await
    .map_err(|e| PeerError::Local(e.to_string()))?
}

fn check_plan(plan: &Plan, expected_id: &str) -> Result<(), PeerError> {
    if plan.snapshot_id != expected_id {
        return Err(PeerError::IdMismatch {
            expected: expected_id.to_string(),
            offered: plan.snapshot_id.clone(),
        });
    }
    let mut names = std::collections::BTreeSet::new();
    for f in &plan.files {
        if !plain_name(&f.name) {
            return Err(PeerError::Protocol(format!(
                "plan names file {:?}, not a plain name",
                f.name
            )));
        }
        if !names.insert(f.name.as_str()) {
            return Err(PeerError::Protocol(format!(
                "plan names file {:?} twice",
                f.name
            )));
        }
        for s in &f.slices {
            let inside = s.offset.checked_add(s.length).is_some_and(|e| e <= f.size);
            if s.length == 0 || !inside {
                return Err(PeerError::Protocol(format!(
                    "plan slice {}@{}+{} is outside the file's {} bytes",
                    f.name, s.offset, s.length, f.size
                )));
            }
        }
    }
    if names.is_empty() {
        return Err(PeerError::Protocol("plan lists no files".into()));
    }
    Ok(())
}

async fn fetch_plan(peer: &Peer, name: &str) -> Result<Plan, PeerError> {
    let query = {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("name", name);
        peer.pod.append_to(&mut q);
        q.finish()
    };
    let what = format!("plan of {name}");
    let mut ex = peer.get(&format!("{PLAN_PATH}?{query}"), &what).await?;
    let mut json = Vec::new();
    while let Some(frame) = ex.frame(peer.timeouts.stall, &what).await? {
        if let Ok(data) = frame.into_data() {
            json.extend_from_slice(&data);
            if json.len() > MAX_PLAN_BYTES {
                return Err(PeerError::Protocol(format!(
                    "{what} is over {MAX_PLAN_BYTES} bytes"
                )));
            }
        }
    }
    serde_json::from_slice(&json)
        .map_err(|e| PeerError::Protocol(format!("{what} does not parse: {e}")))
}

/// Fetching one slice into its place in one file.
struct SliceJob {
    peer: Arc<Peer>,
    id: String,
    name: String,
    file: Arc<File>,
    slice: Slice,
}

impl SliceJob {
    async fn run(self) -> Result<(), PeerError> {
        let Slice { offset, length } = self.slice;
        let what = format!("slice {}@{offset}+{length}", self.name);
        let query = {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("id", &self.id)
                .append_pair("file", &self.name)
                .append_pair("offset", &offset.to_string())
                .append_pair("length", &length.to_string());
            self.peer.pod.append_to(&mut q);
            q.finish()
        };
        let mut ex = self
            .peer
            .get(&format!("{SLICE_PATH}?{query}"), &what)
            .await?;
        let mut out = SparseWriter::new(self.file, offset);
        let whole = length + CRC_LEN as u64;
        let (mut received, mut crc, mut sent_crc) = (0u64, 0u32, Vec::with_capacity(CRC_LEN));
        while let Some(frame) = ex.frame(self.peer.timeouts.stall, &what).await? {
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            if received + data.len() as u64 > whole {
                return Err(PeerError::Protocol(format!(
                    "{what}: the peer sent more than {length} bytes and their checksum"
                )));
            }
            // The range's bytes first, then the checksum's.
            let in_range = (length.saturating_sub(received) as usize).min(data.len());
            let tail = data.split_off(in_range);
            received += (data.len() + tail.len()) as u64;
            sent_crc.extend_from_slice(&tail);
            crc = crc32c::crc32c_append(crc, &data);
            out.push(&data).await?;
        }
        if received < length {
            return Err(PeerError::Truncated(format!(
                "{what}: {received} of {length} bytes"
            )));
        }
        out.finish().await?;
        let sent_crc = <[u8; CRC_LEN]>::try_from(sent_crc.as_slice())
            .map(u32::from_be_bytes)
            .map_err(|_| {
                PeerError::Checksum(format!(
                    "{what}: {} of the checksum's {CRC_LEN} bytes after the data",
                    sent_crc.len()
                ))
            })?;
        if sent_crc != crc {
            return Err(PeerError::Checksum(format!(
                "{what}: the peer says {sent_crc:x}, the bytes received give {crc:x}"
            )));
        }
        Ok(())
    }
}

/// Positional writes of one slice in `ZERO_RUN` pieces; an all-zero piece is not written, so
/// it stays a hole of the freshly truncated file.
struct SparseWriter {
    file: Arc<File>,
    at: u64,
    buf: Vec<u8>,
}

impl SparseWriter {
    fn new(file: Arc<File>, at: u64) -> SparseWriter {
        SparseWriter {
            file,
            at,
            buf: Vec::with_capacity(ZERO_RUN),
        }
    }

    async fn push(&mut self, mut data: &[u8]) -> Result<(), PeerError> {
        while !data.is_empty() {
            let n = (ZERO_RUN - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == ZERO_RUN {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn finish(mut self) -> Result<(), PeerError> {
        self.flush().await
    }

    async fn flush(&mut self) -> Result<(), PeerError> {
        let len = self.buf.len() as u64;
        if self.buf.iter().any(|&b| b != 0) {
            let buf = std::mem::take(&mut self.buf);
            let (file, at) = (self.file.clone(), self.at);
            let written =
                tokio::task::spawn_blocking(move || file.write_all_at(&buf, at).map(|()| buf))
                    .await
                    .map_err(|e| PeerError::Local(e.to_string()))?;
            self.buf = written.map_err(|e| PeerError::Local(format!("write at {at}: {e}")))?;
        }
        self.buf.clear();
        self.at += len;
        Ok(())
    }
}

/// A peer's address, the deadlines that apply to it, and the pod every request is for.
struct Peer {
    host: String,
    port: u16,
    authority: String,
    transport: Transport,
    timeouts: Timeouts,
    pod: WakingPod,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// HTTP/1 over `io`, its connection driven by a task that ends with the exchange.
async fn http1<IO>(io: IO) -> hyper::Result<(Sender, AbortOnDrop)>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let driver = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    Ok((sender, driver))
}

impl Peer {
    fn parse(
        base: &str,
        transport: Transport,
        timeouts: Timeouts,
        pod: WakingPod,
    ) -> Result<Peer, PeerError> {
        let invalid = |why: &str| PeerError::Invalid(format!("peer URL {base:?}: {why}"));
        let uri: Uri = base.parse().map_err(|_| invalid("does not parse"))?;
        let scheme = match &transport {
            Transport::Tls(_) => "https",
            #[cfg(test)]
            Transport::Plain => "http",
        };
        if uri.scheme_str() != Some(scheme) {
            return Err(invalid(&format!("the peer protocol here is {scheme}")));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid("want <scheme>://<ip>:<port> without a path"));
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        let port = authority.port_u16().ok_or_else(|| invalid("no port"))?;
        let host = authority.host();
        Ok(Peer {
            // `[::1]` in a URL, `::1` for the resolver.
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
            authority: authority.as_str().to_string(),
            transport,
            timeouts,
            pod,
        })
    }

    /// GET on a fresh connection: 200 or an error. The connection lives as long as the
    /// returned exchange.
    async fn get(&self, path_and_query: &str, what: &str) -> Result<Exchange, PeerError> {
        let t = self.timeouts;
        let unreachable = |e: &dyn fmt::Display| {
            PeerError::Unreachable(format!("{what} from {}: {e}", self.authority))
        };
        let stream =
            tokio::time::timeout(t.dial, TcpStream::connect((self.host.as_str(), self.port)))
                .await
                .map_err(|_| unreachable(&format!("no connection within {:?}", t.dial)))?
                .map_err(|e| unreachable(&e))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, driver) = match &self.transport {
            Transport::Tls(config) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())
                    .map_err(|e| PeerError::Invalid(format!("{what}: peer host: {e}")))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls = tokio::time::timeout(t.dial, connector.connect(name, stream))
                    .await
                    .map_err(|_| unreachable(&format!("no TLS handshake within {:?}", t.dial)))?
                    .map_err(|e| unreachable(&format!("TLS: {e}")))?;
                http1(tls).await
            }
            #[cfg(test)]
            Transport::Plain => http1(stream).await,
        }
        .map_err(|e| unreachable(&e))?;
        let req = Request::get(path_and_query)
            .header(HOST, &self.authority)
            .body(Empty::<Bytes>::new())
            .map_err(|e| PeerError::Invalid(format!("{what}: {e}")))?;
        let res = tokio::time::timeout(t.response_header, sender.send_request(req))
            .await
            .map_err(|_| unreachable(&format!("no response within {:?}", t.response_header)))?
            .map_err(|e| match e.is_incomplete_message() {
                // It took the request and hung up: a peer that failed while answering
                // (hyper drops a response whose body fails before anything was flushed).
                true => PeerError::Truncated(format!("{what}: {e}")),
                false => unreachable(&e),
            })?;
        let mut ex = Exchange {
            res,
            _driver: driver,
        };
        let status = ex.res.status();
        if status == StatusCode::OK {
            return Ok(ex);
        }
        let mut body = Vec::new();
        while body.len() < MAX_ERROR_BODY {
            match ex.frame(t.response_header, what).await {
                Ok(Some(f)) => {
                    if let Ok(d) = f.into_data() {
                        body.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        body.truncate(MAX_ERROR_BODY);
        Err(PeerError::Status {
            what: what.to_string(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

struct Exchange {
    res: Response<Incoming>,
    _driver: AbortOnDrop,
}

impl Exchange {
    /// The next body frame; `None` at a clean end of the body.
    async fn frame(
        &mut self,
        stall: Duration,
        what: &str,
    ) -> Result<Option<Frame<Bytes>>, PeerError> {
        match tokio::time::timeout(stall, self.res.body_mut().frame()).await {
            Err(_) => Err(PeerError::Stalled(format!("{what}: nothing for {stall:?}"))),
            Ok(None) => Ok(None),
            Ok(Some(Ok(f))) => Ok(Some(f)),
            Ok(Some(Err(e))) => Err(PeerError::Truncated(format!("{what}: {e}"))),
        }
    }
}

/// The connection task, stopped when the exchange is dropped (failure, cancellation).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> WakingPod {
        WakingPod {
            namespace: "team-a".into(),
            name: "victim".into(),
            uid: "u-1".into(),
        }
    }

    fn plan(files: Vec<PlanFile>) -> Plan {
        Plan {
            snapshot_id: "ID".into(),
            files,
        }
    }

    fn file(name: &str, size: u64, slices: &[(u64, u64)]) -> PlanFile {
        PlanFile {
            name: name.into(),
            size,
            slices: slices
                .iter()
                .map(|&(offset, length)| Slice { offset, length })
                .collect(),
        }
    }

    #[test]
    fn a_plan_must_name_the_expected_snapshot() {
        let p = plan(vec![file("m", 10, &[(0, 10)])]);
        assert!(check_plan(&p, "ID").is_ok());
        assert_eq!(
            check_plan(&p, "OTHER").unwrap_err(),
            PeerError::IdMismatch {
                expected: "OTHER".into(),
                offered: "ID".into()
            }
        );
    }

    #[test]
    fn a_plan_with_unsafe_names_or_ranges_is_refused() {
        let bad = [
            vec![file("../etc/passwd", 1, &[])],
            vec![file("a/b", 1, &[])],
            vec![file("..", 1, &[])],
            vec![file("", 1, &[])],
            vec![file("m", 1, &[]), file("m", 1, &[])],
            vec![file("m", 10, &[(5, 6)])],
            vec![file("m", 10, &[(3, 0)])],
            vec![file("m", u64::MAX, &[(u64::MAX, 2)])],
            vec![],
        ];
        for files in bad {
            let err = check_plan(&plan(files.clone()), "ID").unwrap_err();
            assert_eq!(err.kind(), "protocol", "{files:?}: {err}");
        }
    }

    fn drain(s: &mut Schedule) -> Vec<(usize, Slice)> {
        std::iter::from_fn(|| s.next()).collect()
    }

    fn count(started: &[(usize, Slice)], file: usize) -> usize {
        started.iter().filter(|(f, _)| *f == file).count()
    }

    fn slices(n: u64) -> Vec<Slice> {
        (0..n)
            .map(|i| Slice {
                offset: i,
                length: 1,
            })
            .collect()
    }

    #[test]
    fn the_schedule_caps_streams_per_file() {
        let mut s = Schedule::new(vec![slices(100), slices(100), slices(3)]);
        let started = drain(&mut s);
        assert_eq!(
            [count(&started, 0), count(&started, 1), count(&started, 2)],
            [STREAMS_PER_FILE, STREAMS_PER_FILE, 3]
        );
        // Each file's slices start in file order.
        let first: Vec<u64> = started
            .iter()
            .filter(|(f, _)| *f == 0)
            .map(|(_, s)| s.offset)
            .collect();
        assert_eq!(first, (0..8).collect::<Vec<_>>());
        // A finished stream frees a slot for its own file only.
        s.done(0);
        assert_eq!(
            s.next(),
            Some((
                0,
                Slice {
                    offset: 8,
                    length: 1
                }
            ))
        );
        assert_eq!(s.next(), None);
    }

    #[test]
    fn the_schedule_caps_streams_in_total() {
        let mut s = Schedule::new((0..6).map(|_| slices(100)).collect());
        let started = drain(&mut s);
        assert_eq!(started.len(), MAX_STREAMS);
        assert!((0..6).all(|i| (5..=STREAMS_PER_FILE).contains(&count(&started, i))));
        s.done(3);
        assert!(s.next().is_some());
        assert!(s.next().is_none());
    }

    #[test]
    fn the_schedule_runs_dry() {
        let mut s = Schedule::new(vec![
            vec![Slice {
                offset: 0,
                length: 1,
            }],
            vec![],
        ]);
        assert_eq!(s.next().map(|x| x.0), Some(0));
        assert!(s.next().is_none());
        s.done(0);
        assert!(s.next().is_none());
    }

    #[test]
    fn peer_urls_have_the_transport_s_scheme_and_a_port() {
        let p = Peer::parse(
            "http://10.0.0.7:12501",
            Transport::Plain,
            Timeouts::default(),
            pod(),
        )
        .unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.authority.as_str()),
            ("10.0.0.7", 12501, "10.0.0.7:12501")
        );
        let p = Peer::parse(
            "http://[fd00::7]:12501/",
            Transport::Plain,
            Timeouts::default(),
            pod(),
        )
        .unwrap();
        assert_eq!(p.host, "fd00::7");
        for bad in [
            "https://10.0.0.7:12501",
            "http://10.0.0.7",
            "http://10.0.0.7:1/x",
            "10.0.0.7:1",
            "",
        ] {
            assert!(
                Peer::parse(bad, Transport::Plain, Timeouts::default(), pod()).is_err(),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn the_limiter_admits_n_at_a_time() {
        let l = Limiter::per_node();
        let a = l.try_acquire().unwrap();
        let _b = l.try_acquire().unwrap();
        assert!(l.try_acquire().is_none());
        drop(a);
        assert!(l.try_acquire().is_some());
    }

    #[tokio::test]
    async fn zero_runs_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::create(&path).unwrap();
        f.set_len(8 * ZERO_RUN as u64).unwrap();
        let mut w = SparseWriter::new(Arc::new(f), ZERO_RUN as u64);
        // Zeros, then one byte set in the third piece, fed in odd-sized frames.
        let mut data = vec![0u8; 3 * ZERO_RUN + 10];
        data[2 * ZERO_RUN + 5] = 1;
        for part in data.chunks(300_007) {
            w.push(part).await.unwrap();
        }
        w.finish().await.unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back[ZERO_RUN..ZERO_RUN + data.len()], data[..]);
        let (_, extents) = super::super::plan::data_extents(&File::open(&path).unwrap()).unwrap();
        assert_eq!(
            extents,
            vec![Slice {
                offset: 3 * ZERO_RUN as u64,
                length: ZERO_RUN as u64
            }]
        );
    }
}
