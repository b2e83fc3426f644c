//! The snapshot directory cloud-hypervisor writes for `vm.snapshot` and reads for
//! `vm.restore`: `config.json` (the VmConfig), `state.json` (device and memory-manager
//! state, with the memory range table) and `memory-ranges` (guest memory). Every file is
//! created with create_new, as cloud-hypervisor does, so a used directory fails.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::memory::{GuestMemory, PAGE};

pub const CONFIG_FILE: &str = "config.json";
pub const STATE_FILE: &str = "state.json";
pub const MEMORY_FILE: &str = "memory-ranges";

/// What a restore brings back.
pub struct Restored {
    pub config: Value,
    pub memory: GuestMemory,
    pub device_counter: u64,
}

/// `file:///dir` → `/dir`; cloud-hypervisor accepts only the file scheme for snapshots.
pub fn url_to_path(url: &str) -> Result<PathBuf, String> {
    match url.strip_prefix("file://") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(format!("Invalid URL: {url}")),
    }
}

/// How long the memory file is: one page by default; with `CH_STANDIN_MEMORY_FILE=full`
/// the guest's RAM size, as a hole past the first page.
pub fn memory_file_len(config: &Value) -> u64 {
    if std::env::var("CH_STANDIN_MEMORY_FILE").as_deref() == Ok("full") {
        config["memory"]["size"].as_u64().unwrap_or(PAGE)
    } else {
        PAGE
    }
}

pub fn write(
    dir: &Path,
    config: &Value,
    memory: &GuestMemory,
    device_counter: u64,
) -> Result<(), String> {
    let create = |name: &str| -> Result<File, String> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join(name))
            .map_err(|e| format!("Error creating {name} snapshot file: {e}"))
    };
    use std::io::Write;
    let config_text = serde_json::to_vec(config).map_err(|e| e.to_string())?;
    create(CONFIG_FILE)?
        .write_all(&config_text)
        .map_err(|e| format!("Error writing VM config snapshot: {e}"))?;
    let len = memory_file_len(config);
    let state = state_json(config, len, device_counter);
    create(STATE_FILE)?
        .write_all(&serde_json::to_vec(&state).map_err(|e| e.to_string())?)
        .map_err(|e| format!("Error writing VM state snapshot: {e}"))?;
    let mem = create(MEMORY_FILE)?;
    memory
        .write_image(&mem, len)
        .map_err(|e| format!("Error writing memory snapshot: {e}"))?;
    mem.sync_all().map_err(|e| e.to_string())
}

/// The shape of cloud-hypervisor's `Snapshot` tree: one child per snapshottable component,
/// each with its serialised state.
fn state_json(config: &Value, memory_len: u64, device_counter: u64) -> Value {
    let devices: Vec<Value> = crate::config::ids(config)
        .into_iter()
        .map(|id| json!({ "id": id }))
        .collect();
    json!({
        "snapshots": {
            "memory-manager": {
                "snapshots": {},
                "snapshot_data": { "state": {
                    "memory_ranges": { "data": [ { "gpa": 0, "length": memory_len } ] },
                    "guest_ram_mappings": [],
                    "start_of_device_area": 0,
                    "boot_ram": config["memory"]["size"],
                    "current_ram": config["memory"]["size"],
                } },
            },
            "cpu-manager": { "snapshots": {}, "snapshot_data": { "state": {
                "boot_vcpus": config["cpus"]["boot_vcpus"],
            } } },
            "device-manager": { "snapshots": {}, "snapshot_data": { "state": {
                "device_id_cnt": device_counter,
                "devices": devices,
            } } },
        },
        "snapshot_data": null,
    })
}

pub fn read(dir: &Path) -> Result<Restored, String> {
    let text = std::fs::read(dir.join(CONFIG_FILE))
        .map_err(|e| format!("Error opening VM config snapshot file: {e}"))?;
    let config: Value = serde_json::from_slice(&text)
        .map_err(|e| format!("Error deserialising VM config snapshot: {e}"))?;
    let state_text = std::fs::read(dir.join(STATE_FILE))
        .map_err(|e| format!("Error opening VM state snapshot file: {e}"))?;
    let state: Value = serde_json::from_slice(&state_text)
        .map_err(|e| format!("Error deserialising VM state snapshot: {e}"))?;
    let device_counter = state["snapshots"]["device-manager"]["snapshot_data"]["state"]
        ["device_id_cnt"]
        .as_u64()
        .unwrap_or(0);
    let mem = File::open(dir.join(MEMORY_FILE))
        .map_err(|e| format!("Error opening memory snapshot file: {e}"))?;
    let memory = GuestMemory::read_image(&mem)?;
    Ok(Restored {
        config,
        memory,
        device_counter,
    })
}
