//! Builders for the pods and VM records tests talk about. Defaults are chosen so a scenario
//! only spells out what it is about: `pod("default", "a")` is a pod with VM name `vk-a`,
//! UID `u-a` and one container `agent`; `.managed().run("ubuntu:24.04")` makes it a run pod.

use crate::keys;
use crate::pod::{Container, OwnerRef, PodView};
use crate::status::PodStatus;
use crate::time::Millis;
use crate::vm::{Nic, StaticNet, VmRecord};

pub struct PodBuilder {
    pod: PodView,
}

/// A pod `ns/name` with VM name `vk-<name>`, UID `u-<name>`, one container `agent`.
pub fn pod(ns: &str, name: &str) -> PodBuilder {
    let mut pod = PodView {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("u-{name}"),
        containers: vec![Container {
            name: "agent".into(),
            ..Container::default()
        }],
        ..PodView::default()
    };
    pod.annotations
        .insert(keys::VM_NAME.into(), format!("vk-{name}"));
    PodBuilder { pod }
}

impl PodBuilder {
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.pod.annotations.insert(k.into(), v.into());
        self
    }

    pub fn without_annotation(mut self, k: &str) -> Self {
        self.pod.annotations.remove(k);
        self
    }

    pub fn managed(self) -> Self {
        self.annotation(keys::MANAGED, "true")
    }

    /// `mode=run` from `image`.
    pub fn run(self, image: &str) -> Self {
        self.annotation(keys::MODE, "run")
            .annotation(keys::IMAGE, image)
    }

    /// `mode=clone` from the snapshot of `image` (C8).
    pub fn clone_of(self, image: &str) -> Self {
        self.annotation(keys::MODE, "clone")
            .annotation(keys::IMAGE, image)
    }

    pub fn vm_name(self, name: &str) -> Self {
        self.annotation(keys::VM_NAME, name)
    }

    pub fn no_vm_name(self) -> Self {
        self.without_annotation(keys::VM_NAME)
    }

    pub fn probe_port(self, p: u16) -> Self {
        self.annotation(keys::PROBE_PORT, &p.to_string())
    }

    pub fn generation(self, g: i64) -> Self {
        self.annotation(keys::GENERATION, &g.to_string())
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.pod.uid = uid.into();
        self
    }

    /// When the API server made the pod.
    pub fn created(mut self, at: Millis) -> Self {
        self.pod.creation_timestamp = Some(at);
        self
    }

    /// CPU request and limit of container 0; `""` leaves one unset.
    pub fn cpu(self, req: &str, lim: &str) -> Self {
        self.resource("cpu", req, lim)
    }

    /// Memory request and limit of container 0; `""` leaves one unset.
    pub fn memory(self, req: &str, lim: &str) -> Self {
        self.resource("memory", req, lim)
    }

    fn resource(mut self, name: &str, req: &str, lim: &str) -> Self {
        let r = &mut self.pod.containers[0].resources;
        for (map, v) in [(&mut r.requests, req), (&mut r.limits, lim)] {
            if v.is_empty() {
                map.remove(name);
            } else {
                map.insert(name.into(), v.into());
            }
        }
        self
    }

    pub fn node_selector(mut self, k: &str, v: &str) -> Self {
        self.pod.node_selector.insert(k.into(), v.into());
        self
    }

    pub fn owner(mut self, kind: &str, name: &str) -> Self {
        self.pod.owners.push(OwnerRef {
            kind: kind.into(),
            name: name.into(),
        });
        self
    }

    pub fn restart_policy(mut self, p: &str) -> Self {
        self.pod.restart_policy = Some(p.into());
        self
    }

    pub fn deleting(mut self, at: Millis) -> Self {
        self.pod.deletion_timestamp = Some(at);
        self
    }

    pub fn status(mut self, status: PodStatus) -> Self {
        self.pod.status = status;
        self
    }

    pub fn build(self) -> PodView {
        self.pod
    }
}

pub struct VmBuilder {
    vm: VmRecord,
}

/// A running cloud-hypervisor VM with a DHCP NIC whose MAC is derived from the id.
pub fn vm(id: &str, name: &str) -> VmBuilder {
    VmBuilder {
        vm: VmRecord {
            id: id.into(),
            name: name.into(),
            state: "running".into(),
            pid: 100,
            hypervisor: "cloud-hypervisor".into(),
            mac: Some(mac_for(id)),
            static_ip: None,
            nics: vec![Nic {
                mac: mac_for(id),
                network: None,
            }],
            ..VmRecord::default()
        },
    }
}

/// A stable locally administered MAC for an id (FNV-1a), so tests need not invent one.
pub fn mac_for(id: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in id.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    let b = h.to_be_bytes();
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

impl VmBuilder {
    pub fn state(mut self, s: &str) -> Self {
        self.vm.state = s.into();
        self
    }
    pub fn pid(mut self, p: i64) -> Self {
        self.vm.pid = p;
        self
    }
    pub fn mac(mut self, m: &str) -> Self {
        self.vm.mac = Some(m.to_ascii_lowercase());
        if let Some(nic) = self.vm.nics.first_mut() {
            nic.mac = m.to_ascii_lowercase();
        }
        self
    }
    pub fn static_ip(mut self, ip: &str) -> Self {
        self.vm.static_ip = Some(ip.into());
        if let Some(nic) = self.vm.nics.first_mut() {
            nic.network = Some(StaticNet {
                ip: ip.into(),
                prefix: Some(24),
                gateway: None,
            });
        }
        self
    }
    pub fn hypervisor(mut self, h: &str) -> Self {
        self.vm.hypervisor = h.into();
        self
    }
    pub fn image(mut self, i: &str) -> Self {
        self.vm.image = i.into();
        self
    }
    pub fn build(self) -> VmRecord {
        self.vm
    }
}
