//! `make bench-e2e BACKEND=sim|real`: BENCH_MIX (default `50+50`) run-mode and clone-mode pods
//! created at once on one backend, the simulator (the default; `TESTBED_COCOON` unset or
//! `sim`) or the real cocoon of the reference release over the cloud-hypervisor stand-in
//! (`TESTBED_COCOON=real`, needs root). Per pod, from the daemon's journal: create → VM running
//! (the `vm run`/`vm clone` call's successful outcome) and create → Ready; then where the time
//! goes (each cocoon verb's call time, the wait before the VM call, probes). On the real lane
//! the image pull, mkfs.erofs and CNI are also timed by hand before the daemon starts. Measures,
//! never asserts wall time; it fails only when the testbed or the daemon does.

mod bench_backends {
    pub mod journal_times;
    pub mod real_seed;
    pub mod report;
}

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bench_backends::journal_times::{self, PodTimes};
use bench_backends::{real_seed, report};
use e2e::daemon::{self, annotation, pod_manifest, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as KubeEvent, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const SIM_SNAPSHOT: &str = "acme/agent:v1";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Run,
    Clone,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Run => "run",
            Mode::Clone => "clone",
        }
    }
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn mix() -> Result<(usize, usize)> {
    let raw = std::env::var("BENCH_MIX").unwrap_or_else(|_| "50+50".into());
    let (r, c) = raw
        .split_once('+')
        .with_context(|| format!("BENCH_MIX={raw:?}: want RUN+CLONE, e.g. 50+50"))?;
    Ok((r.trim().parse()?, c.trim().parse()?))
}

