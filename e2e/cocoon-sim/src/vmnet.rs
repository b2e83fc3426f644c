//! Gives a VM its host-side resources (address, netns + veth or a loopback address, cgroup
//! scope) and takes them back. The host-wide net lock covers only what parallel roots share:
//! claiming an address together with making sure the bridge exists, and releasing one
//! together with dropping the unused bridge. A VM's own netns and veth are plumbed outside
//! it, so VMs come up in parallel; its claim, made first, keeps the bridge alive meanwhile.

use crate::cgroup;
use crate::config::{Env, NetMode};
use crate::error::Result;
use crate::ipam::{self, Claim};
use crate::lock;
use crate::model::{StaticNet, StoredVm};
use crate::netns;
use crate::output::warn;

/// The simulator's static-IPAM convention: a CNI network whose name contains `static`.
pub fn is_static(network: &str) -> bool {
    network.contains("static")
}

/// The bridge-side address of the simulator's /16 an address belongs to.
pub fn gateway_of(ip: &str) -> String {
    let mut o = ip.split('.');
    match (o.next(), o.next()) {
        (Some(a), Some(b)) if !ip.is_empty() => format!("{a}.{b}.0.1"),
        _ => String::new(),
    }
}

fn want_netns(env: &Env) -> bool {
    match env.net {
        NetMode::Netns => true,
        NetMode::Loopback => false,
        NetMode::Auto => netns::available(),
    }
}

fn set_address(vm: &mut StoredVm, addr: &ipam::Addr) {
    vm.sim.ip = addr.ip.clone();
    let static_net = is_static(&vm.config.network).then(|| StaticNet {
        ip: addr.ip.clone(),
        gateway: addr.gateway.clone(),
        prefix: addr.prefix,
    });
    if let Some(nic) = vm.network_configs.first_mut() {
        nic.network = static_net;
    }
}

fn attach_loopback(env: &Env, vm: &mut StoredVm) -> Result<()> {
    let addr = {
        let _l = lock::exclusive(&ipam::net_lock(env))?;
        ipam::allocate(env, ipam::LOOP_NET, &vm.id)?
    };
    set_address(vm, &addr);
    vm.sim.net_mode = "loopback".into();
    vm.sim.netns.clear();
    vm.sim.veth.clear();
    if let Some(nic) = vm.network_configs.first_mut() {
        nic.netns_path.clear();
    }
    Ok(())
}

fn attach_netns(env: &Env, vm: &mut StoredVm) -> Result<()> {
    let addr = {
        let _l = lock::exclusive(&ipam::net_lock(env))?;
        let addr = ipam::allocate(env, ipam::NETNS_NET, &vm.id)?;
        if let Err(e) = netns::ensure_bridge(&addr.gateway) {
            ipam::release(env, &addr.ip, &vm.id);
            return Err(e);
        }
        addr
    };
    let ns = netns::netns_name(&vm.id);
    let veth = vm.network_configs[0].tap.clone();
    let mac = vm.network_configs[0].mac.clone();
    // A guest that starts with its network down must never answer, not even briefly.
    let held = crate::fixup::pending(vm) || vm.sim.sac.as_ref().is_some_and(|s| s.need_set);
    let res = netns::plumb(&ns, &veth, &mac, (!held).then_some((&addr.ip, addr.prefix)));
    if let Err(e) = res {
        netns::teardown(&ns, &veth);
        if let Ok(_l) = lock::exclusive(&ipam::net_lock(env)) {
            ipam::release(env, &addr.ip, &vm.id);
        }
        return Err(e);
    }
    set_address(vm, &addr);
    vm.sim.net_mode = "netns".into();
    vm.sim.netns = ns.clone();
    vm.sim.veth = veth;
    vm.network_configs[0].netns_path = netns::netns_path(&ns);
    Ok(())
}

/// First-time network setup for a new VM. NICs beyond 0 exist only in the record.
pub fn attach(env: &Env, vm: &mut StoredVm) -> Result<()> {
    if vm.network_configs.is_empty() {
        return Ok(());
    }
    if want_netns(env) {
        match attach_netns(env, vm) {
            Ok(()) => return Ok(()),
            Err(e) if env.net == NetMode::Auto => {
                warn(
                    "sim.net",
                    format!("netns setup failed, using loopback: {e}"),
                );
            }
            Err(e) => return Err(e),
        }
    }
    attach_loopback(env, vm)
}

/// `vm start` recreates missing plumbing, as cocoon's recoverNetwork does.
pub fn recover(env: &Env, vm: &mut StoredVm) -> Result<()> {
    if vm.network_configs.is_empty() {
        return Ok(());
    }
    if vm.sim.ip.is_empty() {
        return attach(env, vm);
    }
    if vm.sim.net_mode != "netns"
        || netns::link_exists(&vm.sim.veth) && netns::netns_exists(&vm.sim.netns)
    {
        return Ok(());
    }
    {
        let _l = lock::exclusive(&ipam::net_lock(env))?;
        let gw = format!("{}.{}.0.1", ipam::NETNS_NET[0], ipam::NETNS_NET[1]);
        netns::ensure_bridge(&gw)?;
    }
    let mac = vm.network_configs[0].mac.clone();
    netns::plumb(&vm.sim.netns, &vm.sim.veth, &mac, Some((&vm.sim.ip, 16)))
}

pub fn attach_cgroup(env: &Env, vm: &mut StoredVm) {
    // A hub guest is a thread: cgroup v2 keeps a process's threads in one domain cgroup, so
    // a per-VM scope would stay empty and report nothing.
    if env.shared_guest(vm) {
        return;
    }
    // Recreated when missing: a sweep may have removed the scope of a stopped VM.
    if vm.sim.cgroup.is_empty() || !std::path::Path::new(&vm.sim.cgroup).is_dir() {
        vm.sim.cgroup = cgroup::create_scope(env, &vm.id)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
    }
}

/// Everything but the lease: cocoon-net keeps a deleted VM's lease until it expires.
/// Removing a VM costs the same however many VMs the host holds, as cocoon's does (a CNI
/// DEL frees one address): only a netns VM, the bridge's user, looks at the other claims, and
/// only at netns ones, so a loopback VM's rm holds the host-wide lock for one file's removal.
pub fn detach(env: &Env, vm: &StoredVm) {
    cgroup::remove_scope(&vm.sim.cgroup);
    netns::teardown(&vm.sim.netns, &vm.sim.veth);
    let Ok(_l) = lock::exclusive(&ipam::net_lock(env)) else {
        return;
    };
    ipam::release(env, &vm.sim.ip, &vm.id);
    if vm.sim.net_mode == "netns" {
        maybe_drop_bridge(env);
    }
}

/// Removes the shared bridge once no live VM of any root still claims a netns address.
/// Caller holds the net lock.
pub fn maybe_drop_bridge(env: &Env) {
    let in_use = ipam::claims_in(env, ipam::NETNS_NET)
        .iter()
        .any(Claim::owner_alive);
    if !in_use {
        netns::delete_bridge();
    }
}
