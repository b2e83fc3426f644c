//! The kubelet API routes (K2–K6). Everything served comes from the published views and the
//! shared sample; a route never waits on the loop.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::{log_query, Ctx};
use crate::stats::{Sample, VmSample};

fn text(code: StatusCode, body: impl Into<String>) -> HttpResponse {
    HttpResponse::build(code)
        .content_type("text/plain; charset=utf-8")
        .body(body.into())
}

pub async fn not_found() -> HttpResponse {
    text(StatusCode::NOT_FOUND, "404 request not found")
}

fn pod_list(items: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok()
        .json(json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}))
}

/// GET /pods: the pods this node tracks, whole, as the cluster has them (K2).
pub async fn pods(ctx: web::Data<Ctx>) -> HttpResponse {
    let mut rows: Vec<_> = ctx.views.pods.iter().map(|r| r.value().clone()).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pod_list(
        rows.iter()
            .map(|r| {
                let key = format!("{}/{}", r.namespace, r.name);
                let watched = ctx.views.objects.get(&key).map(|o| o.value().clone());
                let watched = watched.and_then(|o| o.decode());
                super::pod_object::pod_object(watched.as_ref(), r)
            })
            .collect(),
    )
}

/// GET /runningpods/: the pods vk tracks a VM for.
pub async fn running_pods(ctx: web::Data<Ctx>) -> HttpResponse {
    let mut vms: Vec<_> = ctx.views.vms.iter().map(|v| v.value().clone()).collect();
    vms.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    pod_list(
        vms.into_iter()
            .map(|v| {
                json!({"metadata": {"name": v.pod, "namespace": v.namespace},
                            "status": {"phase": "Running", "podIP": v.ip}})
            })
            .collect(),
    )
}

/// GET /containerLogs/{ns}/{pod}/{container}: the hypervisor log through `cocoon vm logs`.
pub async fn container_logs(
    ctx: web::Data<Ctx>,
    path: web::Path<(String, String, String)>,
    req: HttpRequest,
) -> HttpResponse {
    let (ns, pod, _container) = path.into_inner();
    let q = match log_query::parse(req.query_string()) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let key = format!("{ns}/{pod}");
    if !ctx.views.pods.contains_key(&key) {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {key} is not on this node"),
        );
    }
    let Some(vm) = ctx.views.vms.get(&key).map(|v| v.value().clone()) else {
        return text(StatusCode::OK, "vk-cocoon: pod has no live VM\n");
    };
    let Some(ip) = vm.ip.clone() else {
        return text(StatusCode::OK, "vk-cocoon: pod has no live VM\n");
    };
    if vm.windows {
        return text(
            StatusCode::OK,
            format!("vk-cocoon: Windows guest: use RDP to {ip}\n"),
        );
    }
    if let Some(refused) = ctx.cocoon.lacks(reconcilers::cocoon_caps::Verb::Logs) {
        return text(StatusCode::NOT_IMPLEMENTED, refused.message);
    }
    let permit = match ctx.log_streams.try_acquire(&ns) {
        Ok(p) => p,
        Err(why) => return text(StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let mut argv = vec![
        "vm".to_string(),
        "logs".into(),
        "--tail".into(),
        q.tail.to_string(),
    ];
    if q.follow {
        argv.push("-f".into());
    }
    argv.extend(["--".to_string(), vm.vm_id.clone()]);
    let filter = (q.since.is_some() || q.timestamps).then(|| {
        let now = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
        super::log_time::LineFilter::new(
            super::log_time::process_start(vm.pid),
            q.since.map(|s| s.nanos(now)),
            q.timestamps,
        )
    });
    match super::logs::stream(&ctx.cocoon, &argv, q.limit_bytes, filter, permit).await {
        Ok(body) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .streaming(body),
        Err(e) if e.kind == reconcilers::vm::CocoonErrorKind::VmNotFound => {
            text(StatusCode::NOT_FOUND, e.message)
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.message),
    }
}

fn rfc3339_now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Seconds to the whole nanoseconds the summary API counts in; rounded, so 15.35 s is
/// 15350000000 and not one short of it.
fn nanos(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

/// The K5 document for one sample. `now` stamps every figure and stands for each pod's start:
/// the VM's own start is not in the sample.
pub(crate) fn summary(s: &Sample, node: &str, started: &str, now: &str) -> Value {
    let pods: Vec<Value> = s
        .vms
        .iter()
        .map(|v| {
            let mut pod = json!({
                "podRef": {"name": v.vm.pod, "namespace": v.vm.namespace},
                "startTime": now,
                "containers": [{"name": "agent", "startTime": now,
                    "cpu": {"time": now, "usageCoreNanoSeconds": nanos(v.cpu.usage_seconds)},
                    "memory": {"time": now, "workingSetBytes": v.rss}}],
                "ephemeral-storage": {"time": now, "usedBytes": v.cow_bytes},
            });
            // A NIC whose TAP was never found, or has carried nothing yet, reads as no network.
            if v.net.rx != 0 || v.net.tx != 0 {
                pod["network"] = json!({"time": now, "rxBytes": v.net.rx, "txBytes": v.net.tx});
            }
            pod
        })
        .collect();
    json!({
        "node": {"nodeName": node, "startTime": started,
                 "cpu": {"time": now, "usageCoreNanoSeconds": nanos(s.node.cpu_seconds)},
                 "memory": {"time": now, "workingSetBytes": s.node.memory_used}},
        "pods": pods,
    })
}

/// GET /stats/summary (K5), from the shared sample.
pub async fn stats_summary(ctx: web::Data<Ctx>) -> HttpResponse {
    let s = ctx.sampler.sample();
    HttpResponse::Ok().json(summary(&s, &ctx.node, &ctx.started, &rfc3339_now()))
}

/// A label value as the Prometheus text format quotes it: a backslash, a double quote or a
/// line feed in a name cannot end the value or the line early.
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            other => out.push(other),
        }
    }
    out
}

