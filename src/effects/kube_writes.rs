//! Kubernetes writes of pods: status, annotations, deletes and Events. Every write is bound to
//! the pod UID it acts for, so nothing lands on a same-name successor.

use k8s_openapi::api::core::v1::{Event as K8sEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use reconcilers::event::{KubeError, KubeErrorKind, KubeOk};
use reconcilers::pod::PodKey;
use reconcilers::status::PodStatus;
use std::collections::BTreeMap;

pub use crate::pod_patch::pod_patch;
use crate::sources::pod_view::observed_status;

pub fn classify(e: kube::Error) -> KubeError {
    match &e {
        kube::Error::Api(status) => KubeError {
            kind: match status.code {
                404 => KubeErrorKind::NotFound,
                409 => KubeErrorKind::Conflict,
                422 => KubeErrorKind::Invalid,
                _ => KubeErrorKind::Other,
            },
            message: status.message.clone(),
        },
        other => KubeError {
            kind: KubeErrorKind::Other,
            message: other.to_string(),
        },
    }
}

pub async fn patch_pod(
    client: &Client,
    key: &PodKey,
    uid: &str,
    status: Option<&PodStatus>,
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<KubeOk, KubeError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), key.namespace());
    let pod = api
        .patch_status(
            key.name(),
            &PatchParams::default(),
            &Patch::Merge(pod_patch(uid, status, annotations)),
        )
        .await
        .map_err(classify)?;
    Ok(KubeOk::Status {
        status: Box::new(pod.status.as_ref().map(observed_status).unwrap_or_default()),
        resource_version: pod
            .metadata
            .resource_version
            .as_deref()
            .and_then(crate::sources::pod_view::resource_version),
    })
}

pub async fn delete_pod(
    client: &Client,
    key: &PodKey,
    uid: &str,
    grace: Option<i64>,
) -> Result<KubeOk, KubeError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), key.namespace());
    let dp = DeleteParams {
        grace_period_seconds: grace.map(|g| g as u32),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(key.name(), &dp).await.map_err(classify)?;
    Ok(KubeOk::Done)
}

/// One Event on a pod, as the loop asked for it.
pub struct PodEvent<'a> {
    pub key: &'a PodKey,
    pub uid: &'a str,
    pub kind: &'a str,
    pub reason: &'a str,
    pub message: &'a str,
    pub source: reconcilers::action::EventSource,
}

/// The reporting component: the daemon's own (E2), or the pod controller's, named after the
/// node as a kubelet's is (E1).
fn component(source: reconcilers::action::EventSource, node: &str) -> String {
    match source {
        reconcilers::action::EventSource::Vk => "vk-cocoon".into(),
        reconcilers::action::EventSource::PodController => format!("{node}/pod-controller"),
    }
}

pub async fn record_event(
    client: &Client,
    node: &str,
    event: &PodEvent<'_>,
) -> Result<(), kube::Error> {
    let PodEvent {
        key,
        uid,
        kind,
        reason,
        message,
        source,
    } = *event;
    let component = component(source, node);
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), key.namespace());
    let now = jiff_now();
    let ev = K8sEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", key.name())),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(key.name().to_string()),
            namespace: Some(key.namespace().to_string()),
            uid: Some(uid.to_string()),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        type_: Some(kind.to_string()),
        source: Some(EventSource {
            component: Some(component.clone()),
            host: Some(node.to_string()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some(component),
        reporting_instance: Some(node.to_string()),
        action: Some(reason.to_string()),
        count: Some(1),
        ..K8sEvent::default()
    };
    api.create(&PostParams::default(), &ev).await.map(|_| ())
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
