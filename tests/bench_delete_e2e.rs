//! Mass delete against mass create: N run-mode pods (BENCH_DELETE_PODS, default 200) created at
//! once on the testbed, then deleted with their default grace. Prints create → all Ready and
//! delete → all gone, the waits for the daemon's executor slots and the CPU each process of the
//! run spent in either, and, from the daemon's journal, where each pod's delete went: the
//! deletion seen, the `vm rm` out and back, the final status patch out and back, the grace-0
//! object delete out and back, the object gone seen. Measures, never asserts time.
//!
//! - `BENCH_DELETE_WITH`: unset, 32 API delete calls at once (`BENCH_DELETE_AT_ONCE`) as the
//!   creates; `kubectl` (`kubectl delete pods --all`); `collection` (one collection DELETE).
//! - `BENCH_DELETE_SIM=plain`: the simulator without its scale knobs (a guest process and a
//!   network namespace per VM, boot delays).
//! - `BENCH_DELETE_FOREIGN_CLAIMS=N`: the host also holds N VMs of other simulator roots.
//! - `BENCH_DELETE_SETTLE_SECONDS`: the pods run that long before the delete.
//! - `BENCH_KEEP_JOURNAL=DIR` keeps the journal for `vk-cocoon replay --pod NS/NAME DIR/*`.
//!
//! `cargo test -j2 --release -p vk-cocoon --test bench_delete_e2e -- --ignored --nocapture`

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::daemon::{self, percentile, pod_manifest, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::{Action, Event};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(600);

/// One pod's delete as the journal shows it, each a wall time in ms.
#[derive(Default, Debug)]
struct Delete {
    seen: Option<i64>,
    rm_out: Option<i64>,
    rm_done: Option<i64>,
    patch_out: Option<i64>,
    patch_done: Option<i64>,
    delete_out: Option<i64>,
    delete_done: Option<i64>,
    gone: Option<i64>,
    rm_tries: u32,
    patches: u32,
}

enum Pending {
    Rm(String),
    Patch(String),
    Delete(String),
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn deletes(dir: &Path) -> Result<(BTreeMap<String, Delete>, usize)> {
    let mut pods: BTreeMap<String, Delete> = BTreeMap::new();
    let mut ops: BTreeMap<u64, Pending> = BTreeMap::new();
    // The most `vm rm` calls out at one time.
    let (mut rm_flying, mut rm_peak) = (0usize, 0usize);
    for step in vk_cocoon::journal::Reader::open_dir(dir)?.steps() {
        let vk_cocoon::journal::Step {
            envelope, actions, ..
        } = step?;
        let at = envelope.at;
        match &envelope.event {
            Event::PodApplied { pod } | Event::PodRelistItem { pod }
                if pod.deletion_timestamp.is_some() =>
            {
                let d = pods.entry(pod.key().to_string()).or_default();
                d.seen.get_or_insert(at);
            }
            Event::PodDeleted { pod } => {
                let d = pods.entry(pod.key().to_string()).or_default();
                d.gone.get_or_insert(at);
            }
            Event::CocoonDone { op, .. } => {
                if let Some(Pending::Rm(k)) = ops.remove(op) {
                    rm_flying -= 1;
                    pods.entry(k).or_default().rm_done = Some(at);
                }
            }
            Event::KubeDone { op, .. } => match ops.remove(op) {
                Some(Pending::Patch(k)) => pods.entry(k).or_default().patch_done = Some(at),
                Some(Pending::Delete(k)) => pods.entry(k).or_default().delete_done = Some(at),
                Some(Pending::Rm(_)) | None => {}
            },
            _ => {}
        }
        for a in &actions {
            match a {
                Action::RunCocoon {
                    op,
                    key: Some(k),
                    cmd: CocoonCmd::VmRm { .. },
                    ..
                } => {
                    let d = pods.entry(k.to_string()).or_default();
                    d.rm_out.get_or_insert(at);
                    d.rm_tries += 1;
                    ops.insert(*op, Pending::Rm(k.to_string()));
                    rm_flying += 1;
                    rm_peak = rm_peak.max(rm_flying);
                }
                Action::PatchPod {
                    op,
                    key,
                    status: Some(st),
                    ..
                } if st.phase.as_str() == "Succeeded" => {
                    let d = pods.entry(key.to_string()).or_default();
                    d.patch_out.get_or_insert(at);
                    d.patches += 1;
                    ops.insert(*op, Pending::Patch(key.to_string()));
                }
                Action::DeletePod { op, key, .. } => {
                    let d = pods.entry(key.to_string()).or_default();
                    d.delete_out.get_or_insert(at);
                    ops.insert(*op, Pending::Delete(key.to_string()));
                }
                _ => {}
            }
        }
    }
    Ok((pods, rm_peak))
}

/// p50 / p99 / max of `f` over the pods where it is known.
fn spread(pods: &BTreeMap<String, Delete>, f: impl Fn(&Delete) -> Option<i64>) -> String {
    let mut v: Vec<f64> = pods.values().filter_map(&f).map(|x| x as f64).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "p50 {:>6.0}  p99 {:>6.0}  max {:>6.0}  ({} pods)",
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    )
}

/// The daemon's M6 queue waits so far, by lane: (sum in s, count).
async fn queue_waits(port: u16) -> Result<BTreeMap<String, (f64, f64)>> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let name = "cocoon_vk_action_queue_wait_seconds";
    for (labels, v) in daemon::metric_series(port, &format!("{name}_sum")).await? {
        out.entry(labels).or_default().0 = v;
    }
    for (labels, v) in daemon::metric_series(port, &format!("{name}_count")).await? {
        out.entry(labels).or_default().1 = v;
    }
    Ok(out)
}