/// The K6 text for one sample, every series stamped `ts_ms` (milliseconds since the epoch,
/// which metrics-server takes as the time of the figure).
pub(crate) fn resource_metrics(s: &Sample, ts_ms: u128) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v} {ts_ms}\n"));
        }
    };
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), s.node.cpu_seconds)],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), s.node.memory_used as f64)],
    );
    if s.vms.is_empty() {
        return out;
    }
    let c = |v: &VmSample| {
        format!(
            "{{container=\"agent\",namespace=\"{}\",pod=\"{}\"}}",
            label_value(&v.vm.namespace),
            label_value(&v.vm.pod)
        )
    };
    let p = |v: &VmSample| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label_value(&v.vm.namespace),
            label_value(&v.vm.pod)
        )
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        s.vms.iter().map(|v| (c(v), v.cpu.usage_seconds)).collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        s.vms.iter().map(|v| (c(v), v.rss as f64)).collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        s.vms.iter().map(|v| (p(v), v.cpu.usage_seconds)).collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        s.vms.iter().map(|v| (p(v), v.rss as f64)).collect(),
    );
    family(
        "container_cpu_cfs_throttled_seconds_total",
        "counter",
        "Total time duration the container has been throttled",
        s.vms
            .iter()
            .map(|v| (c(v), v.cpu.throttled_seconds))
            .collect(),
    );
    family(
        "container_cpu_cfs_throttled_periods_total",
        "counter",
        "Number of throttled period intervals",
        s.vms
            .iter()
            .map(|v| (c(v), v.cpu.throttled_periods))
            .collect(),
    );
    out
}

/// GET /metrics (K8): the daemon's own metrics, for a scraper the guard let through as it
/// lets a kubelet's `nodes/metrics` readers through.
pub async fn metrics(ctx: web::Data<Ctx>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(ctx.metrics.render())
}

/// GET /metrics/resource (K6): the families metrics-server reads.
pub async fn metrics_resource(ctx: web::Data<Ctx>) -> HttpResponse {
    let s = ctx.sampler.sample();
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(resource_metrics(&s, ts))
}

#[cfg(test)]
mod tests {
    //! K5 and K6 from a fixture tree laid out as the sampler reads the host (M2): /proc's
    //! `stat`, `meminfo`, `net/dev` and `<pid>/{stat,net/dev}`, and the VM scopes' `cpu.stat`.

    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::stats::{Sampler, Sources};
    use crate::views::{Views, VmView};

    const NET_HEADER: &str = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n";

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// `/proc/<pid>/stat` with `rss_pages` in field 24 and a command name that has a space.
    fn pid_stat(pid: i64, rss_pages: u64) -> String {
        format!("{pid} (cloud hypervisor) S 1 {pid} {pid} 0 -1 4194560 5000 0 0 0 120 80 0 0 20 0 9 0 123456 2147483648 {rss_pages} 18446744073709551615\n")
    }

