//! `make bench-logs`: BENCH_FOLLOWERS (default 100) `logs -f` clients held open on one node's
//! kubelet API while lines are appended to the followed VMs' logs. Measures — never asserts
//! figures — the daemon's RSS and CPU with and without the followers, how long each appended
//! line takes to reach every follower, and create → Ready of a batch of pods created while the
//! followers run against the same batch without them (status writes must not wait behind log
//! streams). The one assertion: every follower receives every line appended while it runs.
//!
//! The followers are `curl -N` processes straight at the port with the apiserver's kubelet
//! client certificate, as the apiserver itself connects; a hundred `kubectl logs -f` would
//! measure the apiserver and kubectl on this 2-core machine more than the daemon.

use e2e::daemon;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, create_pod, is_ready, percentile, until, usage, wait_ready, DaemonOptions,
};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use tokio::io::AsyncBufReadExt;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(120);
/// Pods whose logs are followed; the followers are spread over them.
const FOLLOWED: usize = 10;
/// Pods created for one create → Ready measurement.
const BATCH: usize = 20;
/// Lines appended to each followed log, one every LINE_EVERY.
const LINES: usize = 40;
const LINE_EVERY: Duration = Duration::from_millis(250);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// From the daemon's own journal: for each `pods/status` patch decided within `[from, to)`
/// (ms since the epoch), how long until the apiserver's answer came back as an event — the
/// status write itself, whatever else the daemon is doing.
fn status_writes(journal: &std::path::Path, from: i64, to: i64) -> Result<Vec<f64>> {
    use reconcilers::{Action, Event};
    let dir = journal.parent().context("dir")?;
    let mut issued: BTreeMap<u64, i64> = BTreeMap::new();
    let mut ms = Vec::new();
    for step in vk_cocoon::journal::Reader::open_dir(dir)?.steps() {
        let vk_cocoon::journal::Step {
            envelope, actions, ..
        } = step?;
        if let Event::KubeDone { op, .. } = &envelope.event {
            if let Some(t0) = issued.remove(op) {
                ms.push((envelope.at - t0) as f64);
            }
        }
        for a in &actions {
            if let Action::PatchPod { op, .. } = a {
                if (from..to).contains(&envelope.at) {
                    issued.insert(*op, envelope.at);
                }
            }
        }
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms)
}

fn run_pod(name: &str) -> Result<Pod> {
    daemon::run_pod(NS, name, NODE)
}

/// Creates BATCH pods named `<prefix>-<i>` at once; returns create → Ready in ms, sorted, as
/// a namespace watch sees the Ready condition (the daemon's status write landing).
async fn batch_to_ready(pods: &Api<Pod>, prefix: &str) -> Result<Vec<f64>> {
    let ready_at: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let seen = ready_at.clone();
    let watch_api = pods.clone();
    let watch = tokio::spawn(async move {
        let mut stream = kube::runtime::watcher(watch_api, Default::default()).boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(
                kube::runtime::watcher::Event::Apply(p)
                | kube::runtime::watcher::Event::InitApply(p),
            ) = ev
            {
                if is_ready(&p) {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .entry(name)
                        .or_insert_with(Instant::now);
                }
            }
        }
    });
    let mut created = BTreeMap::new();
    for i in 0..BATCH {
        let name = format!("{prefix}-{i}");
        created.insert(name.clone(), Instant::now());
        create_pod(pods, &run_pod(&name)?).await?;
    }
    let names: Vec<String> = created.keys().cloned().collect();
    until(&format!("{prefix} batch Ready"), LIMIT, || async {
        let r = ready_at.lock().unwrap();
        Ok(names.iter().all(|n| r.contains_key(n)).then_some(()))
    })
    .await?;
    watch.abort();
    let ready = ready_at.lock().unwrap().clone();
    let mut ms: Vec<f64> = created
        .iter()
        .map(|(n, t0)| ready[n].duration_since(*t0).as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    for n in &names {
        pods.delete(n, &DeleteParams::default()).await?;
    }
    Ok(ms)
}

struct Follower {
    child: tokio::process::Child,
    /// line → when it arrived.
    got: Arc<Mutex<BTreeMap<String, Instant>>>,
}

fn follow(port: u16, pki: &e2e::certs::Pki, pod: &str) -> Result<Follower> {
    let mut child = tokio::process::Command::new("curl")
        .args(["-skN", "--cert"])
        .arg(&pki.kubelet_client.cert)
        .arg("--key")
        .arg(&pki.kubelet_client.key)
        .arg(format!(
            "https://127.0.0.1:{port}/containerLogs/{NS}/{pod}/agent?follow=true&tailLines=1"
        ))
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("curl")?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let got: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            g.lock().unwrap().entry(l).or_insert_with(Instant::now);
        }
    });
    Ok(Follower { child, got })
}

