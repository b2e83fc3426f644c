//! The JSON shapes of CLI-4, field order and omit-when-empty rules included, plus the
//! simulator's private bookkeeping stored beside each VM record.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::timefmt::rfc3339_nano;

fn zero_i64(v: &i64) -> bool {
    *v == 0
}
fn zero_u64(v: &u64) -> bool {
    *v == 0
}
fn not(v: &bool) -> bool {
    !*v
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Empty {}

/// Go embeds `types.Config` first and `name` last, hence this order.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VmConfig {
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub memory: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub storage: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub queue_size: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub disk_queue_size: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "not")]
    pub no_direct_io: bool,
    #[serde(default, skip_serializing_if = "not")]
    pub windows: bool,
    #[serde(default)]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct StaticNet {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub prefix: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Nic {
    pub tap: String,
    pub mac: String,
    pub num_queues: i64,
    pub queue_size: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bridge_dev: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<StaticNet>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Disk {
    pub path: String,
    pub ro: bool,
    pub serial: String,
    pub role: String,
}

/// What the simulator needs to know about a VM that cocoon would keep elsewhere (PID file,
/// netns, cgroup). Never printed.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SimInfo {
    #[serde(default)]
    pub pid: i32,
    #[serde(default)]
    pub ip: String,
    /// "netns", "loopback" or "" (no NICs).
    #[serde(default)]
    pub net_mode: String,
    #[serde(default)]
    pub netns: String,
    #[serde(default)]
    pub veth: String,
    #[serde(default)]
    pub cgroup: String,
    pub run_dir: String,
    pub log_dir: String,
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub lease: LeaseFault,
    /// Firecracker clones keep the source VM's MAC in the guest until it is fixed via exec.
    #[serde(default)]
    pub guest_mac: String,
    /// Set on clones that need the daemon's post-clone fixup (`COCOON_SIM_GUEST_FIXUP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixup: Option<FixupState>,
    /// Windows guests with a SAC console (`COCOON_SIM_SAC`): what `i` lists at boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sac: Option<SacBoot>,
    /// cocoon-macos personality: the VNC display QEMU serves, -1 when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vnc: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FixupState {
    /// `linux`, `linux_fc` or `windows`: which script the guest will accept.
    pub kind: String,
    pub done: bool,
}

