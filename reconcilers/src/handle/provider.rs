//! The outcome of each create, update and delete the node carries out for a pod: counted in
//! `cocoon_vk_pod_lifecycle_total{op,result,reason}` and, as a kubelet's pod controller does,
//! reported on the pod as `ProviderCreate|Update|DeleteSuccess|Failed` (E1). Input rejects, a
//! delete with nothing to do, and evictions are counted only (E3).

use crate::action::{Action, Counter, EventSource, EventType};
use crate::labels::{LifecycleReason, LifecycleResult};
use crate::pod::PodKey;
use crate::state::State;

/// What the outcome was for, in the counter's words.
pub(crate) use crate::labels::LifecycleOp as Op;

impl Op {
    /// The Event reasons and success text of the pod controller's report.
    fn report(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Op::Create => (
                "ProviderCreateSuccess",
                "ProviderCreateFailed",
                "Create pod in provider successfully",
            ),
            Op::Wake | Op::Update => (
                "ProviderUpdateSuccess",
                "ProviderUpdateFailed",
                "Update pod in provider successfully",
            ),
            Op::Delete => (
                "ProviderDeleteSuccess",
                "ProviderDeleteFailed",
                "Delete pod in provider successfully",
            ),
        }
    }
}

/// How it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome<'a> {
    Ok,
    /// Carried out; the controller reports the error text.
    Failed(&'a str),
    /// Refused before anything ran (bad input): counted as failed, no Event (E3).
    Rejected,
    /// Nothing to do (a delete without a VM to handle): counted, no Event (E3).
    Skipped,
}

pub(crate) fn outcome(
    s: &mut State,
    key: &PodKey,
    op: Op,
    outcome: Outcome<'_>,
    reason: LifecycleReason,
) {
    let result = match outcome {
        Outcome::Ok => LifecycleResult::Ok,
        Outcome::Failed(_) | Outcome::Rejected => LifecycleResult::Failed,
        Outcome::Skipped => LifecycleResult::Skipped,
    };
    s.emit(Action::Count {
        counter: Counter::PodLifecycle { op, result, reason },
    });
    let (ok, failed, done) = op.report();
    let (kind, reason, message) = match outcome {
        Outcome::Ok => (EventType::Normal, ok, done.to_string()),
        Outcome::Failed(error) => (EventType::Warning, failed, error.to_string()),
        Outcome::Rejected | Outcome::Skipped => return,
    };
    let Some(e) = s.pod(key) else { return };
    let uid = e.pod.uid.clone();
    s.emit(Action::RecordEvent {
        key: key.clone(),
        uid,
        kind,
        reason: reason.into(),
        message: crate::lifecycle::truncate(message, 512),
        source: EventSource::PodController,
    });
}
