//! Kubernetes `Pod` → the core's `PodView`. Only translation: no field is interpreted here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodStatus as K8sStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use reconcilers::pod::{Container, OwnerRef, PodView, Resources};
use reconcilers::small_str::SmallStr;
use reconcilers::status::{
    Condition, ContainerState, ContainerStatus, PodStatus, Running, Terminated,
};
use reconcilers::time::{Millis, Rfc3339};

fn millis(t: &Time) -> Millis {
    t.0.as_millisecond()
}

fn ts(t: &Option<Time>) -> Option<SmallStr> {
    t.as_ref()
        .map(|t| SmallStr::new(Rfc3339::seconds(millis(t)).as_str()))
}

fn quantities(
    m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, String> {
    m.as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// A resourceVersion as the integer Kubernetes defines it (v1.35 on: positive, no leading
/// zero); anything else is left unknown, and then no copy counts as older.
pub fn resource_version(rv: &str) -> Option<u64> {
    (!rv.starts_with('0'))
        .then(|| rv.parse().ok())
        .flatten()
        .filter(|v| *v > 0)
}

pub fn pod_view(pod: &Pod) -> PodView {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    PodView {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        node_selector: spec
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default(),
        containers: spec
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| Container {
                        name: c.name.clone(),
                        image: c.image.clone().unwrap_or_default(),
                        resources: c
                            .resources
                            .as_ref()
                            .map(|r| Resources {
                                requests: quantities(&r.requests),
                                limits: quantities(&r.limits),
                            })
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        owners: meta
            .owner_references
            .as_ref()
            .map(|o| {
                o.iter()
                    .map(|r| OwnerRef {
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        restart_policy: spec.and_then(|s| s.restart_policy.clone()),
        deletion_timestamp: meta.deletion_timestamp.as_ref().map(millis),
        disruption: pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            })
            .map(|c| c.reason.clone().unwrap_or_default()),
        resource_version: meta.resource_version.as_deref().and_then(resource_version),
        creation_timestamp: meta.creation_timestamp.as_ref().map(millis),
        status: pod.status.as_ref().map(observed_status).unwrap_or_default(),
    }
}

/// The server's status, reduced to the fields vk owns, normalised the way the core derives
/// them (second-precision times), so equal means "nothing to write".
pub fn observed_status(s: &K8sStatus) -> PodStatus {
    PodStatus {
        phase: s.phase.as_deref().unwrap_or_default().into(),
        reason: s.reason.as_deref().map(SmallStr::new),
        message: s.message.as_deref().map(SmallStr::new),
        host_ip: s.host_ip.as_deref().map(SmallStr::new),
        pod_ip: s.pod_ip.as_deref().map(SmallStr::new),
        start_time: ts(&s.start_time),
        conditions: s
            .conditions
            .as_ref()
            .map(|cs| {
                cs.iter()
                    .map(|c| Condition {
                        type_: c.type_.as_str().into(),
                        status: c.status.as_str().into(),
                        last_transition_time: ts(&c.last_transition_time),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        container_statuses: s
            .container_statuses
            .as_ref()
            .map(|cs| {
                cs.iter()
                    .map(|c| ContainerStatus {
                        name: c.name.as_str().into(),
                        ready: c.ready,
                        restart_count: c.restart_count,
                        image: c.image.as_str().into(),
                        image_id: c.image_id.as_str().into(),
                        started: c.started,
                        state: ContainerState {
                            running: c
                                .state
                                .as_ref()
                                .and_then(|st| st.running.as_ref())
                                .map(|r| Running {
                                    started_at: ts(&r.started_at),
                                }),
                            terminated: c.state.as_ref().and_then(|st| st.terminated.as_ref()).map(
                                |t| Terminated {
                                    exit_code: t.exit_code,
                                    reason: t.reason.as_deref().map(SmallStr::new),
                                    message: t.message.as_deref().map(SmallStr::new),
                                    finished_at: ts(&t.finished_at),
                                },
                            ),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::resource_version;

    /// Resource versions compare as integers only in the form Kubernetes defines (v1.35 on).
    #[test]
    fn a_resource_version_is_an_integer_or_unknown() {
        assert_eq!(resource_version("12345"), Some(12345));
        for odd in ["", "0", "012", "abc", "-3", "18446744073709551616"] {
            assert_eq!(resource_version(odd), None, "{odd:?}");
        }
    }
}
