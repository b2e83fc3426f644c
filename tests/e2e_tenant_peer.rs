//! The peer boundary (K7.1–K7.4) against real daemons: the peer port serves only the cluster's
//! nodes and starts no cocoon process for anyone else; of those, only the node waking the pod
//! reads a hibernated snapshot, while that wake copies it from the peer; a peer that serves
//! bytes other than the registry's is refused and the pod wakes from the registry with its
//! state intact; a flood of idle connections and plan requests leaves the daemon's memory and
//! descriptors bounded and its Ready pod Ready. A node without credentials serves nothing and
//! says which variables turn the peer API on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::certs::CertPair;
use e2e::daemon::{
    self, annotation, create_pod, metric_series, pod_manifest, until, wait_ready, DaemonOptions,
};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NS: &str = "default";
const LIMIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const PLAN: &str = "/v1/snapshot-plan?name=vk-default-victim";

/// The test's callers check nothing about the daemon: what is under test is what the daemon
/// accepts from them.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client presenting `who` (a certificate and key), or no certificate.
fn caller(who: Option<&CertPair>) -> Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    Ok(Arc::new(match who {
        Some(p) => {
            let chain = CertificateDer::pem_file_iter(&p.cert)?.collect::<Result<Vec<_>, _>>()?;
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&p.key)?)?
        }
        None => builder.with_no_client_auth(),
    }))
}

/// One GET over TLS: the status, or the error that ended the exchange (a refused handshake).
async fn get(addr: SocketAddr, config: Arc<rustls::ClientConfig>, target: &str) -> Result<u16> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(addr.ip().to_string())?;
    let mut tls = tokio::time::timeout(
        LIMIT,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await??;
    let req = format!("GET {target} HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, tls.read_to_end(&mut out)).await??;
    let head = String::from_utf8_lossy(&out);
    head.get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))
}

/// A certificate for node-b signed by a CA the cluster does not know.
fn foreign_node_cert(dir: &Path) -> Result<CertPair> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "not-the-cluster-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name
        .push(DnType::CommonName, "system:node:node-b");
    p.distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &issuer)?;
    let pair = CertPair {
        cert: dir.join("foreign.crt"),
        key: dir.join("foreign.key"),
    };
    std::fs::write(&pair.cert, cert.pem())?;
    std::fs::write(&pair.key, key.serialize_pem())?;
    Ok(pair)
}

