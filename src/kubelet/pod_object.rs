//! One pod as `GET /pods` serves it (K2): the object the watch delivered, with the status and
//! annotations the node has sent, or is sending, applied the way the apiserver applies the
//! node's merge patch, so a caller sees the pod as the cluster has it or is about to.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use crate::pod_patch::pod_patch;
use crate::sources::pod_view::observed_status;
use crate::views::PodRow;

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(held) = target else { return };
    for (k, v) in fields {
        match v {
            Value::Null => {
                held.remove(k);
            }
            v => merge(held.entry(k.clone()).or_insert(Value::Null), v),
        }
    }
}

/// The pod for `row`. A watched object of another incarnation (or none: the watch has already
/// seen the pod go) is not this pod's; then the pod is served from what the node knows of it.
pub fn pod_object(watched: Option<&Pod>, row: &PodRow) -> Value {
    let watched = watched.filter(|p| p.metadata.uid.as_deref() == Some(row.uid.as_str()));
    let mut v = match watched.map(serde_json::to_value) {
        Some(Ok(v)) => v,
        Some(Err(_)) | None => json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": row.name, "namespace": row.namespace, "uid": row.uid},
        }),
    };
    // The object already holding what the node wrote is served as it is: the node's copy of a
    // status keeps only the fields it owns.
    let status_held = watched
        .and_then(|p| p.status.as_ref())
        .is_some_and(|s| observed_status(s) == row.status);
    if !status_held {
        merge(
            &mut v,
            &pod_patch(&row.uid, Some(&row.status), &Default::default()),
        );
    }
    let annotations_held = watched
        .is_some_and(|p| p.metadata.annotations.clone().unwrap_or_default() == row.annotations);
    if !annotations_held {
        if let Some(meta) = v["metadata"].as_object_mut() {
            match row.annotations.is_empty() {
                true => meta.remove("annotations"),
                false => meta.insert("annotations".into(), json!(row.annotations)),
            };
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::status::PodStatus;
    use std::collections::BTreeMap;

    fn watched() -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "uid": "u1",
                         "resourceVersion": "7", "labels": {"app": "x"},
                         "annotations": {"keep": "1", "vm.cocoonstack.io/lifecycle-state": "creating"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "agent", "image": "busybox"}]},
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }))
        .unwrap()
    }

    fn row(status: PodStatus, annotations: &[(&str, &str)]) -> PodRow {
        PodRow {
            namespace: "default".into(),
            name: "a".into(),
            uid: "u1".into(),
            status,
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn running() -> PodStatus {
        serde_json::from_value(json!({
            "phase": "Running", "podIP": "10.0.0.9", "hostIP": "127.0.0.1",
            "startTime": "2026-01-01T00:00:00Z",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-01-01T00:00:01Z"}],
            "containerStatuses": [{"name": "agent", "ready": true, "restartCount": 0,
                                   "image": "busybox", "imageID": "",
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        }))
        .unwrap()
    }

    #[test]
    fn the_watched_object_carries_what_the_node_sent() {
        let r = row(
            running(),
            &[
                ("keep", "1"),
                ("vm.cocoonstack.io/id", "vm-1"),
                ("vm.cocoonstack.io/lifecycle-state", "ready"),
            ],
        );
        let v = pod_object(Some(&watched()), &r);
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["metadata"]["labels"]["app"], "x");
        assert_eq!(v["spec"]["nodeName"], "node-a");
        assert_eq!(v["spec"]["containers"][0]["name"], "agent");
        assert_eq!(v["metadata"]["annotations"]["vm.cocoonstack.io/id"], "vm-1");
        assert_eq!(
            v["metadata"]["annotations"]["vm.cocoonstack.io/lifecycle-state"],
            "ready"
        );
        assert_eq!(v["status"]["phase"], "Running");
        assert_eq!(v["status"]["podIP"], "10.0.0.9");
        assert_eq!(v["status"]["podIPs"], json!([{"ip": "10.0.0.9"}]));
        assert_eq!(v["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(v["status"]["containerStatuses"][0]["ready"], true);
        assert_eq!(
            v["status"]["qosClass"], "BestEffort",
            "fields vk does not own stay"
        );
        let back: Pod = serde_json::from_value(v).expect("a Pod");
        assert_eq!(back.metadata.uid.as_deref(), Some("u1"));
    }

    #[test]
    fn an_object_already_holding_it_is_served_as_it_is() {
        let w = watched();
        let held = observed_status(w.status.as_ref().unwrap());
        let r = row(
            held,
            &[
                ("keep", "1"),
                ("vm.cocoonstack.io/lifecycle-state", "creating"),
            ],
        );
        assert_eq!(pod_object(Some(&w), &r), serde_json::to_value(&w).unwrap());
    }

    #[test]
    fn without_this_incarnations_object_the_node_serves_its_own() {
        let mut other = watched();
        other.metadata.uid = Some("u0".into());
        for w in [Some(&other), None] {
            let v = pod_object(w, &row(running(), &[]));
            assert_eq!(
                v["metadata"],
                json!({"name": "a", "namespace": "default", "uid": "u1"})
            );
            assert_eq!(v["status"]["phase"], "Running");
            assert!(v.get("spec").is_none());
        }
    }
}
