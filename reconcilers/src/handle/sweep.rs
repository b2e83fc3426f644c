//! R11, and what the event stream cannot promise: every 30 s, and at once when the stream
//! reconnects after a gap, `cocoon vm list` is compared with the VMs vk tracks. A tracked VM
//! that is missing from the list or not running gets the same treatment as a stream hint
//! (W4: inspect first; only cocoon's not-found evicts), so a VM removed or crashed while the
//! stream was down is not left behind a pod that looks alive. One sweep at a time.

use crate::action::{Action, Level, Timer};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::phase::Phase;
use crate::pod::PodKey;
use crate::state::{CocoonOwner, State, StreamState, SweepState};
use crate::vm::CocoonError;
use crate::vm_events;

pub const PERIOD_MS: u64 = 30_000;

/// Startup is done: the periodic sweep begins.
pub(crate) fn arm(s: &mut State) {
    s.emit(Action::ArmTimer {
        timer: Timer::Sweep,
        after_ms: PERIOD_MS,
    });
}

/// `periodic`: started by the timer, so its outcome re-arms it.
pub(crate) fn start(s: &mut State, periodic: bool) {
    if !s.started() {
        return;
    }
    crate::macos::sweep(s);
    match &mut s.sweep.cocoon {
        // The one out stands for this one; only the timer chain must go on.
        SweepState::Out { rearm } => *rearm |= periodic,
        SweepState::Idle => {
            s.sweep.cocoon = SweepState::Out { rearm: periodic };
            let now = s.now;
            s.node_vms.listing(now);
            s.run_cocoon(CocoonOwner::Sweep, None, CocoonCmd::VmList);
        }
    }
}

pub(crate) fn stream_connected(s: &mut State) {
    match std::mem::take(&mut s.stream) {
        StreamState::Gap => start(s, false),
        StreamState::Connected => {}
    }
}

pub(crate) fn done(s: &mut State, result: Result<CocoonOk, CocoonError>) {
    if let SweepState::Out { rearm: true } = std::mem::take(&mut s.sweep.cocoon) {
        arm(s);
    }
    let vms = match result {
        Ok(CocoonOk::Vms { vms }) => vms,
        Ok(other) => {
            let what = format!("sweep: cocoon vm list answered {other:?}");
            return crate::outcome::unexpected(s, &what);
        }
        Err(e) => {
            s.node_vms.list_failed();
            return s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "sweep: cocoon vm list failed, trying again later: {}",
                    e.message
                ),
            });
        }
    };
    // T10: a VM the list lacks is gone, and with it an unmanaged pod's claim on it.
    for id in s.node_vms.listed(&vms) {
        crate::unmanaged::vm_gone(s, &id);
    }
    // B8: an orphan that is no longer listed (someone removed it) is no longer adoptable.
    s.unclaimed
        .retain(|_, orphan| vms.iter().any(|v| v.id == orphan.id));
    // R11: every tracked DHCP VM's lease is looked up again; a lease that lapsed without the
    // file changing is noticed here, since a Ready pod's probes report nothing while it answers.
    let dhcp: Vec<PodKey> = s.dhcp_macs.values().cloned().collect();
    for key in dhcp {
        if crate::dhcp::refresh_ip(s, &key) {
            crate::probe::retarget(s, &key);
        }
    }
    let running: std::collections::BTreeSet<&str> = vms
        .iter()
        .filter(|v| v.is_running())
        .map(|v| v.id.as_str())
        .collect();
    let doubtful: Vec<PodKey> = s
        .vm_ids
        .iter()
        .filter(|(id, _)| !running.contains(id.as_str()))
        .map(|(_, key)| key.clone())
        .collect();
    for key in doubtful {
        let Some(e) = s.pod(&key) else { continue };
        if matches!(&e.phase, Phase::Running(r) if r.task.is_none()) && vm_events::hintable(e) {
            vm_events::hint(s, &key);
        }
    }
}
