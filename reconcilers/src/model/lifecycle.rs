//! The lifecycle annotation (L1–L4, ANN-4), derived. A pod's phase says most of it: a
//! bring-up is `creating`, a settled VM `ready`, a hibernate `hibernating` and then
//! `hibernated`. What the phase cannot tell is kept in [`Sticky`]: a failure, which outlives
//! the phase that failed (a hibernate rolled back to `Running`, a guest step given up) until a
//! new attempt (L3), and whether the keys are still the previous process's (L1). Where neither
//! says anything, the keys stay as the pod has them.

use serde::{Deserialize, Serialize};

use crate::entry::{Lifecycle, PodEntry};
use crate::keys;
use crate::model::macos::{MacosStep, Then};
use crate::phase::{CreateStep, IpWait, Phase, Running, Settle};
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Truncated to `MESSAGE_LIMIT` (ANN-4.2.9).
    pub message: String,
    /// The generation it was recorded at, following generation-only updates (ANN-4.2.6): a
    /// settled VM at a higher one replaces it (ANN-4.2.5).
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
    /// The generation a lifecycle write carries (ANN-4.2.2, 4.2.4: never lower than the one
    /// the pod shows).
    pub fn lifecycle_generation(&self) -> i64 {
        self.pod.generation().max(stamp_on(&self.pod))
    }

    /// The lifecycle triple the pod should show; `None`: none (a pod no process gave one).
    pub fn lifecycle(&self) -> Option<Shown<'_>> {
        let generation = self.lifecycle_generation();
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
        let running = |r: &Running| match &r.settle {
            None => at(Lifecycle::Ready),
            // An adopted VM's lease wait is no bring-up of this process's: the pod keeps what
            // it shows (`creating` when the adoption was taken in as a new attempt).
            Some(Settle::Lease {
                wait: IpWait::Adopt,
            }) => kept(),
            Some(Settle::Classify { .. } | Settle::Fixup(_) | Settle::Sac { .. })
            | Some(Settle::Lease {
                wait: IpWait::Clone | IpWait::Run | IpWait::Wake,
            }) => at(Lifecycle::Creating),
        };
        let phased = match &self.phase {
            Phase::Creating(c) => match &c.step {
                // B4 for a macOS guest: the restart's inspect resumes, it does not bring up.
                CreateStep::Macos {
                    macos:
                        MacosStep::Inspect {
                            then: Then::Resume, ..
                        },
                } => kept(),
                _ => at(Lifecycle::Creating),
            },
            Phase::Running(r) => running(r),
            Phase::Evicting(v) => running(&v.running),
            Phase::Hibernating(_) => at(Lifecycle::Hibernating),
            // B6: a hibernated pod taken in is `hibernated` only if its hibernate had begun.
            Phase::Hibernated => match kept() {
                Some((Lifecycle::Hibernating | Lifecycle::Hibernated, _, _)) => {
                    at(Lifecycle::Hibernated)
                }
                shown if self.sticky.inherited => shown,
                Some(_) | None => at(Lifecycle::Hibernated),
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
                if self.pod.generation() > f.generation =>
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
        })
    }
}
