//! T10: an unmanaged pod brings its own VM (C5), but its `id` and `ip` annotations are only a
//! claim, and a tenant may write any. The claim stands only when this node proves it: the id
//! names a VM cocoon reports here, no other pod holds that VM or its name, and the ip is that
//! VM's own address. Otherwise the pod gets no VM, so nothing (exec, logs, port-forward, the
//! probe) reaches any VM or address through it.

use crate::action::{Action, Level};
use crate::phase::Phase;
use crate::pod::PodKey;
use crate::small_str::SmallStr;
use crate::spec::VmSpec;
use crate::state::{DhcpFile, State, VmOwner};
use crate::vm::VmRecord;

/// What the node says of an unmanaged pod's claim.
pub(crate) enum Claim {
    /// The VM, as the pod may hold it: the node's record, probed at the proven address.
    Proven(Box<VmRecord>),
    /// Only cocoon-net's lease file, not read yet since this process started, can tell.
    Wait,
    /// Why the claim is refused, and what to do.
    Refused(String),
}

/// T10: checks the pod's `id` and `ip` against the node's VMs, indexes and leases.
pub(crate) fn check(s: &State, key: &PodKey, spec: &VmSpec) -> Claim {
    let id = spec.static_id.as_deref().unwrap_or_default();
    let ip = spec.static_ip.as_deref().unwrap_or_default();
    let node = &s.config.node_name;
    let Some(vm) = s.node_vms.get(id) else {
        return Claim::Refused(format!(
            "unmanaged pod refused: no VM {id:?} runs on node {node}; vm.cocoonstack.io/id must \
             name a VM made on this node (cocoon vm run) before the pod"
        ));
    };
    let holder = s
        .vm_ids
        .get(id)
        .filter(|k| *k != key)
        .cloned()
        .or_else(|| crate::trust::name_holder(s, key, &vm.name));
    if let Some(other) = holder {
        return Claim::Refused(format!(
            "unmanaged pod refused: VM {id:?} ({}) belongs to {}; an unmanaged pod may \
             only name a VM no other pod holds",
            vm.name,
            crate::trust::holder_words(key, &other)
        ));
    }
    let leased = || {
        vm.macs
            .iter()
            .filter_map(|m| s.dhcp_leases.get(&SmallStr::new(m)))
            .filter(|l| l.expiry > s.now)
            .map(|l| l.ip.as_str())
    };
    if vm.ips.iter().any(|a| a == ip) || leased().any(|a| a == ip) {
        return Claim::Proven(Box::new(VmRecord {
            id: id.to_string(),
            name: vm.name.clone(),
            state: "running".into(),
            static_ip: Some(ip.to_string()),
            ..VmRecord::default()
        }));
    }
    if s.dhcp_file == DhcpFile::Unread && !vm.macs.is_empty() {
        return Claim::Wait;
    }
    let own: Vec<&str> = vm.ips.iter().map(String::as_str).chain(leased()).collect();
    let own = match own.is_empty() {
        true => "none known yet".to_string(),
        false => own.join(", "),
    };
    Claim::Refused(format!(
        "unmanaged pod refused: {ip} is not an address of VM {id:?} (its own: {own}); set \
         vm.cocoonstack.io/ip to the VM's address"
    ))
}

/// The claim waits for the lease file: said once in the log, the pod stays untaken.
pub(crate) fn wait(s: &mut State, key: &PodKey) {
    s.emit(Action::Log {
        level: Level::Info,
        message: format!(
            "pod {key}: its unmanaged VM's address is checked once the lease file is read"
        ),
    });
}

/// The lease file was read for the first time: the claims that waited for it are checked.
pub(crate) fn leases_read(s: &mut State) {
    if !s.started() {
        return;
    }
    let waiting: Vec<PodKey> = s
        .pods
        .sorted()
        .into_iter()
        .filter(|(_, e)| matches!(e.phase, Phase::Waiting))
        .filter(|(_, e)| e.spec.as_ref().is_ok_and(|sp| !sp.managed))
        .map(|(k, _)| k.clone())
        .collect();
    for key in waiting {
        crate::intake::intake(s, &key);
    }
}

/// The VM `id` is gone from the node: an unmanaged pod that held it loses its claim, so its
/// old address, which cocoon-net may hand to another VM, is no longer reached through it.
pub(crate) fn vm_gone(s: &mut State, id: &str) {
    let Some(key) = s.vm_ids.get(id).cloned() else {
        return;
    };
    let Some(e) = s.pods.get_mut(&key) else {
        return;
    };
    let tracked = match &e.phase {
        Phase::Running(r) if r.vm.owner == VmOwner::Pod => r.vm.clone(),
        Phase::Running(_)
        | Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => return,
    };
    e.phase = Phase::Waiting;
    crate::tracking::forget(s, &key, &tracked);
    let node = s.config.node_name.clone();
    crate::create::fail(
        s,
        &key,
        format!(
            "unmanaged pod refused: its VM {id:?} is gone from node {node}; make the VM again \
             and point vm.cocoonstack.io/id and ip at it"
        ),
    );
}
