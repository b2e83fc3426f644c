//! D6 (and B8 `destroy`): once vk has destroyed a VM, or found it gone, the DHCP lease of its
//! NIC is released through cocoon-net's control socket, so its address returns to the pool
//! instead of waiting out the lease. Best effort: the release is idempotent on cocoon-net's
//! side, a failure is logged and counted, never retried, and nothing waits for it.

use crate::action::{Action, Counter, Level};
use crate::state::{OpOwner, State};
use crate::vm::VmRecord;

/// The MAC whose lease a destroyed VM leaves behind: its first NIC's, when that NIC is DHCP.
pub(crate) fn dhcp_mac(vm: &VmRecord) -> Option<String> {
    vm.mac.clone().filter(|_| vm.static_ip.is_none())
}

pub(crate) fn release(s: &mut State, mac: &str) {
    if !s.config.release_leases {
        return;
    }
    let op = s.new_op(OpOwner::LeaseRelease {
        mac: mac.to_string(),
    });
    s.emit(Action::ReleaseLease {
        op,
        mac: mac.to_string(),
    });
}

pub(crate) fn done(s: &mut State, op: crate::action::OpId, result: Result<(), String>) {
    let Some(owner) = s.ops.remove(&op) else {
        return;
    };
    let OpOwner::LeaseRelease { mac } = *owner else {
        return;
    };
    let outcome = match result {
        Ok(()) => "ok",
        Err(why) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("lease release of {mac} failed (it expires on its own): {why}"),
            });
            "error"
        }
    };
    s.emit(Action::Count {
        counter: Counter::LeaseRelease {
            result: outcome.into(),
        },
    });
}
