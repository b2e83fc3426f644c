//! The real server and client on 127.0.0.1, a temporary snapshot store, and a proxy between
//! them that damages slice responses the ways a network or a dying peer can. Every caller is
//! taken for node `node-b`, which wakes `team-a/victim` (K7.4 itself is `tls_tests.rs`'s).

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::cocoon::CocoonCli;

const ID: &str = "M4XW2HQ7K3ZT5N6R7P8S9JV2UA";
const MIB: u64 = 1 << 20;
const MEMORY_SIZE: u64 = 200 * MIB;
const UID: &str = "0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";
const CLAIM: &str = "namespace=team-a&pod=victim&uid=0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";
const PLAN: &str =
    "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=victim&uid=0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";

struct Ids(HashMap<String, String>);

impl LocalSnapshots for Ids {
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LocalSnapshot>, String>> {
        Box::pin(async move {
            Ok(self.0.get(name).map(|id| LocalSnapshot {
                id: id.clone(),
                description: "vk-cocoon owner=team-a/victim".into(),
            }))
        })
    }
}

struct BrokenIds;

impl LocalSnapshots for BrokenIds {
    fn inspect<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<LocalSnapshot>, String>> {
        Box::pin(async { Err("cocoon is not answering".to_string()) })
    }
}

fn ids() -> Arc<dyn LocalSnapshots> {
    Arc::new(Ids(HashMap::from([("vm-a".to_string(), ID.to_string())])))
}

/// The apiserver of these tests: `team-a/victim` is bound to node-b's virtual node.
struct VictimOnNodeB;

impl PodLookup for VictimOnNodeB {
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BoundPod>, String>> {
        Box::pin(async move {
            Ok(
                ((namespace, name) == ("team-a", "victim")).then(|| BoundPod {
                    uid: UID.into(),
                    node: Some("node-b-cocoon".into()),
                }),
            )
        })
    }
}

fn waking_pod() -> WakingPod {
    WakingPod {
        namespace: "team-a".into(),
        name: "victim".into(),
        uid: UID.into(),
    }
}

/// Deterministic noise: data that no hole, zero run or merge can fake.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A snapshot directory as cocoon's localfile store holds one: a sparse memory file with
/// several data extents far apart (one containing explicitly written zeros), small files,
/// an empty one.
fn write_snapshot(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let m = std::fs::File::create(dir.join("memory-ranges")).unwrap();
    m.set_len(MEMORY_SIZE).unwrap();
    m.write_all_at(&noise(1, 64 << 10), 0).unwrap();
    m.write_all_at(&noise(2, (MIB + 4096) as usize), 20 * MIB)
        .unwrap();
    m.write_all_at(&noise(3, MIB as usize), 60 * MIB).unwrap();
    m.write_all_at(&vec![0u8; 2 * MIB as usize], 61 * MIB)
        .unwrap();
    m.write_all_at(&noise(4, MIB as usize), 63 * MIB).unwrap();
    m.write_all_at(&noise(5, 8192), 100 * MIB).unwrap();
    m.write_all_at(&noise(6, MIB as usize), MEMORY_SIZE - MIB)
        .unwrap();
    std::fs::write(dir.join("overlay.qcow2"), noise(7, MIB as usize + 3)).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"cpus":2}"#).unwrap();
    std::fs::write(dir.join("vector.bin"), b"123456789").unwrap();
    std::fs::File::create(dir.join("empty")).unwrap();
}

