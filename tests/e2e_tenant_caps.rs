//! The caps on what a caller can make the daemon spend through its kubelet API (K10–K12),
//! under load on loopback: idle connections that never handshake, a port-forward session
//! opening stream pairs without end, requests with bearer tokens nobody issued. For each,
//! the daemon's memory and descriptors stay within a stated bound of where they started,
//! the cap's refusals are counted in `cocoon_vk_cap_refusals_total{cap}`, and a Ready pod
//! stays Ready with its exec and logs still served to a legitimate caller.

use e2e::daemon;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use bytes::BytesMut;
use e2e::certs::Pki;
use e2e::daemon::{create_pod, until, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vk_cocoon::kubelet::stream::spdy_frame::{Codec, Frame};

const NS: &str = "default";
const NODE: &str = "node-a";
const POD: &str = "caps-a";
const LIMIT: Duration = Duration::from_secs(60);
/// What the daemon may grow by under any of the loads below, over what it held before.
const RSS_GROWTH: u64 = 64 << 20;
/// Descriptors the daemon may hold beyond what the cap itself allows: the legitimate calls
/// made meanwhile, their `cocoon` children's pipes, the apiserver's connections.
const FD_SLACK: usize = 64;

/// A daemon with one Ready pod, serving the kubelet API with a certificate of the testbed's
/// CA, so a test's own client can check it.
struct Node {
    tb: Testbed,
    d: daemon::Daemon,
    pki: Pki,
    kubelet_port: u16,
    metrics_port: u16,
    /// The pod's hypervisor log, which `kubectl logs` reads.
    log: PathBuf,
}

async fn node() -> Result<Node> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
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
        ],
        ..DaemonOptions::default()
    };
    let d = daemon::start(&tb, &opts, &journal, metrics_port, kubelet_port)?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &daemon::run_pod(NS, POD, NODE)?).await?;
    let p = wait_ready(&pods, POD, LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let vm = daemon::annotation(&p, "vm.cocoonstack.io/id").context("vm id")?;
    let sim = tb.sim.as_ref().context("sim")?;
    let log = sim
        .root
        .join("log/cloudhypervisor")
        .join(&vm)
        .join("cloud-hypervisor.log");
    let n = Node {
        tb,
        d,
        pki,
        kubelet_port,
        metrics_port,
        log,
    };
    // A pod the cluster sees Ready is served by the node at once (INV-7).
    n.tb.kubectl(&["exec", POD, "--", "true"])
        .await
        .context("the pod's exec right after Ready")?;
    Ok(n)
}

/// The daemon's resident memory (VmRSS, bytes) and open descriptors.
fn footprint(pid: u32) -> Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((kib << 10, fds))
}

/// `cocoon_vk_cap_refusals_total{cap}` on the daemon's metrics port.
async fn refusals(n: &Node, cap: &str) -> Result<u64> {
    let series = daemon::metric_series(n.metrics_port, "cocoon_vk_cap_refusals_total").await?;
    let label = format!("cap=\"{cap}\"");
    let v = series
        .iter()
        .find(|(l, _)| *l == label)
        .with_context(|| format!("no {label} series in {series:?}"))?;
    Ok(v.1 as u64)
}

/// The pod is still Ready, and a legitimate caller still execs in it and reads its log.
async fn still_served(n: &Node, marker: &str) -> Result<()> {
    let ready =
        n.tb.kubectl(&[
            "get",
            "pod",
            POD,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])
        .await?;
    ensure!(ready == "True", "the pod's Ready condition is {ready:?}");
    let said = n.tb.kubectl(&["exec", POD, "--", "echo", marker]).await?;
    ensure!(said == format!("{marker}\n"), "kubectl exec said {said:?}");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&n.log)?;
        writeln!(f, "{marker}")?;
    }
    let logs = n.tb.kubectl(&["logs", POD, "--tail=1"]).await?;
    ensure!(logs == format!("{marker}\n"), "kubectl logs said {logs:?}");
    Ok(())
}

/// `GET path` on the kubelet port with the apiserver's client certificate: the status.
async fn as_apiserver(n: &Node, path: &str) -> Result<String> {
    let c = &n.pki.kubelet_client;
    let (cert, key) = (c.cert.display().to_string(), c.key.display().to_string());
    let url = format!("https://127.0.0.1:{}{path}", n.kubelet_port);
    daemon::curl_status(&url, &["--cert", &cert, "--key", &key]).await
}

