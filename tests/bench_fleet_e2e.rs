//! `make bench-fleet`: what a fleet of daemons costs the apiserver, as the apiserver counts it.
//! FLEET_NODES (20) daemons on one testbed, each a virtual node with a cocoon simulator root
//! of its own (zero-boot VMs, guests in one hub process per root), its own metrics and kubelet
//! ports, and its own node identity (a `system:node:<node>` client certificate, as a
//! kubelet's), so API Priority and Fairness can attribute its requests
//! (`e2e::apiserver_metrics`). FLEET_PODS (50) pods pinned to each node. Phases: every daemon
//! up and idle for FLEET_STEADY_SECS (60), all pods created at once until every one is Ready,
//! FLEET_STEADY_SECS with the pods running, then all deleted until every one is gone.
//! Per node it prints requests per minute by kind in each phase, the watch events and bytes it
//! receives, the pod writes per pod lifecycle, and the figures a kubelet spends beside them;
//! then the whole apiserver's view and an extrapolation to 5,000 hosts × 100 pods
//! (docs/bench-fleet.md). A bench: it measures and prints; it asserts only that every pod goes
//! Ready and then away, and that each node's watch carries its own pods alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::apiserver_metrics::{self as am, CountedWatch, Metrics, Tally, NODE_KINDS, OTHER};
use e2e::daemon::{self, Daemon, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const NS: &str = "default";
/// What a kubelet writes per minute when nothing changes: its Lease every 10 s and its node
/// status every 5 minutes (nodeStatusReportFrequency), docs/bench-fleet.md.
const KUBELET_WRITES_PER_MIN: f64 = 6.0 + 0.2;

struct Settings {
    nodes: usize,
    pods: usize,
    steady: Duration,
}

fn env_number(name: &str, default: usize) -> usize {
    let set = std::env::var(name).ok().and_then(|v| v.parse().ok());
    set.unwrap_or(default)
}

/// One daemon of the fleet, and the watch that receives what its pod watch does.
struct Member {
    node: String,
    daemon: Daemon,
    metrics_port: u16,
    /// The node's own identity, for checking what the apiserver lets it read.
    client: kube::Client,
    watch: CountedWatch,
}

fn node_name(i: usize) -> String {
    format!("fleet-{i:02}")
}

/// Every node: its simulator root, identity, FlowSchemas and daemon; returns once every
/// node holds its Lease.
async fn start_fleet(tb: &mut Testbed, s: &Settings) -> Result<Vec<Member>> {
    let t0 = Instant::now();
    for i in 0..s.nodes {
        tb.add_host(&node_name(i))?;
    }
    let admin = tb.client()?;
    let pki = tb.pki.as_ref().context("testbed without a PKI")?;
    let url = tb.apiserver.as_ref().context("no apiserver")?.url.clone();
    let mut fleet = Vec::new();
    for i in 0..s.nodes {
        let node = node_name(i);
        let user = format!("system:node:{node}");
        // Not `Pki::issue_node`'s files: the launch issues those again for the peer API.
        let cert = pki.issue_client(&format!("api-{node}"), &user, &["system:nodes"])?;
        let kubeconfig = tb.run_dir().join(format!("{node}.kubeconfig"));
        e2e::kubeconfig::write_for(&kubeconfig, &url, pki, &cert)?;
        am::attribute(&admin, &node, &user, NODE_KINDS).await?;
        let mut env = e2e::sim::CocoonSim::at_scale_env();
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        let opts = DaemonOptions {
            node: node.clone(),
            env,
            host: Some(node.clone()),
            ..DaemonOptions::default()
        };
        let journal = tb.run_dir().join(&node).join("journal/events.journal");
        let metrics_port = e2e::ports::free_port()?;
        let kubelet_port = e2e::ports::free_port()?;
        let d = daemon::start(tb, &opts, &journal, metrics_port, kubelet_port)?;
        fleet.push(Member {
            client: e2e::kube::client(&kubeconfig).await?,
            watch: am::count_pods(admin.clone(), &format!("spec.nodeName={node}")),
            node,
            daemon: d,
            metrics_port,
        });
    }
    e2e::step!(
        "fleet: {} daemons started; waiting for their Leases",
        s.nodes
    );
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    daemon::until("every node Lease", Duration::from_secs(180), || async {
        // No other node runs on this testbed.
        let held = leases.list(&ListParams::default()).await?.items.len();
        Ok((held == s.nodes).then_some(()))
    })
    .await
    .with_context(|| fleet[0].daemon.proc.log_tail(40))?;
    let took = t0.elapsed().as_secs_f64();
    e2e::step!("fleet: every node up after {took:.1}s");
    Ok(fleet)
}

/// Everything measured at one moment.
struct Snapshot {
    at: Instant,
    api: Metrics,
    /// Per node, in fleet order: what its watch received.
    watches: Vec<Tally>,
    /// The watch of every pod: each pod change once.
    all: Tally,
    /// Per node: `cocoon_vk_api_writes_total` by kind.
    writes: Vec<BTreeMap<String, f64>>,
    /// Per node: the daemon's (CPU seconds, RSS bytes).
    usage: Vec<(f64, u64)>,
}

async fn snapshot(tb: &Testbed, fleet: &[Member], all: &CountedWatch) -> Result<Snapshot> {
    let mut writes = Vec::new();
    let mut usage = Vec::new();
    for m in fleet {
        let series = daemon::metric_series(m.metrics_port, "cocoon_vk_api_writes_total").await?;
        writes.push(
            series
                .into_iter()
                .map(|(l, v)| (l.trim_start_matches("kind=").trim_matches('"').into(), v))
                .collect(),
        );
        usage.push(daemon::usage(m.daemon.proc.pid())?);
    }
    Ok(Snapshot {
        at: Instant::now(),
        api: Metrics::scrape(&tb.client()?).await?,
        watches: fleet.iter().map(|m| m.watch.tally()).collect(),
        all: all.tally(),
        writes,
        usage,
    })
}

/// What happened between two snapshots.
struct Phase {
    name: &'static str,
    minutes: f64,
    api: Metrics,
    /// Per node: requests by kind.
    requests: Vec<BTreeMap<&'static str, f64>>,
    watches: Vec<Tally>,
    all: Tally,
    writes: Vec<BTreeMap<String, f64>>,
}

fn phase(name: &'static str, a: &Snapshot, b: &Snapshot, fleet: &[Member]) -> Phase {
    let api = b.api.since(&a.api);
    let requests = fleet
        .iter()
        .map(|m| am::attributed(&api, &m.node, NODE_KINDS))
        .collect();
    let writes = b
        .writes
        .iter()
        .zip(&a.writes)
        .map(|(after, before)| {
            after
                .iter()
                .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
                .collect()
        })
        .collect();
    let watches = b.watches.iter().zip(&a.watches);
    Phase {
        name,
        minutes: (b.at - a.at).as_secs_f64() / 60.0,
        requests,
        watches: watches.map(|(x, y)| x.since(y)).collect(),
        all: b.all.since(&a.all),
        writes,
        api,
    }
}

/// Mean and max over the nodes of `f`.
fn spread(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = values.collect();
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    (mean, v.iter().copied().fold(f64::NAN, f64::max))
}

fn writes_of(requests: &BTreeMap<&'static str, f64>) -> f64 {
    am::writes(requests, NODE_KINDS)
}

fn reads_of(requests: &BTreeMap<&'static str, f64>) -> f64 {
    am::reads(requests, NODE_KINDS)
}

/// Requests per node by kind, one column per phase: mean (max over the nodes), per minute
/// or, with `per_minute` false, in the whole phase.
fn print_requests(phases: &[Phase], per_minute: bool) {
    let unit = ["in the whole phase", "per minute"][per_minute as usize];
    println!("\nrequests per node {unit}, by kind: mean over the nodes (max)");
    let head: Vec<String> = phases
        .iter()
        .map(|p| format!("{} ({:.0} s)", p.name, p.minutes * 60.0))
        .collect();
    println!("| request | {} |", head.join(" | "));
    println!("|---|{}", "---|".repeat(phases.len()));
    let mut names: Vec<&str> = NODE_KINDS.iter().map(|k| k.name).collect();
    names.push(OTHER);
    let cell = |p: &Phase, f: &dyn Fn(&BTreeMap<&'static str, f64>) -> f64| {
        let per = if per_minute { p.minutes } else { 1.0 };
        let (mean, max) = spread(p.requests.iter().map(|r| f(r) / per));
        format!("{mean:.2} ({max:.1})")
    };
    for name in names {
        let row: Vec<String> = phases
            .iter()
            .map(|p| cell(p, &|r| r.get(name).copied().unwrap_or(0.0)))
            .collect();
        if row.iter().any(|c| !c.starts_with("0.00 (0.0)")) {
            println!("| {name} | {} |", row.join(" | "));
        }
    }
    let reads: Vec<String> = phases.iter().map(|p| cell(p, &reads_of)).collect();
    let writes: Vec<String> = phases.iter().map(|p| cell(p, &writes_of)).collect();
    println!("| **reads** | {} |", reads.join(" | "));
    println!("| **writes** | {} |", writes.join(" | "));
}

/// What each node's watch received, and how many watchers the apiserver sent each pod change.
fn print_watches(phases: &[Phase], fleet: &[Member]) -> Result<()> {
    println!("\npod watch of one node (the daemon's selector spec.nodeName=<node>, JSON): mean over the nodes (max)");
    println!("| phase | object events | bookmarks | KiB received | watch requests | every pod's changes | pod watch events to other watchers | cluster-wide watchers per change |");
    println!("|---|---|---|---|---|---|---|---|");
    for p in phases {
        let (ev, ev_max) = spread(p.watches.iter().map(|t| t.object_events() as f64));
        let (bm, _) = spread(p.watches.iter().map(|t| bookmarks(t) as f64));
        let (kib, kib_max) = spread(p.watches.iter().map(|t| t.bytes as f64 / 1024.0));
        let (opened, _) = spread(p.requests.iter().map(|r| r["watch pods"]));
        let changes = p.all.object_events() as f64;
        let nodes: f64 = p.watches.iter().map(|t| t.object_events() as f64).sum();
        // The counting watches are watchers too; what remains went to the daemons (as much
        // as the nodes' counting watches received) and to the cluster-wide watchers:
        // kube-scheduler, kube-controller-manager and the apiserver's own informers.
        let counted: f64 = p
            .watches
            .iter()
            .chain([&p.all])
            .map(|t| (t.object_events() + bookmarks(t)) as f64)
            .sum();
        let others = p.api.watch_events("pods", "Pod").map(|(n, _)| n - counted);
        let per_change = match (others, changes > 0.0) {
            (Some(n), true) => format!("{:.2}", (n - nodes) / changes),
            _ => "-".into(),
        };
        println!(
            "| {} | {ev:.1} ({ev_max:.0}) | {bm:.1} | {kib:.1} ({kib_max:.1}) | {opened:.2} | {changes:.0} | {} | {per_change} |",
            p.name,
            others.map_or("absent".into(), |n| format!("{n:.0}")),
        );
    }
    for (i, m) in fleet.iter().enumerate() {
        let nodes: std::collections::BTreeSet<&String> = phases
            .iter()
            .flat_map(|p| p.watches[i].nodes.iter())
            .collect();
        ensure!(
            nodes.iter().all(|n| **n == m.node),
            "the watch of {} carried pods of {nodes:?}",
            m.node
        );
    }
    Ok(())
}

fn bookmarks(t: &Tally) -> u64 {
    t.events.get("BOOKMARK").copied().unwrap_or(0)
}

/// The whole apiserver's requests by verb and resource, per minute, the busiest first, and the
/// share the fleet's attributed requests make of them.
fn print_apiserver(phases: &[Phase]) {
    println!("\nthe whole apiserver (apiserver_request_total; every client), requests per minute");
    let tables: Vec<BTreeMap<String, f64>> = phases.iter().map(|p| p.api.requests()).collect();
    let mut busiest: BTreeMap<&String, f64> = BTreeMap::new();
    for (p, t) in phases.iter().zip(&tables) {
        for (k, v) in t {
            let e = busiest.entry(k).or_insert(0.0);
            *e = e.max(v / p.minutes);
        }
    }
    let mut order: Vec<(&String, f64)> = busiest.into_iter().filter(|(_, v)| *v > 0.0).collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let head: Vec<&str> = phases.iter().map(|p| p.name).collect();
    println!("| verb resource | {} |", head.join(" | "));
    println!("|---|{}", "---|".repeat(phases.len()));
    for (key, _) in order.iter().take(14) {
        let cells: Vec<String> = phases
            .iter()
            .zip(&tables)
            .map(|(p, t)| format!("{:.1}", t.get(*key).copied().unwrap_or(0.0) / p.minutes))
            .collect();
        println!("| {key} | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = phases
        .iter()
        .zip(&tables)
        .map(|(p, t)| {
            let all: f64 = t.values().sum();
            let fleet: f64 = p.requests.iter().flat_map(|r| r.values()).sum();
            let share = 100.0 * fleet / all.max(1.0);
            format!("{:.1} (fleet {share:.0} %)", all / p.minutes)
        })
        .collect();
    println!("| **all** | {} |", totals.join(" | "));
}

/// Pod writes per pod lifecycle per node, from the apiserver's attribution and from the
/// daemon's own counter; Events apart.
fn print_lifecycle(life: &Phase, pods: usize) -> (f64, f64) {
    let per_pod =
        |f: &dyn Fn(usize) -> f64| spread((0..life.requests.len()).map(|i| f(i) / pods as f64));
    let (api, api_max) = per_pod(&|i| {
        let r = &life.requests[i];
        r["patch pods/status"] + r["delete pods"]
    });
    let (events, events_max) = per_pod(&|i| life.requests[i]["create events"]);
    let (own, own_max) = per_pod(&|i| {
        let w = &life.writes[i];
        w.get("pod").copied().unwrap_or(0.0) + w.get("delete").copied().unwrap_or(0.0)
    });
    let (status, _) = per_pod(&|i| life.requests[i]["patch pods/status"]);
    let (deletes, _) = per_pod(&|i| life.requests[i]["delete pods"]);
    println!("\npod writes per pod lifecycle (create → Ready → deleted → gone), per node: mean (max); goal ≤ 4");
    println!("| source | pod writes per pod | of which status patches | deletes | Events per pod (apart) |");
    println!("|---|---|---|---|---|");
    println!("| the apiserver (FlowSchema attribution) | {api:.2} ({api_max:.2}) | {status:.2} | {deletes:.2} | {events:.2} ({events_max:.2}) |");
    println!(
        "| the daemon (cocoon_vk_api_writes_total pod + delete) | {own:.2} ({own_max:.2}) | | | |"
    );
    (api, events)
}

/// (mean, max) RSS in MiB and mean CPU % of a core of the daemons between two snapshots.
fn daemon_usage(a: &Snapshot, b: &Snapshot) -> (f64, f64, f64) {
    let secs = (b.at - a.at).as_secs_f64();
    let (rss, rss_max) = spread(b.usage.iter().map(|(_, r)| *r as f64 / 1048576.0));
    let (cpu, _) = spread(
        b.usage
            .iter()
            .zip(&a.usage)
            .map(|((c1, _), (c0, _))| (c1 - c0) / secs * 100.0),
    );
    (rss, rss_max, cpu)
}

/// RSS of the run's processes summed by program, in MiB: the simulator and the daemon by
/// what they run as (`cocoon sim hub`, `cocoon vm status`), the control plane by program.
fn rss_by_program(tb: &Testbed) -> BTreeMap<String, (usize, f64)> {
    let mut out: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (pid, cmd) in tb.processes() {
        let Ok((_, rss)) = daemon::usage(pid as u32) else {
            continue;
        };
        let words: Vec<&str> = cmd
            .split_whitespace()
            .filter(|w| !w.starts_with('-'))
            .collect();
        let program = words
            .first()
            .map_or("?", |p| p.rsplit('/').next().unwrap_or(p));
        let verb = words.iter().skip(1).take(2).copied();
        let name: Vec<&str> = match program {
            "cocoon" | "vk-cocoon" => std::iter::once(program).chain(verb).collect(),
            _ => vec![program],
        };
        let e = out.entry(name.join(" ")).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += rss as f64 / 1048576.0;
    }
    out
}

/// The measured per-node figures scaled to a cluster of 5,000 cocoon hosts × 100 pods.
struct Scale {
    steady_writes_per_min: f64,
    steady_reads_per_min: f64,
    bookmarks_per_min: f64,
    pod_writes_per_pod: f64,
    events_per_pod: f64,
    pod_event_bytes: f64,
}

fn print_extrapolation(x: &Scale) {
    let (hosts, per_host) = (5000.0, 100.0);
    let pods = hosts * per_host;
    println!("\nextrapolated to {hosts:.0} cocoon hosts × {per_host:.0} pods ({pods:.0} pods):");
    println!(
        "  steady state: {:.0} writes/s and {:.0} reads/s from the nodes (a kubelet per node: {:.0} writes/s)",
        hosts * x.steady_writes_per_min / 60.0,
        hosts * x.steady_reads_per_min / 60.0,
        hosts * KUBELET_WRITES_PER_MIN / 60.0
    );
    println!(
        "  watches: {hosts:.0} node-scoped pod watches, {:.0} bookmark events/s among them, no pod events while nothing changes",
        hosts * x.bookmarks_per_min / 60.0
    );
    println!(
        "  every pod created and deleted once: {:.1} M pod writes and {:.1} M Events from the nodes; {:.2} GiB of pod objects as JSON ({:.0} B each)",
        pods * x.pod_writes_per_pod / 1e6,
        pods * x.events_per_pod / 1e6,
        pods * x.pod_event_bytes / 1073741824.0,
        x.pod_event_bytes
    );
    println!(
        "  against the documented limits: {hosts:.0} of 5,000 nodes, {per_host:.0} of 110 pods per node, {pods:.0} of 150,000 pods ({:.1}×)",
        pods / 150_000.0
    );
}

/// Runs `call` on every item, 32 at a time, as a client creating or deleting at once would.
async fn each<T, F, Fut>(items: Vec<T>, call: F) -> Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let done = futures::stream::iter(items).map(call).buffer_unordered(32);
    done.collect::<Vec<_>>().await.into_iter().collect()
}

async fn create_all(pods: &Api<Pod>, fleet: &[Member], per_node: usize) -> Result<()> {
    let img = "ghcr.io/cocoonstack/ubuntu:24.04";
    let names: Vec<(String, String)> = (0..per_node)
        .flat_map(|p| {
            fleet
                .iter()
                .map(move |m| (m.node.clone(), format!("{}-p{p:03}", m.node)))
        })
        .collect();
    each(names, |(node, name)| async move {
        let p = daemon::pod_manifest(NS, &name, &node, json!({
            "cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/name": format!("vk-{name}"),
            "cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": img}))?;
        daemon::create_pod(pods, &p).await.map(|_| ())
    })
    .await
}

/// Waits until `done` holds of the every-pod watch's tally, printing progress every 10 s.
async fn wait_all(
    what: &str,
    all: &CountedWatch,
    limit: Duration,
    done: impl Fn(&Tally) -> (bool, String),
) -> Result<Duration> {
    let t0 = Instant::now();
    let mut said = Instant::now();
    loop {
        let (ok, progress) = done(&all.tally());
        if ok {
            return Ok(t0.elapsed());
        }
        ensure!(
            t0.elapsed() < limit,
            "{what}: not within {limit:?} ({progress})"
        );
        if said.elapsed() > Duration::from_secs(10) {
            e2e::step!(
                "{what}: {progress} after {:.0}s",
                t0.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `FLEET_KEEP_JOURNALS=DIR` copies every node's journal there before the teardown, for
/// `vk-cocoon replay --pod default/<pod> DIR/<node>/events.journal*`.
fn keep_journals(tb: &Testbed, fleet: &[Member]) -> Result<()> {
    let Some(keep) = std::env::var_os("FLEET_KEEP_JOURNALS") else {
        return Ok(());
    };
    for m in fleet {
        let to = std::path::Path::new(&keep).join(&m.node);
        std::fs::create_dir_all(&to)?;
        for f in std::fs::read_dir(tb.run_dir().join(&m.node).join("journal"))? {
            let f = f?.path();
            std::fs::copy(&f, to.join(f.file_name().context("journal file name")?))?;
        }
    }
    Ok(())
}

/// What the apiserver lets a node identity list: every pod (refused when it authorizes by
/// field selector), and its own.
async fn node_reads(m: &Member) -> (String, String) {
    let api: Api<Pod> = Api::all(m.client.clone());
    let outcome = |r: kube::Result<_>| match r {
        Ok(l) => {
            let l: kube::core::ObjectList<Pod> = l;
            format!("allowed ({} pods)", l.items.len())
        }
        Err(kube::Error::Api(s)) => format!("refused ({} {})", s.code, s.reason),
        Err(e) => format!("failed ({e})"),
    };
    let every = outcome(api.list(&ListParams::default()).await);
    let own = ListParams::default().fields(&format!("spec.nodeName={}", m.node));
    (every, outcome(api.list(&own).await))
}

/// The figures measured outside the phases' differences.
struct Outcome {
    ready: Duration,
    gone: Duration,
    /// The daemons' (mean RSS MiB, max RSS MiB, mean CPU %) idle and with the pods.
    idle: (f64, f64, f64),
    loaded: (f64, f64, f64),
    programs: BTreeMap<String, (usize, f64)>,
    /// A node identity listing every pod, and its own.
    reads: (String, String),
}

fn report(
    s: &Settings,
    fleet: &[Member],
    phases: &[Phase],
    life: &Phase,
    o: &Outcome,
) -> Result<()> {
    let build = ["release", "debug"][cfg!(debug_assertions) as usize];
    let total = s.nodes * s.pods;
    println!("\nbench-fleet: {} nodes × {} pods ({total}), {build} build, zero-boot VMs, guests in one hub per node", s.nodes, s.pods);
    println!(
        "  all {total} Ready {:.1} s after the first create call; all gone {:.1} s after the first delete call",
        o.ready.as_secs_f64(),
        o.gone.as_secs_f64()
    );
    print_requests(phases, true);
    print_requests(phases, false);
    // Both windows without pod changes make the steady state: together they hold more of
    // the node status' 60 s period than either.
    let quiet = [&phases[0], &phases[2]];
    let minutes: f64 = quiet.iter().map(|p| p.minutes).sum();
    let rate = |f: &dyn Fn(&BTreeMap<&'static str, f64>) -> f64| {
        let of = |i: usize| quiet.iter().map(|p| f(&p.requests[i])).sum::<f64>() / minutes;
        spread((0..fleet.len()).map(of))
    };
    let pod_calls = |r: &BTreeMap<&'static str, f64>| {
        let pod = ["list pods", "get pods", "patch pods/status", "delete pods"];
        pod.iter().map(|k| r[k]).sum::<f64>()
    };
    let ((w, w_max), (r, _), (pod, _)) = (rate(&writes_of), rate(&reads_of), rate(&pod_calls));
    let verdict = ["over", "within"][(w <= KUBELET_WRITES_PER_MIN) as usize];
    println!(
        "  steady state (idle and steady, {:.0} s): {w:.2} writes/min per node (max {w_max:.1}; a kubelet {KUBELET_WRITES_PER_MIN:.1}: {verdict}), {r:.2} reads/min; pod reads and writes {pod:.2}/min (goal 0)",
        minutes * 60.0
    );
    print_watches(phases, fleet)?;
    println!(
        "  a node identity listing every pod: {}; its own (spec.nodeName): {}",
        o.reads.0, o.reads.1
    );
    let (pod_writes, events) = print_lifecycle(life, s.pods);
    print_apiserver(phases);
    let mib = |(rss, max, cpu): (f64, f64, f64)| {
        format!("RSS {rss:.1} MiB (max {max:.1}), CPU {cpu:.2} % of a core")
    };
    println!(
        "\ndaemons idle: {}; with {} pods each: {}",
        mib(o.idle),
        s.pods,
        mib(o.loaded)
    );
    println!("the run's processes with the pods (RSS summed by program):");
    for (name, (n, rss)) in &o.programs {
        println!("  {name:<28} ×{n:<3} {rss:8.1} MiB");
    }
    println!("  20 daemons at this RSS: {:.0} MiB", 20.0 * o.loaded.0);
    let create = &phases[1];
    let marks: u64 = quiet
        .iter()
        .flat_map(|p| p.watches.iter().map(bookmarks))
        .sum();
    print_extrapolation(&Scale {
        steady_writes_per_min: w,
        steady_reads_per_min: r,
        bookmarks_per_min: marks as f64 / fleet.len() as f64 / minutes,
        pod_writes_per_pod: pod_writes,
        events_per_pod: events,
        pod_event_bytes: create.all.bytes as f64 / create.all.object_events().max(1) as f64,
    });
    if let Some((events, bytes)) = create.api.watch_events("pods", "Pod") {
        println!(
            "  (the apiserver sent {events:.0} pod watch events, {:.1} MiB, to all watchers during the mass create)",
            bytes / 1048576.0
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: run with `make bench-fleet`"]
async fn bench_fleet() -> Result<()> {
    let s = Settings {
        nodes: env_number("FLEET_NODES", 20),
        pods: env_number("FLEET_PODS", 50),
        steady: Duration::from_secs(env_number("FLEET_STEADY_SECS", 60) as u64),
    };
    let total = s.nodes * s.pods;
    let steady = s.steady.as_secs();
    let (nodes, est) = (s.nodes, total / 50 + 5);
    e2e::step!(
        "bench-fleet: {nodes} nodes × {} pods; testbed ~15 s, daemons ~1 s each, idle {steady} s, \
         mass create (~{est} s at 50 pods/s), steady {steady} s, delete (~{est} s)",
        s.pods
    );
    let mut tb = Testbed::start(TestbedOptions::control_plane()).await?;
    let fleet = start_fleet(&mut tb, &s).await?;
    let all = am::count_pods(tb.client()?, "");
    // The daemons' startup (registration, the first list, the first status) is not idle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle0 = snapshot(&tb, &fleet, &all).await?;
    e2e::step!("idle: every daemon up, no pods, for {steady} s");
    tokio::time::sleep(s.steady).await;
    let idle1 = snapshot(&tb, &fleet, &all).await?;
    e2e::step!("mass create: {total} pods, 32 create calls in flight");
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let t0 = Instant::now();
    create_all(&pods, &fleet, s.pods).await?;
    let took = t0.elapsed().as_secs_f64();
    e2e::step!("mass create: create calls done after {took:.1}s");
    wait_all("mass create", &all, Duration::from_secs(900), |t| {
        (t.ready() == total, format!("{}/{total} Ready", t.ready()))
    })
    .await
    .with_context(|| fleet[0].daemon.proc.log_tail(30))?;
    let ready = t0.elapsed();
    let created = snapshot(&tb, &fleet, &all).await?;
    // Writes that trail the last Ready (its Events) belong to the pods' lifecycle, not to the
    // steady state.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let steady0 = snapshot(&tb, &fleet, &all).await?;
    e2e::step!("steady state with {total} pods Ready, for {steady} s");
    tokio::time::sleep(s.steady).await;
    let steady1 = snapshot(&tb, &fleet, &all).await?;
    let programs = rss_by_program(&tb);
    e2e::step!("delete: all {total} pods");
    let t1 = Instant::now();
    let names: Vec<String> = all
        .tally()
        .pods
        .keys()
        .map(|k| k.trim_start_matches("default/").to_string())
        .collect();
    each(names, |name| {
        let pods = pods.clone();
        async move {
            Ok(pods
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())?)
        }
    })
    .await?;
    wait_all("delete", &all, Duration::from_secs(900), |t| {
        (t.pods.is_empty(), format!("{} pods left", t.pods.len()))
    })
    .await?;
    let gone = t1.elapsed();
    let end = snapshot(&tb, &fleet, &all).await?;
    let outcome = Outcome {
        ready,
        gone,
        idle: daemon_usage(&idle0, &idle1),
        loaded: daemon_usage(&steady0, &steady1),
        programs,
        reads: node_reads(&fleet[0]).await,
    };
    let phases = [
        phase("idle", &idle0, &idle1, &fleet),
        phase("mass create", &idle1, &created, &fleet),
        phase("steady", &steady0, &steady1, &fleet),
        phase("delete", &steady1, &end, &fleet),
    ];
    let life = phase("lifecycle", &idle1, &end, &fleet);
    keep_journals(&tb, &fleet)?;
    report(&s, &fleet, &phases, &life, &outcome)
}
