//! The indexes from a VM to the pod that holds it (id, name, DHCP MAC), kept in step with the
//! pod's phase: a VM enters them when a phase takes it and leaves when the pod lets it go.

use crate::pod::PodKey;
use crate::state::{State, Tracked};
use crate::{dhcp, probe};

/// Indexes the VM the pod's phase now holds and resolves its IP.
pub(crate) fn indexed(s: &mut State, key: &PodKey) {
    let Some(vm) = s.pod(key).and_then(|e| e.vm()) else {
        return;
    };
    let (id, name) = (vm.record.id.clone(), vm.record.name.clone());
    let mac = vm
        .record
        .mac
        .as_ref()
        .filter(|_| vm.record.static_ip.is_none())
        .map(|m| m.to_ascii_lowercase());
    let managed = vm.managed();
    // T11: a VM vk runs for this pod is recorded as the pod's, now with its id.
    let uid = s.pod(key).map(|e| e.pod.uid.clone());
    if let (true, Some(uid)) = (managed, uid) {
        let held = crate::holders::Held {
            holder: crate::holders::Holder::of(key, &uid, s.tenant(key)),
            id: Some(id.clone()),
            kept: false,
        };
        s.hold(&name, Some(held));
    }
    s.vm_ids.insert(id, key.clone());
    s.vm_names.insert(name, key.clone());
    if let Some(mac) = mac {
        s.dhcp_macs.insert(mac, key.clone());
    }
    s.touched.insert(key);
    if managed {
        dhcp::refresh_ip(s, key);
    }
}

/// Drops the indexes that point at this pod's VM.
pub(crate) fn unindex(s: &mut State, key: &PodKey, vm: &Tracked) {
    if s.vm_ids.get(&vm.record.id) == Some(key) {
        s.vm_ids.remove(&vm.record.id);
    }
    if s.vm_names.get(&vm.record.name) == Some(key) {
        s.vm_names.remove(&vm.record.name);
    }
    if let Some(mac) = &vm.record.mac {
        let mac = mac.to_ascii_lowercase();
        if s.dhcp_macs.get(&mac) == Some(key) {
            s.dhcp_macs.remove(&mac);
        }
    }
}

/// The VM is gone for good (removed by vk, or found gone): stop probing it, drop its
/// indexes and its restart record, and release its DHCP lease. The caller has already moved
/// the pod to a phase without it.
pub(crate) fn forget(s: &mut State, key: &PodKey, vm: &Tracked) {
    probe::stop(s, key);
    s.restarts.remove(&vm.record.id);
    unindex(s, key, vm);
    // T11: nothing is left to hold.
    if vm.managed() && s.holders.of_vm(&vm.record.name, &vm.record.id).is_some() {
        s.hold(&vm.record.name, None);
    }
    if vm.managed() {
        if let Some(mac) = dhcp::release_mac(&vm.record) {
            dhcp::release(s, &mac);
        }
    }
    s.touched.insert(key);
}
