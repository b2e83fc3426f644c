//! `make bench-e2e`: N pods (BENCH_PODS, default 200) created at once on the real testbed with
//! zero-boot VMs whose guests share one simulator hub process and listen on loopback addresses.
//! First the same N pods go to a null node (`e2e::null_node`: an agent in this process that
//! only registers, renews its Lease, writes one Ready status per pod and deletes the deleted),
//! through the same kube-scheduler: what this control plane does without the daemon, the
//! ceiling the daemon's mass create and delete are measured against. Then the daemon's run.
//! Measures — never asserts — pods Ready per second and deleted pods gone per second (from
//! the first call to the last pod seen by a watch), where each pod's time goes (the watch's
//! receive times, the null node's and the daemon's own journal), API writes per pod
//! lifecycle, daemon RSS and CPU at steady state, and VM-vanished → pod Failed latency. The
//! one assertion: the daemon's node Lease never misses a renewal while the pods are created
//! (N17). It ends with one table of the scale goals beside what the run measured, replay
//! --verify of a synthetic 1,000-pod journal and of the run's own included (`make bench-all`
//! runs it at 1,000 pods, release). `BENCH_SCHEDULER_QPS=500` (or `500/1000`, qps/burst)
//! raises kube-scheduler's API client limit from its default (qps 50, burst 100).

use e2e::daemon;
#[path = "support/bench_stages.rs"]
mod bench_stages;
#[path = "support/journal_stages.rs"]
mod journal_stages;
#[path = "support/mass.rs"]
mod mass;
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, percentile, phase, pod_manifest, terminated_reason, usage, watch_for, DaemonOptions,
};
use e2e::null_node::{self, NullNode, PodTrace, Writes};
use e2e::scheduler::{ClientConnection, DEFAULT_CLIENT};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use journal_stages::{Latencies, Replay};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use mass::{create_until_ready, delete_until_gone, Mass, PodWatch};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const NULL_NODE: &str = "null-node";
/// The label that tells the two runs' pods apart, for each run's watch.
const RUN_LABEL: &str = "bench-run";
/// Longest wait for the vanished pods' objects to go.
const LIMIT: Duration = Duration::from_secs(600);

/// Bytes on disk and lines (two per reduced event) of every journal file in `dir`.
fn journal_size(dir: &Path) -> Result<(u64, u64)> {
    let (mut bytes, mut lines) = (0, 0);
    for f in std::fs::read_dir(dir)? {
        let raw = std::fs::read(f?.path())?;
        bytes += raw.len() as u64;
        let text = vk_cocoon::journal::frame::lines_of_file(&raw).unwrap_or_else(|(t, _)| t);
        lines += text.iter().filter(|b| **b == b'\n').count() as u64;
    }
    Ok((bytes, lines))
}

/// kube-scheduler's client limit for this run: `BENCH_SCHEDULER_QPS` unset (or `default`)
/// keeps its default, `QPS` raises it with twice as much burst, `QPS/BURST` sets both.
fn scheduler_client() -> Result<Option<ClientConnection>> {
    let v = std::env::var("BENCH_SCHEDULER_QPS").unwrap_or_default();
    let v = v.trim();
    if v.is_empty() || v == "default" {
        return Ok(None);
    }
    let (qps, burst) = match v.split_once('/') {
        Some((q, b)) => (q.trim().parse::<f32>()?, Some(b.trim().parse::<u32>()?)),
        None => (v.parse::<f32>()?, None),
    };
    ensure!(
        qps > 0.0,
        "BENCH_SCHEDULER_QPS: qps must be positive, not {v:?}"
    );
    Ok(Some(ClientConnection {
        qps,
        burst: burst.unwrap_or((qps * 2.0).ceil() as u32),
    }))
}

/// A bench pod: `pod_manifest`'s shape (placed on `node` by the pool label and a hostname
/// affinity), its VM named after it, labelled with its run.
fn manifest(name: &str, node: &str, run: &str) -> Result<Pod> {
    let mut p = pod_manifest(
        NS,
        name,
        node,
        json!({"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/name": format!("vk-{name}"),
            "cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"}),
    )?;
    p.metadata.labels = Some([(RUN_LABEL.to_string(), run.to_string())].into());
    Ok(p)
}