/// A `cocoon` that logs every invocation's arguments, one line each, then runs the real one.
fn logging_cocoon(real: &Path, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let (script, log) = (dir.join("cocoon-logged"), dir.join("cocoon-calls.log"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok((script, log))
}

fn inspect_calls(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("snapshot inspect"))
        .count()
}

async fn refusals(metrics_port: u16, reason: &str) -> Result<f64> {
    let series = metric_series(metrics_port, "cocoon_vk_peer_refusals_total").await?;
    Ok(series
        .iter()
        .find(|(l, _)| l == &format!("reason=\"{reason}\""))
        .map(|(_, v)| *v)
        .unwrap_or(0.0))
}

fn managed(node: &str, name: &str, extra: serde_json::Value) -> Result<Pod> {
    let mut a = json!({
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": format!("vk-default-{name}"),
        "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": IMAGE,
    });
    a.as_object_mut()
        .context("annotations")?
        .extend(extra.as_object().context("extra")?.clone());
    pod_manifest(NS, name, node, a)
}

fn peer_addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("an address"), port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_serves_only_the_cluster_s_nodes() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let pki = tb.pki.clone().context("pki")?;
    let (cocoon, calls) = logging_cocoon(&tb.host(None)?.bin, tb.run_dir())?;
    let port = e2e::ports::free_port()?;
    let metrics = e2e::ports::free_port()?;
    let opts = DaemonOptions {
        node: "node-a".into(),
        env: vec![("VK_COCOON_BIN".into(), cocoon.display().to_string())],
        peer_addr: Some(format!("127.0.0.1:{port}")),
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(&tb, &opts, &journal, metrics, e2e::ports::free_port()?)?;
    let addr = peer_addr("127.0.0.1", port);
    until("the peer API listening", LIMIT, || async {
        Ok(TcpStream::connect(addr).await.ok().map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    // No certificate: 401.
    let listening = || {
        std::process::Command::new("ss")
            .args(["-ltnp", &format!("sport = :{port}")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let got = get(addr, caller(None)?, PLAN)
        .await
        .with_context(|| format!("{}\n{}", listening(), d.proc.log_tail(40)))?;
    ensure!(got == 401, "no certificate: {got}");
    // A node certificate from another CA: the handshake is refused.
    let foreign = foreign_node_cert(&tb.run_dir().join("foreign"))?;
    let got = get(addr, caller(Some(&foreign))?, PLAN).await;
    ensure!(got.is_err(), "a certificate from another CA got {got:?}");
    // The cluster's CA, but not a node: 401, whatever the groups.
    for (file, user, groups) in [
        ("tenant", "alice", &["system:authenticated"][..]),
        ("admin-like", "kube-admin", &["system:masters"][..]),
        (
            "sa",
            "system:serviceaccount:default:default",
            &["system:serviceaccounts"][..],
        ),
    ] {
        let cert = pki.issue_client(file, user, groups)?;
        ensure!(
            get(addr, caller(Some(&cert))?, PLAN).await? == 401,
            "{user} was not refused"
        );
    }
    ensure!(
        inspect_calls(&calls) == 0,
        "a refused caller started cocoon: {:?}",
        std::fs::read_to_string(&calls)
    );
    ensure!(refusals(metrics, "no_certificate").await? >= 1.0);
    ensure!(refusals(metrics, "untrusted_certificate").await? >= 1.0);
    ensure!(refusals(metrics, "not_a_node").await? >= 3.0);

    // A node of the cluster passes the node check, and (K7.4) a request of its that names no
    // pod it wakes is refused all the same, before cocoon runs.
    let node_b = pki.issue_node("node-b")?;
    ensure!(get(addr, caller(Some(&node_b))?, PLAN).await? == 403);
    ensure!(refusals(metrics, "no_grant").await? == 1.0);
    ensure!(
        inspect_calls(&calls) == 0,
        "a request naming no pod ran a lookup"
    );
    drop(d);

    // Without credentials the peer API is off, says so, and nothing listens.
    let off_port = e2e::ports::free_port()?;
    let off = DaemonOptions {
        node: "node-c".into(),
        peer_addr: Some(format!("127.0.0.1:{off_port}")),
        peer_tls: daemon::PeerTls::Off,
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal-c").join("events.journal");
    let c = daemon::start(
        &tb,
        &off,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    until("the daemon saying the peer API is off", LIMIT, || async {
        let log = std::fs::read_to_string(c.proc.log_path()).unwrap_or_default();
        Ok(log
            .contains("peer API off: set VK_PEER_CA_FILE")
            .then_some(()))
    })
    .await?;
    let dialed = TcpStream::connect(peer_addr("127.0.0.1", off_port)).await;
    ensure!(
        dialed.is_err(),
        "something listens on the peer port of a node without credentials"
    );
    drop(c);
    Ok(())
}

/// The largest file of node-a's local copy of snapshot `id`, one of its bytes changed.
fn alter_local_copy(snapshots: &Path, id: &str) -> Result<PathBuf> {
    let dir = snapshots.join(id);
    let victim = std::fs::read_dir(&dir)
        .with_context(|| format!("node-a's copy {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n != "snapshot.json"))
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .context("a file in node-a's copy")?;
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&victim)?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 0)?;
    f.write_all_at(&[b[0] ^ 0x5A], 0)?;
    Ok(victim)
}

/// Two nodes sharing a registry, each serving the peer API at one port on its own loopback
/// address; the victim ran on node-a, was hibernated there (its `marker` file written first)
/// and deleted, node-a keeping its local copy.
struct Hibernated {
    a: daemon::Daemon,
    b: daemon::Daemon,
    tb: Testbed,
    metrics_a: u16,
    metrics_b: u16,
    journal_b: PathBuf,
    /// node-a's peer API.
    peer_a: SocketAddr,
    pods: Api<Pod>,
}

async fn victim_hibernated_on_node_a() -> Result<Hibernated> {
    let mut tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    tb.add_host("sim-b")?;
    let registry = tb.registry.as_ref().context("registry")?.addr.clone();
    let port = e2e::ports::free_port()?;
    let opts = |node: &str, ip: &str, host: Option<&str>| DaemonOptions {
        node: node.into(),
        env: vec![
            ("OCI_REGISTRY".into(), format!("{registry}/{PREFIX}")),
            ("COCOON_SIM_EXEC".into(), "host".into()),
        ],
        host: host.map(str::to_string),
        node_ip: Some(ip.into()),
        peer_addr: Some(format!("{ip}:{port}")),
        ..DaemonOptions::default()
    };
    let (metrics_a, metrics_b) = (e2e::ports::free_port()?, e2e::ports::free_port()?);
    let a = daemon::start(
        &tb,
        &opts("node-a", "127.0.0.2", None),
        &tb.run_dir().join("journal-a").join("events.journal"),
        metrics_a,
        e2e::ports::free_port()?,
    )?;
    let journal_b = tb.run_dir().join("journal-b").join("events.journal");
    let b = daemon::start(
        &tb,
        &opts("node-b", "127.0.0.3", Some("sim-b")),
        &journal_b,
        metrics_b,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let sim_a = tb.host(None)?;

    let keep = json!({"vm.cocoonstack.io/keep-snapshot-on-delete": "true"});
    create_pod(&pods, &managed("node-a", "victim", keep)?).await?;
    let p = wait_ready(&pods, "victim", LIMIT)
        .await
        .with_context(|| a.proc.log_tail(60))?;
    let id = annotation(&p, "vm.cocoonstack.io/id").context("id")?;
    sim_a
        .command()
        .env("COCOON_SIM_EXEC", "host")
        .args([
            "vm",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo victim-state > marker",
        ])
        .status()?;
    let patch = json!({"metadata": {"annotations": {"vm.cocoonstack.io/hibernate": "true"}}});
    pods.patch("victim", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    until("victim hibernated", LIMIT, || async {
        let p = pods.get("victim").await?;
        let state = annotation(&p, "vm.cocoonstack.io/lifecycle-state");
        Ok((state.as_deref() == Some("hibernated")).then_some(()))
    })
    .await
    .with_context(|| a.proc.log_tail(60))?;
    pods.delete("victim", &DeleteParams::default()).await?;
    until("victim deleted", LIMIT, || async {
        Ok(pods.get_opt("victim").await?.is_none().then_some(()))
    })
    .await?;
    Ok(Hibernated {
        a,
        b,
        tb,
        metrics_a,
        metrics_b,
        journal_b,
        peer_a: peer_addr("127.0.0.2", port),
        pods,
    })
}

/// A pod bound to `node` at its creation: no daemon runs a Node of that name here, so the
/// scheduler would never bind it, and the grant goes by the binding.
fn bound_to(ns: &str, name: &str, node: &str) -> Result<Pod> {
    let mut p = pod_manifest(ns, name, node, json!({}))?;
    p.spec.as_mut().context("spec")?.node_name = Some(node.into());
    Ok(p)
}

/// The ids of node-a's local snapshots.
fn local_snapshots(snapshots: &Path) -> Result<Vec<String>> {
    Ok(std::fs::read_dir(snapshots)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect())
}

/// `cat marker` in the guest of the pod `p` on `sim`.
fn marker_of(sim: &e2e::sim::CocoonSim, p: &Pod) -> Result<String> {
    let id = annotation(p, "vm.cocoonstack.io/id").context("id")?;
    let out = sim
        .command()
        .env("COCOON_SIM_EXEC", "host")
        .args(["vm", "exec", &id, "--", "cat", "marker"])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The peer-restore outcomes a node counted, by result.
async fn peer_restores(metrics_port: u16, result: &str) -> Result<f64> {
    let series = metric_series(metrics_port, "cocoon_vk_snapshot_peer_restore_total").await?;
    Ok(series
        .iter()
        .find(|(l, _)| l == &format!("result=\"{result}\""))
        .map(|(_, v)| *v)
        .unwrap_or(0.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_node_waking_the_pod_reads_its_snapshot() -> Result<()> {
    let h = victim_hibernated_on_node_a().await?;
    let pki = h.tb.pki.clone().context("pki")?;
    let snapshots = h.tb.host(None)?.root.join("snapshots");
    let local = local_snapshots(&snapshots)?;
    ensure!(local.len() == 1, "node-a's local snapshots: {local:?}");

    // The wake is node-b's: the pod is bound to it, and the apiserver says so.
    let marker = json!({"vm.cocoonstack.io/restore-from-hibernate": "true"});
    let waking = create_pod(&h.pods, &managed("node-b", "victim", marker)?).await?;
    let uid = waking.metadata.uid.clone().context("uid")?;
    // A pod of another namespace, bound to node-c: a wake of node-c's own.
    let system: Api<Pod> = Api::namespaced(h.tb.client()?, "kube-system");
    let own = create_pod(&system, &bound_to("kube-system", "c-own", "node-c")?).await?;
    let own_uid = own.metadata.uid.clone().context("uid")?;

    // node-c holds a valid node certificate of the cluster: none of it reads the snapshot.
    let node_c = caller(Some(&pki.issue_node("node-c")?))?;
    let victim = format!("namespace={NS}&pod=victim&uid={uid}");
    let attempts = [
        // The victim's own wake, claimed by a node it is not bound to.
        (format!("{PLAN}&{victim}"), "not_the_waking_node"),
        // Its own pod, of another namespace than the snapshot's.
        (
            format!("{PLAN}&namespace=kube-system&pod=c-own&uid={own_uid}"),
            "foreign_snapshot",
        ),
        // Straight to the files, with the victim's claim: no plan granted them to node-c.
        (
            format!(
                "/v1/snapshot-slice?id={}&file=config.json&offset=0&length=1&{victim}",
                local[0]
            ),
            "no_grant",
        ),
    ];
    for (target, reason) in &attempts {
        let got = get(h.peer_a, node_c.clone(), target).await?;
        ensure!(got == 403, "node-c got {got} for {target}");
        ensure!(
            refusals(h.metrics_a, reason).await? >= 1.0,
            "node-a did not count {reason}\n{}",
            h.a.proc.log_tail(40)
        );
    }

    // The real wake is served by node-a and brings the victim's state back.
    let woken = wait_ready(&h.pods, "victim", LIMIT)
        .await
        .with_context(|| h.b.proc.log_tail(80))?;
    let text = marker_of(h.tb.host(Some("sim-b"))?, &woken)?;
    ensure!(
        text == "victim-state",
        "the victim's state after waking: {text:?}"
    );
    ensure!(
        peer_restores(h.metrics_b, "ok").await? == 1.0,
        "node-b did not restore from its peer\n{}",
        h.b.proc.log_tail(60)
    );
    ensure!(
        daemon::metric(
            h.metrics_b,
            "cocoon_vk_snapshot_pull_duration_seconds_count"
        )
        .await?
            == 0.0,
        "node-b pulled from the registry although its peer had the snapshot"
    );
    system.delete("c-own", &DeleteParams::default()).await?;
    let Hibernated {
        tb,
        a,
        b,
        journal_b,
        ..
    } = h;
    drop((a, b));
    daemon::replay_verify(&journal_b)?;
    drop(tb);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_serving_altered_bytes_is_refused_and_the_pod_wakes_from_the_registry() -> Result<()>
{
    let Hibernated {
        tb,
        a,
        b,
        metrics_b,
        journal_b,
        pods,
        ..
    } = victim_hibernated_on_node_a().await?;
    let (sim_a, sim_b) = (tb.host(None)?, tb.host(Some("sim-b"))?);

    // node-a's local copy changes after the push: what it serves now hashes to other digests
    // than the registry records (its own slice checksums still agree with it).
    let snapshots = sim_a.root.join("snapshots");
    let local = local_snapshots(&snapshots)?;
    ensure!(local.len() == 1, "node-a's local snapshots: {local:?}");
    let altered = alter_local_copy(&snapshots, &local[0])?;

    let marker = json!({"vm.cocoonstack.io/restore-from-hibernate": "true"});
    create_pod(&pods, &managed("node-b", "victim", marker)?).await?;
    let woken = wait_ready(&pods, "victim", LIMIT)
        .await
        .with_context(|| b.proc.log_tail(80))?;
    let text = marker_of(sim_b, &woken)?;
    ensure!(
        text == "victim-state",
        "the victim's state after waking: {text:?} (altered {})",
        altered.display()
    );
    ensure!(
        refusals(metrics_b, "altered_bytes").await? == 1.0,
        "node-b did not count the altered copy\n{}",
        b.proc.log_tail(60)
    );
    ensure!(
        peer_restores(metrics_b, "failed").await? == 1.0,
        "node-b counted no failed peer restore"
    );
    ensure!(
        daemon::metric(metrics_b, "cocoon_vk_snapshot_pull_duration_seconds_count").await? == 1.0,
        "node-b did not fall back to the registry"
    );
    let staging = sim_b.root.join("vk-staging");
    until(
        "node-b's staging directory without the refused copy",
        LIMIT,
        || async {
            let left: Vec<String> = std::fs::read_dir(&staging)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("peer-"))
                        .collect()
                })
                .unwrap_or_default();
            Ok(left.is_empty().then_some(()))
        },
    )
    .await?;
    drop((a, b));
    daemon::replay_verify(&journal_b)?;
    Ok(())
}

/// Whether a request failed because the server closed the connection without answering.
fn is_shed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::BrokenPipe
            )
        })
    })
}

/// VmRSS in KiB and open descriptors of `pid`.
fn footprint(pid: u32) -> Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((rss, fds))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_and_plans_leaves_the_daemon_bounded() -> Result<()> {
    const IDLE: usize = 600;
    const PLANS: usize = 200;
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let pki = tb.pki.clone().context("pki")?;
    let port = e2e::ports::free_port()?;
    let metrics = e2e::ports::free_port()?;
    let opts = DaemonOptions {
        node: "node-a".into(),
        peer_addr: Some(format!("127.0.0.1:{port}")),
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(&tb, &opts, &journal, metrics, e2e::ports::free_port()?)?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &managed("node-a", "steady", json!({}))?).await?;
    // K7.4: the flood's plans are for a pod node-b wakes, so each passes the grant's pod
    // check and reaches the plan slots and cocoon, the costs the caps bound.
    let waking = create_pod(&pods, &bound_to(NS, "waking", "node-b")?).await?;
    let uid = waking.metadata.uid.clone().context("uid")?;
    let plan = format!("{PLAN}&namespace={NS}&pod=waking&uid={uid}");
    wait_ready(&pods, "steady", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let pid = d.proc.pid();
    let addr = peer_addr("127.0.0.1", port);
    let (rss0, fds0) = footprint(pid)?;

    // Connections that never say a word: at most the handshake cap is let in at a time.
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(addr).await?);
    }
    // Plan requests from a node, all at once, while the idle ones hold their slots.
    let node_b = caller(Some(&pki.issue_node("node-b")?))?;
    let mut plans = tokio::task::JoinSet::new();
    for _ in 0..PLANS {
        let (config, plan) = (node_b.clone(), plan.clone());
        plans.spawn(async move { get(addr, config, &plan).await });
    }
    let (mut rss_max, mut fds_max) = (rss0, fds0);
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    while let Some(r) = plans.join_next().await {
        let key = match r? {
            Ok(status) => status.to_string(),
            // A connection the daemon dropped unanswered (its handshake outlived the
            // handshake timeout behind the idle ones) is shedding, not a wrong answer.
            Err(e) if is_shed(&e) => "shed".to_string(),
            Err(e) => format!("error: {e}"),
        };
        *answered.entry(key).or_default() += 1;
        let (rss, fds) = footprint(pid)?;
        rss_max = rss_max.max(rss);
        fds_max = fds_max.max(fds);
    }
    eprintln!(
        "flood: {IDLE} idle connections, {PLANS} plans: descriptors {fds0} -> at most {fds_max}, \
         RSS {rss0} KiB -> at most {rss_max} KiB, answers {answered:?}"
    );
    ensure!(
        answered
            .keys()
            .all(|k| k == "404" || k == "503" || k == "shed"),
        "plan answers: {answered:?}"
    );
    ensure!(
        answered.contains_key("404"),
        "no plan was served: {answered:?}"
    );
    // K7.2: every 503 was a cap refusal, counted.
    let refused = metric_series(metrics, "cocoon_vk_cap_refusals_total")
        .await?
        .into_iter()
        .find(|(l, _)| l == "cap=\"peer_requests\"")
        .map(|(_, v)| v as usize);
    ensure!(
        refused == Some(answered.get("503").copied().unwrap_or(0)),
        "cap refusals {refused:?}, answers {answered:?}"
    );
    // Descriptors: never one per idle connection, at most the two workers' connection caps
    // (K7.2) and a few for the plans' cocoon processes; memory: no growth with the flood
    // beyond a few buffers per admitted connection.
    const CONNECTION_CAP: usize = 2 * 128;
    ensure!(
        fds_max <= fds0 + CONNECTION_CAP + 32,
        "descriptors grew from {fds0} to {fds_max} with {IDLE} idle connections"
    );
    ensure!(
        rss_max < rss0 + 64 * 1024,
        "RSS grew from {rss0} KiB to {rss_max} KiB"
    );
    // The idle connections the daemon let in are closed on its handshake timeout.
    let mut first = idle.swap_remove(0);
    let mut buf = [0u8; 1];
    let closed = tokio::time::timeout(LIMIT, first.read(&mut buf)).await?;
    ensure!(
        matches!(closed, Ok(0) | Err(_)),
        "an idle connection was answered: {closed:?}"
    );
    drop(idle);
    until("descriptors back near the start", LIMIT, || async {
        Ok((footprint(pid)?.1 < fds0 + 16).then_some(()))
    })
    .await?;
    let p = pods.get("steady").await?;
    ensure!(
        daemon::is_ready(&p),
        "the Ready pod lost Ready under the flood"
    );
    wait_ready(&pods, "steady", Duration::from_secs(5)).await?;
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