/// The executor runs a bounded number of cocoon calls at once; the journal's call times hold
/// the wait for a slot, which only the daemon's histogram separates.
async fn cocoon_slot_wait(metrics_port: u16) -> Result<String> {
    let name = "cocoon_vk_action_queue_wait_seconds";
    let of_cocoon = |series: Vec<(String, f64)>| -> Vec<(String, f64)> {
        series
            .into_iter()
            .filter(|(labels, _)| labels.contains("kind=\"cocoon\""))
            .collect()
    };
    let value = |suffix: &str| {
        let name = format!("{name}_{suffix}");
        async move {
            let series = daemon::metric_series(metrics_port, &name).await?;
            anyhow::Ok(of_cocoon(series).first().map_or(0.0, |(_, v)| *v))
        }
    };
    let (count, sum) = (value("count").await?, value("sum").await?);
    let buckets = of_cocoon(daemon::metric_series(metrics_port, &format!("{name}_bucket")).await?);
    // The smallest bucket bound holding a share of the calls: an upper bound of that quantile.
    let bound = |share: f64| {
        buckets
            .iter()
            .filter(|(_, n)| *n >= share * count)
            .filter_map(|(labels, _)| {
                let le = labels.split("le=\"").nth(1)?.trim_end_matches('"');
                le.parse::<f64>().ok()
            })
            .fold(f64::INFINITY, f64::min)
    };
    Ok(format!(
        "wait for a cocoon slot (the daemon's histogram): {count:.0} calls, mean {:.0} ms, \
         p50 ≤ {} s, p99 ≤ {} s",
        sum / count.max(1.0) * 1000.0,
        bound(0.5),
        bound(0.99)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: run with `make bench-e2e [BACKEND=real]`"]
async fn bench_run_and_clone_pods_at_once() -> Result<()> {
    let real_lane = e2e::real_cocoon::requested()?;
    let backend = if real_lane { "real" } else { "sim" };
    if real_lane {
        if let Some(reason) = real_seed::missing() {
            e2e::skip::required(reason);
        }
    }
    let (n_run, n_clone) = mix()?;
    let limit = Duration::from_secs(
        std::env::var("BENCH_LIMIT_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    let mut opts = TestbedOptions::control_plane().with_sim();
    if real_lane {
        opts = opts.with_registry();
    }
    let tb = Testbed::start(opts).await?;
    let (run_image, clone_source, by_hand) = match (&tb.real_cocoon, &tb.sim) {
        (Some(real), _) => {
            let rows = real_seed::seed(&tb, real).await?;
            let image = tb.guest_image.clone().context("no guest image")?;
            (image, real_seed::SNAPSHOT, rows)
        }
        (None, Some(_)) => {
            daemon::seed_clone_snapshot(&tb)?;
            (
                "ghcr.io/cocoonstack/ubuntu:24.04".to_string(),
                SIM_SNAPSHOT,
                Vec::new(),
            )
        }
        (None, None) => bail!("the testbed has no cocoon host"),
    };

    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        e2e::ports::free_port()?,
    )?;
    daemon::node_registered(&tb, &d, NODE, Duration::from_secs(60)).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);

    // Interleaved, so neither mode gets a head start in the daemon's queues.
    let mut wanted: Vec<(String, Mode)> = Vec::new();
    for i in 0..n_run.max(n_clone) {
        if i < n_run {
            wanted.push((format!("run-{i:03}"), Mode::Run));
        }
        if i < n_clone {
            wanted.push((format!("clone-{i:03}"), Mode::Clone));
        }
    }
    let t0 = Instant::now();
    let created: Vec<(String, i64)> = futures::stream::iter(wanted.clone())
        .map(|(name, mode)| {
            let pods = pods.clone();
            let run_image = run_image.clone();
            async move {
                let mut a = json!({"cocoonset.cocoonstack.io/managed": "true",
                    "vm.cocoonstack.io/name": format!("vk-{NS}-{name}")});
                a["cocoonset.cocoonstack.io/image"] = match mode {
                    Mode::Run => {
                        a["cocoonset.cocoonstack.io/mode"] = json!("run");
                        json!(run_image)
                    }
                    Mode::Clone => json!(clone_source),
                };
                let p = pod_manifest(NS, &name, NODE, a)?;
                let at = wall_ms();
                daemon::create_pod(&pods, &p).await?;
                anyhow::Ok((format!("{NS}/{name}"), at))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    let create_calls = t0.elapsed();

    // Settled: Ready, or given up by the node (a clone on the reference release).
    let total = wanted.len();
    let settled = daemon::until(&format!("{total} pods settled"), limit, || async {
        let list = pods.list(&ListParams::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|p| {
                daemon::is_ready(p)
                    || annotation(p, "vm.cocoonstack.io/lifecycle-state").as_deref()
                        == Some("failed")
            })
            .count();
        Ok((done == total).then_some(()))
    })
    .await;
    let all_settled = t0.elapsed();
    if let Err(e) = &settled {
        println!("  not every pod settled: {e:#}\n{}", d.proc.log_tail(40));
    }
    let list = pods.list(&ListParams::default()).await?.items;
    let failed: Vec<String> = list
        .iter()
        .filter(|p| annotation(p, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("failed"))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let events: Api<KubeEvent> = Api::namespaced(tb.client()?, NS);
    let exhausted = events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("PostCloneExecExhausted"))
        .filter_map(|e| e.involved_object.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let rss = daemon::usage(d.proc.pid()).map(|(_, rss)| rss).unwrap_or(0);
    let slot_wait = cocoon_slot_wait(metrics_port).await?;
    d.proc.stop();
    // For a look at what the daemon did: `BENCH_KEEP_JOURNAL=DIR`, then `vk-cocoon replay
    // --pod NS/NAME DIR/*.journal*`.
    if let Some(keep) = std::env::var_os("BENCH_KEEP_JOURNAL") {
        std::fs::create_dir_all(&keep)?;
        for f in std::fs::read_dir(journal.parent().context("dir")?)? {
            let f = f?.path();
            std::fs::copy(&f, Path::new(&keep).join(f.file_name().context("name")?))?;
        }
    }

    let created: BTreeMap<String, i64> = created.into_iter().collect();
    let figures = journal_times::read(&journal, &created)?;
    println!(
        "\nbench-backends-e2e: {n_run} run + {n_clone} clone pods at once on the {backend} backend, {} build",
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!(
        "  create calls done in {create_calls:?}; every pod Ready or failed after {all_settled:?}; \
         lifecycle failed: {}, PostCloneExecExhausted Warnings: {exhausted}; daemon RSS {:.1} MiB",
        failed.len(),
        rss as f64 / 1048576.0
    );
    report::calls(&by_hand, &figures);
    println!("    {slot_wait}");
    let group = |mode: Mode| -> Vec<&PodTimes> {
        wanted
            .iter()
            .filter(|(_, m)| *m == mode)
            .filter_map(|(name, _)| figures.pods.get(&format!("{NS}/{name}")))
            .collect()
    };
    let (run, clone) = (group(Mode::Run), group(Mode::Clone));
    report::stages(&run, &clone);
    // The reference release cannot run a clone's fix-up (no `vm exec`): never Ready there.
    report::table(
        backend,
        &[
            (Mode::Run.name(), &run, false),
            (Mode::Clone.name(), &clone, real_lane),
        ],
    );
    settled.map(|_| ())
}
