//! The part of the daemon's configuration that decisions depend on. It is written into the
//! journal header, so a replay decides with exactly the settings the run had.

use serde::{Deserialize, Serialize};

use crate::cocoon_caps::CocoonCaps;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrphanPolicy {
    Destroy,
    Alert,
    Keep,
}

impl OrphanPolicy {
    /// An unknown value behaves as `alert` (B8).
    pub fn parse(s: &str) -> Self {
        match s {
            "destroy" => OrphanPolicy::Destroy,
            "keep" => OrphanPolicy::Keep,
            _ => OrphanPolicy::Alert,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestoreMode {
    Copy,
    Ondemand,
    Mmap,
}

impl RestoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Copy => "copy",
            RestoreMode::Ondemand => "ondemand",
            RestoreMode::Mmap => "mmap",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub node_name: String,
    /// `OCI_REGISTRY`, the base snapshots are pushed to and pulled from; `None`: unset, so
    /// nothing is pushed or pulled.
    #[serde(default)]
    pub registry: Option<String>,
    pub node_ip: String,
    pub orphan_policy: OrphanPolicy,
    pub cpu_class: Option<String>,
    pub restore_mode: RestoreMode,
    /// D6: DHCP leases of destroyed VMs are released through cocoon-net's control socket
    /// (`VK_COCOON_NET_CONTROL_SOCKET` set).
    #[serde(default)]
    pub release_dhcp_leases: bool,
    /// T4 (`VK_CLONE_FROM_DIR_ROOT`): the directory `clone-from-dir` paths must lie under;
    /// `None`: the annotation is refused.
    #[serde(default)]
    pub clone_from_dir_root: Option<String>,
    /// C14: `COCOON_MACOS_VNC_PASSWORD` is set, so macOS guests get a VNC display. The
    /// password itself stays in the shell.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub macos_vnc: bool,
    /// CLI-10: what this node's cocoon can do, read from its help texts at startup.
    #[serde(default, skip_serializing_if = "CocoonCaps::is_current")]
    pub cocoon: CocoonCaps,
    /// How many pod status-and-annotation writes the node has out at once (S9); the shell
    /// runs that many. A pod with something to write waits its turn beyond that.
    #[serde(
        default = "default_write_slots",
        skip_serializing_if = "is_default_write_slots"
    )]
    pub write_slots: u32,
    /// T12 (`VK_IMAGE_URL_HOSTS`): the hosts an `http(s)://` run image may be fetched from,
    /// as `host` (any port) or `host:port`; `*` allows any. `None`: any host, as journals
    /// written before the list existed decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url_hosts: Option<Vec<String>>,
    /// T14 (`VK_NETWORKS`): by namespace (`*` for every one), the named networks its pods may
    /// join; a pod that names none joins the node's default network. `None`: any network, as
    /// journals written before the list existed decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// T15 (`VK_PUBLIC_SNAPSHOTS`): the repositories whose snapshots without an owner record
    /// are public bases. `None`: every record-less snapshot is public, as journals written
    /// before the list existed decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_snapshots: Option<Vec<String>>,
    /// C13 (`VK_POST_CLONE_BUDGET`): how long a clone's guest fix-up is tried, from its first
    /// attempt.
    #[serde(
        default = "default_fixup_budget",
        skip_serializing_if = "is_default_fixup_budget"
    )]
    pub fixup_budget_ms: i64,
}

/// C13: three minutes of attempts every 3 s.
pub const FIXUP_BUDGET_MS: i64 = 180_000;

fn default_fixup_budget() -> i64 {
    FIXUP_BUDGET_MS
}

fn is_default_fixup_budget(ms: &i64) -> bool {
    *ms == FIXUP_BUDGET_MS
}

/// The kube write lane's size: enough to keep a loaded apiserver busy, few enough that a burst
/// of 1,000 pods queues here, where a pod's write is derived when its turn comes.
pub const WRITE_SLOTS: u32 = 32;

fn default_write_slots() -> u32 {
    WRITE_SLOTS
}

fn is_default_write_slots(n: &u32) -> bool {
    *n == WRITE_SLOTS
}

impl Config {
    /// T15: which record-less snapshots this node counts as public bases.
    pub fn bases(&self) -> crate::owner::Bases<'_> {
        crate::owner::Bases::of(self.public_snapshots.as_ref())
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_name: "cocoon-pool".into(),
            registry: None,
            node_ip: "127.0.0.1".into(),
            orphan_policy: OrphanPolicy::Destroy,
            cpu_class: None,
            restore_mode: RestoreMode::Ondemand,
            release_dhcp_leases: false,
            clone_from_dir_root: None,
            macos_vnc: false,
            cocoon: CocoonCaps::CURRENT,
            write_slots: WRITE_SLOTS,
            image_url_hosts: None,
            networks: None,
            public_snapshots: None,
            fixup_budget_ms: FIXUP_BUDGET_MS,
        }
    }
}