fn append(path: &PathBuf, line: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    writeln!(f, "{line}")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: make bench-logs"]
async fn bench_logs_followers() -> Result<()> {
    let followers: usize = std::env::var("BENCH_FOLLOWERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    let pki = tb.pki.clone().context("pki")?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let kubelet_port = e2e::ports::free_port()?;
    let opts = DaemonOptions {
        env: vec![
            ("COCOON_SIM_BOOT_MS".into(), "0".into()),
            ("COCOON_SIM_LEASE_DELAY_MS".into(), "0".into()),
        ],
        ..DaemonOptions::default()
    };
    let d = daemon::start(&tb, &opts, &journal, e2e::ports::free_port()?, kubelet_port)?;
    let pid = d.proc.pid();
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);

    eprintln!("[bench] {FOLLOWED} pods to follow");
    let mut logs = Vec::new();
    for i in 0..FOLLOWED {
        create_pod(&pods, &run_pod(&format!("followed-{i}"))?).await?;
    }
    for i in 0..FOLLOWED {
        let name = format!("followed-{i}");
        let p = wait_ready(&pods, &name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(40))?;
        let vm = annotation(&p, "vm.cocoonstack.io/id").context("vm id")?;
        logs.push((
            name,
            sim.root
                .join("log/cloudhypervisor")
                .join(&vm)
                .join("cloud-hypervisor.log"),
        ));
    }
    // Let the daemon's published view catch up before anyone follows (it lags by ≤ 1 s).
    tokio::time::sleep(Duration::from_secs(2)).await;

    eprintln!("[bench] baseline: {BATCH} pods create → Ready, no followers");
    let quiet_from = now_ms();
    let quiet = batch_to_ready(&pods, "quiet").await?;
    let quiet_to = now_ms();
    let (cpu0, rss_idle) = usage(pid)?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cpu_idle = (usage(pid)?.0 - cpu0) / t0.elapsed().as_secs_f64();

    eprintln!("[bench] starting {followers} followers");
    let mut fs = Vec::new();
    for i in 0..followers {
        fs.push((
            i % FOLLOWED,
            follow(kubelet_port, &pki, &logs[i % FOLLOWED].0)?,
        ));
    }
    // Every follower has its first line (the tail) before the lines are counted.
    let warm = fs.iter().map(|(_, f)| f.got.clone()).collect::<Vec<_>>();
    for (i, (name, log)) in logs.iter().enumerate() {
        append(log, &format!("warm-{i}"))?;
        let _ = name;
    }
    until("every follower streaming", LIMIT, || async {
        Ok(warm
            .iter()
            .all(|g| g.lock().unwrap().keys().any(|l| l.starts_with("warm-")))
            .then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    eprintln!(
        "[bench] appending {LINES} lines to each of {FOLLOWED} logs, one every {} ms, while {BATCH} pods are created",
        LINE_EVERY.as_millis()
    );
    let (cpu1, _) = usage(pid)?;
    let t1 = Instant::now();
    let written: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let w = written.clone();
    let paths: Vec<PathBuf> = logs.iter().map(|(_, p)| p.clone()).collect();
    let writer = tokio::spawn(async move {
        for n in 0..LINES {
            for (i, p) in paths.iter().enumerate() {
                let line = format!("line-{i}-{n}");
                w.lock().unwrap().insert(line.clone(), Instant::now());
                append(p, &line)?;
            }
            tokio::time::sleep(LINE_EVERY).await;
        }
        anyhow::Ok(())
    });
    let busy_from = now_ms();
    let busy = batch_to_ready(&pods, "busy").await?;
    let busy_to = now_ms();
    writer.await??;
    let mut rss_busy = 0;
    // The last lines need a moment to reach everyone; RSS is sampled meanwhile.
    let expected: Vec<Vec<String>> = (0..FOLLOWED)
        .map(|i| (0..LINES).map(|n| format!("line-{i}-{n}")).collect())
        .collect();
    until("every line at every follower", LIMIT, || {
        rss_busy = rss_busy.max(usage(pid).map(|u| u.1).unwrap_or(0));
        let done = fs.iter().all(|(i, f)| {
            let g = f.got.lock().unwrap();
            expected[*i].iter().all(|l| g.contains_key(l))
        });
        async move { Ok(done.then_some(())) }
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let busy_secs = t1.elapsed().as_secs_f64();
    let cpu_busy = (usage(pid)?.0 - cpu1) / busy_secs;

    let written = written.lock().unwrap().clone();
    let mut delivery: Vec<f64> = Vec::new();
    for (_, f) in &fs {
        for (line, at) in f.got.lock().unwrap().iter() {
            if let Some(w) = written.get(line) {
                delivery.push(at.duration_since(*w).as_secs_f64() * 1e3);
            }
        }
    }
    delivery.sort_by(f64::total_cmp);
    ensure!(
        delivery.len() == followers * LINES,
        "{} deliveries, {} expected",
        delivery.len(),
        followers * LINES
    );
    for (_, mut f) in fs {
        let _ = f.child.kill().await;
    }

    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!("bench-logs: {followers} followers over {FOLLOWED} pods, {LINES} lines each");
    println!(
        "  daemon RSS: {:.1} MiB idle, {:.1} MiB peak with followers",
        mib(rss_idle),
        mib(rss_busy)
    );
    println!(
        "  daemon CPU: {:.1}% of a core idle, {:.1}% with followers ({:.0} lines/s delivered)",
        cpu_idle * 100.0,
        cpu_busy * 100.0,
        (followers * LINES) as f64 / busy_secs
    );
    println!(
        "  line appended → at the follower: p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms",
        percentile(&delivery, 0.5),
        percentile(&delivery, 0.95),
        percentile(&delivery, 1.0)
    );
    for (what, v, from, to) in [
        ("no followers", &quiet, quiet_from, quiet_to),
        ("with followers", &busy, busy_from, busy_to),
    ] {
        let writes = status_writes(&journal, from, to)?;
        println!(
            "  {BATCH} pods, {what}: create → Ready p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms; \
             {} status writes p50 {:.0} ms, p95 {:.0} ms, max {:.0} ms",
            percentile(v, 0.5),
            percentile(v, 0.95),
            percentile(v, 1.0),
            writes.len(),
            percentile(&writes, 0.5),
            percentile(&writes, 0.95),
            percentile(&writes, 1.0)
        );
    }
    Ok(())
}
