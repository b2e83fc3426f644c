//! The cocoon-net lease table (spec/cocoon-net-leases.md §5) and IP resolution for DHCP NICs.

use std::collections::{BTreeMap, BTreeSet};

use crate::create;
use crate::event::Lease;
use crate::pod::PodKey;
use crate::state::{State, Tracked};

pub fn changed(s: &mut State, table: Vec<Lease>) {
    let mut next: BTreeMap<String, Lease> = BTreeMap::new();
    for mut lease in table {
        lease.mac = lease.mac.to_ascii_lowercase();
        // Duplicate MACs should not happen; if they do, the latest expiry wins.
        match next.get(&lease.mac) {
            Some(have) if have.expiry >= lease.expiry => {}
            _ => {
                next.insert(lease.mac.clone(), lease);
            }
        }
    }
    let mut macs: BTreeSet<String> = BTreeSet::new();
    for (mac, lease) in &next {
        if s.leases.get(mac) != Some(lease) {
            macs.insert(mac.clone());
        }
    }
    for mac in s.leases.keys() {
        if !next.contains_key(mac) {
            macs.insert(mac.clone());
        }
    }
    s.leases = next;
    s.leases_seen = true;
    for mac in macs {
        if let Some(key) = s.macs.get(&mac).cloned() {
            refresh_ip(s, &key);
        }
    }
}

/// Static NIC → its IP; DHCP NIC → an unexpired lease for its MAC, else none.
pub fn resolve(s: &State, vm: &Tracked) -> Option<String> {
    if let Some(ip) = &vm.record.static_ip {
        return Some(ip.clone());
    }
    if vm.unmanaged {
        return vm.ip.clone();
    }
    // Before the lease file was read (a restart), the IP the pod already shows stands.
    if !s.leases_seen {
        return vm.ip.clone();
    }
    let mac = vm.record.mac.as_ref()?.to_ascii_lowercase();
    let lease = s.leases.get(&mac)?;
    (lease.expiry > s.now).then(|| lease.ip.clone())
}

pub fn refresh_ip(s: &mut State, key: &PodKey) {
    let Some(vm) = s.pods.get(key).and_then(|e| e.vm.as_ref()) else {
        return;
    };
    let ip = resolve(s, vm);
    let e = s.pods.get_mut(key).expect("present");
    let vm = e.vm.as_mut().expect("present");
    if vm.ip == ip {
        return;
    }
    vm.ip = ip.clone();
    s.touched.insert(key.clone());
    if ip.is_some() && s.pods[key].ip_wait.is_some() {
        create::ip_arrived(s, key);
    }
}
