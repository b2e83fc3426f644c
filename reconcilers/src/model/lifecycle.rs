//! The lifecycle annotation (L1–L4, ANN-4), derived. A pod's phase says most of it: a
//! bring-up is `creating`, a settled VM `ready`, a hibernate `hibernating` and then
//! `hibernated`. What the phase cannot tell is kept in [`Sticky`]: a failure, which outlives
//! the phase that failed (a hibernate rolled back to `Running`, a guest step given up) until a
//! new attempt (L3), and whether the keys are still the previous process's (L1). Where neither
//! says anything, the keys stay as the pod has them.

use serde::{Deserialize, Serialize};

use crate::entry::{Lifecycle, PodEntry};
use crate::keys;
use crate::phase::{IpWait, Phase, Running, Settle};
use crate::pod::PodView;

/// What the lifecycle annotation needs that the phase cannot tell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sticky {
    /// L3: the failure the pod shows until a new attempt.
    pub failure: Option<Failure>,
    /// The keys are still what the previous process wrote (L1): nothing of this process's has
    /// moved them, so a phase that cannot tell (a restart's resume, a hibernated pod taken in)
    /// neither rewinds nor rewrites them.
    pub inherited: bool,
    /// The generation stamp the triple carries (ANN-4.2.2): seeded from the keys, raised to
    /// the pod's by each transition and by a generation-only update (ANN-4.2.6), so a restart
    /// does not re-stamp what the previous process wrote (L1).
    pub generation: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Truncated to `MESSAGE_LIMIT` (ANN-4.2.9).
    pub message: String,
    /// The generation it was recorded at, following generation-only updates (ANN-4.2.6): a
    /// transition the phase shows (`ready`, `hibernated`) stamped higher replaces it
    /// (ANN-4.2.5).
    pub generation: i64,
}

/// The published triple: state, observed generation, message.
pub type Shown<'a> = (Lifecycle, i64, Option<&'a str>);

impl Sticky {
    /// Seeded from the annotations already on the pod (L1).
    pub fn seeded(pod: &PodView) -> Self {
        let failed = pod
            .annotation(keys::LIFECYCLE_STATE)
            .and_then(Lifecycle::parse)
            == Some(Lifecycle::Failed);
        Sticky {
            failure: failed.then(|| Failure {
                message: pod
                    .annotation(keys::LIFECYCLE_MESSAGE)
                    .unwrap_or_default()
                    .to_string(),
                generation: stamp_on(pod),
            }),
            inherited: true,
            generation: stamp_on(pod),
        }
    }
}

/// The generation stamp the pod's lifecycle keys carry.
pub fn stamp_on(pod: &PodView) -> i64 {
    pod.annotation(keys::LIFECYCLE_GENERATION)
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

impl PodEntry {
    /// The generation a transition of this process's stamps (ANN-4.2.2, 4.2.4: never lower
    /// than the stamp so far).
    pub fn lifecycle_generation(&self) -> i64 {
        self.pod.generation().max(self.sticky.generation)
    }

    /// The lifecycle triple the pod should show; `None`: none (a pod no process gave one).
    pub fn lifecycle(&self) -> Option<Shown<'_>> {
        let generation = self.sticky.generation;
        let at = |state| Some((state, generation, None));
        // What the pod shows, re-stamped: a generation-only update republishes it (L3).
        let kept = || {
            let state = self
                .pod
                .annotation(keys::LIFECYCLE_STATE)
                .and_then(Lifecycle::parse)?;
            let message = self.pod.annotation(keys::LIFECYCLE_MESSAGE);
            Some((state, generation, message))
        };
        // A restart's resume (B4, B9) is no attempt of this process's: while the keys are the
        // previous process's, a phase that only resumes what it began keeps them.
        let begun = |state| match self.sticky.inherited {
            true => kept(),
            false => at(state),
        };
        let running = |r: &Running| match &r.settle {
            None => at(Lifecycle::Ready),
            Some(Settle::Lease {
                wait: IpWait::Adopt,
            }) => begun(Lifecycle::Creating),
            Some(Settle::Classify { .. } | Settle::Fixup(_) | Settle::Sac { .. })
            | Some(Settle::Lease {
                wait: IpWait::Clone | IpWait::Run | IpWait::Wake,
            }) => at(Lifecycle::Creating),
        };
        let phased = match &self.phase {
            Phase::Creating(_) => begun(Lifecycle::Creating),
            Phase::Running(r) => running(r),
            Phase::Evicting(v) => running(&v.running),
            Phase::Hibernating(_) => at(Lifecycle::Hibernating),
            // B6: a hibernated pod taken in is `hibernated` if its hibernate had begun, or if
            // it never showed a state (a pod made with `hibernate=true`, as the operator remakes
            // a hibernated agent's: nothing runs for it, and its owner waits for `hibernated`).
            Phase::Hibernated => match kept() {
                Some((Lifecycle::Hibernating | Lifecycle::Hibernated, _, _)) | None => {
                    at(Lifecycle::Hibernated)
                }
                Some(_) => begun(Lifecycle::Hibernated),
            },
            // A rejected pod gets no lifecycle write (C1); a failed bring-up's is its failure.
            Phase::Failed(_)
            | Phase::Waiting
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => kept(),
        };
        match (&self.sticky.failure, phased) {
            (Some(f), settled @ Some((Lifecycle::Ready | Lifecycle::Hibernated, _, _)))
                if self.sticky.generation > f.generation =>
            {
                settled
            }
            (Some(f), _) => Some((Lifecycle::Failed, generation, Some(f.message.as_str()))),
            (None, shown) => shown,
        }
    }
}

