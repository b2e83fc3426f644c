//! A failed bring-up (C12.6, P3): Warning, lifecycle `failed`, a retry with backoff.

use super::wake::restore;
use crate::action::{Action, EventType, Level, Timer};
use crate::backoff::Backoff;
use crate::labels::LifecycleReason;
use crate::phase::{CreateStep, Creating, Failed, Phase, Purpose, Retry};
use crate::pod::PodKey;
use crate::provider::{self, Op, Outcome};
use crate::state::State;
use crate::{delete, lifecycle};

/// P3: a failed bring-up is retried 5 ms doubling to 1000 s, 20 attempts in all.
pub const RETRY: Backoff = Backoff::doubling(5, 1_000_000);
pub(super) const MAX_ATTEMPTS: u32 = 20;

/// C12.6 / P3: a bring-up error. Warning Event, lifecycle `failed`, and a retry with backoff.
pub fn fail(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, Retry::Timer)
}

/// A bring-up error that a retry cannot change (a bad annotation): reported like any other,
/// then the pod waits for a change instead of a timer.
pub fn fail_permanently(s: &mut State, key: &PodKey, msg: String) {
    fail_with(s, key, msg, Retry::OnChange)
}

pub(super) fn fail_with(s: &mut State, key: &PodKey, msg: String, retry: Retry) {
    fail_as(s, key, None, msg, retry)
}

/// A failed bring-up; `reason` overrides the Warning's reason, which is otherwise
/// `CreateBringUpFailed` for a fresh pod and `WakeCloneFailed` / `WakePullFailed` for a wake.
pub(super) fn fail_as(
    s: &mut State,
    key: &PodKey,
    reason: Option<&str>,
    msg: String,
    retry: Retry,
) {
    let scratch = match s.pods.get_mut(key).map(|e| &mut e.phase) {
        Some(Phase::Creating(c)) => c.scratch.take(),
        Some(_) | None => None,
    };
    if let Some(scratch) = scratch {
        crate::snapshot::drop_scratch(s, key, scratch);
    }
    let Some(e) = s.pod(key) else { return };
    let (purpose, reason) = match &e.phase {
        Phase::Creating(c) => {
            let wake_reason = match c.step {
                CreateStep::Clone | CreateStep::InspectAfterBoot { .. } => "WakeCloneFailed",
                CreateStep::CheckEvidence
                | CreateStep::CheckHibernated
                | CreateStep::RemoveFork { .. }
                | CreateStep::PullImage
                | CreateStep::ClassifyImage
                | CreateStep::ImportCloudImage
                | CreateStep::Run
                | CreateStep::InspectSnapshot { .. }
                | CreateStep::SaveForkSnapshot { .. }
                | CreateStep::InspectNameTaken
                | CreateStep::PullSnapshot { .. }
                | CreateStep::InspectLocal { .. }
                | CreateStep::VerifyRemote { .. }
                | CreateStep::PeerRestore { .. }
                | CreateStep::PullHibernate { .. }
                | CreateStep::AwaitSnapshot { .. }
                | CreateStep::Macos { .. } => "WakePullFailed",
            };
            match c.purpose {
                Purpose::Fresh => (c.purpose, reason.unwrap_or("CreateBringUpFailed")),
                Purpose::Wake | Purpose::Restore => (c.purpose, reason.unwrap_or(wake_reason)),
            }
        }
        Phase::Failed(f) => (f.purpose, reason.unwrap_or("CreateBringUpFailed")),
        Phase::Waiting
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => (Purpose::Fresh, reason.unwrap_or("CreateBringUpFailed")),
    };
    let attempts = match &e.phase {
        Phase::Creating(Creating {
            cancel: Some(object),
            ..
        }) => return delete::without_vm(s, key, *object),
        Phase::Creating(c) => c.attempts,
        Phase::Failed(f) => f.attempts,
        Phase::Waiting
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => 0,
    } + 1;
    let uid = e.pod.uid.clone();
    s.touched.insert(key);
    let op = match purpose {
        Purpose::Fresh => Op::Create,
        Purpose::Wake | Purpose::Restore => Op::Wake,
    };
    let verb = match op {
        Op::Create => "create",
        Op::Wake | Op::Update | Op::Delete => "wake",
    };
    warn_event(s, key, reason, &format!("{verb}: {msg}"));
    lifecycle::failed(s, key, msg.clone());
    let counted = match retry {
        Retry::Timer => LifecycleReason::BringUp,
        Retry::OnChange => LifecycleReason::InvalidSpec,
    };
    provider::outcome(s, key, op, Outcome::Failed(&msg), counted);
    let retry = match retry {
        Retry::Timer if attempts < MAX_ATTEMPTS => {
            s.emit(Action::ArmTimer {
                timer: Timer::CreateRetry {
                    key: key.clone(),
                    uid,
                },
                after_ms: RETRY.after(attempts),
            });
            Retry::Timer
        }
        Retry::Timer => {
            s.emit(Action::Log {
                level: Level::Error,
                message: format!(
                    "pod {key}: create failed {attempts} times; giving up until the pod changes: {msg}"
                ),
            });
            Retry::OnChange
        }
        Retry::OnChange => Retry::OnChange,
    };
    if let Some(e) = s.pods.get_mut(key) {
        e.phase = Phase::Failed(Failed {
            message: msg,
            attempts,
            retry,
            purpose,
        });
    }
}

/// The create-retry timer: a failed pod tries again.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    match e.phase {
        // A failed wake wakes again: a fresh boot would lose the hibernated state.
        Phase::Failed(Failed {
            purpose: purpose @ (Purpose::Wake | Purpose::Restore),
            ..
        }) => restore(s, key, purpose),
        Phase::Failed(_) => crate::intake::intake(s, key),
        Phase::Waiting
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}

pub(crate) fn warn_event(s: &mut State, key: &PodKey, reason: &str, message: &str) {
    let Some(e) = s.pod(key) else { return };
    let uid = e.pod.uid.clone();
    s.emit(Action::RecordEvent {
        source: crate::action::EventSource::Vk,
        key: key.clone(),
        uid,
        kind: EventType::Warning,
        reason: reason.into(),
        message: lifecycle::truncate(message.to_string(), 512),
    });
}