/// K10: a thousand connections that never start a handshake, from one address and then from
/// twenty, and a hundred that handshake and then say nothing, hold at most the places and
/// never keep the apiserver out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_starve_the_kubelet_api() -> Result<()> {
    use vk_cocoon::kubelet::handshakes::{DEADLINE, PENDING, PER_ADDRESS};
    const ONE: usize = 500;
    const MANY: usize = 500;
    const ADDRESSES: u8 = 20;
    const SILENT: usize = 100;
    let n = node().await?;
    let pid = n.d.proc.pid();
    let (rss0, fds0) = footprint(pid)?;
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], n.kubelet_port));
    let mut idle = Vec::new();
    let connect = |from: [u8; 4]| async move {
        let s = tokio::net::TcpSocket::new_v4()?;
        s.bind(std::net::SocketAddr::from((from, 0)))?;
        anyhow::Ok(s.connect(target).await?)
    };
    for _ in 0..ONE {
        idle.push(connect([127, 0, 0, 2]).await?);
    }
    let one_address = (ONE - PER_ADDRESS) as u64;
    until(
        "one address's connections over its share cut",
        LIMIT,
        || async { Ok((refusals(&n, "tls_handshake").await? >= one_address).then_some(())) },
    )
    .await?;
    for i in 0..MANY {
        let from = [127, 0, 0, 3 + (i % usize::from(ADDRESSES)) as u8];
        idle.push(connect(from).await?);
    }
    let mut silent = Vec::new();
    for _ in 0..SILENT {
        silent.push(tls_as_apiserver(&n, [127, 0, 0, 3 + ADDRESSES]).await?);
    }
    let total = (ONE + MANY + SILENT) as u64;
    until("the connections over all places cut", LIMIT, || async {
        Ok((refusals(&n, "tls_handshake").await? >= total - PENDING as u64).then_some(()))
    })
    .await?;
    let (rss, fds) = footprint(pid)?;
    e2e::step!(
        "{total} idle connections: RSS {} -> {} MiB, fds {fds0} -> {fds}",
        rss0 >> 20,
        rss >> 20
    );
    ensure!(fds <= fds0 + PENDING + FD_SLACK, "fds {fds0} -> {fds}");
    ensure!(rss <= rss0 + RSS_GROWTH, "RSS {rss0} -> {rss}");
    // With every place taken by an idle connection, the apiserver still gets in.
    let pods = as_apiserver(&n, "/pods").await?;
    ensure!(
        pods == "200",
        "the apiserver's certificate at /pods: {pods}"
    );
    still_served(&n, "after-idle-connections").await?;
    // Every idle connection is cut exactly once, by a newcomer or by its deadline; none of
    // the legitimate ones is.
    let all = until("every idle connection cut", DEADLINE * 3, || async {
        let got = refusals(&n, "tls_handshake").await?;
        Ok((got >= total).then_some(got))
    })
    .await?;
    ensure!(
        all == total,
        "{all} handshakes cut for {total} idle connections"
    );
    let (_, fds) = footprint(pid)?;
    ensure!(
        fds <= fds0 + FD_SLACK,
        "fds {fds0} -> {fds} once all are cut"
    );
    drop((idle, silent));
    Ok(())
}

/// A TLS connection to the kubelet port from `from`, presenting the apiserver's client
/// certificate.
async fn tls_as_apiserver(
    n: &Node,
    from: [u8; 4],
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
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
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((from, 0)))?;
    let tcp = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], n.kubelet_port)))
        .await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(tls.connect(name, tcp).await?)
}

