//! The bookkeeping of a pod's one status-and-annotations write: whether one is out, whether
//! it waits for one of the node's write slots, whether the last failed and waits for its retry
//! timer, whether the incarnation refused writes for good, and a pushed status the server
//! answered differently. And the node's queue of pods waiting for a write slot.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::action::OpId;
use crate::backoff::Backoff;
use crate::pod::PodKey;
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
    /// Something to write, and every write slot of the node taken: waits at this turn of
    /// [`WriteTurns`]. What it writes is derived when its turn comes, so the changes made
    /// while it waited go out as one write.
    Waiting(u64),
    /// The last write failed; the kube-retry timer re-opens the writer.
    Backoff,
    /// A write was refused as superseded (404/409/422): this incarnation gets no more.
    Superseded,
}

impl Writer {
    pub fn can_write(&self) -> bool {
        match self.state {
            WriteState::Idle | WriteState::Waiting(_) => true,
            WriteState::Out(_) | WriteState::Backoff | WriteState::Superseded => false,
        }
    }

    pub fn out(&self) -> Option<OpId> {
        match self.state {
            WriteState::Out(op) => Some(op),
            WriteState::Idle
            | WriteState::Waiting(_)
            | WriteState::Backoff
            | WriteState::Superseded => None,
        }
    }
}

/// The pods waiting for a write slot, by the turn they began waiting at: the first turns get
/// the slots as they free, whatever else touches pods meanwhile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteTurns {
    next: u64,
    waiting: BTreeMap<u64, PodKey>,
}

impl WriteTurns {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// A new turn for `key`, behind every pod waiting.
    pub(crate) fn join(&mut self, key: &PodKey) -> u64 {
        let turn = self.next;
        self.next += 1;
        self.waiting.insert(turn, key.clone());
        turn
    }

    pub(crate) fn leave(&mut self, turn: u64) {
        self.waiting.remove(&turn);
        // Turns only order the pods waiting: with none, numbering starts again, so an idle
        // queue is the empty default a journal's state leaves out.
        if self.waiting.is_empty() {
            self.next = 0;
        }
    }

    /// Whether the pod at `turn` (`None`: not waiting) is among the first `free` in line.
    pub(crate) fn within(&self, turn: Option<u64>, free: usize) -> bool {
        match turn {
            Some(t) => self.waiting.range(..t).count() < free,
            None => self.waiting.len() < free,
        }
    }

    /// The pods waiting, first in line first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &PodKey)> {
        self.waiting.iter().map(|(t, k)| (*t, k))
    }
}
