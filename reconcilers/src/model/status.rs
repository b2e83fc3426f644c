//! The pod status vk owns, shaped like the `PodStatus` JSON of the Kubernetes API so the
//! shell can put it into a `pods/status` merge patch as it is, and can compare it with what the
//! server holds. Its texts are [`SmallStr`]s: phases, condition types, times and IPs all fit
//! inline, so a status costs two allocations (its lists) instead of about twenty.

use serde::{Deserialize, Serialize};

use crate::small_str::SmallStr;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: SmallStr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SmallStr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<SmallStr>,
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<SmallStr>,
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<SmallStr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<SmallStr>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: SmallStr,
    pub status: SmallStr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<SmallStr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: SmallStr,
    pub ready: bool,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default)]
    pub image: SmallStr,
    #[serde(rename = "imageID", default)]
    pub image_id: SmallStr,
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
    pub started_at: Option<SmallStr>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SmallStr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<SmallStr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<SmallStr>,
}

pub const CONTAINER: &str = "agent";

use crate::config::Config;
use crate::phase::{End, Phase};
use crate::state::{Agent, Lifecycle, PodEntry};
use crate::time::{parse_rfc3339, Millis, Rfc3339};

/// The complete status vk wants the server to hold for this pod (S1–S10).
pub fn derive(config: &Config, e: &PodEntry) -> PodStatus {
    Desired::of(config, e).to_status()
}

/// `derive(config, e) == *status`, without building the derived status.
pub fn is_desired(config: &Config, e: &PodEntry, status: &PodStatus) -> bool {
    Desired::of(config, e).matches(status)
}

/// The desired status as borrowed parts of the entry (S1–S10). It is compared
/// with the server's status after every event that touches the pod, and is almost always
/// equal: the comparison must not allocate, so only a status that goes out is built.
struct Desired<'a> {
    phase: &'static str,
    reason: Option<&'static str>,
    message: Option<&'a str>,
    host_ip: Option<&'a str>,
    pod_ip: Option<&'a str>,
    start_time: Option<Stamp<'a>>,
    /// `None`: no conditions at all (a pod without a VM).
    conditions: Option<Conditions>,
    /// `None`: no container status (a pod without a VM).
    container: Option<Container<'a>>,
}

/// A timestamp as the status shows it: the server's own text, or one of ours.
#[derive(Clone, Copy)]
enum Stamp<'a> {
    Server(&'a str),
    Ours(Rfc3339),
}

impl Stamp<'_> {
    fn as_str(&self) -> &str {
        match self {
            Stamp::Server(t) => t,
            Stamp::Ours(t) => t.as_str(),
        }
    }
}

/// The four conditions: scheduled and initialized since the start, ready since it changed.
struct Conditions {
    since: Option<Rfc3339>,
    ready: bool,
    ready_at: Option<Rfc3339>,
}

struct Container<'a> {
    ready: bool,
    started: bool,
    /// `None`: running since the pod's start time.
    terminated: Option<(i32, &'a str, Option<&'a str>)>,
}

