//! The moments a user waits between (M6), kept per incarnation: an interval is observed once,
//! when its second moment arrives, and only if its first was seen by this process.

use serde::{Deserialize, Serialize};

use crate::status::PodStatus;
use crate::time::Millis;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// When intake first saw the incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_created: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_probe_ok: Option<Millis>,
    /// A status with ready=true came back from the server: the start-up is over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready_pushed: bool,
    /// A VM event acted on whose status change has not been written yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_event: Option<VmEventMark>,
}

/// The status the pod derived when the event came: a write carrying another one is the
/// event's effect reaching the server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmEventMark {
    pub at: Millis,
    pub before: PodStatus,
}

impl Moments {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}
