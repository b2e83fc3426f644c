//! K7.1, K7.2 and K7.4 end to end on 127.0.0.1: the TLS server and client with certificates from a
//! CA made here, callers that are not nodes, a peer that is not the node asked for, the caps,
//! and the grant: only the node waking a pod of the snapshot's namespace is served.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tls::client_config_as;
use super::*;
use crate::config::PeerTls;
use crate::metrics::{Cap, Metrics};

const ID: &str = "M4XW2HQ7K3ZT5N6R7P8S9JV2UA";
const UID: &str = "0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";
/// node-b wakes `team-a/victim`, whose snapshot is `vm-a`.
const CLAIM: &str = "namespace=team-a&pod=victim&uid=0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";

/// Counts lookups: each stands for a `cocoon` process the server would start. `vm-a` is
/// team-a's, `vm-b` team-b's, `base` a public base without a record.
struct Lookups(AtomicUsize);

impl LocalSnapshots for Lookups {
    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LocalSnapshot>, String>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let description = match name {
            "vm-a" => "vk-cocoon owner=team-a/victim",
            "vm-b" => "vk-cocoon owner=team-b/other",
            "base" => "ubuntu 24.04",
            _ => return Box::pin(async { Ok(None) }),
        };
        Box::pin(async move {
            Ok(Some(LocalSnapshot {
                id: ID.into(),
                description: description.into(),
            }))
        })
    }
}

/// The apiserver's pods, which a test may move between nodes; counts the GETs.
#[derive(Default)]
struct Apiserver {
    pods: Mutex<HashMap<(String, String), BoundPod>>,
    gets: AtomicUsize,
}

impl Apiserver {
    fn bind(&self, namespace: &str, name: &str, uid: &str, node: &str) {
        self.pods.lock().unwrap().insert(
            (namespace.into(), name.into()),
            BoundPod {
                uid: uid.into(),
                node: Some(node.into()),
            },
        );
    }
}

impl PodLookup for Apiserver {
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BoundPod>, String>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let key = (namespace.to_string(), name.to_string());
        let found = self.pods.lock().unwrap().get(&key).cloned();
        Box::pin(async move { Ok(found) })
    }
}

struct Ca {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    cert: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = dir.join(format!("{name}.crt"));
        std::fs::write(&cert, p.self_signed(&key).unwrap().pem()).unwrap();
        Ca {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(p, key),
            cert,
        }
    }

    /// A client certificate (CN, O…) as one PEM file holding certificate and key, the way a
    /// kubelet's client credential is stored.
    fn issue(&self, file: &str, cn: &str, orgs: &[&str]) -> PathBuf {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let path = self.dir.join(format!("{file}.pem"));
        std::fs::write(&path, format!("{}{}", cert.pem(), key.serialize_pem())).unwrap();
        path
    }

    fn node(&self, node: &str) -> PathBuf {
        self.issue(node, &format!("system:node:{node}"), &["system:nodes"])
    }
}

fn identity(pem: &Path) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let chain = CertificateDer::pem_file_iter(pem)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (chain, PrivateKeyDer::from_pem_file(pem).unwrap())
}

fn node_tls(ca: &Ca, pem: &Path) -> NodeTls {
    let t = PeerTls {
        ca_file: ca.cert.clone(),
        cert: pem.to_path_buf(),
        key: pem.to_path_buf(),
    };
    NodeTls::load(&t).unwrap()
}

struct Fixture {
    _tmp: tempfile::TempDir,
    ca: Ca,
    addr: SocketAddr,
    lookups: Arc<Lookups>,
    apiserver: Arc<Apiserver>,
    counting: Counting,
    staging: PathBuf,
    store: PathBuf,
}

async fn serving(plan_limit: Option<usize>) -> Fixture {
    serving_with(plan_limit, None).await
}