/// Mean wait per action between two readings, by lane.
fn mean_waits(a: &BTreeMap<String, (f64, f64)>, b: &BTreeMap<String, (f64, f64)>) -> String {
    b.iter()
        .map(|(k, (s1, c1))| {
            let (s0, c0) = a.get(k).copied().unwrap_or_default();
            let n = c1 - c0;
            let ms = if n > 0.0 { (s1 - s0) / n * 1000.0 } else { 0.0 };
            format!("{k}: {n:.0} actions, {ms:.0} ms mean")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// CPU ticks (user + system) of every process of the run by name, and apart the children
/// each reaped (for the daemon: its cocoon calls).
fn cpu_ticks(tb: &Testbed, daemon_pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut procs: Vec<i32> = tb.processes().into_iter().map(|p| p.0).collect();
    procs.push(daemon_pid as i32);
    procs.sort();
    procs.dedup();
    for pid in procs {
        let (Ok(stat), Ok(comm)) = (
            std::fs::read_to_string(format!("/proc/{pid}/stat")),
            std::fs::read_to_string(format!("/proc/{pid}/comm")),
        ) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // utime, stime, cutime, cstime: fields 14-17 of proc(5), counted here from field 3.
        let own = f.get(11..13).map_or(0, |v| v.iter().sum());
        let children = f.get(13..15).map_or(0, |v| v.iter().sum());
        let comm = comm.trim().to_string();
        *out.entry(comm.clone()).or_default() += own;
        *out.entry(format!("{comm}'s children")).or_default() += children;
    }
    out
}

fn cpu_spent(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> String {
    let mut v: Vec<(u64, &String)> = b
        .iter()
        .map(|(k, t)| (t.saturating_sub(a.get(k).copied().unwrap_or(0)), k))
        .filter(|(t, _)| *t > 0)
        .collect();
    v.sort_by(|x, y| y.cmp(x));
    v.iter()
        .map(|(t, k)| format!("{k} {:.2}", *t as f64 / 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn gap(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    Some(b? - a?)
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The simulator's environment for the daemon: its scale knobs unless `plain`, and `foreign`
/// address claims of other roots in a claims directory of this run's own (other testbeds on
/// the host, or what killed runs left).
fn sim_env(tb: &Testbed, plain: bool, foreign: usize) -> Result<Vec<(String, String)>> {
    let mut env = match plain {
        true => Vec::new(),
        false => e2e::sim::CocoonSim::at_scale_env(),
    };
    if foreign > 0 {
        let dir = tb.run_dir().join("ipam");
        std::fs::create_dir_all(dir.join("ips"))?;
        for i in 0..foreign {
            let ip = format!("127.214.{}.{}", i / 250 + 1, i % 250 + 1);
            std::fs::write(
                dir.join("ips").join(ip),
                format!("/nonexistent/root-{}\nVM{i:06}\n", i % 7),
            )?;
        }
        env.push(("COCOON_SIM_IPAM_DIR".into(), dir.display().to_string()));
    }
    Ok(env)
}

/// Creates the run-mode pods `names`, 32 calls at once.
async fn create_all(pods: &Api<Pod>, names: &[String]) -> Result<()> {
    let img = "ghcr.io/cocoonstack/ubuntu:24.04";
    futures::stream::iter(names.to_vec())
        .map(|name| {
            let pods = pods.clone();
            async move {
                let p = pod_manifest(
                    NS,
                    &name,
                    NODE,
                    json!({
                        "cocoonset.cocoonstack.io/managed": "true",
                        "vm.cocoonstack.io/name": format!("vk-{name}"),
                        "cocoonset.cocoonstack.io/mode": "run",
                        "cocoonset.cocoonstack.io/image": img}),
                )?;
                daemon::create_pod(&pods, &p).await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(())
}

/// Deletes every pod of `names` with its default grace, as `BENCH_DELETE_WITH` says; returns
/// how, with the calls' own times.
async fn delete_all(tb: &Testbed, pods: &Api<Pod>, names: &[String]) -> Result<String> {
    let t = Instant::now();
    match std::env::var("BENCH_DELETE_WITH")
        .unwrap_or_default()
        .as_str()
    {
        "kubectl" => {
            let out = tokio::process::Command::new(e2e::bins::built("kubectl")?)
                .args(["delete", "pods", "--all", "-n", NS, "--wait=false"])
                .env("KUBECONFIG", tb.kubeconfig()?)
                .env("PATH", e2e::bins::path_env())
                .env("NO_PROXY", "127.0.0.1,localhost")
                .stdin(std::process::Stdio::null())
                .output()
                .await?;
            let err = String::from_utf8_lossy(&out.stderr);
            let throttled = err.lines().filter(|l| l.contains("throttling")).count();
            anyhow::ensure!(out.status.success(), "kubectl delete: {err}");
            Ok(format!(
                "kubectl delete pods --all done in {:?}; {throttled} client-side throttling \
                 lines on its stderr",
                t.elapsed()
            ))
        }
        "collection" => {
            pods.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
            Ok(format!(
                "one collection DELETE, answered in {:?}",
                t.elapsed()
            ))
        }
        _ => {
            let at_once: usize = env_num("BENCH_DELETE_AT_ONCE", 32);
            let mut call_ms = futures::stream::iter(names.to_vec())
                .map(|name| {
                    let pods = pods.clone();
                    async move {
                        let t = Instant::now();
                        pods.delete(&name, &DeleteParams::default()).await?;
                        Ok::<_, kube::Error>(t.elapsed().as_secs_f64() * 1000.0)
                    }
                })
                .buffer_unordered(at_once.max(1))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
            call_ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
            Ok(format!(
                "API delete calls, {at_once} at once, done in {:?}; each call p50 {:.0} ms, \
                 p99 {:.0} ms",
                t.elapsed(),
                percentile(&call_ms, 0.5),
                percentile(&call_ms, 0.99)
            ))
        }
    }
}

/// Where each pod's delete went, from the journal; `t1_ms` is the first delete call.
fn print_stages(all: &BTreeMap<String, Delete>, rm_peak: usize, t1_ms: i64) {
    let at = |what: &str, f: &dyn Fn(&Delete) -> Option<i64>| {
        println!("    {what:<20}{}", spread(all, |d| f(d).map(|t| t - t1_ms)));
    };
    println!("  per pod, ms from the first delete call:");
    at("deletion seen", &|d| d.seen);
    at("vm rm out", &|d| d.rm_out);
    at("vm rm back", &|d| d.rm_done);
    at("final patch out", &|d| d.patch_out);
    at("final patch back", &|d| d.patch_done);
    at("grace-0 delete out", &|d| d.delete_out);
    at("grace-0 delete back", &|d| d.delete_done);
    at("gone seen", &|d| d.gone);
    let step = |what: &str, f: &dyn Fn(&Delete) -> Option<i64>| {
        println!("    {what:<20}{}", spread(all, f));
    };
    println!("  per pod, ms in each step:");
    step("seen -> rm out", &|d| gap(d.seen, d.rm_out));
    step("vm rm", &|d| gap(d.rm_out, d.rm_done));
    step("rm -> patch out", &|d| gap(d.rm_done, d.patch_out));
    step("final patch", &|d| gap(d.patch_out, d.patch_done));
    step("patch -> delete out", &|d| gap(d.patch_done, d.delete_out));
    step("grace-0 delete", &|d| gap(d.delete_out, d.delete_done));
    step("delete -> gone seen", &|d| gap(d.delete_done, d.gone));
    step("seen -> gone seen", &|d| gap(d.seen, d.gone));
    let retried = all.values().filter(|d| d.rm_tries > 1).count();
    let repatched = all.values().filter(|d| d.patches > 1).count();
    println!(
        "  vm rm calls out at once: at most {rm_peak}; pods whose vm rm was retried: {retried}; \
         whose final patch was written more than once: {repatched}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: BENCH_DELETE_PODS pods on the testbed"]
async fn bench_mass_delete() -> Result<()> {
    let n: usize = env_num("BENCH_DELETE_PODS", 200);
    let plain = std::env::var("BENCH_DELETE_SIM").is_ok_and(|v| v == "plain");
    let foreign: usize = env_num("BENCH_DELETE_FOREIGN_CLAIMS", 0);
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let opts = DaemonOptions {
        env: sim_env(&tb, plain, foreign)?,
        ..DaemonOptions::default()
    };
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    daemon::until("node lease", Duration::from_secs(60), || async {
        let leases: Api<Lease> = Api::namespaced(tb.client()?, "kube-node-lease");
        Ok(leases.get_opt(NODE).await?.map(|_| ()))
    })
    .await?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let (waits0, cpu0) = (
        queue_waits(metrics_port).await?,
        cpu_ticks(&tb, d.proc.pid()),
    );
    let names: Vec<String> = (0..n).map(|i| format!("del-{i:04}")).collect();
    let t0 = Instant::now();
    create_all(&pods, &names).await?;
    daemon::until(&format!("{n} pods Ready"), LIMIT, || async {
        let list = pods.list(&ListParams::default()).await?;
        let ready = list.items.iter().filter(|p| daemon::is_ready(p)).count();
        Ok((ready == n).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let ready = t0.elapsed();
    // Pods that have run a while (sweeps, standing probes), as in `make bench-e2e`.
    tokio::time::sleep(Duration::from_secs(env_num(
        "BENCH_DELETE_SETTLE_SECONDS",
        0,
    )))
    .await;

    let (waits1, cpu1) = (
        queue_waits(metrics_port).await?,
        cpu_ticks(&tb, d.proc.pid()),
    );
    let (t1, t1_ms) = (Instant::now(), now_ms());
    let how = delete_all(&tb, &pods, &names).await?;
    daemon::until("all pods gone", LIMIT, || async {
        let left = pods.list(&ListParams::default()).await?.items;
        Ok(left.is_empty().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let gone = t1.elapsed();
    // The last outcomes reach the journal just after the objects go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (waits2, cpu2) = (
        queue_waits(metrics_port).await?,
        cpu_ticks(&tb, d.proc.pid()),
    );
    d.proc.stop();

    let dir = journal.parent().context("dir")?;
    if let Some(keep) = std::env::var_os("BENCH_KEEP_JOURNAL") {
        std::fs::create_dir_all(&keep)?;
        for f in std::fs::read_dir(dir)? {
            let f = f?.path();
            std::fs::copy(&f, Path::new(&keep).join(f.file_name().context("name")?))?;
        }
    }
    let (all, rm_peak) = deletes(dir)?;
    let build = match cfg!(debug_assertions) {
        true => "debug",
        false => "release",
    };
    let sim = match plain {
        true => "simulator VMs with a guest process and a network namespace each",
        false => "zero-boot simulator VMs, guests in one hub, loopback addresses",
    };
    println!("bench-delete: {n} run-mode pods, {build} build, {sim}");
    println!("  other VMs' address claims on the host: {foreign}");
    println!("  create -> all Ready: {ready:?}");
    println!("  delete -> all gone:  {gone:?} ({how})");
    let waits = |a, b| mean_waits(a, b);
    println!("  executor slot waits, create: {}", waits(&waits0, &waits1));
    println!("  executor slot waits, delete: {}", waits(&waits1, &waits2));
    println!("  CPU s, create to all Ready: {}", cpu_spent(&cpu0, &cpu1));
    println!("  CPU s, delete to all gone:  {}", cpu_spent(&cpu1, &cpu2));
    print_stages(&all, rm_peak, t1_ms);
    Ok(())
}
