//! Hot-plug: vm.add-disk, vm.add-net, vm.remove-device. With a VM they plug a device and
//! answer 200 with its PCI id; without one they only edit the config (204), as
//! cloud-hypervisor does. The guest always sees the first NIC.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::config;
use crate::guest::shared::NicLink;
use crate::vmm::{check_disks, Answer, ApiError, Nic, Vmm};

impl Vmm {
    pub(crate) fn open_nics(&self, config: &Value) -> Result<Vec<Nic>, String> {
        config["net"]
            .as_array()
            .into_iter()
            .flatten()
            .map(open_nic)
            .collect()
    }

    pub fn add_disk(&mut self, disk: Value) -> Answer {
        const TOP: &str = "The disk could not be added to the VM";
        let path = disk["path"]
            .as_str()
            .ok_or_else(|| ApiError::new(400, TOP, "missing path"))?;
        let probe = json!({ "disks": [ { "path": path } ] });
        self.add_device("disks", "_disk", disk.clone(), TOP, |_| {
            check_disks(&probe).map(|_| None)
        })
    }

    pub fn add_net(&mut self, net: Value) -> Answer {
        const TOP: &str = "The network device could not be added to the VM";
        let mut net = net;
        if net.get("mac").is_none_or(Value::is_null) {
            net["mac"] = Value::String(crate::mac::format(&crate::mac::random()));
        }
        self.add_device("net", "_net", net, TOP, |n| open_nic(n).map(Some))
    }

    fn add_device(
        &mut self,
        key: &str,
        prefix: &str,
        mut device: Value,
        top: &str,
        plug: impl FnOnce(&Value) -> Result<Option<Nic>, String>,
    ) -> Answer {
        let config = self
            .config
            .as_mut()
            .ok_or_else(|| ApiError::new(404, top, "VM is not created"))?;
        let taken = config::ids(config);
        if let Some(id) = device["id"].as_str() {
            if taken.iter().any(|t| t == id) {
                return Err(ApiError::new(
                    409,
                    top,
                    format!("Identifier {id} is not unique"),
                ));
            }
        }
        let Some(vm) = self.vm.as_mut() else {
            push(config, key, device);
            return Ok(None);
        };
        if device.get("id").is_none_or(Value::is_null) {
            device["id"] = Value::String(config::next_id(prefix, &mut self.device_counter, &taken));
        }
        let nic = plug(&device).map_err(|e| ApiError::new(500, top, e))?;
        let id = device["id"].as_str().unwrap_or_default().to_string();
        push(config, key, device);
        let slot = vm.next_slot;
        vm.next_slot += 1;
        if let Some(nic) = nic {
            vm.nics.push(nic);
            self.relink_guest();
        }
        Ok(Some(
            json!({ "id": id, "bdf": format!("0000:00:{slot:02x}.0") }),
        ))
    }

    pub fn remove_device(&mut self, id: &str) -> Answer {
        const TOP: &str = "The device could not be removed from the VM";
        let config = self
            .config
            .as_mut()
            .ok_or_else(|| ApiError::new(404, TOP, "VM is not created"))?;
        let mut found = false;
        for key in ["disks", "net"] {
            if let Some(Value::Array(items)) = config.get_mut(key) {
                let before = items.len();
                items.retain(|d| d["id"].as_str() != Some(id));
                found |= items.len() != before;
            }
        }
        if !found {
            return Err(ApiError::new(
                404,
                TOP,
                format!("No device with id {id} to remove"),
            ));
        }
        if let Some(vm) = self.vm.as_mut() {
            let before = vm.nics.len();
            vm.nics.retain(|n| n.id != id);
            if vm.nics.len() != before {
                self.relink_guest();
            }
        }
        Ok(None)
    }

    /// The guest's NIC is the first one plugged; its MAC is that NIC's.
    fn relink_guest(&self) {
        let link = self
            .vm
            .as_ref()
            .and_then(|vm| vm.nics.first())
            .map(|n| n.link.clone());
        self.guest.update(|v| {
            v.nic = link;
            v.generation += 1;
        });
    }
}

fn push(config: &mut Value, key: &str, device: Value) {
    match config.get_mut(key) {
        Some(Value::Array(items)) => items.push(device),
        _ => config[key] = Value::Array(vec![device]),
    }
}

fn open_nic(net: &Value) -> Result<Nic, String> {
    let tap = net["tap"]
        .as_str()
        .ok_or("a NIC without a tap is not supported by the stand-in")?;
    let mac_text = net["mac"].as_str().unwrap_or_default();
    let mac = crate::mac::parse(mac_text).ok_or_else(|| format!("invalid mac {mac_text:?}"))?;
    let queues = crate::tap::open(tap, net["num_queues"].as_u64().unwrap_or(2))
        .map_err(|e| format!("Error opening TAP {tap}: {e}"))?;
    Ok(Nic {
        id: net["id"].as_str().unwrap_or_default().to_string(),
        link: NicLink {
            mac,
            queues: queues.into_iter().map(Arc::new).collect(),
        },
    })
}