/// node-a serves; `team-a/victim` is bound to node-b's virtual node, `team-a/elsewhere` to
/// node-c.
async fn serving_with(plan_limit: Option<usize>, recheck: Option<Duration>) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new(tmp.path(), "cluster-ca");
    let store = tmp.path().join("snapshots");
    std::fs::create_dir_all(store.join(ID)).unwrap();
    std::fs::write(store.join(ID).join("config.json"), b"{\"cpus\":2}").unwrap();
    let tls = node_tls(&ca, &ca.node("node-a"));
    let lookups = Arc::new(Lookups(AtomicUsize::new(0)));
    let counting = Counting {
        metrics: Metrics::new(),
        peer: PeerCounters::new(),
    };
    let apiserver = Arc::new(Apiserver::default());
    apiserver.bind("team-a", "victim", UID, "node-b-cocoon");
    apiserver.bind("team-a", "elsewhere", "u-elsewhere", "node-c");
    let sources = Sources {
        snapshots: lookups.clone(),
        pods: apiserver.clone(),
    };
    let mut server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        store.clone(),
        sources,
        &tls,
        counting.clone(),
    )
    .unwrap();
    if let Some(n) = plan_limit {
        server = server.with_plan_limit(n);
    }
    if let Some(d) = recheck {
        server = server.with_grant_recheck(d);
    }
    let addr = server.local_addr().unwrap();
    server.spawn().unwrap();
    Fixture {
        staging: tmp.path().join("staging"),
        store,
        _tmp: tmp,
        ca,
        addr,
        lookups,
        apiserver,
        counting,
    }
}

/// One GET over TLS as `config` presents itself; the status, or the error that ended it.
async fn get(addr: SocketAddr, config: rustls::ClientConfig, target: &str) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!("GET {target} HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    let head = String::from_utf8_lossy(&out);
    head.get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))
}

const PLAN: &str =
    "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=victim&uid=0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";
const SLICE: &str = "/v1/snapshot-slice?id=M4XW2HQ7K3ZT5N6R7P8S9JV2UA&file=config.json&offset=0&length=10&namespace=team-a&pod=victim&uid=0b9f3c52-5d1e-4a57-9a43-5f1e2f6f7a10";

/// A node's dialing config, by the node its certificate names.
fn as_node(fx: &Fixture, node: &str) -> rustls::ClientConfig {
    client_config_as(&fx.ca.cert, Some(identity(&fx.ca.node(node))))
}

#[tokio::test]
async fn the_node_waking_the_pod_is_served() {
    let fx = serving(None).await;
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), PLAN).await, Ok(200));
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), SLICE).await, Ok(200));
    assert_eq!(fx.lookups.0.load(Ordering::SeqCst), 1);
    // The plan asked the apiserver; its slice rode on the grant.
    assert_eq!(fx.apiserver.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn another_node_s_valid_certificate_is_refused() {
    let fx = serving(None).await;
    let peer = &fx.counting.peer;
    // node-c is a node of the cluster, but the pod is bound to node-b-cocoon.
    assert_eq!(get(fx.addr, as_node(&fx, "node-c"), PLAN).await, Ok(403));
    assert_eq!(peer.count(Refusal::NotTheWakingNode), 1);
    assert_eq!(
        fx.lookups.0.load(Ordering::SeqCst),
        0,
        "a refused node made cocoon look the snapshot up"
    );
    // node-b's grant is node-b's: node-c cannot ride on it.
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), PLAN).await, Ok(200));
    assert_eq!(get(fx.addr, as_node(&fx, "node-c"), SLICE).await, Ok(403));
    assert_eq!(peer.count(Refusal::NoGrant), 1);
    // A team-a pod bound to node-c gets node-c a grant of its own (T6: a namespace's
    // snapshots serve any of its pods), which still opens nothing of node-b's wake.
    let elsewhere = "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=elsewhere&uid=u-elsewhere";
    assert_eq!(
        get(fx.addr, as_node(&fx, "node-c"), elsewhere).await,
        Ok(200)
    );
    assert_eq!(get(fx.addr, as_node(&fx, "node-c"), SLICE).await, Ok(403));
    assert_eq!(peer.count(Refusal::NoGrant), 2);
}