impl<'a> Desired<'a> {
    fn of(config: &'a Config, e: &'a PodEntry) -> Self {
        // S1/S2: start time is kept once the server has one.
        let start_time = match &e.pod.status.start_time {
            Some(t) => Some(Stamp::Server(t)),
            None => e.started_at.map(|t| Stamp::Ours(Rfc3339::seconds(t))),
        };
        let host_ip = Some(config.node_ip.as_str());
        let restart_never = e.pod.restart_policy.as_deref() == Some("Never");
        if let Phase::Terminal(terminal) = &e.phase {
            let (phase, code, reason, message) = match &terminal.end {
                End::Evicted { reason, message } => {
                    ("Failed", 1, reason.as_str(), Some(message.as_str()))
                }
                End::Succeeded => ("Succeeded", 0, "Completed", None),
            };
            return Desired {
                phase,
                reason: None,
                message,
                host_ip,
                pod_ip: None,
                start_time,
                conditions: Some(Conditions::of(e, false)),
                container: Some(Container {
                    ready: false,
                    started: false,
                    terminated: Some((code, reason, message)),
                }),
            };
        }
        let Some(vm) = e.phase.vm() else {
            // S1: no VM → Pending with no conditions and no container statuses (the operator's
            // wake gate depends on that); P3: a failed create shows ProviderFailed, also while
            // the next attempt runs.
            let failure = match &e.phase {
                Phase::Failed(f) => Some(&f.message),
                Phase::Creating(c) => c.last_failure.as_ref(),
                Phase::Waiting
                | Phase::Running(_)
                | Phase::Hibernating(_)
                | Phase::Hibernated
                | Phase::Evicting(_)
                | Phase::Deleting(_)
                | Phase::Terminal(_)
                | Phase::Gone(_) => None,
            };
            let (phase, reason, message) = match failure {
                Some(msg) => (
                    if restart_never { "Failed" } else { "Pending" },
                    Some("ProviderFailed"),
                    Some(msg.as_str()),
                ),
                None => ("Pending", None, None),
            };
            // A pod vk has not placed keeps whatever hostIP it has: writing ours onto a fresh
            // Pending pod would be a write with nothing to say.
            let host_ip = match failure {
                Some(_) => host_ip,
                None => e.pod.status.host_ip.as_deref(),
            };
            return Desired {
                phase,
                reason,
                message,
                host_ip,
                pod_ip: None,
                start_time,
                conditions: None,
                container: None,
            };
        };
        let ready =
            e.probe.ready && e.lifecycle().map(|(state, _, _)| state) == Some(Lifecycle::Ready);
        // D4: a delete held by a failed snapshot says why on the pod.
        let message = match &e.phase {
            Phase::Deleting(d) => d.blocked.as_deref(),
            Phase::Waiting
            | Phase::Failed(_)
            | Phase::Creating(_)
            | Phase::Running(_)
            | Phase::Hibernating(_)
            | Phase::Hibernated
            | Phase::Evicting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => None,
        };
        Desired {
            phase: "Running",
            reason: None,
            message,
            host_ip,
            pod_ip: vm.ip.as_deref(),
            start_time,
            conditions: Some(Conditions::of(e, ready)),
            container: Some(Container {
                ready,
                started: true,
                terminated: None,
            }),
        }
    }

    fn start_time(&self) -> Option<&str> {
        self.start_time.as_ref().map(Stamp::as_str)
    }

    fn to_status(&self) -> PodStatus {
        let start_time = self.start_time().map(SmallStr::new);
        PodStatus {
            phase: self.phase.into(),
            reason: self.reason.map(Into::into),
            message: self.message.map(Into::into),
            host_ip: self.host_ip.map(Into::into),
            pod_ip: self.pod_ip.map(Into::into),
            start_time: start_time.clone(),
            conditions: self
                .conditions
                .as_ref()
                .map(Conditions::to_vec)
                .unwrap_or_default(),
            container_statuses: self
                .container
                .iter()
                .map(|c| c.to_status(start_time.clone()))
                .collect(),
        }
    }

    /// Field by field what `self.to_status() == *s` would say.
    fn matches(&self, s: &PodStatus) -> bool {
        let conditions = match &self.conditions {
            Some(c) => c.matches(&s.conditions),
            None => s.conditions.is_empty(),
        };
        let container = match (&self.container, s.container_statuses.as_slice()) {
            (Some(c), [cs]) => c.matches(cs, self.start_time()),
            (None, []) => true,
            _ => false,
        };
        s.phase == self.phase
            && s.reason.as_deref() == self.reason
            && s.message.as_deref() == self.message
            && s.host_ip.as_deref() == self.host_ip
            && s.pod_ip.as_deref() == self.pod_ip
            && s.start_time.as_deref() == self.start_time()
            && conditions
            && container
    }
}

impl Conditions {
    fn of(e: &PodEntry, ready: bool) -> Self {
        let since = e
            .pod
            .status
            .start_time
            .as_deref()
            .and_then(parse_rfc3339)
            .or(e.started_at);
        let ready_at = e.ready_changed_at.or(since);
        Conditions {
            since: since.map(Rfc3339::seconds),
            ready,
            ready_at: ready_at.map(Rfc3339::seconds),
        }
    }

