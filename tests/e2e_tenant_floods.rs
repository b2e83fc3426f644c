//! One tenant flooding what the node shares, end to end: namespace `team-b` (the attacker)
//! against `team-a` (the victim), on one node with the simulator.
//!
//! - T13: team-b makes 32 pods whose images are `http://` URLs on a server that never answers,
//!   so their `cocoon image pull`s hang in the node's cocoon lane. team-b holds 24 of its 32
//!   slots and no more; meanwhile team-a's new pod goes Ready and another of its pods is
//!   deleted, and once the server answers, team-b's 8 waiting pulls get their turn.
//! - K13: team-b holds exec and port-forward sessions and log streams up to its namespace's
//!   share; one more of each is answered 503 and counted in
//!   `cocoon_vk_cap_refusals_total{cap="namespace_sessions"}`, while team-a still execs,
//!   port-forwards and reads its logs, and an ended session gives team-b its place back.

use e2e::daemon;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, create_pod, is_ready, pod_manifest, until, wait_ready, DaemonOptions,
};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use vk_cocoon::kubelet::stream::spdy_frame::{Codec, Frame};

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const ID: &str = "vm.cocoonstack.io/id";

/// A managed run-mode pod `name` of `ns` on the node, booting `image`.
fn run_pod(ns: &str, name: &str, image: &str) -> Result<Pod> {
    pod_manifest(
        ns,
        name,
        NODE,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": format!("vk-{ns}-{name}"),
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": image,
        }),
    )
}

/// An image server on loopback that reads each request and then never answers it, until it is
/// released: from then on each request, held or new, is answered 404.
struct SlowServer {
    port: u16,
    /// Requests waiting for an answer now.
    open: Arc<AtomicUsize>,
    /// Every path asked for so far.
    paths: Arc<Mutex<BTreeSet<String>>>,
    release: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowServer {
    async fn start() -> Result<SlowServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let open = Arc::new(AtomicUsize::new(0));
        let paths = Arc::new(Mutex::new(BTreeSet::new()));
        let (release, released) = watch::channel(false);
        let (o, p) = (open.clone(), paths.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(Self::serve(conn, o.clone(), p.clone(), released.clone()));
            }
        });
        Ok(SlowServer {
            port,
            open,
            paths,
            release,
            task,
        })
    }

    async fn serve(
        mut conn: tokio::net::TcpStream,
        open: Arc<AtomicUsize>,
        paths: Arc<Mutex<BTreeSet<String>>>,
        mut released: watch::Receiver<bool>,
    ) {
        let mut head = Vec::new();
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let path = text.split_whitespace().nth(1).unwrap_or_default();
        paths.lock().expect("paths").insert(path.to_string());
        open.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            // The client gave up (the daemon stopped): nothing to answer.
            _ = conn.read(&mut chunk) => {}
            _ = async { released.wait_for(|r| *r).await.is_ok() } => {
                let _ = conn.write_all(b"HTTP/1.0 404 Not Found\r\n\r\n").await;
            }
        }
        open.fetch_sub(1, Ordering::SeqCst);
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn paths(&self) -> usize {
        self.paths.lock().expect("paths").len()
    }
}