#[tokio::test]
async fn a_pod_uid_that_does_not_match_is_refused() {
    let fx = serving(None).await;
    // The pod of that name now is another one than the wake was for.
    let stale = "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=victim&uid=an-earlier-pod";
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), stale).await, Ok(403));
    let gone = "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=gone&uid=u";
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), gone).await, Ok(403));
    assert_eq!(fx.counting.peer.count(Refusal::NotTheWakingNode), 2);
    assert_eq!(fx.lookups.0.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_snapshot_of_another_namespace_or_without_a_record_is_refused() {
    let fx = serving(None).await;
    for name in ["vm-b", "base"] {
        let plan = format!("/v1/snapshot-plan?name={name}&{CLAIM}");
        assert_eq!(
            get(fx.addr, as_node(&fx, "node-b"), &plan).await,
            Ok(403),
            "{name}"
        );
    }
    assert_eq!(fx.counting.peer.count(Refusal::ForeignSnapshot), 2);
    // Nothing was granted: the snapshot's slices stay closed.
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), SLICE).await, Ok(403));
}

#[tokio::test]
async fn a_request_naming_no_pod_is_refused_before_any_lookup() {
    let fx = serving(None).await;
    let slice = SLICE.split("&namespace=").next().unwrap();
    for target in [
        "/v1/snapshot-plan?name=vm-a",
        "/v1/snapshot-plan?name=vm-a&namespace=team-a&pod=victim",
        slice,
    ] {
        assert_eq!(
            get(fx.addr, as_node(&fx, "node-b"), target).await,
            Ok(403),
            "{target}"
        );
    }
    assert_eq!(fx.counting.peer.count(Refusal::NoGrant), 3);
    assert_eq!(fx.lookups.0.load(Ordering::SeqCst), 0);
    assert_eq!(fx.apiserver.gets.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_grant_ends_once_the_apiserver_binds_the_pod_elsewhere() {
    let fx = serving_with(None, Some(Duration::ZERO)).await;
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), PLAN).await, Ok(200));
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), SLICE).await, Ok(200));
    fx.apiserver
        .bind("team-a", "victim", "a-new-pod", "node-c-cocoon");
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), SLICE).await, Ok(403));
    assert_eq!(fx.counting.peer.count(Refusal::NotTheWakingNode), 1);
    // Revoked, not merely refused once.
    fx.apiserver.bind("team-a", "victim", UID, "node-b-cocoon");
    assert_eq!(get(fx.addr, as_node(&fx, "node-b"), SLICE).await, Ok(403));
    assert_eq!(fx.counting.peer.count(Refusal::NoGrant), 1);
}

#[tokio::test]
async fn callers_without_the_cluster_s_node_credentials_are_refused_before_any_lookup() {
    let fx = serving(None).await;
    let peer = &fx.counting.peer;

    let none = client_config_as(&fx.ca.cert, None);
    assert_eq!(get(fx.addr, none, PLAN).await, Ok(401));
    assert_eq!(peer.count(Refusal::NoCertificate), 1);

    let other = Ca::new(fx.ca.dir.parent().unwrap_or(&fx.ca.dir), "other-ca");
    let stranger = other.node("node-b");
    let config = client_config_as(&fx.ca.cert, Some(identity(&stranger)));
    let got = get(fx.addr, config, PLAN).await;
    assert!(got.is_err(), "a certificate from another CA got {got:?}");
    assert_eq!(peer.count(Refusal::UntrustedCertificate), 1);

    for (file, cn, orgs) in [
        ("alice", "alice", &["system:authenticated"][..]),
        (
            "masters",
            "kube-apiserver-kubelet-client",
            &["system:masters"][..],
        ),
        ("no-group", "system:node:node-b", &[][..]),
    ] {
        let pem = fx.ca.issue(file, cn, orgs);
        let config = client_config_as(&fx.ca.cert, Some(identity(&pem)));
        assert_eq!(get(fx.addr, config, PLAN).await, Ok(401), "{cn}");
    }
    assert_eq!(peer.count(Refusal::NotANode), 3);
    // Unknown paths and slices are refused the same way.
    let none = client_config_as(&fx.ca.cert, None);
    assert_eq!(get(fx.addr, none, "/nope").await, Ok(401));
    assert_eq!(
        fx.lookups.0.load(Ordering::SeqCst),
        0,
        "a refused caller started a lookup"
    );
}

