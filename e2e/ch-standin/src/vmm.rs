//! The VMM's state machine, one call per API request, with cloud-hypervisor's answers:
//! a VM config exists after create (or a restore); a VM exists after boot or restore, in
//! state Running or Paused; vm.shutdown drops the VM and keeps the config (vm.info then
//! says Created). Wrong-state requests get the status cloud-hypervisor's code gives them
//! (404 for a missing config or device, 500 for a VM in the wrong state), not the 405 its
//! OpenAPI document lists.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use crate::cmdline::Cmdline;
use crate::config::{self, str_at};
use crate::console::Console;
use crate::guest::shared::{GuestShared, NicLink};
use crate::memory::GuestMemory;
use crate::program::Program;

/// The version the stand-in answers for (the cloud-hypervisor release its API follows).
pub const VERSION: &str = "v50.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum VmState {
    Created,
    Running,
    Shutdown,
    Paused,
}

/// A failed request: its status and cloud-hypervisor's error chain (a JSON array of strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub messages: Vec<String>,
}

impl ApiError {
    pub fn new(status: u16, top: &str, cause: impl Into<String>) -> ApiError {
        ApiError {
            status,
            messages: vec!["Error from API".into(), top.into(), cause.into()],
        }
    }
}

pub type Answer = Result<Option<Value>, ApiError>;

/// What the process does once the answer is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Continue,
    Exit,
}

pub(crate) struct Nic {
    pub id: String,
    pub link: NicLink,
}

pub(crate) struct Vm {
    pub state: VmState,
    pub nics: Vec<Nic>,
    /// A power button pressed while paused: the guest acts on it once it runs.
    pub power_off_pending: bool,
    pub next_slot: u32,
}

pub struct Vmm {
    pub(crate) config: Option<Value>,
    pub(crate) vm: Option<Vm>,
    pub(crate) device_counter: u64,
    pub(crate) guest: Arc<GuestShared>,
    pub(crate) console: Arc<Console>,
    no_shutdown: bool,
}

fn not_running(top: &str) -> ApiError {
    ApiError::new(500, top, "VM is not running")
}

impl Vmm {
    pub fn new(guest: Arc<GuestShared>, console: Arc<Console>, no_shutdown: bool) -> Vmm {
        Vmm {
            config: None,
            vm: None,
            device_counter: 0,
            guest,
            console,
            no_shutdown,
        }
    }

    pub fn state(&self) -> Option<VmState> {
        self.vm.as_ref().map(|v| v.state)
    }

    pub fn create(&mut self, config: Value) -> Answer {
        if self.config.is_some() {
            return Err(ApiError::new(
                500,
                "The VM could not be created",
                "VM is already created",
            ));
        }
        self.config = Some(config);
        Ok(None)
    }

    pub fn boot(&mut self) -> Answer {
        const TOP: &str = "The VM could not boot";
        if self.vm.is_some() {
            return Err(ApiError::new(500, TOP, "VM is already created"));
        }
        let mut config = self
            .config
            .clone()
            .ok_or_else(|| ApiError::new(404, TOP, "VM is not created"))?;
        let fail = |e: String| ApiError::new(500, TOP, e);
        for key in ["kernel", "firmware", "initramfs"] {
            if let Some(path) = str_at(&config, &["payload", key]) {
                std::fs::metadata(path)
                    .map_err(|e| fail(format!("Cannot open {key} {path}: {e}")))?;
            }
        }
        check_disks(&config).map_err(fail)?;
        config::assign_ids(&mut config, &mut self.device_counter);
        let nics = self.open_nics(&config).map_err(fail)?;
        self.console.open(&mut config).map_err(fail)?;
        let cmdline = Cmdline::parse(str_at(&config, &["payload", "cmdline"]).unwrap_or(""));
        let (program, why) = Program::load(str_at(&config, &["payload", "initramfs"]));
        if let Some(why) = why {
            self.console.line(&why);
        }
        let memory = GuestMemory {
            hostname: cmdline.hostname.clone().unwrap_or_else(|| "standin".into()),
            address: cmdline.ip_of(0),
            value: String::new(),
            program,
        };
        self.console.line(&boot_line(&memory, nics.first()));
        self.config = Some(config);
        self.start(memory, nics, VmState::Running);
        Ok(None)
    }

    pub(crate) fn start(&mut self, memory: GuestMemory, nics: Vec<Nic>, state: VmState) {
        let link = nics.first().map(|n| n.link.clone());
        self.guest.update(|v| {
            v.memory = Some(memory);
            v.running = state == VmState::Running;
            v.nic = link;
            v.generation += 1;
        });
        let next_slot = 2 + config::ids(self.config.as_ref().unwrap_or(&Value::Null)).len() as u32;
        self.vm = Some(Vm {
            state,
            nics,
            power_off_pending: false,
            next_slot,
        });
    }

