//! The pod status vk owns, shaped like the `PodStatus` JSON of the Kubernetes API so the
//! shell can put it into a `pods/status` merge patch as it is, and can compare it with what the
//! server holds.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default)]
    pub image: String,
    #[serde(rename = "imageID", default)]
    pub image_id: String,
    #[serde(default)]
    pub started: Option<bool>,
    pub state: ContainerState,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<Running>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<Terminated>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

pub const CONTAINER: &str = "agent";

use crate::config::Config;
use crate::pod::PodKey;
use crate::state::{Lifecycle, PodEntry, State, Terminal};
use crate::time::{parse_rfc3339, rfc3339_seconds, Millis};

/// The complete status vk wants the server to hold for this pod (spec/behavior.md §5).
pub fn derive(config: &Config, e: &PodEntry) -> PodStatus {
    let ts = |t: Option<Millis>| t.map(rfc3339_seconds);
    // S1/S2: start time is kept once the server has one.
    let start_time = e.pod.status.start_time.clone().or_else(|| ts(e.started_at));
    let host_ip = Some(config.node_ip.clone());
    let restart_never = e.pod.restart_policy.as_deref() == Some("Never");
    if let Some(terminal) = &e.terminal {
        let (phase, code, reason, message) = match terminal {
            Terminal::Evicted { reason, message } => {
                ("Failed", 1, reason.clone(), Some(message.clone()))
            }
            Terminal::Succeeded => ("Succeeded", 0, "Completed".to_string(), None),
        };
        return PodStatus {
            phase: phase.into(),
            reason: None,
            message: message.clone(),
            host_ip,
            pod_ip: None,
            start_time,
            conditions: conditions(e, false),
            container_statuses: vec![ContainerStatus {
                name: CONTAINER.into(),
                ready: false,
                started: Some(false),
                state: ContainerState {
                    running: None,
                    terminated: Some(Terminated {
                        exit_code: code,
                        reason: Some(reason),
                        message,
                        finished_at: None,
                    }),
                },
                ..ContainerStatus::default()
            }],
        };
    }
    let Some(vm) = &e.vm else {
        // S1: no VM → Pending with no conditions and no container statuses (the operator's
        // wake gate depends on that); P3: a failed create shows ProviderFailed.
        let (phase, reason, message) = match &e.failure {
            Some(msg) => (
                if restart_never { "Failed" } else { "Pending" },
                Some("ProviderFailed".to_string()),
                Some(msg.clone()),
            ),
            None => ("Pending", None, None),
        };
        return PodStatus {
            phase: phase.into(),
            reason,
            message,
            host_ip,
            start_time,
            ..PodStatus::default()
        };
    };
    let ready = e.probe.ready && e.intent.state == Some(Lifecycle::Ready);
    PodStatus {
        phase: "Running".into(),
        reason: None,
        message: None,
        host_ip,
        pod_ip: vm.ip.clone(),
        start_time: start_time.clone(),
        conditions: conditions(e, ready),
        container_statuses: vec![ContainerStatus {
            name: CONTAINER.into(),
            ready,
            started: Some(true),
            state: ContainerState {
                running: Some(Running {
                    started_at: start_time,
                }),
                terminated: None,
            },
            ..ContainerStatus::default()
        }],
    }
}

fn conditions(e: &PodEntry, ready: bool) -> Vec<Condition> {
    let since = e
        .pod
        .status
        .start_time
        .as_deref()
        .and_then(parse_rfc3339)
        .or(e.started_at);
    let cond = |t: &str, ok: bool, at: Option<Millis>| Condition {
        type_: t.into(),
        status: if ok { "True" } else { "False" }.into(),
        last_transition_time: at.map(rfc3339_seconds),
    };
    let ready_at = e.ready_changed_at.or(since);
    vec![
        cond("PodScheduled", true, since),
        cond("Initialized", true, since),
        cond("ContainersReady", ready, ready_at),
        cond("Ready", ready, ready_at),
    ]
}

/// The Ready condition of a status the server holds, with its transition time.
pub fn parse_ready_condition(status: &PodStatus) -> Option<(bool, Option<Millis>)> {
    let c = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        c.status == "True",
        c.last_transition_time.as_deref().and_then(parse_rfc3339),
    ))
}

/// Push the derived status when it differs from what the server holds — not from what was
/// last sent, so a status someone else overwrote is repaired (issue #5 §6).
pub fn sync(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get(key) else { return };
    if !s.started
        || e.gone
        || e.deleted_by_us
        || e.superseded
        || e.kube_backoff
        || e.status_op.is_some()
    {
        return;
    }
    let desired = derive(&s.config, e);
    if desired == e.pod.status || e.echo_mismatch.as_ref() == Some(&desired) {
        crate::delete::finalize(s, key);
        return;
    }
    let uid = e.pod.uid.clone();
    let op = s.new_op(crate::state::OpOwner::Status {
        key: key.clone(),
        pushed: desired.clone(),
    });
    s.pods.get_mut(key).expect("present").status_op = Some(op);
    s.emit(crate::action::Action::PushStatus {
        op,
        key: key.clone(),
        uid,
        status: desired,
    });
}