async fn delete_and_wait(pods: &Api<Pod>, name: &str, d: &daemon::Daemon) -> Result<Duration> {
    let t = Instant::now();
    pods.delete(name, &DeleteParams::default()).await?;
    until(&format!("{name} deleted"), LIMIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    Ok(t.elapsed())
}

/// T13: 32 pods of team-b pull images from a server that never answers. 24 pulls reach it and
/// hang, and no more: the other 8 wait for a slot team-b may take. Meanwhile team-a's new pod
/// goes Ready and its other pod's delete completes, each in seconds. Once the server answers,
/// the 8 waiting pulls get their turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_image_pulls_of_one_namespace_leave_the_others_their_lane() -> Result<()> {
    use vk_cocoon::effects::fair_slots::NAMESPACE_SLOTS;
    const FLOOD: usize = 32;
    let started = Instant::now();
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let server = SlowServer::start().await?;
    let host = format!("127.0.0.1:{}", server.port);
    let opts = DaemonOptions {
        env: vec![("VK_IMAGE_URL_HOSTS".into(), host.clone())],
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");

    e2e::step!("team-a's steady pod runs before the flood");
    create_pod(&a, &run_pod("team-a", "steady", IMAGE)?).await?;
    wait_ready(&a, "steady", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;

    e2e::step!("team-b makes {FLOOD} pods pulling from http://{host}, which never answers");
    for i in 0..FLOOD {
        let image = format!("http://{host}/slow-{i}.qcow2");
        create_pod(&b, &run_pod("team-b", &format!("slow-{i}"), &image)?).await?;
    }
    until("team-b's share of pulls hanging", LIMIT, || async {
        Ok((server.open() >= NAMESPACE_SLOTS).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        server.open() == NAMESPACE_SLOTS && server.paths() == NAMESPACE_SLOTS,
        "{} pulls hang ({} paths asked for), not team-b's share of {NAMESPACE_SLOTS}",
        server.open(),
        server.paths()
    );
    e2e::step!("{} of team-b's pulls hang", server.open());

    e2e::step!("team-a's fresh pod is made while they hang");
    let t = Instant::now();
    create_pod(&a, &run_pod("team-a", "fresh", IMAGE)?).await?;
    wait_ready(&a, "fresh", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    e2e::step!(
        "team-a's fresh pod Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let took = delete_and_wait(&a, "steady", &d).await?;
    e2e::step!("team-a's steady pod deleted in {:.1}s", took.as_secs_f64());
    ensure!(
        server.open() == NAMESPACE_SLOTS,
        "{} pulls hang after team-a's calls",
        server.open()
    );
    for p in b.list(&Default::default()).await?.items {
        ensure!(
            !is_ready(&p) && annotation(&p, ID).is_none(),
            "team-b's {:?} runs a VM",
            p.metadata.name
        );
    }

    e2e::step!("the server answers: team-b's waiting pulls get their turn");
    server.release.send_replace(true);
    until("every pull of team-b asked for", LIMIT, || async {
        Ok((server.paths() == FLOOD).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let p = wait_ready(&a, "fresh", LIMIT).await?;
    ensure!(
        annotation(&p, ID).is_some(),
        "team-a's fresh pod lost its VM"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// A node serving the kubelet API with a certificate of the testbed's CA, so the test's own
/// client can check it, with a Ready pod of each namespace: team-a's `victim` and team-b's
/// `flooder`.
struct Node {
    tb: Testbed,
    d: daemon::Daemon,
    pki: e2e::certs::Pki,
    kubelet_port: u16,
    metrics_port: u16,
}

async fn node() -> Result<Node> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let pki = tb.pki.clone().context("pki")?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let (kubelet_port, metrics_port) = (e2e::ports::free_port()?, e2e::ports::free_port()?);
    let opts = DaemonOptions {
        env: vec![
            (
                "VK_TLS_CERT".into(),
                pki.apiserver.cert.display().to_string(),
            ),
            ("VK_TLS_KEY".into(), pki.apiserver.key.display().to_string()),
            ("COCOON_SIM_EXEC".into(), "host".into()),
            // The held sessions outlast the test; kubectl's pings keep them going anyway.
            ("VK_EXEC_IDLE_TIMEOUT".into(), "600s".into()),
        ],
        ..DaemonOptions::default()
    };
    let d = daemon::start(&tb, &opts, &journal, metrics_port, kubelet_port)?;
    for (ns, name) in [("team-a", "victim"), ("team-b", "flooder")] {
        let pods: Api<Pod> = Api::namespaced(tb.client()?, ns);
        create_pod(&pods, &run_pod(ns, name, IMAGE)?).await?;
    }
    for (ns, name) in [("team-a", "victim"), ("team-b", "flooder")] {
        let pods: Api<Pod> = Api::namespaced(tb.client()?, ns);
        wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
    }
    Ok(Node {
        tb,
        d,
        pki,
        kubelet_port,
        metrics_port,
    })
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to the kubelet port presenting the apiserver's client certificate, as
/// the apiserver makes when it relays a tenant's exec, port-forward or logs.
async fn as_apiserver(n: &Node) -> Result<Tls> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&n.pki.ca.cert)? {
        roots.add(c?)?;
    }
    let chain = CertificateDer::pem_file_iter(&n.pki.kubelet_client.cert)?
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&n.pki.kubelet_client.key)?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", n.kubelet_port)).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(tls.connect(ServerName::try_from("127.0.0.1")?, tcp).await?)
}

/// Sends `head` on a new connection and reads the answer's head, and its body when it says
/// how long that is: (status code, head and body as text, the connection).
async fn ask(n: &Node, head: &str) -> Result<(u16, String, Tls)> {
    let mut conn = as_apiserver(n).await?;
    conn.write_all(head.as_bytes()).await?;
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let got = tokio::time::timeout(LIMIT, conn.read(&mut chunk))
            .await
            .context("no answer")??;
        ensure!(got > 0, "the connection closed before an answer");
        buf.extend_from_slice(&chunk[..got]);
    };
    let answer = String::from_utf8_lossy(&buf[..end]).into_owned();
    let code: u16 = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {answer:?}"))?;
    let length = answer
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < end + length {
        let mut chunk = [0u8; 4096];
        let got = tokio::time::timeout(LIMIT, conn.read(&mut chunk))
            .await
            .context("no body")??;
        ensure!(got > 0, "the connection closed in the body");
        buf.extend_from_slice(&chunk[..got]);
    }
    Ok((code, String::from_utf8_lossy(&buf).into_owned(), conn))
}

/// A port-forward session upgrade for pod `name` of `ns`.
async fn port_forward(n: &Node, ns: &str, name: &str) -> Result<(u16, String, Tls)> {
    let head = format!(
        "POST /portForward/{ns}/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\
         Content-Length: 0\r\n\r\n"
    );
    ask(n, &head).await
}

/// A follow of pod `name`'s log.
async fn follow_logs(n: &Node, ns: &str, name: &str) -> Result<(u16, String, Tls)> {
    let head = format!(
        "GET /containerLogs/{ns}/{name}/agent?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    );
    ask(n, &head).await
}

/// Keeps a session open: reads whatever comes and, for SPDY, pings every 5 s as Kubernetes
/// clients do, so the daemon's idle limit never ends it. Aborting the task closes it.
fn hold(mut conn: Tls, spdy: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        let mut codec = Codec::default();
        let mut id = 1;
        let mut chunk = [0u8; 4096];
        loop {
            tokio::select! {
                got = conn.read(&mut chunk) => if !matches!(got, Ok(n) if n > 0) { return },
                _ = tick.tick(), if spdy => {
                    if conn.write_all(&codec.encode(&Frame::Ping { id })).await.is_err() {
                        return;
                    }
                    id += 2;
                }
            }
        }
    })
}

/// `cocoon_vk_cap_refusals_total{cap="namespace_sessions"}`.
async fn refusals(n: &Node) -> Result<u64> {
    let series = daemon::metric_series(n.metrics_port, "cocoon_vk_cap_refusals_total").await?;
    let v = series
        .iter()
        .find(|(l, _)| l == "cap=\"namespace_sessions\"")
        .with_context(|| format!("no namespace_sessions series in {series:?}"))?;
    Ok(v.1 as u64)
}

/// `kubectl exec` children of the simulator running `sleep <seconds>` in a guest.
fn guest_sleeps(seconds: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
            args.windows(2).any(|w| w == [b"vm".as_slice(), b"exec"])
                && args.ends_with(&[b"sleep".as_slice(), seconds.as_bytes()])
        })
        .count()
}

/// A `kubectl exec` in pod `name` of `ns` left running `sleep 601`.
fn held_exec(n: &Node, ns: &str, name: &str) -> Result<tokio::process::Child> {
    Ok(tokio::process::Command::new(e2e::bins::built("kubectl")?)
        .args(["exec", "-n", ns, name, "--", "sleep", "601"])
        .env("KUBECONFIG", n.tb.kubeconfig()?)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

/// team-a still execs, port-forwards, reads its log and follows it, while team-b holds its
/// shares.
async fn victim_served(n: &Node, marker: &str) -> Result<()> {
    let said =
        n.tb.kubectl(&["exec", "-n", "team-a", "victim", "--", "echo", marker])
            .await?;
    ensure!(said == format!("{marker}\n"), "team-a's exec said {said:?}");
    let a: Api<Pod> = Api::namespaced(n.tb.client()?, "team-a");
    let vm = annotation(&a.get("victim").await?, ID).context("victim id")?;
    let log =
        n.tb.sim
            .as_ref()
            .context("sim")?
            .root
            .join("log/cloudhypervisor");
    {
        use std::io::Write;
        let path = log.join(&vm).join("cloud-hypervisor.log");
        let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
        writeln!(f, "{marker}")?;
    }
    let logs =
        n.tb.kubectl(&["logs", "-n", "team-a", "victim", "--tail=1"])
            .await?;
    ensure!(logs == format!("{marker}\n"), "team-a's logs said {logs:?}");
    let (code, answer, _) = port_forward(n, "team-a", "victim").await?;
    ensure!(code == 101, "team-a's port-forward: {answer}");
    let (code, answer, _) = follow_logs(n, "team-a", "victim").await?;
    ensure!(code == 200, "team-a's log follow: {answer}");
    Ok(())
}

/// K13: team-b holds its share of exec and port-forward sessions (4 `kubectl exec` and 4
/// port-forwards) and of log streams (32 follows); one more of each is 503, saying it is the
/// namespace's share, and counted. team-a's exec, logs and port-forward are served meanwhile,
/// and a session team-b ends gives it its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespaces_sessions_never_take_another_namespaces_share() -> Result<()> {
    use vk_cocoon::kubelet::{NAMESPACE_LOG_STREAMS, NAMESPACE_STREAMS};
    let started = Instant::now();
    let n = node().await?;
    victim_served(&n, "before-the-flood").await?;
    ensure!(refusals(&n).await? == 0, "refusals before the flood");

    e2e::step!("team-b holds {NAMESPACE_STREAMS} exec and port-forward sessions");
    let execs = NAMESPACE_STREAMS / 2;
    let mut kubectls = Vec::new();
    for _ in 0..execs {
        kubectls.push(held_exec(&n, "team-b", "flooder")?);
    }
    until("team-b's exec sessions running", LIMIT, || async {
        Ok((guest_sleeps("601") == execs).then_some(()))
    })
    .await
    .with_context(|| n.d.proc.log_tail(60))?;
    let mut held = Vec::new();
    for _ in execs..NAMESPACE_STREAMS {
        let (code, answer, conn) = port_forward(&n, "team-b", "flooder").await?;
        ensure!(
            code == 101,
            "team-b's port-forward within its share: {answer}"
        );
        held.push(hold(conn, true));
    }
    let (code, answer, _) = port_forward(&n, "team-b", "flooder").await?;
    let share = format!("{NAMESPACE_STREAMS} exec and port-forward sessions of namespace team-b");
    ensure!(
        code == 503 && answer.contains(&share) && answer.contains("its share"),
        "team-b's port-forward past its share: {answer}"
    );
    ensure!(refusals(&n).await? == 1, "the refusal not counted once");
    let out =
        n.tb.kubectl(&["exec", "-n", "team-b", "flooder", "--", "true"])
            .await;
    let refused = out.err().context("team-b's exec past its share ran")?;
    ensure!(
        format!("{refused:#}").contains(&share),
        "team-b's kubectl exec past its share: {refused:#}"
    );
    let counted = refusals(&n).await?;
    ensure!(counted >= 2, "team-b's refused exec not counted: {counted}");

    e2e::step!("team-b follows its log {NAMESPACE_LOG_STREAMS} times");
    let mut streams = Vec::new();
    for _ in 0..NAMESPACE_LOG_STREAMS {
        let (code, answer, conn) = follow_logs(&n, "team-b", "flooder").await?;
        ensure!(
            code == 200,
            "team-b's log stream within its share: {answer}"
        );
        streams.push(hold(conn, false));
    }
    let (code, answer, _) = follow_logs(&n, "team-b", "flooder").await?;
    let share = format!("{NAMESPACE_LOG_STREAMS} log streams of namespace team-b");
    ensure!(
        code == 503 && answer.contains(&share),
        "team-b's log stream past its share: {answer}"
    );
    ensure!(
        refusals(&n).await? == counted + 1,
        "the log stream's refusal not counted once"
    );

    e2e::step!("team-a is served while team-b holds its shares");
    victim_served(&n, "during-the-flood").await?;
    ensure!(
        guest_sleeps("601") == execs,
        "team-b's exec sessions ended early"
    );
    ensure!(
        refusals(&n).await? == counted + 1,
        "team-a's calls were refused"
    );

    e2e::step!("one of team-b's port-forwards ends: its place is team-b's again");
    held.pop().context("a held session")?.abort();
    until("team-b's place given back", LIMIT, || async {
        let (code, _, _) = port_forward(&n, "team-b", "flooder").await?;
        Ok((code == 101).then_some(()))
    })
    .await
    .with_context(|| n.d.proc.log_tail(60))?;

    drop((kubectls, held, streams));
    e2e::step!("done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
