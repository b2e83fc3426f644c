//! The bookkeeping of a pod's one status-and-annotations write: whether one is out, whether
//! the last failed and waits for its retry timer, whether the incarnation refused writes for
//! good, and a pushed status the server answered differently.

use serde::{Deserialize, Serialize};

use crate::action::OpId;
use crate::backoff::Backoff;
use crate::status::PodStatus;

/// Retries of a failed Kubernetes write (F2): 500 ms doubling to 15 s.
pub const RETRY: Backoff = Backoff::doubling(500, 15_000);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub state: WriteState,
    /// Failed writes in a row; the next retry waits `RETRY.after(failures)`.
    pub failures: u32,
    /// A status we pushed whose echo still differed: not pushed again until it changes.
    pub echo_mismatch: Option<PodStatus>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "write", content = "op", rename_all = "snake_case")]
pub enum WriteState {
    #[default]
    Idle,
    /// One write out; what it lacks goes after its outcome.
    Out(OpId),
    /// The last write failed; the kube-retry timer re-opens the writer.
    Backoff,
    /// A write was refused as superseded (404/409/422): this incarnation gets no more.
    Superseded,
}

impl Writer {
    pub fn can_write(&self) -> bool {
        match self.state {
            WriteState::Idle => true,
            WriteState::Out(_) | WriteState::Backoff | WriteState::Superseded => false,
        }
    }

    pub fn out(&self) -> Option<OpId> {
        match self.state {
            WriteState::Out(op) => Some(op),
            WriteState::Idle | WriteState::Backoff | WriteState::Superseded => None,
        }
    }
}