    fn net_line(dev: &str, rx: u64, tx: u64) -> String {
        format!("{dev}: {rx} 10 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0\n")
    }

    fn vm(ns: &str, pod: &str, id: &str, pid: i64, taps: &[&str]) -> VmView {
        VmView {
            vm_id: id.into(),
            vm_name: format!("vk-{ns}-{pod}"),
            namespace: ns.into(),
            pod: pod.into(),
            pid,
            ip: Some("10.88.0.5".into()),
            backend: "cloud-hypervisor".into(),
            unmanaged: false,
            windows: false,
            taps: taps.iter().map(|t| t.to_string()).collect(),
            cow: None,
        }
    }

    /// A node with four tracked VMs: `web-0` (CNI: its TAPs in the VMM's namespace, two NICs),
    /// `idle-0` (bridge mode: its TAP in the host's namespace, no traffic, no scope), one whose
    /// PID is not known yet and one unmanaged.
    fn fixture(dir: &Path) -> Sampler {
        fixture_with(dir, Vec::new())
    }

    /// [`fixture`] with `more` VMs beside its own.
    fn fixture_with(dir: &Path, more: Vec<VmView>) -> Sampler {
        let proc = dir.join("proc");
        let scopes = dir.join("cgroup/cocoon.slice");
        // busy = user + nice + system + irq + softirq + steal = 1535 ticks = 15.35 s
        put(
            &proc,
            "stat",
            "cpu  1000 200 300 50000 400 10 20 5 70 0\ncpu0 500 100 150 25000 200 5 10 2 35 0\n",
        );
        put(
            &proc,
            "meminfo",
            "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:   12288000 kB\n",
        );
        put(
            &proc,
            "net/dev",
            &format!(
                "{NET_HEADER}{}{}",
                net_line("lo", 1, 1),
                net_line("btIDLE0000-0", 0, 0)
            ),
        );
        put(&proc, "4242/stat", &pid_stat(4242, 25_600));
        put(
            &proc,
            "4242/net/dev",
            &format!(
                "{NET_HEADER}{}{}{}",
                net_line("lo", 9, 9),
                net_line("tapWEB00000-0", 5_000, 7_000),
                net_line("tapWEB00000-1", 100, 200)
            ),
        );
        put(
            &scopes,
            "vm-WEB00000.scope/cpu.stat",
            "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 3\nthrottled_usec 125000\n",
        );
        put(&proc, "4343/stat", &pid_stat(4343, 1_024));
        put(
            &proc,
            "4343/net/dev",
            &format!("{NET_HEADER}{}", net_line("lo", 0, 0)),
        );
        put(&proc, "4444/stat", &pid_stat(4444, 7));

        let views = Views::default();
        for v in [
            vm(
                "demo",
                "web-0",
                "WEB00000",
                4242,
                &["tapWEB00000-0", "tapWEB00000-1"],
            ),
            vm("demo", "idle-0", "IDLE0000", 4343, &["btIDLE0000-0"]),
            vm("demo", "booting-0", "BOOT0000", 0, &["tapBOOT0000-0"]),
            VmView {
                unmanaged: true,
                ..vm("other", "adopted-0", "ADOPT000", 4444, &[])
            },
        ]
        .into_iter()
        .chain(more)
        {
            views.vms.insert(format!("{}/{}", v.namespace, v.pod), v);
        }
        Sampler::with_sources(
            views,
            Sources {
                proc,
                scopes: Some(scopes),
                page_size: 4096,
                user_hz: 100.0,
            },
            dir.to_str().unwrap(),
        )
    }

