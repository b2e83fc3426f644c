//! The label values of the daemon's metrics. What the core counts carries the core's own label
//! enums (`reconcilers::labels`), re-exported here where the shell names them too; what only
//! the shell counts takes the enums below. Either way a count takes an enum, never a string,
//! and the series that exist at 0 from the start (`Metrics::zeroed`) are derived from each
//! enum's `ALL`, so a new value gets its series with no second list to update. The strings
//! are a contract with dashboards and alerts.

use reconcilers::action::{CountHistogram, Counter};
use reconcilers::labels::{
    EvidenceVerdict, IpWaitResult, LeaseReleaseResult, ResumeOp, StaleCreateOutcome, VerifyResult,
};
pub use reconcilers::labels::{HibernatePhase, Outcome, PostCloneKind};

pub use crate::caps::Cap;

macro_rules! label {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }
    };
}

label! {
    /// `reason` of `cocoon_vk_events_dropped_total` (F4).
    DropReason {
        LaneFull => "lane_full",
        Timeout => "timeout",
        Rejected => "rejected",
    }
}

label! {
    /// `kind` of `cocoon_vk_api_writes_total`: what a write to the Kubernetes API was for.
    ApiWrite {
        Pod => "pod",
        Delete => "delete",
        Event => "event",
    }
}

label! {
    /// `kind` of `cocoon_vk_action_queue_wait_seconds`: the slot an action waited for.
    ActionSlot {
        Cocoon => "cocoon",
        Kube => "kube",
        Registry => "registry",
    }
}

/// Every labelled series of the core's counters that exists at 0 from the start: each label
/// value crossed with the others of its family. `pod_lifecycle_total` is left out: its `reason`
/// belongs to one `op` and `result` at a time, so the cross product would export series no
/// pod can ever move.
pub(super) fn zeroed_counters() -> Vec<Counter> {
    let mut all = Vec::new();
    for &result in Outcome::ALL {
        all.extend([
            Counter::SnapshotPull { result },
            Counter::SnapshotSave { result },
            Counter::SnapshotPush { result },
            Counter::CloneFromDir { result },
            Counter::Wake { result },
            Counter::SnapshotPeerRestore { result },
            Counter::WakeRenewNudge { result },
        ]);
        all.extend(
            HibernatePhase::ALL
                .iter()
                .map(|&phase| Counter::Hibernate { phase, result }),
        );
        all.extend(
            PostCloneKind::ALL
                .iter()
                .map(|&kind| Counter::PostClone { kind, result }),
        );
    }
    all.extend(
        StaleCreateOutcome::ALL
            .iter()
            .map(|&outcome| Counter::StaleCreateReconcile { outcome }),
    );
    all.extend(
        IpWaitResult::ALL
            .iter()
            .map(|&result| Counter::WakeIpWait { result }),
    );
    all.extend(
        ResumeOp::ALL
            .iter()
            .map(|&op| Counter::StartupResume { op }),
    );
    all.extend(
        LeaseReleaseResult::ALL
            .iter()
            .map(|&result| Counter::LeaseRelease { result }),
    );
    all.extend(
        VerifyResult::ALL
            .iter()
            .map(|&result| Counter::SnapshotVerify { result }),
    );
    all.extend(
        EvidenceVerdict::ALL
            .iter()
            .map(|&verdict| Counter::HibernateEvidence { verdict }),
    );
    all
}

/// The count histograms' series that exist at 0 from the start.
pub(super) fn zeroed_count_histograms() -> Vec<CountHistogram> {
    Outcome::ALL
        .iter()
        .map(|&result| CountHistogram::PostCloneRetryAttempts { result })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_a_distinct_prometheus_label() {
        let all: Vec<&str> = [
            DropReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
            ApiWrite::ALL.iter().map(|v| v.as_str()).collect(),
            ActionSlot::ALL.iter().map(|v| v.as_str()).collect(),
        ]
        .concat();
        for v in &all {
            assert!(
                !v.is_empty() && v.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{v}"
            );
        }
    }
}