/// kube-scheduler's rate-limiter wait so far: (s, requests).
async fn limiter(tb: &Testbed) -> Result<(f64, f64)> {
    let s = tb
        .scheduler
        .as_ref()
        .context("testbed without kube-scheduler")?;
    s.rate_limiter_wait().await
}

async fn limiter_since(tb: &Testbed, before: (f64, f64)) -> Result<(f64, f64)> {
    let now = limiter(tb).await?;
    Ok((now.0 - before.0, now.1 - before.1))
}

/// `S s over N requests`, of a rate-limiter wait.
fn waited(w: (f64, f64)) -> String {
    format!("{:.2} s in all over {:.0} requests", w.0, w.1)
}

/// The null node's run.
struct NullRun {
    mass: Mass,
    /// By `namespace/name`.
    traces: HashMap<String, PodTrace>,
    writes: Writes,
    /// kube-scheduler's rate-limiter wait while the pods were created: (s, requests).
    limiter: (f64, f64),
}

/// The same N pods, placed by the scheduler on the null node by its label alone, created at
/// once, then deleted at once; the null node's Node is deleted afterwards.
async fn null_node_run(tb: &Testbed, n: usize) -> Result<NullRun> {
    let client = &tb.client()?;
    let node = NullNode::start(client.clone(), NULL_NODE).await?;
    null_node::untainted(client, NULL_NODE, Duration::from_secs(60)).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let watch = PodWatch::start(api.clone(), &format!("{RUN_LABEL}=null")).await?;
    let names: Vec<String> = (0..n).map(|i| format!("null-{i:04}")).collect();
    let pods = names
        .iter()
        .map(|name| {
            let mut p = manifest(name, NULL_NODE, "null")?;
            p.spec.as_mut().context("spec")?.node_selector = Some(node.node_selector());
            Ok(p)
        })
        .collect::<Result<Vec<_>>>()?;
    let before = limiter(tb).await?;
    let (created, all_ready) = create_until_ready(&api, &watch, pods).await?;
    let limiter = limiter_since(tb, before).await?;
    let (deleted, all_gone) = delete_until_gone(&api, &watch, &names).await?;
    let run = NullRun {
        mass: Mass {
            created,
            all_ready,
            deleted,
            all_gone,
            seen: watch.seen(),
        },
        traces: node.traces(),
        writes: node.writes(),
        limiter,
    };
    node.stop().await?;
    Ok(run)
}

/// The daemon at steady state: CPU and memory, what its journal grows by, `/metrics` time.
struct Steady {
    secs: f64,
    cpu_percent: f64,
    rss: u64,
    bytes: u64,
    lines: u64,
    scrape_ms: Vec<f64>,
    scrape_timeouts: usize,
}

