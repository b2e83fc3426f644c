//! Who waits for an operation's outcome. Each kind of outcome has its own table, so routing
//! an outcome matches every owner of its kind and no other.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pod::PodKey;
use crate::status::PodStatus;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "owner", rename_all = "snake_case")]
pub enum CocoonOwner {
    /// The pod's one VM operation, whatever its phase.
    Pod { key: PodKey },
    /// The watcher of a VM record left `creating` (B3).
    StaleCreate {
        id: String,
        name: String,
        attempt: u32,
        call: crate::stale_create::Call,
    },
    /// The periodic `vm list` comparison (R11).
    Sweep,
    /// C13: an attempt of the guest fix-up.
    Fixup { key: PodKey },
    /// B1: `cocoon-macos vm list` before the startup reconcile.
    MacosInventory,
    /// R10/R11: the sweep's `cocoon-macos vm list`.
    MacosSweep,
    /// U7: the lease renewal nudged in a woken Windows guest; its outcome is counted.
    RenewNudge { key: PodKey },
    /// T8: a cleanup's `snapshot inspect` of `name`; its record decides whether `key`
    /// removes it.
    GuardedRemoval { key: PodKey, name: String },
    /// Work whose outcome is only logged (orphan removal, snapshot cleanup).
    Detached {
        what: String,
        /// Once this succeeds, the DHCP lease of this MAC is released (D6, B8 destroy).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        release: Option<String>,
    },
}

// The table boxes every owner, so a large write owner costs no space in the others.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "owner", rename_all = "snake_case")]
pub enum KubeOwner {
    /// The pod's one status-and-annotations write.
    Write {
        key: PodKey,
        /// The status pushed, if any, to tell an echo that differs from it (the server
        /// changed it) from a desired status that moved on while the write was out.
        status: Option<PodStatus>,
        annotations: BTreeMap<String, Option<String>>,
    },
    /// vk's grace-0 delete of the pod object.
    DeleteObject { key: PodKey },
    /// The eviction delete (W6).
    Evict { key: PodKey },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "owner", rename_all = "snake_case")]
pub enum RegistryOwner {
    /// The pod's one VM operation.
    Pod { key: PodKey },
    /// B9: the evidence that tells a restored Windows clone from a fresh one.
    Classify { key: PodKey },
    /// Cleanup whose outcome is only logged.
    Detached { what: String },
}