struct Fixture {
    _tmp: tempfile::TempDir,
    store: PathBuf,
    staging: PathBuf,
    addr: SocketAddr,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("snapshots");
        write_snapshot(&store.join(ID));
        Fixture {
            staging: tmp.path().join("staging"),
            store,
            _tmp: tmp,
            addr: "127.0.0.1:0".parse().unwrap(),
        }
    }

    async fn serve(mut self, ids: Arc<dyn LocalSnapshots>, limit: Option<usize>) -> Fixture {
        let sources = Sources {
            snapshots: ids,
            pods: Arc::new(VictimOnNodeB),
        };
        let mut server =
            Server::bind_plain(self.addr, self.store.clone(), sources, "node-b").unwrap();
        if let Some(n) = limit {
            server = server.with_stream_limit(n);
        }
        self.addr = server.local_addr().unwrap();
        server.spawn().unwrap();
        self
    }

    async fn started() -> Fixture {
        Fixture::new().serve(ids(), None).await
    }

    fn request(&self, peer: SocketAddr) -> RestoreRequest {
        RestoreRequest {
            peer: format!("http://{peer}"),
            snapshot_name: "vm-a".into(),
            snapshot_id: ID.into(),
            pod: waking_pod(),
            staging_root: self.staging.clone(),
            leaf: "vm-a".into(),
            snapshot_json: b"{\"version\": 1}\n".to_vec(),
            files: expected_of(&self.store.join(ID)),
            timeouts: Timeouts::default(),
            transport: Transport::Plain,
        }
    }

    fn leaf(&self) -> PathBuf {
        self.staging.join("vm-a")
    }
}

/// What the registry records for `dir` as cocoon exports it: each file's data extents as its
/// sparse map, and the sha256 of their bytes.
fn expected_of(dir: &Path) -> Expected {
    use sha2::Digest;
    let mut out = Expected::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let f = std::fs::File::open(&path).unwrap();
        let (size, extents) = super::plan::data_extents(&f).unwrap();
        let mut h = sha2::Sha256::new();
        for x in &extents {
            let mut buf = vec![0u8; x.length as usize];
            f.read_exact_at(&mut buf, x.offset).unwrap();
            h.update(&buf);
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let digest = FileDigest {
            sha256: format!("sha256:{:x}", h.finalize()),
            size,
            segments: Some(extents),
        };
        out.insert(name, digest);
    }
    out
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[tokio::test]
async fn a_sparse_snapshot_round_trips_byte_identical_and_stays_sparse() {
    let fx = Fixture::started().await;
    let dir = restore(fx.request(fx.addr)).await.unwrap();
    assert_eq!(dir, fx.leaf());

    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "empty",
            "memory-ranges",
            "overlay.qcow2",
            "snapshot.json",
            "vector.bin"
        ]
    );
    let src = fx.store.join(ID);
    for n in names.iter().filter(|n| *n != "snapshot.json") {
        assert!(same_bytes(&src.join(n), &dir.join(n)), "{n} differs");
        let mode = std::fs::metadata(dir.join(n)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640, "{n}");
    }
    assert_eq!(
        std::fs::read(dir.join("snapshot.json")).unwrap(),
        b"{\"version\": 1}\n"
    );

    let staged = allocated(&dir.join("memory-ranges"));
    let source = allocated(&src.join("memory-ranges"));
    assert_eq!(
        std::fs::metadata(dir.join("memory-ranges")).unwrap().len(),
        MEMORY_SIZE
    );
    assert!(
        staged < MEMORY_SIZE / 16,
        "staged copy allocates {staged} bytes"
    );
    // The explicitly written 2 MiB of zeros in the source were not written again.
    assert!(staged + MIB < source, "staged {staged}, source {source}");
}

#[tokio::test]
async fn an_existing_staging_leaf_is_replaced() {
    let fx = Fixture::started().await;
    std::fs::create_dir_all(fx.leaf()).unwrap();
    std::fs::write(fx.leaf().join("memory-ranges"), b"stale").unwrap();
    std::fs::write(fx.leaf().join("leftover"), b"stale").unwrap();
    let dir = restore(fx.request(fx.addr)).await.unwrap();
    assert!(!dir.join("leftover").exists());
    assert!(same_bytes(
        &fx.store.join(ID).join("memory-ranges"),
        &dir.join("memory-ranges")
    ));
}