#[tokio::test]
async fn the_restore_dials_over_tls_and_accepts_only_a_node_of_the_cluster() {
    let fx = serving(None).await;
    let me = node_tls(&fx.ca, &fx.ca.node("node-b"));
    let expected: Expected = [(
        "config.json".to_string(),
        FileDigest {
            sha256: {
                use sha2::Digest;
                format!("sha256:{:x}", sha2::Sha256::digest(b"{\"cpus\":2}"))
            },
            size: 10,
            segments: None,
        },
    )]
    .into();
    let request = |config: rustls::ClientConfig| RestoreRequest {
        peer: format!("https://{}", fx.addr),
        transport: Transport::Tls(Arc::new(config)),
        snapshot_name: "vm-a".into(),
        snapshot_id: ID.into(),
        pod: WakingPod {
            namespace: "team-a".into(),
            name: "victim".into(),
            uid: UID.into(),
        },
        staging_root: fx.staging.clone(),
        leaf: "vm-a".into(),
        snapshot_json: b"{\"version\": 1}\n".to_vec(),
        files: expected.clone(),
        timeouts: Timeouts::default(),
    };
    // A client that trusts another CA does not take node-a for a node of its cluster.
    let other = Ca::new(fx.ca.dir.parent().unwrap_or(&fx.ca.dir), "other-ca");
    let elsewhere = node_tls(&other, &other.node("node-b"));
    let err = restore(request(elsewhere.client_config().unwrap()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(!fx.staging.join("vm-a").exists());

    let dir = restore(request(me.client_config().unwrap())).await.unwrap();
    assert_eq!(
        std::fs::read(dir.join("config.json")).unwrap(),
        std::fs::read(fx.store.join(ID).join("config.json")).unwrap()
    );
}

#[tokio::test]
async fn plans_over_the_cap_are_503_and_counted() {
    let fx = serving(Some(0)).await;
    let me = fx.ca.node("node-b");
    let config = client_config_as(&fx.ca.cert, Some(identity(&me)));
    assert_eq!(get(fx.addr, config, PLAN).await, Ok(503));
    let refused = fx
        .counting
        .metrics
        .cap_refusals
        .with_label_values(&[Cap::PeerRequests.as_str()])
        .get();
    assert_eq!(refused, 1);
    assert_eq!(fx.lookups.0.load(Ordering::SeqCst), 0);
}

/// The certificate the server presents to a node now.
async fn presented(fx: &Fixture) -> Vec<u8> {
    let me = fx.ca.node("node-b");
    let config = client_config_as(&fx.ca.cert, Some(identity(&me)));
    let tcp = TcpStream::connect(fx.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let certs = tls.get_ref().1.peer_certificates().unwrap();
    certs[0].to_vec()
}

#[tokio::test]
async fn a_rotated_certificate_is_presented_from_the_next_handshake() {
    let fx = serving(None).await;
    let first = presented(&fx).await;
    // The kubelet's rotation: a new key and certificate in place of the old.
    let pem = fx.ca.node("node-a");
    let rotated = identity(&pem).0[0].to_vec();
    assert_ne!(first, rotated);
    assert_eq!(presented(&fx).await, rotated);
    // A file that stops parsing leaves the last good certificate in use.
    std::fs::write(&pem, b"half written").unwrap();
    assert_eq!(presented(&fx).await, rotated);
}

#[test]
fn a_credential_that_names_no_node_or_another_ca_signed_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new(tmp.path(), "cluster-ca");
    let pem = ca.node("node-a");
    let t = PeerTls {
        ca_file: ca.cert.clone(),
        cert: pem.clone(),
        key: pem.clone(),
    };
    assert_eq!(NodeTls::load(&t).unwrap().node, "node-a");
    let alice = ca.issue("alice", "alice", &[]);
    let t = PeerTls {
        cert: alice.clone(),
        key: alice,
        ..t
    };
    let err = NodeTls::load(&t).unwrap_err();
    assert!(format!("{err:#}").contains("not a node"), "{err:#}");
    let other = Ca::new(tmp.path(), "other-ca");
    let t = PeerTls {
        ca_file: other.cert.clone(),
        cert: pem.clone(),
        key: pem,
    };
    let err = NodeTls::load(&t).unwrap_err();
    assert!(format!("{err:#}").contains("does not verify"), "{err:#}");
}