/// Nothing changes for BENCH_STEADY_SECONDS (30); the daemon is sampled around it.
async fn steady_state(d: &daemon::Daemon, journal_dir: &Path, metrics_port: u16) -> Result<Steady> {
    let steady = Duration::from_secs(
        std::env::var("BENCH_STEADY_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    );
    // The first sweep after the pods came up journals the whole VM list; every later one finds
    // it in the journal's compression window and costs a few hundred bytes. Steady state
    // starts after that first sweep (every 30 s).
    tokio::time::sleep(Duration::from_secs(31)).await;
    let (bytes0, lines0) = journal_size(journal_dir)?;
    let (cpu0, _) = usage(d.proc.pid())?;
    tokio::time::sleep(steady).await;
    let (cpu1, rss) = usage(d.proc.pid())?;
    let (bytes1, lines1) = journal_size(journal_dir)?;
    let mut scrape_ms = Vec::new();
    // A scrape that takes longer than the client's timeout is a figure too, not the end.
    let mut scrape_timeouts = 0;
    let http = e2e::ready::http();
    for _ in 0..20 {
        let t = Instant::now();
        let got = async {
            http.get(format!("http://127.0.0.1:{metrics_port}/metrics"))
                .send()
                .await?
                .bytes()
                .await
        }
        .await;
        match got {
            Ok(_) => scrape_ms.push(t.elapsed().as_secs_f64() * 1000.0),
            Err(e) if e.is_timeout() => scrape_timeouts += 1,
            Err(e) => return Err(e.into()),
        }
    }
    scrape_ms.sort_by(|a, b| a.total_cmp(b));
    let secs = steady.as_secs_f64();
    Ok(Steady {
        secs,
        cpu_percent: (cpu1 - cpu0) / secs * 100.0,
        rss,
        bytes: bytes1 - bytes0,
        lines: lines1 - lines0,
        scrape_ms,
        scrape_timeouts,
    })
}

/// Every renewTime the daemon's node Lease shows from now on.
fn watch_renewals(client: kube::Client) -> (Arc<Mutex<Vec<i64>>>, tokio::task::JoinHandle<()>) {
    let renewals: Arc<Mutex<Vec<i64>>> = Arc::default();
    let api: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let task = tokio::spawn({
        let renewals = renewals.clone();
        async move {
            let cfg =
                kube::runtime::watcher::Config::default().fields(&format!("metadata.name={NODE}"));
            let mut s = kube::runtime::watcher(api, cfg).boxed();
            while let Some(Ok(ev)) = s.next().await {
                if let kube::runtime::watcher::Event::Apply(l)
                | kube::runtime::watcher::Event::InitApply(l) = ev
                {
                    if let Some(t) = l.spec.and_then(|s| s.renew_time) {
                        renewals.lock().unwrap().push(t.0.as_millisecond());
                    }
                }
            }
        }
    });
    (renewals, task)
}

/// VM vanished → pod Failed, ms, for each pod in `names`.
async fn vanish(tb: &Testbed, pods: &Api<Pod>, names: &[String]) -> Result<Vec<f64>> {
    let mut vanish_ms = Vec::new();
    for name in names {
        let p = pods.get(name).await?;
        let id = annotation(&p, "vm.cocoonstack.io/id").context("id")?;
        let seen = watch_for(pods.clone(), name, |p| {
            phase(p) == "Failed" && terminated_reason(p).as_deref() == Some("VMGone")
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        tb.sim
            .as_ref()
            .context("sim")?
            .run(&["sim", "fault", "vanish", &id])?;
        seen.wait("vanish evicted", Duration::from_secs(30)).await?;
        vanish_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    vanish_ms.sort_by(|a, b| a.total_cmp(b));
    Ok(vanish_ms)
}

/// The daemon's run.
struct DaemonRun {
    mass: Mass,
    steady: Steady,
    vanish_ms: Vec<f64>,
    /// `cocoon_vk_api_writes_total` by kind.
    by_kind: Vec<(String, f64)>,
    renew: Vec<i64>,
    /// kube-scheduler's rate-limiter wait while the pods were created: (s, requests).
    limiter: (f64, f64),
}

/// The daemon's N pods created at once; steady state; five VMs made to vanish; the rest
/// deleted at once.
async fn daemon_run(tb: &Testbed, n: usize, journal: &Path) -> Result<DaemonRun> {
    let metrics_port = e2e::ports::free_port()?;
    // BENCH_LAUNCHER runs the daemon under a profiler, e.g. `heaptrack -o DIR/vk-cocoon` for
    // the heap table of docs/benchmarks.md.
    let launcher = std::env::var("BENCH_LAUNCHER")
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let opts = DaemonOptions {
        env: e2e::sim::CocoonSim::at_scale_env(),
        launcher,
        ..DaemonOptions::default()
    };
    let mut d = daemon::start(tb, &opts, journal, metrics_port, e2e::ports::free_port()?)?;
    let client = tb.client()?;
    daemon::until("node lease", Duration::from_secs(60), || async {
        let leases: Api<Lease> = Api::namespaced(tb.client()?, "kube-node-lease");
        Ok(leases.get_opt(NODE).await?.map(|_| ()))
    })
    .await?;
    // As for the null node: the pods are created once the scheduler may place them.
    null_node::untainted(&client, NODE, Duration::from_secs(60))
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let (renewals, lease_task) = watch_renewals(client.clone());
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let watch = PodWatch::start(api.clone(), &format!("{RUN_LABEL}=daemon")).await?;
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i:04}")).collect();
    let pods = names
        .iter()
        .map(|name| manifest(name, NODE, "daemon"))
        .collect::<Result<Vec<_>>>()?;
    let before = limiter(tb).await?;
    let (created, all_ready) = create_until_ready(&api, &watch, pods)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let limiter = limiter_since(tb, before).await?;
    let journal_dir = journal.parent().context("dir")?;
    let steady = steady_state(&d, journal_dir, metrics_port).await?;
    let renew = renewals.lock().unwrap().clone();
    lease_task.abort();
    let (vanished, rest) = names.split_at(5.min(n));
    let vanish_ms = vanish(tb, &api, vanished).await?;
    let (deleted, all_gone) = delete_until_gone(&api, &watch, rest)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    // The vanished pods' objects too: the daemon deletes them itself.
    daemon::until("all pods gone", LIMIT, || async {
        let left = api.list(&ListParams::default()).await?.items;
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    let by_kind = daemon::metric_series(metrics_port, "cocoon_vk_api_writes_total").await?;
    d.proc.stop();
    Ok(DaemonRun {
        mass: Mass {
            created,
            all_ready,
            deleted,
            all_gone,
            seen: watch.seen(),
        },
        steady,
        vanish_ms,
        by_kind,
        renew,
        limiter,
    })
}

/// For a look at what the daemon did: `BENCH_KEEP_JOURNAL=DIR make bench-e2e`, then
/// `vk-cocoon replay --pod NS/NAME DIR/*.journal*`.
fn keep_journal(journal_dir: &Path) -> Result<()> {
    if let Some(keep) = std::env::var_os("BENCH_KEEP_JOURNAL") {
        std::fs::create_dir_all(&keep)?;
        for f in std::fs::read_dir(journal_dir)? {
            let f = f?.path();
            std::fs::copy(&f, Path::new(&keep).join(f.file_name().context("name")?))?;
        }
    }
    Ok(())
}

fn print_summary(n: usize, null: &NullRun, d: &DaemonRun, lat: &Latencies) {
    let (m, nm) = (&d.mass, &null.mass);
    let w = null.writes;
    println!("null node: {n} pods through the same kube-scheduler, one status write each");
    println!(
        "  create calls done in {:.2} s; all Ready after {:.2} s ({:.1} pods/s); {} deleted, all gone after {:.2} s ({:.1} pods/s)",
        (nm.created.done - nm.created.first) / 1000.0,
        nm.ready_after_s(),
        nm.ready_rate(),
        nm.deleted.sent.len(),
        nm.gone_after_s(),
        nm.gone_rate()
    );
    println!(
        "  its API writes: {} status, {} delete, {} lease, {} node, {} failed ({:.2} per pod)",
        w.status,
        w.delete,
        w.lease,
        w.node,
        w.failed,
        (w.status + w.delete) as f64 / n as f64
    );
    println!(
        "  kube-scheduler's requests waited on its client rate limiter: {}",
        waited(null.limiter)
    );
    println!("bench-e2e: {n} pods, zero-boot VMs, guests in one shared hub, loopback network");
    println!(
        "  create calls done in {:.2} s; all Ready after {:.2} s ({:.1} pods/s, {:.0} % of the null node's)",
        (m.created.done - m.created.first) / 1000.0,
        m.ready_after_s(),
        m.ready_rate(),
        m.ready_rate() / nm.ready_rate() * 100.0
    );
    println!(
        "  {} deleted at once: all gone after {:.2} s ({:.1} pods/s; {:.0} % of the null node's)",
        m.deleted.sent.len(),
        m.gone_after_s(),
        m.gone_rate(),
        m.gone_rate() / nm.gone_rate() * 100.0
    );
    println!(
        "  kube-scheduler's requests waited on its client rate limiter: {}",
        waited(d.limiter)
    );
    println!(
        "  create -> Ready (daemon journal, ms): p50 {:.0}  p99 {:.0}  max {:.0}  ({} pods)",
        percentile(&lat.total, 0.5),
        percentile(&lat.total, 0.99),
        lat.total.last().copied().unwrap_or(f64::NAN),
        lat.total.len()
    );
    println!(
        "  of which the daemon's own reduce time (µs): p50 {:.0}  p99 {:.0}",
        percentile(&lat.share_us, 0.5),
        percentile(&lat.share_us, 0.99)
    );
    println!(
        "  of which daemon overhead (not in cocoon calls or probe waits, ms): p50 {:.0}  p99 {:.0}",
        percentile(&lat.overhead, 0.5),
        percentile(&lat.overhead, 0.99)
    );
    let writes: f64 = d.by_kind.iter().map(|(_, v)| v).sum();
    println!(
        "  API writes per pod lifecycle: {:.2} ({})",
        writes / n as f64,
        d.by_kind
            .iter()
            .map(|(k, v)| format!("{k} {:.2}", v / n as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let s = &d.steady;
    println!(
        "  daemon at steady state ({:.0} s): RSS {:.1} MiB, CPU {:.2} % of a core",
        s.secs,
        s.rss as f64 / 1048576.0,
        s.cpu_percent
    );
    println!(
        "  journal at steady state: {:.2} events/s, {:.0} B/s ({:.1} MiB/day)",
        s.lines as f64 / 2.0 / s.secs,
        s.bytes as f64 / s.secs,
        s.bytes as f64 / s.secs * 86400.0 / 1048576.0
    );
    println!(
        "  /metrics scrape (ms): p50 {:.1}  max {:.1}  ({} of 20 timed out after 10 s)",
        percentile(&s.scrape_ms, 0.5),
        s.scrape_ms.last().copied().unwrap_or(f64::NAN),
        s.scrape_timeouts
    );
    println!(
        "  VM vanished -> pod Failed/VMGone (ms): p50 {:.0}  max {:.0}",
        percentile(&d.vanish_ms, 0.5),
        d.vanish_ms.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  node Lease renewals seen: {}, largest gap {} ms",
        d.renew.len(),
        max_gap(&d.renew)
    );
}

fn max_gap(renew: &[i64]) -> i64 {
    renew.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// A row of the table: the figure, the goal, what this run measured.
type Row = (&'static str, String, String);

/// The mass create and delete rows: the daemon's rates beside the null node's.
fn mass_rows(sched: &str, null: &NullRun, d: &DaemonRun) -> Vec<Row> {
    let (m, nm) = (&d.mass, &null.mass);
    vec![
        ("kube-scheduler's API client", "-".into(), sched.to_string()),
        (
            "kube-scheduler's rate-limiter wait in the create: null node / daemon",
            "-".into(),
            format!("{} / {}", waited(null.limiter), waited(d.limiter)),
        ),
        (
            "null node (same control plane): pods Ready per second",
            "-".into(),
            format!(
                "{:.1} (all Ready after {:.1} s)",
                nm.ready_rate(),
                nm.ready_after_s()
            ),
        ),
        (
            "mass create: pods Ready per second",
            "≥ 100".into(),
            format!(
                "{:.1} (all Ready after {:.1} s)",
                m.ready_rate(),
                m.ready_after_s()
            ),
        ),
        (
            "mass create: the daemon's rate / the null node's",
            "≥ 90 %".into(),
            format!("{:.0} %", m.ready_rate() / nm.ready_rate() * 100.0),
        ),
        (
            "null node: deleted pods gone per second",
            "-".into(),
            format!(
                "{:.1} (all gone after {:.1} s)",
                nm.gone_rate(),
                nm.gone_after_s()
            ),
        ),
        (
            "mass delete: pods gone per second",
            "≥ the create rate".into(),
            format!(
                "{:.1} ({} pods, all gone after {:.1} s; {:.0} % of the create rate)",
                m.gone_rate(),
                m.deleted.sent.len(),
                m.gone_after_s(),
                m.gone_rate() / m.ready_rate() * 100.0
            ),
        ),
    ]
}

/// The scale goals, one row each: the figure, the goal, what this run measured.
fn table(sched: &str, null: &NullRun, d: &DaemonRun, lat: &Latencies, r: &Replay) -> Vec<Row> {
    let s = &d.steady;
    let ms = |v: &[f64]| format!("{:.0} / {:.0} ms", percentile(v, 0.5), percentile(v, 0.99));
    let mut rows: Vec<Row> = vec![
        (
            "steady state: daemon CPU",
            "≤ 2 % of a core".into(),
            format!("{:.2} %", s.cpu_percent),
        ),
        (
            "steady state: daemon RSS",
            "≤ 32 MiB".into(),
            format!("{:.1} MiB", s.rss as f64 / 1048576.0),
        ),
        (
            "steady state: journal growth",
            "≤ 50 MiB/day".into(),
            format!(
                "{:.1} MiB/day",
                s.bytes as f64 / s.secs * 86400.0 / 1048576.0
            ),
        ),
        (
            "steady state: /metrics scrape p50",
            "≤ 10 ms".into(),
            format!("{:.1} ms", percentile(&s.scrape_ms, 0.5)),
        ),
    ];
    rows.extend(mass_rows(sched, null, d));
    rows.extend([
        ("create → Ready p50 / p99", "-".into(), ms(&lat.total)),
        (
            "daemon's own share (reduce) p50 / p99",
            "≤ 5 / 20 ms".into(),
            format!(
                "{:.0} / {:.0} µs",
                percentile(&lat.share_us, 0.5),
                percentile(&lat.share_us, 0.99)
            ),
        ),
        (
            "create → Ready not in cocoon or probes p50 / p99",
            "-".into(),
            ms(&lat.overhead),
        ),
        (
            "VM vanished → pod Failed p99",
            "≤ 50 ms".into(),
            format!("{:.0} ms", percentile(&d.vanish_ms, 0.99)),
        ),
        (
            "replay --verify, synthetic 1,000-pod journal",
            "≥ 1 M events/s".into(),
            format!("{:.0} k events/s", r.synthetic_rate / 1000.0),
        ),
        (
            "replay --verify, this run's journal",
            "-".into(),
            format!(
                "{:.0} k events/s ({} events)",
                r.run_rate / 1000.0,
                r.run_events
            ),
        ),
        (
            "journal bytes per lifecycle event (synthetic)",
            "≤ 200".into(),
            format!("{:.0}", r.synthetic_bytes),
        ),
        (
            "journal bytes per event (this run)",
            "-".into(),
            format!("{:.0}", r.run_bytes as f64 / r.run_events.max(1) as f64),
        ),
    ]);
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: run with `make bench-e2e`"]
async fn bench_many_pods() -> Result<()> {
    let n: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let client_limit = scheduler_client()?;
    let opts = TestbedOptions::control_plane()
        .with_sim()
        .with_scheduler_client(client_limit);
    let tb = Testbed::start(opts).await?;
    let sched = match client_limit {
        None => format!("{DEFAULT_CLIENT}: its default, a stock cluster's"),
        Some(c) => format!("{c}: raised (BENCH_SCHEDULER_QPS)"),
    };
    let null = null_node_run(&tb, n).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon_run(&tb, n, &journal).await?;
    let journal_dir = journal.parent().context("dir")?;
    keep_journal(journal_dir)?;
    let replay = journal_stages::replay_figures(journal_dir)?;
    let lat = journal_stages::create_to_ready(&journal)?;

    println!("kube-scheduler's API client: {sched}");
    print_summary(n, &null, &d, &lat);
    bench_stages::print_stages(
        &bench_stages::null_steps(&null.mass, &null.traces),
        &bench_stages::daemon_steps(&d.mass, &lat),
    );
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("\n| {n} pods, {build} build | goal | measured |\n|---|---|---|");
    for (figure, goal, measured) in table(&sched, &null, &d, &lat, &replay) {
        println!("| {figure} | {goal} | {measured} |");
    }
    let gap = max_gap(&d.renew);
    ensure!(
        d.renew.len() >= 2,
        "too few Lease renewals observed to judge"
    );
    ensure!(
        gap < 20_000,
        "the node Lease missed a renewal: a gap of {gap} ms (renewals every 10 s)"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}