#[tokio::test]
async fn a_different_snapshot_id_fails_and_leaves_no_staging_dir() {
    let fx = Fixture::started().await;
    let mut req = fx.request(fx.addr);
    req.snapshot_id = "AAAAAAAAAAAAAAAAAAAAAAAAAA".into();
    let err = restore(req).await.unwrap_err();
    assert_eq!(
        err,
        PeerError::IdMismatch {
            expected: "AAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            offered: ID.into()
        }
    );
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn an_unknown_snapshot_fails_with_404() {
    let fx = Fixture::started().await;
    let mut req = fx.request(fx.addr);
    req.snapshot_name = "vm-b".into();
    match restore(req).await.unwrap_err() {
        PeerError::Status { status: 404, .. } => {}
        other => panic!("{other}"),
    }
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_flipped_byte_fails_the_checksum() {
    let fx = Fixture::started().await;
    let proxy = tamper_proxy(fx.addr, Tamper::FlipByte).await;
    let err = restore(fx.request(proxy)).await.unwrap_err();
    assert_eq!(err.kind(), "checksum", "{err}");
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_missing_checksum_fails() {
    let fx = Fixture::started().await;
    let proxy = tamper_proxy(fx.addr, Tamper::DropChecksum).await;
    let err = restore(fx.request(proxy)).await.unwrap_err();
    assert_eq!(err.kind(), "checksum", "{err}");
    assert!(
        err.to_string().contains("0 of the checksum's 4 bytes"),
        "{err}"
    );
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_body_shorter_than_its_slice_is_detected() {
    let fx = Fixture::started().await;
    let proxy = tamper_proxy(fx.addr, Tamper::EndEarly).await;
    let err = restore(fx.request(proxy)).await.unwrap_err();
    assert_eq!(err.kind(), "truncated", "{err}");
    assert!(err.to_string().contains(" of "), "a byte count: {err}");
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_broken_connection_mid_slice_is_detected() {
    let fx = Fixture::started().await;
    let proxy = tamper_proxy(fx.addr, Tamper::Break).await;
    let err = restore(fx.request(proxy)).await.unwrap_err();
    assert_eq!(err.kind(), "truncated", "{err}");
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_silent_peer_fails_on_the_stall_timeout() {
    let fx = Fixture::started().await;
    let proxy = tamper_proxy(fx.addr, Tamper::Stall).await;
    let mut req = fx.request(proxy);
    req.timeouts.stall = Duration::from_millis(200);
    let err = restore(req).await.unwrap_err();
    assert_eq!(err.kind(), "stalled", "{err}");
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_peer_without_an_answer_fails_on_the_header_timeout() {
    let fx = Fixture::new();
    // Connections complete in the backlog; nobody ever reads the request.
    let mute = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut req = fx.request(mute.local_addr().unwrap());
    req.timeouts.response_header = Duration::from_millis(200);
    let err = restore(req).await.unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(err.to_string().contains("no response within"), "{err}");
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let fx = Fixture::new();
    let gone = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let err = restore(fx.request(gone)).await.unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_peer_serving_other_bytes_than_the_registry_records_fails_closed() {
    let fx = Fixture::started().await;
    let req = fx.request(fx.addr);
    // The peer's own store changes after the push: its slices and checksums agree with each
    // other, but not with the registry.
    let m = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.store.join(ID).join("memory-ranges"))
        .unwrap();
    m.write_all_at(&[0xA5], 20 * MIB + 7).unwrap();
    match restore(req).await.unwrap_err() {
        PeerError::Altered(m) => assert!(m.contains("memory-ranges"), "{m}"),
        other => panic!("{other}"),
    }
    assert!(!fx.leaf().exists(), "the altered copy was left staged");

    // Bytes written into what the registry records as a hole are refused the same way.
    let fx = Fixture::started().await;
    let req = fx.request(fx.addr);
    let m = std::fs::OpenOptions::new()
        .write(true)
        .open(fx.store.join(ID).join("memory-ranges"))
        .unwrap();
    m.write_all_at(&[1], 150 * MIB).unwrap();
    match restore(req).await.unwrap_err() {
        PeerError::Altered(m) => assert!(m.contains("hole"), "{m}"),
        other => panic!("{other}"),
    }
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_plan_without_a_file_the_registry_lists_fails() {
    let fx = Fixture::started().await;
    let mut req = fx.request(fx.addr);
    req.files.insert(
        "state.json".into(),
        FileDigest {
            sha256: "sha256:00".into(),
            size: 2,
            segments: None,
        },
    );
    match restore(req).await.unwrap_err() {
        PeerError::Altered(m) => assert!(m.contains("state.json"), "{m}"),
        other => panic!("{other}"),
    }
    assert!(!fx.leaf().exists());
}

#[tokio::test]
async fn a_saturated_peer_fails_the_restore_with_503() {
    let fx = Fixture::new().serve(ids(), Some(0)).await;
    match restore(fx.request(fx.addr)).await.unwrap_err() {
        PeerError::Status { status: 503, .. } => {}
        other => panic!("{other}"),
    }
    assert!(!fx.leaf().exists());
}

// ---- the wire, request by request ----

/// One request on its own connection; the whole response as the server sent it.
async fn raw_bytes(addr: SocketAddr, method: &str, target: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {target} HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .unwrap();
    let status = String::from_utf8_lossy(&out)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, out)
}

/// [`raw_bytes`] as text (bodies here are ASCII or short).
async fn raw(addr: SocketAddr, method: &str, target: &str) -> (u16, String) {
    let (status, out) = raw_bytes(addr, method, target).await;
    (status, String::from_utf8_lossy(&out).into_owned())
}

/// The head (lowercased) and the body of a whole response.
fn split_response(out: &[u8]) -> (String, &[u8]) {
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    (head, &out[end + 4..])
}

fn slice_target(id: &str, file: &str, offset: &str, length: &str) -> String {
    let q = form_urlencoded::Serializer::new(String::new())
        .append_pair("id", id)
        .append_pair("file", file)
        .append_pair("offset", offset)
        .append_pair("length", length)
        .finish();
    format!("/v1/snapshot-slice?{q}&{CLAIM}")
}

/// The plan, for the grant its slices are served under.
async fn granted(fx: &Fixture) {
    let (status, text) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn a_slice_ends_in_its_crc32c() {
    let fx = Fixture::started().await;
    granted(&fx).await;
    let (status, out) = raw_bytes(fx.addr, "GET", &slice_target(ID, "vector.bin", "0", "9")).await;
    assert_eq!(status, 200);
    let (head, body) = split_response(&out);
    assert!(
        head.contains("content-type: application/octet-stream"),
        "{head}"
    );
    assert!(head.contains("content-length: 13"), "{head}");
    // CRC-32C("123456789") is the Castagnoli check value.
    assert_eq!(body, b"123456789\xe3\x06\x92\x83");
    let (status, out) = raw_bytes(fx.addr, "GET", &slice_target(ID, "vector.bin", "3", "2")).await;
    assert_eq!(status, 200);
    let (head, body) = split_response(&out);
    assert!(head.contains("content-length: 6"), "{head}");
    let mut want = b"45".to_vec();
    want.extend_from_slice(&crc32c::crc32c(b"45").to_be_bytes());
    assert_eq!(body, want);
}

#[tokio::test]
async fn a_short_read_cuts_the_body_short_of_its_length() {
    let fx = Fixture::started().await;
    granted(&fx).await;
    // overlay.qcow2 has 1 MiB + 3 bytes: the stream starts, then runs out.
    let t = slice_target(ID, "overlay.qcow2", "0", &(2 * MIB).to_string());
    let (status, out) = raw_bytes(fx.addr, "GET", &t).await;
    assert_eq!(status, 200);
    let (head, body) = split_response(&out);
    let want = format!("content-length: {}", 2 * MIB + 4);
    assert!(head.contains(&want), "{head}");
    assert!(body.len() as u64 <= MIB + 3, "{} body bytes", body.len());
}

#[tokio::test]
async fn bad_slice_parameters_are_400() {
    let fx = Fixture::started().await;
    granted(&fx).await;
    let targets = [
        slice_target(ID, "..", "0", "1"),
        slice_target(ID, ".", "0", "1"),
        slice_target(ID, "a/b", "0", "1"),
        slice_target(ID, "", "0", "1"),
        slice_target(ID, "vector.bin\0", "0", "1"),
        slice_target("..", "vector.bin", "0", "1"),
        slice_target("x/..", "vector.bin", "0", "1"),
        slice_target(ID, "vector.bin", "-1", "1"),
        slice_target(ID, "vector.bin", "0", "0"),
        slice_target(ID, "vector.bin", "zero", "1"),
        slice_target(ID, "vector.bin", "0", &(257 * MIB).to_string()),
        slice_target(ID, "vector.bin", &u64::MAX.to_string(), "1"),
        format!("/v1/snapshot-slice?id={ID}&file=vector.bin&offset=0"),
        "/v1/snapshot-slice?file=vector.bin&offset=0&length=1".to_string(),
        "/v1/snapshot-slice".to_string(),
    ];
    for t in targets {
        let (status, text) = raw(fx.addr, "GET", &t).await;
        assert_eq!(status, 400, "{t}: {text}");
    }
}

#[tokio::test]
async fn a_missing_file_is_404_and_a_snapshot_no_plan_granted_403() {
    let fx = Fixture::started().await;
    granted(&fx).await;
    let t = slice_target(ID, "nope", "0", "1");
    let (status, text) = raw(fx.addr, "GET", &t).await;
    assert_eq!(status, 404, "{t}: {text}");
    let t = slice_target("AAAAAAAAAAAAAAAAAAAAAAAAAA", "vector.bin", "0", "1");
    let (status, text) = raw(fx.addr, "GET", &t).await;
    assert_eq!(status, 403, "{t}: {text}");
}

#[tokio::test]
async fn plan_answers() {
    let fx = Fixture::started().await;
    let (status, text) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 200, "{text}");
    assert!(text
        .to_ascii_lowercase()
        .contains("content-type: application/json"));
    let plan: Plan = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(plan.snapshot_id, ID);
    let memory = plan
        .files
        .iter()
        .find(|f| f.name == "memory-ranges")
        .unwrap();
    assert_eq!(memory.size, MEMORY_SIZE);
    let offsets: Vec<u64> = memory.slices.iter().map(|s| s.offset).collect();
    assert_eq!(
        offsets,
        [0, 20 * MIB, 60 * MIB, 100 * MIB, MEMORY_SIZE - MIB]
    );

    for (target, want) in [
        ("/v1/snapshot-plan".to_string(), 400),
        (format!("/v1/snapshot-plan?name=&{CLAIM}"), 400),
        (format!("/v1/snapshot-plan?name=-rf&{CLAIM}"), 400),
        (format!("/v1/snapshot-plan?name=vm-b&{CLAIM}"), 404),
        ("/v1/snapshot-plan?name=vm-a".to_string(), 403),
        ("/v1/other".to_string(), 404),
        ("/".to_string(), 404),
    ] {
        let (status, text) = raw(fx.addr, "GET", &target).await;
        assert_eq!(status, want, "{target}: {text}");
    }
    let (status, text) = raw(fx.addr, "POST", PLAN).await;
    assert_eq!(status, 405, "{text}");
    assert!(text.to_ascii_lowercase().contains("allow: get"), "{text}");
}

#[tokio::test]
async fn a_known_snapshot_without_a_store_dir_is_404_and_a_failing_lookup_500() {
    let fx = Fixture::new();
    std::fs::remove_dir_all(fx.store.join(ID)).unwrap();
    let fx = fx.serve(ids(), None).await;
    let (status, text) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 404, "{text}");

    let fx = Fixture::new().serve(Arc::new(BrokenIds), None).await;
    let (status, text) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("cocoon is not answering"), "{text}");
}

#[tokio::test]
async fn streams_over_the_limit_are_503() {
    let fx = Fixture::new().serve(ids(), Some(1)).await;
    granted(&fx).await;
    // 64 MiB cannot sit in socket buffers: unread, this stream keeps its slot.
    let mut held = TcpStream::connect(fx.addr).await.unwrap();
    let target = slice_target(ID, "memory-ranges", "0", &(64 * MIB).to_string());
    held.write_all(format!("GET {target} HTTP/1.1\r\nHost: peer\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    held.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    let (status, text) = raw(fx.addr, "GET", &slice_target(ID, "vector.bin", "0", "9")).await;
    assert_eq!(status, 503, "{text}");
    // Plans are not streams.
    let (status, _) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 200);
    drop(held);
}

#[tokio::test]
async fn names_resolve_through_cocoon_snapshot_inspect() {
    let fx = Fixture::new();
    let script = fx.staging.with_file_name("cocoon");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             [ \"$1 $2 $3 $4\" = \"snapshot inspect -- vm-a\" ] && {{ printf '{{\"id\":\"{ID}\",\"name\":\"vm-a\",\"description\":\"vk-cocoon owner=team-a/victim\"}}\\n'; exit 0; }}\n\
             echo 'Error: inspect: snapshot not found' >&2\nexit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cocoon = CocoonCli::new(script.to_str().unwrap());
    let fx = fx.serve(Arc::new(cocoon), None).await;
    let (status, text) = raw(fx.addr, "GET", PLAN).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(ID));
    let (status, text) = raw(
        fx.addr,
        "GET",
        &format!("/v1/snapshot-plan?name=vm-b&{CLAIM}"),
    )
    .await;
    assert_eq!(status, 404, "{text}");
}

#[tokio::test]
async fn a_taken_address_is_an_error_naming_vk_peer_addr() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let sources = Sources {
        snapshots: Arc::new(CocoonCli::new("cocoon")),
        pods: Arc::new(VictimOnNodeB),
    };
    let err = Server::bind_plain(addr, PathBuf::from("/nonexistent"), sources, "node-b")
        .err()
        .expect("the address is taken");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("VK_PEER_ADDR") && msg.contains(&addr.to_string()),
        "{msg}"
    );
}

// ---- the tampering proxy ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tamper {
    /// Invert the first byte of every slice body.
    FlipByte,
    /// Forward the data, drop the checksum after it.
    DropChecksum,
    /// Forward at most 64 KiB of the body, short of the range's end, then end the body
    /// as if complete.
    EndEarly,
    /// Forward at most 64 KiB of the body, then break the connection.
    Break,
    /// Forward the head, then send nothing.
    Stall,
}

/// A request head from `from`, as sent.
async fn read_head(from: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end + 4);
        }
        let mut chunk = [0u8; 4096];
        match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Forwards every request to `upstream` and its answer back, byte for byte, damaging 200
/// slice answers as `tamper` says. The server's answers are sized, which is what lets a
/// body be cut or shortened here.
async fn tamper_proxy(upstream: SocketAddr, tamper: Tamper) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            tokio::spawn(relay(client, upstream, tamper));
        }
    });
    addr
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, tamper: Tamper) {
    let mut request = Vec::new();
    let Some(end) = read_head(&mut client, &mut request).await else {
        return;
    };
    let slice = request.starts_with(b"GET /v1/snapshot-slice?");
    let mut up = TcpStream::connect(upstream).await.unwrap();
    up.write_all(&request[..end]).await.unwrap();
    let mut answer = Vec::new();
    let Some(head_end) = read_head(&mut up, &mut answer).await else {
        return;
    };
    let head = String::from_utf8_lossy(&answer[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("sized answers");
    let mut body = answer.split_off(head_end);
    while body.len() < length {
        let mut chunk = vec![0u8; 64 << 10];
        match up.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let damage = slice && head.starts_with("HTTP/1.1 200");
    let resized = |head: &str, n: usize| {
        head.replacen(
            &format!("content-length: {length}"),
            &format!("content-length: {n}"),
            1,
        )
    };
    let (head, body, then_close) = match (damage, tamper) {
        (false, _) => (head, body, true),
        (true, Tamper::FlipByte) => {
            body[0] ^= 0xff;
            (head, body, true)
        }
        (true, Tamper::DropChecksum) => {
            body.truncate(length - 4);
            (resized(&head, length - 4), body, true)
        }
        (true, Tamper::EndEarly) => {
            // One byte short of the range, whatever the checksum.
            body.truncate(body.len().min(64 << 10) - 5);
            (resized(&head, body.len()), body, true)
        }
        (true, Tamper::Break) => {
            body.truncate(body.len().min(64 << 10));
            (head, body, true)
        }
        (true, Tamper::Stall) => (head, Vec::new(), false),
    };
    let _ = client.write_all(head.as_bytes()).await;
    let _ = client.write_all(&body).await;
    if !then_close {
        let _ = client.read(&mut [0u8; 1]).await;
    }
}