    #[test]
    fn stats_summary_reports_the_fixture_figures() {
        let dir = tempfile::tempdir().unwrap();
        let s = fixture(dir.path()).sample();
        let now = "2026-12-01T20:00:00Z";
        let got = summary(&s, "node-a", "2026-12-01T19:00:00Z", now);
        let want = json!({
            "node": {
                "nodeName": "node-a",
                "startTime": "2026-12-01T19:00:00Z",
                "cpu": {"time": now, "usageCoreNanoSeconds": 15_350_000_000u64},
                "memory": {"time": now, "workingSetBytes": 4_194_304_000u64},
            },
            "pods": [
                {
                    "podRef": {"name": "idle-0", "namespace": "demo"},
                    "startTime": now,
                    "containers": [{"name": "agent", "startTime": now,
                        "cpu": {"time": now, "usageCoreNanoSeconds": 0},
                        "memory": {"time": now, "workingSetBytes": 4_194_304}}],
                    "ephemeral-storage": {"time": now, "usedBytes": 0},
                },
                {
                    "podRef": {"name": "web-0", "namespace": "demo"},
                    "startTime": now,
                    "containers": [{"name": "agent", "startTime": now,
                        "cpu": {"time": now, "usageCoreNanoSeconds": 2_500_000_000u64},
                        "memory": {"time": now, "workingSetBytes": 104_857_600}}],
                    // The first NIC only, in the TAP's own columns (M2): rx 5000, tx 7000.
                    "network": {"time": now, "rxBytes": 5_000, "txBytes": 7_000},
                    "ephemeral-storage": {"time": now, "usedBytes": 0},
                },
            ],
        });
        assert_eq!(got, want, "{}", serde_json::to_string_pretty(&got).unwrap());
    }