/// K12: one port-forward session opening 200 stream pairs at once gets 64 forwarded and the
/// rest refused on their own error streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_forward_session_cannot_open_unbounded_connections() -> Result<()> {
    use vk_cocoon::kubelet::stream::MAX_PAIRS;
    const PAIRS: usize = 200;
    let n = node().await?;
    let pid = n.d.proc.pid();
    let (rss0, fds0) = footprint(pid)?;
    let mut conn = tls_as_apiserver(&n, [127, 0, 0, 1]).await?;
    let head = format!(
        "POST /portForward/{NS}/{POD} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\
         Content-Length: 0\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await?;
    let mut buf = BytesMut::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        ensure!(
            conn.read_buf(&mut buf).await? > 0,
            "no answer to the upgrade"
        );
    };
    let answer = String::from_utf8_lossy(&buf.split_to(end)).into_owned();
    ensure!(answer.starts_with("HTTP/1.1 101"), "{answer}");

    // Every pair at once, to the guest's SSH port, which greets and then waits.
    let (mut codec, mut from_daemon) = (Codec::default(), Codec::default());
    let mut out = Vec::new();
    for request in 0..PAIRS {
        for (k, kind) in ["error", "data"].iter().enumerate() {
            let open = Frame::SynStream {
                stream: (4 * request + 2 * k + 1) as u32,
                fin: false,
                headers: vec![
                    ("streamtype".into(), kind.to_string()),
                    ("port".into(), "22".into()),
                    ("requestid".into(), request.to_string()),
                ],
            };
            out.extend_from_slice(&codec.encode(&open));
        }
    }
    conn.write_all(&out).await?;
    let (mut greeted, mut refused) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let mut message = String::new();
    let read = async {
        while greeted.len() + refused.len() < PAIRS {
            while let Some(f) = from_daemon
                .decode(&mut buf)
                .map_err(|e| anyhow::anyhow!("SPDY from the daemon: {}", e.0))?
            {
                if let Frame::Data { stream, data, .. } = f {
                    let request = (stream - 1) / 4;
                    match (stream - 1) % 4 {
                        0 if !data.is_empty() => {
                            message = String::from_utf8_lossy(&data).into_owned();
                            refused.insert(request);
                        }
                        2 if data.starts_with(b"SSH-") => {
                            greeted.insert(request);
                        }
                        _ => {}
                    }
                }
            }
            ensure!(conn.read_buf(&mut buf).await? > 0, "the session ended");
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(LIMIT, read)
        .await
        .context("not every pair was answered")??;
    ensure!(
        greeted.len() == MAX_PAIRS && refused.len() == PAIRS - MAX_PAIRS,
        "{} pairs forwarded and {} refused of {PAIRS}",
        greeted.len(),
        refused.len()
    );
    ensure!(
        message.contains(&format!("already forwards {MAX_PAIRS} connections")),
        "the refusal said {message:?}"
    );
    let (rss, fds) = footprint(pid)?;
    e2e::step!(
        "{PAIRS} pairs in one session: RSS {} -> {} MiB, fds {fds0} -> {fds}",
        rss0 >> 20,
        rss >> 20
    );
    ensure!(fds <= fds0 + MAX_PAIRS + FD_SLACK, "fds {fds0} -> {fds}");
    ensure!(rss <= rss0 + RSS_GROWTH, "RSS {rss0} -> {rss}");
    // Both streams of each refused pair.
    let counted = refusals(&n, "port_forward_streams").await?;
    ensure!(
        counted == 2 * (PAIRS - MAX_PAIRS) as u64,
        "{counted} streams counted refused"
    );
    drop(conn);
    until("the session's guest connections closed", LIMIT, || async {
        Ok((footprint(pid)?.1 <= fds0 + FD_SLACK).then_some(()))
    })
    .await?;
    still_served(&n, "after-port-forward").await?;
    Ok(())
}

/// TokenReviews the apiserver has answered so far, from its own metrics.
async fn token_reviews(tb: &Testbed) -> Result<u64> {
    let text = tb.kubectl(&["get", "--raw", "/metrics"]).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"tokenreviews\"") && l.contains("verb=\"POST\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// K11 and K8: 2,000 requests with random bearer tokens cost the apiserver a bounded number
/// of TokenReviews and are otherwise answered 429; a scraper whose token was checked before
/// keeps reading `/metrics` on the kubelet port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_tokens_cost_the_apiserver_a_bounded_number_of_reviews() -> Result<()> {
    use vk_cocoon::kubelet::auth::{REVIEWS_PER_SECOND, REVIEW_BURST};
    const REQUESTS: usize = 2000;
    let n = node().await?;
    let pid = n.d.proc.pid();
    let metrics_url = format!("https://127.0.0.1:{}/metrics", n.kubelet_port);

    // K8: the daemon's metrics on the kubelet port, for a caller allowed nodes/metrics.
    let none = daemon::curl_status(&metrics_url, &[]).await?;
    ensure!(none == "401", "/metrics without credentials: {none}");
    for args in [
        vec!["create", "serviceaccount", "scraper", "-n", NS],
        vec![
            "create",
            "clusterrole",
            "node-metrics",
            "--verb=get",
            "--resource=nodes/metrics",
        ],
        vec![
            "create",
            "clusterrolebinding",
            "node-metrics",
            "--clusterrole=node-metrics",
            "--serviceaccount=default:scraper",
        ],
    ] {
        n.tb.kubectl(&args).await?;
    }
    let token =
        n.tb.kubectl(&["create", "token", "scraper", "-n", NS])
            .await?;
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let scrape = || async {
        let out = tokio::process::Command::new("curl")
            .args(["-sk", "--max-time", "10", "-H", &bearer, &metrics_url])
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .output()
            .await?;
        anyhow::Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let scraped = until("the scraper's RBAC in effect", LIMIT, || async {
        let body = scrape().await?;
        ensure!(
            body.contains("cocoon_vk_cap_refusals_total"),
            "/metrics answered {:?}",
            body.chars().take(300).collect::<String>()
        );
        Ok(Some(body))
    })
    .await?;
    ensure!(scraped.contains("cap=\"token_reviews\"} 0"), "{scraped}");

    let (rss0, fds0) = footprint(pid)?;
    let reviews0 = token_reviews(&n.tb).await?;
    // One curl, many transfers: each its own random token.
    let config = n.tb.run_dir().join("random-tokens.curl");
    let transfers: Vec<String> = (0..REQUESTS)
        .map(|i| {
            let token = format!("{:016x}{i:08x}", rand_u64(i));
            format!(
                "url = \"https://127.0.0.1:{}/pods\"\nheader = \"Authorization: Bearer {token}\"\n\
                 insecure\noutput = /dev/null\nwrite-out = \"%{{http_code}}\\n\"\n",
                n.kubelet_port
            )
        })
        .collect();
    std::fs::write(&config, transfers.join("next\n"))?;
    let started = Instant::now();
    let out = tokio::process::Command::new("curl")
        // Fewer at once than K10 lets one address handshake, so no request is cut there.
        .args(["-sS", "--parallel", "--parallel-max", "16", "-K"])
        .arg(&config)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await?;
    let elapsed = started.elapsed();
    let codes = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = |c: &str| codes.lines().filter(|l| *l == c).count();
    let (unauthorized, throttled) = (count("401"), count("429"));
    e2e::step!(
        "{REQUESTS} random tokens in {elapsed:?}: {unauthorized} reviewed (401), {throttled} throttled (429)"
    );
    ensure!(
        unauthorized + throttled == REQUESTS,
        "answers other than 401 and 429: {:?}; curl said {}; handshakes cut {}",
        codes.lines().filter(|l| *l != "401" && *l != "429").count(),
        String::from_utf8_lossy(&out.stderr)
            .chars()
            .take(600)
            .collect::<String>(),
        refusals(&n, "tls_handshake").await?
    );
    // The budget: the burst, then the rate for as long as the flood lasted.
    let budget = u64::from(REVIEW_BURST) + u64::from(REVIEWS_PER_SECOND) * (elapsed.as_secs() + 1);
    ensure!(
        (unauthorized as u64) <= budget,
        "{unauthorized} tokens reviewed in {elapsed:?}, over the budget of {budget}"
    );
    let counted = refusals(&n, "token_reviews").await?;
    ensure!(
        counted == throttled as u64,
        "{counted} counted, {throttled} answered 429"
    );
    let reviews = token_reviews(&n.tb).await? - reviews0;
    ensure!(
        reviews <= budget,
        "the apiserver answered {reviews} TokenReviews in {elapsed:?}, over the budget of {budget}"
    );
    let (rss, fds) = footprint(pid)?;
    e2e::step!(
        "after the flood: RSS {} -> {} MiB, fds {fds0} -> {fds}",
        rss0 >> 20,
        rss >> 20
    );
    ensure!(fds <= fds0 + FD_SLACK, "fds {fds0} -> {fds}");
    ensure!(rss <= rss0 + RSS_GROWTH, "RSS {rss0} -> {rss}");
    // The scraper known before the flood is still served from the cache.
    let body = scrape().await?;
    ensure!(
        body.contains(&format!("cap=\"token_reviews\"}} {counted}")),
        "{body}"
    );
    still_served(&n, "after-random-tokens").await?;
    Ok(())
}

/// A token-looking number, different for each request (splitmix64).
fn rand_u64(i: usize) -> u64 {
    let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
