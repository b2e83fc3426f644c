//! T10: every VM cocoon reports on this node, by id — the startup inventory, then the event
//! stream and the sweeps' lists — so an unmanaged pod's claim on a VM is checked against what
//! the node holds instead of taken on the pod's word.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::time::Millis;
use crate::vm::VmRecord;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVms {
    vms: BTreeMap<String, NodeVm>,
    /// When the sweep's `vm list` that is out was asked for: a VM the stream reported after
    /// that stays even when that list lacks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listing_since: Option<Millis>,
}

/// What proves a VM's identity and address: its name and its NICs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVm {
    pub name: String,
    /// The address of each NIC with static addressing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Each NIC's MAC, lowercase: a DHCP NIC's address is cocoon-net's lease for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<String>,
    /// When cocoon last reported it.
    pub seen: Millis,
}

impl NodeVm {
    fn of(vm: &VmRecord, seen: Millis) -> Self {
        let mut ips: Vec<String> = vm.static_ip.iter().cloned().collect();
        let mut macs: Vec<String> = vm.mac.iter().map(|m| m.to_ascii_lowercase()).collect();
        for nic in &vm.nics {
            macs.push(nic.mac.to_ascii_lowercase());
            if let Some(net) = &nic.network {
                ips.push(net.ip.clone());
            }
        }
        for v in [&mut ips, &mut macs] {
            v.sort_unstable();
            v.dedup();
        }
        NodeVm {
            name: vm.name.clone(),
            ips,
            macs,
            seen,
        }
    }
}

impl NodeVms {
    pub fn is_empty(&self) -> bool {
        self.vms.is_empty() && self.listing_since.is_none()
    }

    /// Whether cocoon reports a VM of this name.
    pub fn has_name(&self, name: &str) -> bool {
        self.vms.values().any(|v| v.name == name)
    }

    pub fn get(&self, id: &str) -> Option<&NodeVm> {
        self.vms.get(id)
    }

    /// The startup inventory: what the stream already reported is as fresh or fresher.
    pub fn seed(&mut self, vms: &[VmRecord], now: Millis) {
        for vm in vms.iter().filter(|v| !v.id.is_empty()) {
            self.vms
                .entry(vm.id.clone())
                .or_insert_with(|| NodeVm::of(vm, now));
        }
    }

    /// A stream record: the VM is there, as it says.
    pub fn reported(&mut self, vm: &VmRecord, now: Millis) {
        if !vm.id.is_empty() {
            self.vms.insert(vm.id.clone(), NodeVm::of(vm, now));
        }
    }

    /// A stream `DELETED`: the VM is gone.
    pub fn deleted(&mut self, id: &str) -> bool {
        self.vms.remove(id).is_some()
    }

    /// A sweep's `vm list` was asked for.
    pub fn listing(&mut self, now: Millis) {
        self.listing_since.get_or_insert(now);
    }

    /// The sweep's list came: it holds every VM that existed when it was asked for, so one it
    /// lacks that the stream has not reported since is gone. Returns the ids dropped.
    pub fn listed(&mut self, vms: &[VmRecord]) -> Vec<String> {
        let Some(since) = self.listing_since.take() else {
            return Vec::new();
        };
        let listed: BTreeMap<&str, &VmRecord> = vms.iter().map(|v| (v.id.as_str(), v)).collect();
        let gone: Vec<String> = self
            .vms
            .iter()
            .filter(|(id, vm)| !listed.contains_key(id.as_str()) && vm.seen < since)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.vms.remove(id);
        }
        for (id, vm) in listed {
            match self.vms.get(id) {
                Some(known) if known.seen >= since => {}
                Some(_) | None if !id.is_empty() => {
                    self.vms.insert(id.to_string(), NodeVm::of(vm, since));
                }
                Some(_) | None => {}
            }
        }
        gone
    }

    /// The sweep's list failed: the next one is asked for afresh.
    pub fn list_failed(&mut self) {
        self.listing_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(id: &str, ip: Option<&str>) -> VmRecord {
        VmRecord {
            id: id.into(),
            name: format!("n-{id}"),
            state: "running".into(),
            mac: Some("02:AA:00:00:00:01".into()),
            static_ip: ip.map(str::to_string),
            ..VmRecord::default()
        }
    }

    #[test]
    fn a_list_drops_only_what_the_stream_has_not_reported_since_it_was_asked_for() {
        let mut t = NodeVms::default();
        t.seed(&[vm("OLD", None), vm("KEPT", Some("10.0.0.2"))], 10);
        t.listing(20);
        t.reported(&vm("NEW", None), 25);
        let gone = t.listed(&[vm("KEPT", Some("10.0.0.2"))]);
        assert_eq!(gone, vec!["OLD".to_string()]);
        assert!(
            t.get("NEW").is_some(),
            "reported after the list was asked for"
        );
        let kept = t.get("KEPT").expect("listed");
        assert_eq!(kept.ips, vec!["10.0.0.2".to_string()]);
        assert_eq!(kept.macs, vec!["02:aa:00:00:00:01".to_string()]);
        assert!(t.listed(&[]).is_empty(), "no list out: nothing is judged");
    }
}