    /// Type, status and transition time of each condition, in order.
    fn rows(&self) -> [(&'static str, bool, Option<&str>); 4] {
        let since = self.since.as_ref().map(Rfc3339::as_str);
        let ready_at = self.ready_at.as_ref().map(Rfc3339::as_str);
        [
            ("PodScheduled", true, since),
            ("Initialized", true, since),
            ("ContainersReady", self.ready, ready_at),
            ("Ready", self.ready, ready_at),
        ]
    }

    fn to_vec(&self) -> Vec<Condition> {
        self.rows()
            .into_iter()
            .map(|(t, ok, at)| Condition {
                type_: t.into(),
                status: true_false(ok).into(),
                last_transition_time: at.map(Into::into),
            })
            .collect()
    }

    fn matches(&self, have: &[Condition]) -> bool {
        have.len() == 4
            && self.rows().iter().zip(have).all(|((t, ok, at), c)| {
                c.type_ == *t
                    && c.status == true_false(*ok)
                    && c.last_transition_time.as_deref() == *at
            })
    }
}

fn true_false(ok: bool) -> &'static str {
    if ok {
        "True"
    } else {
        "False"
    }
}

impl Container<'_> {
    fn to_status(&self, start_time: Option<SmallStr>) -> ContainerStatus {
        let state = match self.terminated {
            Some((exit_code, reason, message)) => ContainerState {
                running: None,
                terminated: Some(Terminated {
                    exit_code,
                    reason: Some(reason.into()),
                    message: message.map(Into::into),
                    finished_at: None,
                }),
            },
            None => ContainerState {
                running: Some(Running {
                    started_at: start_time,
                }),
                terminated: None,
            },
        };
        ContainerStatus {
            name: CONTAINER.into(),
            ready: self.ready,
            started: Some(self.started),
            state,
            ..ContainerStatus::default()
        }
    }

    fn matches(&self, c: &ContainerStatus, start_time: Option<&str>) -> bool {
        let state = match (self.terminated, &c.state) {
            (
                Some((exit_code, reason, message)),
                ContainerState {
                    running: None,
                    terminated: Some(t),
                },
            ) => {
                t.exit_code == exit_code
                    && t.reason.as_deref() == Some(reason)
                    && t.message.as_deref() == message
                    && t.finished_at.is_none()
            }
            (
                None,
                ContainerState {
                    running: Some(r),
                    terminated: None,
                },
            ) => r.started_at.as_deref() == start_time,
            _ => false,
        };
        c.name == CONTAINER
            && c.ready == self.ready
            && c.restart_count == 0
            && c.image.is_empty()
            && c.image_id.is_empty()
            && c.started == Some(self.started)
            && state
    }
}

/// The Ready condition of a status the server holds, with its transition time.
pub fn parse_ready_condition(status: &PodStatus) -> Option<(bool, Option<Millis>)> {
    let c = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        c.status == "True",
        c.last_transition_time.as_deref().and_then(parse_rfc3339),
    ))
}

/// A VM whose probe agent has not reported yet: its first status waits for that result
/// (R2), which comes at once or within the 3 s probe deadline.
pub(crate) fn first_probe_pending(e: &PodEntry) -> bool {
    e.phase.vm().is_some() && e.probe.agent == Agent::AwaitingFirst
}

/// The derived status when it differs from what the server holds — not from what was last
/// sent, so a status someone else overwrote is repaired (INV-6); `None` when it holds.
pub(crate) fn wanted(config: &Config, e: &PodEntry) -> Option<PodStatus> {
    let desired = Desired::of(config, e);
    // Tests (debug builds) prove the cheap comparison against the built status every time.
    debug_assert_eq!(
        desired.matches(&e.pod.status),
        desired.to_status() == e.pod.status
    );
    debug_assert!(e
        .writer
        .echo_mismatch
        .as_ref()
        .is_none_or(|m| desired.matches(m) == (desired.to_status() == *m)));
    let holds = desired.matches(&e.pod.status)
        || e.writer
            .echo_mismatch
            .as_ref()
            .is_some_and(|m| desired.matches(m));
    (!holds).then(|| desired.to_status())
}
