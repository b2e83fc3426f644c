//! vm.snapshot and vm.restore. A snapshot needs a paused VM; a restore needs a VMM with no
//! config yet (a fresh `--api-socket`-only process), reads the config.json cocoon may have
//! patched (its disks, NICs and console), reopens those devices, and leaves the VM Paused
//! unless the request says `resume: true`. The guest comes back with its memory: the value
//! and the address it had when the snapshot was taken.

use serde::Deserialize;

use crate::snapshot;
use crate::vmm::{boot_line, check_disks, Answer, ApiError, VmState, Vmm};

#[derive(Deserialize)]
pub struct SnapshotRequest {
    pub destination_url: String,
}

#[derive(Deserialize)]
pub struct RestoreRequest {
    pub source_url: String,
    #[serde(default)]
    pub prefault: bool,
    #[serde(default)]
    pub memory_restore_mode: Option<MemoryRestoreMode>,
    #[serde(default)]
    pub resume: bool,
}

/// Accepted and recorded; the stand-in's memory is one page, copied either way.
#[derive(Deserialize, Debug, Clone, Copy)]
pub enum MemoryRestoreMode {
    Copy,
    OnDemand,
}

impl Vmm {
    pub fn snapshot(&mut self, req: SnapshotRequest) -> Answer {
        const TOP: &str = "The VM could not be snapshotted";
        let vm = self
            .vm
            .as_ref()
            .ok_or_else(|| ApiError::new(500, TOP, "VM is not running"))?;
        if vm.state != VmState::Paused {
            return Err(ApiError::new(
                500,
                TOP,
                "Trying to snapshot while VM is running",
            ));
        }
        let dir =
            snapshot::url_to_path(&req.destination_url).map_err(|e| ApiError::new(500, TOP, e))?;
        let memory = self.guest.lock().memory.clone().unwrap_or_default();
        let config = self
            .config
            .as_ref()
            .ok_or_else(|| ApiError::new(500, TOP, "VM is not created"))?;
        snapshot::write(&dir, config, &memory, self.device_counter)
            .map_err(|e| ApiError::new(500, TOP, e))?;
        self.console
            .line(&format!("snapshot written to {}", dir.display()));
        Ok(None)
    }

    pub fn restore(&mut self, req: RestoreRequest) -> Answer {
        const TOP: &str = "The VM could not be restored";
        if self.vm.is_some() || self.config.is_some() {
            return Err(ApiError::new(500, TOP, "VM is already created"));
        }
        let fail = |e: String| ApiError::new(500, TOP, e);
        let dir = snapshot::url_to_path(&req.source_url).map_err(fail)?;
        let restored = snapshot::read(&dir).map_err(fail)?;
        let mut config = restored.config;
        check_disks(&config).map_err(fail)?;
        let nics = self.open_nics(&config).map_err(fail)?;
        self.console.open(&mut config).map_err(fail)?;
        self.device_counter = restored.device_counter;
        let mode = req.memory_restore_mode.unwrap_or(MemoryRestoreMode::Copy);
        self.console.line(&format!(
            "restored from {} (memory {mode:?}, prefault {}): {}",
            dir.display(),
            req.prefault,
            boot_line(&restored.memory, nics.first())
        ));
        self.config = Some(config);
        let state = if req.resume {
            VmState::Running
        } else {
            VmState::Paused
        };
        self.start(restored.memory, nics, state);
        Ok(None)
    }
}