/// One NIC as Windows SAC's `i` command lists it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SacNic {
    pub net: u32,
    pub ip: String,
    pub mask: String,
    pub gateway: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SacBoot {
    pub nics: Vec<SacNic>,
    /// A clone with a static NIC 0: its pod address answers only once SAC has set it.
    pub need_set: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LeaseFault {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub withhold: bool,
    #[serde(default)]
    pub until_renew: bool,
    #[serde(default)]
    pub renewed: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoredVm {
    pub id: String,
    pub hypervisor: String,
    pub state: String,
    pub config: VmConfig,
    #[serde(default)]
    pub network_configs: Vec<Nic>,
    #[serde(default)]
    pub storage_configs: Vec<Disk>,
    #[serde(default)]
    pub first_booted: bool,
    #[serde(default)]
    pub snapshot_ids: BTreeMap<String, Empty>,
    pub created_ns: i128,
    pub updated_ns: i128,
    #[serde(default)]
    pub started_ns: Option<i128>,
    #[serde(default)]
    pub stopped_ns: Option<i128>,
    #[serde(default)]
    pub transition_generation: u64,
    #[serde(default)]
    pub last_transition_reason: String,
    #[serde(default)]
    pub last_transition_at: Option<i128>,
    pub sim: SimInfo,
}

/// The public VM record (CLI-4.1), including the fields newer cocoon releases add.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct VmOut {
    pub id: String,
    pub hypervisor: String,
    pub state: String,
    pub config: VmConfig,
    pub pid: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_configs: Vec<Nic>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_configs: Vec<Disk>,
    pub first_booted: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_ids: BTreeMap<String, Empty>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vsock_socket: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net_backend: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns_path: String,
    #[serde(default, skip_serializing_if = "zero_u64")]
    pub transition_generation: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_at: Option<String>,
}

pub const CH: &str = "cloud-hypervisor";
pub const FC: &str = "firecracker";

impl StoredVm {
    pub fn socket_path(&self) -> String {
        format!("{}/api.sock", self.sim.run_dir)
    }

    pub fn log_file(&self) -> String {
        let name = if self.hypervisor == FC {
            "firecracker.log"
        } else {
            "cloud-hypervisor.log"
        };
        format!("{}/{name}", self.sim.log_dir)
    }

    pub fn transition(&mut self, state: &str, reason: &str, now: i128) {
        self.state = state.to_string();
        self.updated_ns = now;
        self.transition_generation += 1;
        self.last_transition_reason = reason.to_string();
        self.last_transition_at = Some(now);
        match state {
            "running" => self.started_ns = Some(now),
            "stopped" => self.stopped_ns = Some(now),
            _ => {}
        }
    }

    /// `state` is the stored value (what `vm list` shows); inspect and events pass the
    /// reconciled one. The PID is only reported while the stored state is `running`, as cocoon
    /// reads its PID file only then.
    pub fn to_out(&self, state: &str) -> VmOut {
        let out = self.to_out_newer(state);
        match crate::tier::current() {
            crate::tier::Tier::N => out,
            crate::tier::Tier::S => out.without_newer_fields(),
        }
    }

    fn to_out_newer(&self, state: &str) -> VmOut {
        let running = self.state == "running";
        VmOut {
            id: self.id.clone(),
            hypervisor: self.hypervisor.clone(),
            state: state.to_string(),
            config: self.config.clone(),
            pid: if running { self.sim.pid as i64 } else { 0 },
            socket_path: if running {
                self.socket_path()
            } else {
                String::new()
            },
            network_configs: self.network_configs.clone(),
            storage_configs: self.storage_configs.clone(),
            first_booted: self.first_booted,
            snapshot_ids: self.snapshot_ids.clone(),
            created_at: rfc3339_nano(self.created_ns),
            updated_at: rfc3339_nano(self.updated_ns),
            started_at: self.started_ns.map(rfc3339_nano),
            stopped_at: self.stopped_ns.map(rfc3339_nano),
            vsock_socket: if running {
                format!("{}/vsock.sock", self.sim.run_dir)
            } else {
                String::new()
            },
            net_backend: if self.network_configs.is_empty() {
                String::new()
            } else {
                "cni".into()
            },
            netns_path: self
                .network_configs
                .first()
                .map(|n| n.netns_path.clone())
                .unwrap_or_default(),
            transition_generation: self.transition_generation,
            last_transition_reason: self.last_transition_reason.clone(),
            last_transition_at: self.last_transition_at.map(rfc3339_nano),
        }
    }
}

impl VmOut {
    /// The reference release's record: none of the fields newer releases added.
    pub fn without_newer_fields(self) -> VmOut {
        VmOut {
            vsock_socket: String::new(),
            net_backend: String::new(),
            netns_path: String::new(),
            transition_generation: 0,
            last_transition_reason: String::new(),
            last_transition_at: None,
            ..self
        }
    }
}

/// `types.SnapshotConfig`: the embedded Config first, then the snapshot's own fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SnapshotConfig {
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub memory: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub storage: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub queue_size: i64,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub disk_queue_size: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "not")]
    pub no_direct_io: bool,
    #[serde(default, skip_serializing_if = "not")]
    pub windows: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, Empty>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "zero_i64")]
    pub nics: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct SnapshotOut {
    #[serde(flatten)]
    pub config: SnapshotConfig,
    pub created_at: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoredSnapshot {
    pub config: SnapshotConfig,
    pub created_ns: i128,
    #[serde(default)]
    pub pending: bool,
    /// MACs of the source VM's NICs, so a Firecracker clone can keep them inside the guest.
    #[serde(default)]
    pub source_macs: Vec<String>,
}

/// The `snapshot.json` envelope of an export archive (CLI-9).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct SnapshotEnvelope {
    pub config: SnapshotConfig,
    pub version: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ImageRec {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub size: i64,
    pub created_at: String,
}
