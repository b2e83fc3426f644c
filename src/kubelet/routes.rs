//! The kubelet API routes (K2–K6). Everything served comes from the published views and the
//! shared sample; a route never waits on the loop.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::{log_query, Ctx};

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

/// GET /pods: the pods the watch sees on this node.
pub async fn pods(ctx: web::Data<Ctx>) -> HttpResponse {
    let mut rows: Vec<_> = ctx.views.pods.iter().map(|r| r.value().clone()).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pod_list(
        rows.into_iter()
            .map(|r| json!({"metadata": {"name": r.name, "namespace": r.namespace, "uid": r.uid}, "status": {"phase": r.phase}}))
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
    let Ok(permit) = ctx.log_streams.clone().try_acquire_owned() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} log streams are running on this node; try again later",
                super::MAX_LOG_STREAMS
            ),
        );
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
    match super::logs::stream(&ctx.cocoon, &argv, q.limit_bytes, permit).await {
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

/// GET /stats/summary (K5), from the shared sample.
pub async fn stats_summary(ctx: web::Data<Ctx>) -> HttpResponse {
    let s = ctx.sampler.sample();
    let now = rfc3339_now();
    let pods: Vec<Value> = s
        .vms
        .iter()
        .map(|v| {
            json!({
                "podRef": {"name": v.vm.pod, "namespace": v.vm.namespace},
                "startTime": now,
                "containers": [{"name": "agent", "startTime": now,
                    "cpu": {"time": now, "usageCoreNanoSeconds": (v.cpu.usage_seconds * 1e9) as u64},
                    "memory": {"time": now, "workingSetBytes": v.rss}}],
                "network": {"time": now, "rxBytes": v.net.rx, "txBytes": v.net.tx},
                "ephemeral-storage": {"time": now, "usedBytes": v.cow_bytes},
            })
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "node": {"nodeName": ctx.node, "startTime": ctx.started,
                 "cpu": {"time": now, "usageCoreNanoSeconds": (s.node.cpu_seconds * 1e9) as u64},
                 "memory": {"time": now, "workingSetBytes": s.node.memory_used}},
        "pods": pods,
    }))
}

/// GET /metrics/resource (K6): the families metrics-server reads, ms timestamps.
pub async fn metrics_resource(ctx: web::Data<Ctx>) -> HttpResponse {
    let s = ctx.sampler.sample();
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v} {ts}\n"));
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
    if !s.vms.is_empty() {
        let c = |v: &crate::stats::VmSample| {
            format!(
                "{{container=\"agent\",namespace=\"{}\",pod=\"{}\"}}",
                v.vm.namespace, v.vm.pod
            )
        };
        let p = |v: &crate::stats::VmSample| {
            format!("{{namespace=\"{}\",pod=\"{}\"}}", v.vm.namespace, v.vm.pod)
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
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(out)
}
