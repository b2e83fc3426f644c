//! The kubelet API as a cluster uses it: `kubectl logs` through the real apiserver, which
//! presents its kubelet client certificate (K3, K9), and callers straight at the port, each
//! answered as a kubelet would answer them.

use e2e::daemon;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, curl_status as status, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::io::AsyncBufReadExt;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

fn append(path: &PathBuf, lines: &[String]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    for l in lines {
        writeln!(f, "{l}")?;
    }
    Ok(())
}

/// `cocoon vm logs` children still running for `vm`.
fn log_readers(vm: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.windows(2).any(|w| w == [b"vm".as_slice(), b"logs"])
                && args.contains(&vm.as_bytes())
        })
        .count()
}

/// Appends a line every 300 ms until no `cocoon vm logs` runs for `vm`, for at most 15 s.
async fn followers_end(log: &PathBuf, vm: &str) -> Result<()> {
    for _ in 0..50 {
        if log_readers(vm) == 0 {
            return Ok(());
        }
        append(log, &["after-the-reader-left".to_string()])?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    anyhow::bail!("a cocoon vm logs -f outlived its reader by 15 s")
}

/// The body of `GET /pods` on the kubelet port, asked with the client certificate `cert`.
async fn pods_body(port: u16, cert: &e2e::certs::CertPair) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sSk", "--fail", "--max-time", "10", "--cert"])
        .arg(&cert.cert)
        .arg("--key")
        .arg(&cert.key)
        .arg(format!("https://127.0.0.1:{port}/pods"))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "GET /pods: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_api_checks_callers_and_streams_logs() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    let pki = tb.pki.clone().context("pki")?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let kubelet_port = e2e::ports::free_port()?;
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        e2e::ports::free_port()?,
        kubelet_port,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let pod = daemon::run_pod(NS, "log-a", NODE)?;
    create_pod(&pods, &pod).await?;
    let p = wait_ready(&pods, "log-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let vm = annotation(&p, "vm.cocoonstack.io/id").context("vm id")?;
    // Where the simulated hypervisor writes its log (the guest's stdout and stderr).
    let log = sim
        .root
        .join("log/cloudhypervisor")
        .join(&vm)
        .join("cloud-hypervisor.log");
    append(
        &log,
        &(1..=5).map(|i| format!("marker-{i}")).collect::<Vec<_>>(),
    )?;

    // K2: GET /pods serves the pod whole, as the cluster has it, with what the node wrote
    // (asked as the apiserver asks: its node proxy refuses a loopback node address).
    let raw = pods_body(kubelet_port, &pki.kubelet_client).await?;
    let list: serde_json::Value = serde_json::from_str(&raw).context("GET /pods")?;
    ensure!(list["kind"] == "PodList", "GET /pods: {raw}");
    let served = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["metadata"]["name"] == "log-a"))
        .with_context(|| format!("log-a is not in GET /pods: {raw}"))?;
    let served: Pod = serde_json::from_value(served.clone()).context("a Pod")?;
    let spec = served.spec.as_ref().context("the pod's spec")?;
    ensure!(
        served.metadata.uid == p.metadata.uid
            && served.metadata.resource_version.is_some()
            && served.metadata.labels == p.metadata.labels
            && spec.node_name.as_deref() == Some(NODE)
            && spec.containers.first().map(|c| c.name.as_str()) == Some("agent"),
        "GET /pods lacks the pod's object: {served:?}"
    );
    ensure!(
        annotation(&served, "vm.cocoonstack.io/id").as_deref() == Some(vm.as_str())
            && daemon::phase(&served) == "Running"
            && daemon::is_ready(&served)
            && daemon::pod_ip(&served) == daemon::pod_ip(&p),
        "GET /pods lacks what the node wrote: {:?} {:?}",
        served.metadata.annotations,
        served.status
    );

    // kubectl logs --tail: the apiserver's client certificate is accepted and authorized, and
    // a pod the cluster sees Ready has its VM served at once (INV-7).
    let tail = tb.kubectl(&["logs", "log-a", "--tail=3"]).await?;
    let lines: Vec<&str> = tail.lines().collect();
    ensure!(
        lines == ["marker-3", "marker-4", "marker-5"],
        "kubectl logs --tail=3 said {tail:?}"
    );

    // --since-time and --timestamps: lines are dated by the hypervisor's own stamps (here
    // cloud-hypervisor's time since its process started), unstamped lines by the one before.
    // The apiserver passes sinceTime in whole seconds: the cut is the next whole second, and
    // everything before it was written before it.
    let cut = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() + 1,
    )?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    append(
        &log,
        &[
            "cloud-hypervisor: 0.000001s: <vmm> INFO:vmm/src/lib.rs:1 -- at-boot".to_string(),
            "cloud-hypervisor: 100000.000000s: <vmm> INFO:vmm/src/lib.rs:2 -- much-later"
                .to_string(),
            "unstamped-after-later".to_string(),
        ],
    )?;
    let since = tb
        .kubectl(&["logs", "log-a", &format!("--since-time={cut}")])
        .await?;
    ensure!(
        since
            == "cloud-hypervisor: 100000.000000s: <vmm> INFO:vmm/src/lib.rs:2 -- much-later\n\
                unstamped-after-later\n",
        "kubectl logs --since-time said {since:?}"
    );
    let stamped = tb
        .kubectl(&["logs", "log-a", "--tail=2", "--timestamps"])
        .await?;
    let rows: Vec<(&str, &str)> = stamped.lines().filter_map(|l| l.split_once(' ')).collect();
    ensure!(
        rows.len() == 2 && rows[1].1 == "unstamped-after-later" && rows[0].0 == rows[1].0,
        "{stamped:?}"
    );
    let at: k8s_openapi::jiff::Timestamp = rows[1].0.parse().context("an RFC 3339 timestamp")?;
    ensure!(
        at > cut + k8s_openapi::jiff::SignedDuration::from_secs(90_000),
        "the unstamped line takes the time of the stamped line before it: {stamped:?}"
    );

    // kubectl logs -f: lines appended while it runs arrive while it runs.
    let mut follower = tokio::process::Command::new(e2e::bins::built("kubectl")?)
        .args(["logs", "-f", "--tail=1", "log-a"])
        .env("KUBECONFIG", tb.kubeconfig()?)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = tokio::io::BufReader::new(follower.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), out.next_line())
        .await
        .context("kubectl logs -f printed nothing")??;
    ensure!(
        first.as_deref() == Some("unstamped-after-later"),
        "kubectl logs -f began with {first:?}"
    );
    for i in 1..=3 {
        let line = format!("followed-{i}");
        let started = std::time::Instant::now();
        append(&log, std::slice::from_ref(&line))?;
        let got = tokio::time::timeout(Duration::from_secs(10), out.next_line())
            .await
            .with_context(|| format!("{line} did not arrive within 10 s"))??;
        ensure!(got.as_deref() == Some(line.as_str()), "got {got:?}");
        e2e::step!(
            "{line} arrived through kubectl logs -f in {:?}",
            started.elapsed()
        );
    }
    ensure!(
        log_readers(&vm) == 1,
        "one cocoon vm logs -f while following"
    );
    follower.kill().await?;
    // The caller went away: its cocoon child goes too, once the next line finds the
    // connection closed (a quiet stream has nothing to write that would notice).
    followers_end(&log, &vm)
        .await
        .context("after kubectl logs -f was killed")?;

    // The same straight at the port, with the apiserver's certificate.
    let mut direct = tokio::process::Command::new("curl")
        .args(["-skN", "--cert"])
        .arg(&pki.kubelet_client.cert)
        .arg("--key")
        .arg(&pki.kubelet_client.key)
        .arg(format!(
            "https://127.0.0.1:{kubelet_port}/containerLogs/{NS}/log-a/agent?follow=true&tailLines=1"
        ))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(direct.stdout.take().context("stdout")?).lines();
    append(&log, &["direct-1".to_string()])?;
    let direct_1 = async {
        while let Some(l) = lines.next_line().await? {
            if l == "direct-1" {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the direct follower ended before direct-1")
    };
    tokio::time::timeout(Duration::from_secs(20), direct_1)
        .await
        .context("direct-1 did not arrive within 20 s")??;
    ensure!(log_readers(&vm) == 1, "one cocoon vm logs -f for curl");
    direct.kill().await?;
    followers_end(&log, &vm)
        .await
        .context("after curl was killed")?;

    // Straight at the port.
    let url = format!("https://127.0.0.1:{kubelet_port}/pods");
    let cert = |c: &e2e::certs::CertPair| {
        [
            "--cert".to_string(),
            c.cert.display().to_string(),
            "--key".into(),
            c.key.display().to_string(),
        ]
    };
    let run = |extra: Vec<String>| {
        let url = url.clone();
        async move {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            status(&url, &extra).await
        }
    };
    let none = run(vec![]).await?;
    ensure!(none == "401", "no credentials: {none}");

    let other = e2e::certs::Pki::generate(&tb.run_dir().join("other-pki"))?;
    let foreign = run(cert(&other.admin).to_vec()).await?;
    ensure!(
        foreign == "000" || foreign == "401",
        "a certificate of another CA: {foreign}"
    );

    let bearer = |t: &str| vec!["-H".to_string(), format!("Authorization: Bearer {t}")];
    let bad = run(bearer("not-a-token")).await?;
    ensure!(bad == "401", "a token the apiserver rejects: {bad}");

    tb.kubectl(&["create", "serviceaccount", "reader", "-n", NS])
        .await?;
    let reader = tb.kubectl(&["create", "token", "reader", "-n", NS]).await?;
    let denied = run(bearer(reader.trim())).await?;
    ensure!(
        denied == "403",
        "a ServiceAccount without nodes/proxy: {denied}"
    );

    tb.kubectl(&["create", "serviceaccount", "proxier", "-n", NS])
        .await?;
    tb.kubectl(&[
        "create",
        "clusterrole",
        "node-proxy",
        "--verb=get",
        "--resource=nodes/proxy",
    ])
    .await?;
    tb.kubectl(&[
        "create",
        "clusterrolebinding",
        "node-proxy",
        "--clusterrole=node-proxy",
        "--serviceaccount=default:proxier",
    ])
    .await?;
    let proxier = tb
        .kubectl(&["create", "token", "proxier", "-n", NS])
        .await?;
    let started = std::time::Instant::now();
    let granted = run(bearer(proxier.trim())).await?;
    ensure!(
        granted == "200",
        "a ServiceAccount with nodes/proxy: {granted}"
    );
    let first = started.elapsed();
    // Within the cache's 30 s the same caller costs the apiserver nothing.
    let started = std::time::Instant::now();
    for _ in 0..10 {
        ensure!(run(bearer(proxier.trim())).await? == "200");
    }
    e2e::step!(
        "token caller: first request (TokenReview + SubjectAccessReview) {first:?}, then {:?} each (curl included)",
        started.elapsed() / 10
    );

    let apiserver = run(cert(&pki.kubelet_client).to_vec()).await?;
    ensure!(
        apiserver == "200",
        "the apiserver's kubelet client certificate: {apiserver}"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}
