//! The shipped dashboard and alerts against a real Prometheus scraping the daemon (M6): after
//! a short workload (three pods Ready, one deleted) every panel query of
//! packaging/grafana-dashboard.json returns a series, and every metric an alert of
//! packaging/alerts.yaml names has one; the three start-ups are observed once each.
//!
//! Dashboard queries run as Grafana would send them, with `$instance` as the "All" regex and
//! `$__rate_interval` as a window that holds several 1 s scrapes. An alert's expression is
//! rightly empty while nothing is wrong, so it is only checked to be valid PromQL; what must
//! not happen is an alert that watches a metric the daemon does not export (a typo, a rename,
//! a label vector nobody initialised): it could never fire. So each metric an alert names must
//! have a series of job `vk-cocoon`.

use e2e::daemon;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::daemon::{create_pod, wait_ready, DaemonOptions};
use e2e::prometheus::{Prometheus, ScrapeJob};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

const NS: &str = "default";
const NODE: &str = "node-a";
const PODS: [&str; 3] = ["dash-a", "dash-b", "dash-c"];
const LIMIT: Duration = Duration::from_secs(60);
/// Rates need two scrapes inside their window; a slow scrape or two on a loaded machine.
const SERIES_LIMIT: Duration = Duration::from_secs(20);
const RATE_INTERVAL: &str = "15s";

/// Every panel target's `expr`, with the dashboard's variables filled in.
fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string("packaging/grafana-dashboard.json")?;
    let dash: serde_json::Value = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for p in dash["panels"].as_array().context("panels")? {
        for t in p["targets"].as_array().map_or(&[][..], Vec::as_slice) {
            let expr = t["expr"].as_str().context("a target without expr")?;
            let expr = expr
                .replace("$instance", ".*")
                .replace("$__rate_interval", RATE_INTERVAL);
            ensure!(!expr.contains('$'), "an unknown variable in {expr}");
            out.push((p["title"].as_str().unwrap_or_default().to_string(), expr));
        }
    }
    Ok(out)
}

/// Every alert's name and expression (each `expr:` of alerts.yaml is one line).
fn alert_exprs() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string("packaging/alerts.yaml")?;
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("- alert:") {
            name = Some(n.trim().to_string());
        } else if let Some(e) = line.strip_prefix("expr:") {
            out.push((
                name.take().context("an expr before its alert")?,
                e.trim().to_string(),
            ));
        }
    }
    ensure!(
        out.len() == text.matches("- alert:").count(),
        "an alert without a one-line expr"
    );
    Ok(out)
}

/// The metrics an expression names: the daemon's families, and any selector `name{…}`.
fn metrics_named(expr: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < expr.len() {
        let rest = &expr[i..];
        let len = rest.find(|c: char| !is_name(c)).unwrap_or(rest.len());
        if len == 0 {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let word = &rest[..len];
        let starts_word = i == 0 || !expr[..i].ends_with(is_name);
        let selector = rest[len..].starts_with('{');
        if starts_word && (word.starts_with("cocoon_vk_") || selector) {
            out.insert(word.to_string());
        }
        i += len;
    }
    out
}

/// Queries until every one returns a series, or the limit passes; returns what stayed empty.
async fn empty_after(prom: &Prometheus, queries: &[String], limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut left: Vec<String> = queries.to_vec();
    loop {
        let mut still = Vec::new();
        for q in left {
            match prom.query(&q).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => still.push(q),
                Err(e) => still.push(format!("{q} (error: {e:#})")),
            }
        }
        left = still;
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_alert_has_a_series() -> Result<()> {
    let started = Instant::now();
    let dashboard = dashboard_queries()?;
    let alerts = alert_exprs()?;
    let metrics_port = e2e::ports::free_port()?;
    let kubelet_port = e2e::ports::free_port()?;
    // Job `vk-cocoon`, as the alerts' `up{job="vk-cocoon"}` expects.
    let job = ScrapeJob::new("vk-cocoon", &format!("127.0.0.1:{metrics_port}"));
    let tb = Testbed::start(
        TestbedOptions::control_plane()
            .with_sim()
            .with_prometheus(vec![job]),
    )
    .await?;
    let prom = tb.prometheus.as_ref().context("prometheus")?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        kubelet_port,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    for name in PODS {
        create_pod(&pods, &daemon::run_pod(NS, name, NODE)?).await?;
    }
    for name in PODS {
        wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
    }
    pods.delete(PODS[0], &DeleteParams::default()).await?;
    daemon::until("the deleted pod gone", LIMIT, || async {
        Ok(pods.get_opt(PODS[0]).await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    e2e::step!("workload done after {:?}", started.elapsed());

    // Each pod's start-up is observed once, however many status writes and probes followed.
    let total = r#"sum(cocoon_vk_pod_startup_seconds_count{stage="total"})"#;
    prom.query_until(total, SERIES_LIMIT, |v| v == PODS.len() as f64)
        .await
        .with_context(|| d.proc.log_tail(20))?;

    let queries: Vec<String> = dashboard.iter().map(|(_, q)| q.clone()).collect();
    let empty = empty_after(prom, &queries, SERIES_LIMIT).await;
    let titled: Vec<String> = dashboard
        .iter()
        .filter(|(_, q)| empty.iter().any(|e| e.starts_with(q.as_str())))
        .map(|(t, q)| format!("{t}: {q}"))
        .collect();

    let mut named = BTreeSet::new();
    for (alert, expr) in &alerts {
        // Valid PromQL; an empty answer is an alert with nothing to say.
        prom.query(expr)
            .await
            .with_context(|| format!("alert {alert}"))?;
        named.extend(metrics_named(expr));
    }
    let presence: Vec<String> = named
        .iter()
        .map(|m| format!(r#"group({{__name__="{m}",job="vk-cocoon"}})"#))
        .collect();
    let missing = empty_after(prom, &presence, SERIES_LIMIT).await;

    e2e::step!(
        "{} dashboard queries, {} alerts naming {} metrics, checked after {:?}",
        queries.len(),
        alerts.len(),
        named.len(),
        started.elapsed()
    );
    if !titled.is_empty() || !missing.is_empty() {
        bail!(
            "dashboard queries without a series:\n  {}\nalert metrics without a series:\n  {}",
            titled.join("\n  "),
            missing.join("\n  ")
        );
    }
    Ok(())
}

#[test]
fn an_expression_names_its_metrics() {
    let e = r#"sum by (instance) (rate(cocoon_vk_pod_lifecycle_total{op="create"}[10m])) > 0.1 or up{job="vk-cocoon"} == 0 or cocoon_vk_probe_icmp_degraded == 1"#;
    let names: Vec<String> = metrics_named(e).into_iter().collect();
    assert_eq!(
        names,
        [
            "cocoon_vk_pod_lifecycle_total",
            "cocoon_vk_probe_icmp_degraded",
            "up"
        ]
    );
}