    pub fn pause(&mut self) -> Answer {
        const TOP: &str = "The VM could not be paused";
        let vm = self.vm.as_mut().ok_or_else(|| not_running(TOP))?;
        if vm.state != VmState::Running {
            return Err(ApiError::new(
                500,
                TOP,
                format!("Invalid transition: {:?} to Paused", vm.state),
            ));
        }
        vm.state = VmState::Paused;
        self.guest.update(|v| v.running = false);
        Ok(None)
    }

    pub fn resume(&mut self) -> Result<After, ApiError> {
        const TOP: &str = "The VM could not be resumed";
        let vm = self.vm.as_mut().ok_or_else(|| not_running(TOP))?;
        if vm.state != VmState::Paused {
            return Err(ApiError::new(
                500,
                TOP,
                format!("Invalid transition: {:?} to Running", vm.state),
            ));
        }
        vm.state = VmState::Running;
        if vm.power_off_pending {
            return Ok(self.guest_power_off());
        }
        self.guest.update(|v| v.running = true);
        Ok(After::Continue)
    }

    pub fn shutdown(&mut self) -> Answer {
        if self.vm.is_none() {
            return Err(not_running("The VM could not shut down"));
        }
        self.console.line("shutting down");
        self.stop_vm();
        Ok(None)
    }

    /// The guest reacts to ACPI power-button by powering off, and cloud-hypervisor exits
    /// when its guest powers off (unless `--no-shutdown`).
    pub fn power_button(&mut self) -> Result<After, ApiError> {
        let vm = self
            .vm
            .as_mut()
            .ok_or_else(|| not_running("The VM could not be powered off"))?;
        if vm.state == VmState::Paused {
            vm.power_off_pending = true;
            return Ok(After::Continue);
        }
        Ok(self.guest_power_off())
    }

    fn guest_power_off(&mut self) -> After {
        self.console.line("power button pressed: powering off");
        self.stop_vm();
        if self.no_shutdown {
            After::Continue
        } else {
            After::Exit
        }
    }

    fn stop_vm(&mut self) {
        self.vm = None;
        self.console.close();
        self.guest.update(|v| {
            v.memory = None;
            v.running = false;
            v.nic = None;
            v.generation += 1;
        });
    }

    pub fn delete(&mut self) -> Answer {
        if self.vm.is_some() {
            self.stop_vm();
        }
        self.config = None;
        Ok(None)
    }

    pub fn info(&self) -> Answer {
        let config = self.config.as_ref().ok_or_else(|| {
            ApiError::new(
                404,
                "The VM information is not available",
                "VM is not created",
            )
        })?;
        let size = config["memory"]["size"].as_u64().unwrap_or(0);
        let balloon = config["balloon"]["size"].as_u64().unwrap_or(0);
        let device_tree = self.vm.as_ref().map(|_| {
            let nodes: serde_json::Map<String, Value> = config::ids(config)
                .into_iter()
                .map(|id| {
                    (
                        id.clone(),
                        json!({ "id": id, "resources": [], "children": [], "pci_bdf": null }),
                    )
                })
                .collect();
            Value::Object(nodes)
        });
        Ok(Some(json!({
            "config": config,
            "state": self.state().unwrap_or(VmState::Created),
            "memory_actual_size": size.saturating_sub(if self.vm.is_some() { balloon } else { 0 }),
            "device_tree": device_tree,
        })))
    }

    pub fn ping(&self) -> Value {
        json!({
            "build_version": format!("{VERSION}-ch-standin"),
            "version": VERSION.trim_start_matches('v'),
            "pid": std::process::id(),
            "features": ["kvm"],
        })
    }
}

pub(crate) fn check_disks(config: &Value) -> Result<(), String> {
    for d in config["disks"].as_array().into_iter().flatten() {
        let path = d["path"].as_str().unwrap_or("");
        std::fs::metadata(path).map_err(|e| format!("Failed to open disk image {path}: {e}"))?;
    }
    Ok(())
}

pub(crate) fn boot_line(memory: &GuestMemory, nic: Option<&Nic>) -> String {
    let mac = nic
        .map(|n| crate::mac::format(&n.link.mac))
        .unwrap_or_else(|| "-".into());
    let addr = match &memory.address {
        Some(a) => format!("{}/{}", a.address, a.prefix),
        None => "no address".into(),
    };
    format!(
        "cocoon-standin guest {} booted: eth0 {mac} {addr}",
        memory.hostname
    )
}

#[cfg(test)]
#[path = "vmm_tests.rs"]
mod tests;