    #[test]
    fn metrics_resource_reports_the_fixture_figures() {
        let dir = tempfile::tempdir().unwrap();
        let s = fixture(dir.path()).sample();
        let got = resource_metrics(&s, 1_764_619_200_123);
        let want = r#"# HELP node_cpu_usage_seconds_total Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 15.35 1764619200123
# HELP node_memory_working_set_bytes Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 4194304000 1764619200123
# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="agent",namespace="demo",pod="idle-0"} 0 1764619200123
container_cpu_usage_seconds_total{container="agent",namespace="demo",pod="web-0"} 2.5 1764619200123
# HELP container_memory_working_set_bytes Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="agent",namespace="demo",pod="idle-0"} 4194304 1764619200123
container_memory_working_set_bytes{container="agent",namespace="demo",pod="web-0"} 104857600 1764619200123
# HELP pod_cpu_usage_seconds_total Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace="demo",pod="idle-0"} 0 1764619200123
pod_cpu_usage_seconds_total{namespace="demo",pod="web-0"} 2.5 1764619200123
# HELP pod_memory_working_set_bytes Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace="demo",pod="idle-0"} 4194304 1764619200123
pod_memory_working_set_bytes{namespace="demo",pod="web-0"} 104857600 1764619200123
# HELP container_cpu_cfs_throttled_seconds_total Total time duration the container has been throttled
# TYPE container_cpu_cfs_throttled_seconds_total counter
container_cpu_cfs_throttled_seconds_total{container="agent",namespace="demo",pod="idle-0"} 0 1764619200123
container_cpu_cfs_throttled_seconds_total{container="agent",namespace="demo",pod="web-0"} 0.125 1764619200123
# HELP container_cpu_cfs_throttled_periods_total Number of throttled period intervals
# TYPE container_cpu_cfs_throttled_periods_total counter
container_cpu_cfs_throttled_periods_total{container="agent",namespace="demo",pod="idle-0"} 0 1764619200123
container_cpu_cfs_throttled_periods_total{container="agent",namespace="demo",pod="web-0"} 3 1764619200123
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn label_values_are_escaped_so_a_hostile_name_stays_one_series() {
        let s = Sample {
            node: Default::default(),
            vms: vec![VmSample {
                vm: vm("ns\\x", "evil\"} 1 2\nfake_metric{a=\"", "ID", 1, &[]),
                cpu: crate::stats::procfs::CpuStat {
                    usage_seconds: 1.5,
                    ..Default::default()
                },
                rss: 7,
                cow_bytes: 0,
                net: Default::default(),
            }],
        };
        let text = resource_metrics(&s, 42);
        let want = r#"pod_memory_working_set_bytes{namespace="ns\\x",pod="evil\"} 1 2\nfake_metric{a=\""} 7 42"#;
        assert!(text.lines().any(|l| l == want), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("fake_metric")),
            "{text}"
        );
        // Every sample line is a name, one label set, a value and the stamp.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.ends_with(" 42"), "{line}");
        }
    }

    /// VMMs in one network namespace (the host's, in bridge mode) share its device table:
    /// it is read through the first of them, once per sample, and serves the others.
    #[test]
    fn vmms_in_one_namespace_share_its_device_table() {
        let dir = tempfile::tempdir().unwrap();
        let v = vm("demo", "web-1", "WEB00001", 4545, &["tapWEB00001-0"]);
        let sampler = fixture_with(dir.path(), vec![v]);
        let proc = dir.path().join("proc");
        put(&proc, "4545/stat", &pid_stat(4545, 2_048));
        put(
            &proc,
            "4242/net/dev",
            &format!(
                "{NET_HEADER}{}{}",
                net_line("tapWEB00000-0", 5_000, 7_000),
                net_line("tapWEB00001-0", 300, 400)
            ),
        );
        for pid in ["4242", "4545"] {
            std::fs::create_dir_all(proc.join(pid).join("ns")).unwrap();
            std::os::unix::fs::symlink("net:[4026531840]", proc.join(pid).join("ns/net")).unwrap();
        }
        let s = sampler.sample();
        let got = summary(&s, "node-a", "2026-12-01T19:00:00Z", "2026-12-01T20:00:00Z");
        let web1 = got["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["name"] == "web-1")
            .unwrap();
        assert_eq!(web1["network"]["rxBytes"], 300);
        assert_eq!(web1["network"]["txBytes"], 400);
    }

    #[test]
    fn nanoseconds_are_not_one_short() {
        assert_eq!(
            nanos(crate::stats::procfs::cpu_stat("usage_usec 260\n").usage_seconds),
            260_000
        );
    }

    #[test]
    fn without_a_sampled_vm_only_the_node_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let sampler = fixture(dir.path());
        std::fs::remove_dir_all(dir.path().join("proc/4242")).unwrap();
        std::fs::remove_dir_all(dir.path().join("proc/4343")).unwrap();
        let views = Views::default();
        views.vms.insert(
            "demo/booting-0".into(),
            vm("demo", "booting-0", "BOOT0000", 0, &[]),
        );
        let empty = Sampler::with_sources(
            views,
            Sources {
                proc: dir.path().join("proc"),
                scopes: None,
                page_size: 4096,
                user_hz: 100.0,
            },
            dir.path().to_str().unwrap(),
        )
        .sample();
        let text = resource_metrics(&empty, 7);
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            series,
            [
                "node_cpu_usage_seconds_total 15.35 7",
                "node_memory_working_set_bytes 4194304000 7"
            ]
        );
        assert_eq!(summary(&empty, "node-a", "t0", "t1")["pods"], json!([]));
        // A VM whose process is gone reads as zeros (M2), it is still listed.
        let gone = sampler.sample();
        assert_eq!(gone.vms.len(), 2);
        assert!(gone.vms.iter().all(|v| v.rss == 0 && v.net.rx == 0));
    }

    #[actix_web::test]
    async fn metrics_resource_is_prometheus_text_stamped_now() {
        use actix_web::{test, App};
        let dir = tempfile::tempdir().unwrap();
        let ctx = Ctx {
            views: Views::default(),
            cocoon: crate::cocoon::CocoonCli::new("cocoon"),
            sampler: Arc::new(fixture(dir.path())),
            node: "node-a".into(),
            started: "2026-12-01T19:00:00Z".into(),
            log_streams: super::super::log_streams(Default::default()),
            streams: super::super::streams(Default::default()),
            exec_idle: std::time::Duration::from_secs(30),
            metrics: crate::metrics::Metrics::new(),
        };
        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(ctx))
                .route("/metrics/resource", web::get().to(metrics_resource))
                .route("/stats/summary", web::get().to(stats_summary)),
        )
        .await;
        let ms = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
        };
        let before = ms();
        let resp = test::call_service(
            &app,
            test::TestRequest::get()
                .uri("/metrics/resource")
                .to_request(),
        )
        .await;
        let after = ms();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers().get("content-type").unwrap(),
            "text/plain; version=0.0.4"
        );
        let body = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
        let series: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(series.len(), 2 + 6 * 2, "{body}");
        for l in series {
            let ts: u128 = l.rsplit(' ').next().unwrap().parse().unwrap();
            assert!((before..=after).contains(&ts), "{l}: not stamped now in ms");
        }

        let resp = test::call_service(
            &app,
            test::TestRequest::get().uri("/stats/summary").to_request(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let doc: Value = test::read_body_json(resp).await;
        assert_eq!(doc["node"]["nodeName"], "node-a");
        assert_eq!(doc["node"]["startTime"], "2026-12-01T19:00:00Z");
        assert_eq!(doc["pods"].as_array().unwrap().len(), 2);
    }
}
