//! The one shape of vk's writes to a pod: the merge patch of `pods/status`, which the writer
//! sends and the kubelet API's `/pods` applies to the watched object to show what is being
//! written. Below both, so neither imports the other.

use std::collections::BTreeMap;

use reconcilers::small_str::SmallStr;
use reconcilers::status::PodStatus;
use serde_json::{json, Map, Value};

/// The merge patch for `pods/status`. Every status field vk owns is written, absent ones as
/// `null`, so a stale reason or IP never survives on the server; annotations ride along in
/// `metadata` (the status subresource keeps them, and only them, of the metadata).
pub fn pod_patch(
    uid: &str,
    status: Option<&PodStatus>,
    annotations: &BTreeMap<String, Option<String>>,
) -> Value {
    let mut metadata = json!({ "uid": uid });
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(status) = status {
        patch["status"] = status_fields(status);
    }
    patch
}

fn status_fields(status: &PodStatus) -> Value {
    let mut s: Map<String, Value> = match serde_json::to_value(status) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    for k in ["reason", "message", "podIP", "hostIP", "startTime"] {
        s.entry(k).or_insert(Value::Null);
    }
    let ips = |ip: &Option<SmallStr>| {
        ip.as_ref()
            .map(|ip| json!([{ "ip": ip }]))
            .unwrap_or(Value::Null)
    };
    s.insert("podIPs".into(), ips(&status.pod_ip));
    s.insert("hostIPs".into(), ips(&status.host_ip));
    Value::Object(s)
}