/// `Sticky` as journals hold it: also the intent triple of format 5 and before.
impl<'de> Deserialize<'de> for Sticky {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            failure: Option<Failure>,
            #[serde(default)]
            inherited: Option<bool>,
            #[serde(default)]
            state: Option<Lifecycle>,
            #[serde(default)]
            generation: i64,
            #[serde(default)]
            message: Option<String>,
        }
        let w = Wire::deserialize(d)?;
        let failure = w.failure.or_else(|| {
            (w.state == Some(Lifecycle::Failed)).then(|| Failure {
                message: w.message.unwrap_or_default(),
                generation: w.generation,
            })
        });
        Ok(Sticky {
            failure,
            inherited: w.inherited.unwrap_or(w.state.is_none()),
            generation: w.generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Tracked, VmOwner};
    use crate::vm::VmRecord;

    fn pod(annotations: &[(&str, &str)]) -> PodView {
        PodView {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u1".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..PodView::default()
        }
    }

    fn running(settle: Option<Settle>) -> Phase {
        Phase::Running(Running {
            vm: Tracked {
                record: VmRecord::default(),
                ip: None,
                owner: VmOwner::Vk,
            },
            task: None,
            settle,
        })
    }

    const ADOPT_LEASE: Option<Settle> = Some(Settle::Lease {
        wait: IpWait::Adopt,
    });

    #[test]
    fn a_resumed_pod_keeps_what_the_previous_process_said() {
        let mut e = PodEntry::new(pod(&[
            (keys::LIFECYCLE_STATE, "hibernated"),
            (keys::LIFECYCLE_GENERATION, "3"),
        ]));
        e.phase = running(ADOPT_LEASE);
        assert_eq!(e.lifecycle(), Some((Lifecycle::Hibernated, 3, None)));
        // An adoption this process began as a new attempt is `creating` until the lease.
        e.sticky.inherited = false;
        assert_eq!(e.lifecycle(), Some((Lifecycle::Creating, 3, None)));
        e.phase = running(None);
        assert_eq!(e.lifecycle(), Some((Lifecycle::Ready, 3, None)));
    }

    #[test]
    fn a_pod_no_process_gave_a_lifecycle_gets_none_until_one_begins() {
        let mut e = PodEntry::new(pod(&[]));
        e.phase = running(ADOPT_LEASE);
        assert_eq!(e.lifecycle(), None);
        e.sticky.inherited = false;
        assert_eq!(e.lifecycle(), Some((Lifecycle::Creating, 0, None)));
    }

    /// B6: a pod made with `hibernate=true` (the operator remaking a hibernated agent's pod)
    /// shows `hibernated` at once: nothing runs for it, and its owner waits for that state. One
    /// that showed another state keeps it until this process begins something.
    #[test]
    fn a_pod_taken_in_hibernated_without_a_state_is_hibernated() {
        let mut e = PodEntry::new(pod(&[]));
        e.phase = Phase::Hibernated;
        assert_eq!(e.lifecycle(), Some((Lifecycle::Hibernated, 0, None)));
        let mut e = PodEntry::new(pod(&[(keys::LIFECYCLE_STATE, "ready")]));
        e.phase = Phase::Hibernated;
        assert_eq!(e.lifecycle(), Some((Lifecycle::Ready, 0, None)));
    }

    #[test]
    fn a_failure_outlives_a_settled_vm_until_a_higher_generation() {
        let mut e = PodEntry::new(pod(&[(keys::GENERATION, "2")]));
        e.sticky = Sticky {
            failure: Some(Failure {
                message: "hibernate: push failed".into(),
                generation: 2,
            }),
            inherited: false,
            generation: 2,
        };
        e.phase = running(None);
        let failed = Some((Lifecycle::Failed, 2, Some("hibernate: push failed")));
        assert_eq!(e.lifecycle(), failed);
        e.phase = Phase::Hibernated;
        assert_eq!(e.lifecycle(), failed);
        e.pod
            .annotations
            .insert(keys::GENERATION.into(), "3".into());
        // A higher generation alone does not end it: the transition stamped with it does.
        assert_eq!(
            e.lifecycle(),
            Some((Lifecycle::Failed, 2, Some("hibernate: push failed")))
        );
        e.sticky.generation = e.lifecycle_generation();
        assert_eq!(e.lifecycle(), Some((Lifecycle::Hibernated, 3, None)));
    }

    #[test]
    fn a_seeded_failure_is_sticky() {
        let e = PodEntry::new(pod(&[
            (keys::LIFECYCLE_STATE, "failed"),
            (keys::LIFECYCLE_GENERATION, "1"),
            (keys::LIFECYCLE_MESSAGE, "boom"),
        ]));
        assert_eq!(
            e.sticky.failure,
            Some(Failure {
                message: "boom".into(),
                generation: 1
            })
        );
    }

    #[test]
    fn a_journal_intent_decodes_into_sticky() {
        let old: Sticky =
            serde_json::from_str(r#"{"state":"failed","generation":4,"message":"boom"}"#)
                .expect("decodes");
        assert_eq!(
            old,
            Sticky {
                failure: Some(Failure {
                    message: "boom".into(),
                    generation: 4
                }),
                inherited: false,
                generation: 4,
            }
        );
        let none: Sticky = serde_json::from_str(r#"{"state":null,"generation":0,"message":null}"#)
            .expect("decodes");
        assert!(none.inherited && none.failure.is_none());
        let ready: Sticky = serde_json::from_str(r#"{"state":"ready","generation":1}"#).unwrap();
        assert_eq!(
            ready,
            Sticky {
                failure: None,
                inherited: false,
                generation: 1
            }
        );
        let new = serde_json::to_string(&old).expect("encodes");
        assert_eq!(serde_json::from_str::<Sticky>(&new).expect("decodes"), old);
    }
}
