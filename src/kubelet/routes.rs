//! The kubelet API routes (K2–K6). Everything served comes from the published views and the
//! shared sample; a route never waits on the loop.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::Ctx;

fn text(code: StatusCode, body: impl Into<String>) -> HttpResponse {
    HttpResponse::build(code)
        .content_type("text/plain; charset=utf-8")
        .body(body.into())
}

pub async fn not_found() -> HttpResponse {
    text(StatusCode::NOT_FOUND, "404 request not found")
}

pub async fn not_implemented(req: HttpRequest) -> HttpResponse {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{} is not implemented by vk-cocoon", req.path()),
    )
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

/// Lines a caller may ask for at once: more is a 400, not a host reading gigabytes.
pub const MAX_TAIL_LINES: u64 = 100_000;
/// Lines when the caller names none (or 0), as before.
const DEFAULT_TAIL_LINES: u64 = 200;

/// A validated `/containerLogs` query (K3). `sinceSeconds`, `sinceTime`, `timestamps` and
/// `previous` are checked but not applied: `cocoon vm logs` has no such options, and a
/// hypervisor log line carries no wall-clock time to filter or stamp by.
#[derive(Debug, PartialEq, Eq)]
pub struct LogQuery {
    pub tail: u64,
    pub follow: bool,
    pub limit_bytes: Option<u64>,
}

fn log_query(q: &HashMap<String, String>) -> Result<LogQuery, String> {
    let boolean = |k: &str| match q.get(k).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(format!("{k}={v:?} is not a boolean")),
    };
    let follow = boolean("follow")?;
    boolean("previous")?;
    boolean("timestamps")?;
    let at_least = |k: &str, min: u64| match q.get(k) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            _ => Err(format!("{k}={v:?} must be an integer >= {min}")),
        },
    };
    let limit_bytes = at_least("limitBytes", 1)?;
    at_least("sinceSeconds", 1)?;
    if let Some(t) = q.get("sinceTime") {
        if reconcilers::time::parse_rfc3339(t).is_none() {
            return Err(format!("sinceTime={t:?} is not RFC 3339"));
        }
        if q.contains_key("sinceSeconds") {
            return Err("sinceTime and sinceSeconds are mutually exclusive".into());
        }
    }
    let tail = match at_least("tailLines", 0)? {
        None | Some(0) => DEFAULT_TAIL_LINES,
        Some(n) if n <= MAX_TAIL_LINES => n,
        Some(n) => return Err(format!("tailLines={n} is more than {MAX_TAIL_LINES}")),
    };
    Ok(LogQuery {
        tail,
        follow,
        limit_bytes,
    })
}

/// GET /containerLogs/{ns}/{pod}/{container}: the hypervisor log through `cocoon vm logs`.
pub async fn container_logs(
    ctx: web::Data<Ctx>,
    path: web::Path<(String, String, String)>,
    query: web::Query<HashMap<String, String>>,
) -> HttpResponse {
    let (ns, pod, _container) = path.into_inner();
    let q = match log_query(&query) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn log_query_validation() {
        let tail = |pairs: &[(&str, &str)]| log_query(&q(pairs)).map(|l| l.tail);
        assert_eq!(tail(&[]), Ok(200));
        assert_eq!(tail(&[("tailLines", "0")]), Ok(200));
        assert_eq!(tail(&[("tailLines", "5"), ("follow", "false")]), Ok(5));
        assert_eq!(tail(&[("tailLines", "100000")]), Ok(100_000));
        assert_eq!(
            log_query(&q(&[("follow", "true"), ("limitBytes", "10")])),
            Ok(LogQuery {
                tail: 200,
                follow: true,
                limit_bytes: Some(10)
            })
        );
        for bad in [
            vec![("tailLines", "-1")],
            vec![("tailLines", "100001")],
            vec![("tailLines", "ten")],
            vec![("timestamps", "1")],
            vec![("previous", "maybe")],
            vec![("limitBytes", "-5")],
            vec![("follow", "yes")],
            vec![("limitBytes", "0")],
            vec![("sinceSeconds", "0")],
            vec![("sinceTime", "yesterday")],
            vec![("sinceTime", "2026-01-01T00:00:00Z"), ("sinceSeconds", "5")],
        ] {
            assert!(log_query(&q(&bad)).is_err(), "{bad:?}");
        }
    }
}
