//! R11, and what the event stream cannot promise: every 30 s, and at once when the stream
//! reconnects after a gap, `cocoon vm list` is compared with the VMs vk tracks. A tracked VM
//! that is missing from the list or not running gets the same treatment as a stream hint
//! (W4: inspect first; only cocoon's not-found evicts), so a VM removed or crashed while the
//! stream was down is not left behind a pod that looks alive. One sweep at a time.

use crate::action::{Action, Level, Timer};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::pod::PodKey;
use crate::state::{OpOwner, State};
use crate::vm::CocoonError;
use crate::vmevents;

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
    if !s.started {
        return;
    }
    if s.sweeping {
        // The one in flight stands for this one; only the timer chain must go on.
        s.sweep_rearm |= periodic;
        return;
    }
    s.sweeping = true;
    s.sweep_rearm = periodic;
    let op = s.new_op(OpOwner::Sweep);
    s.emit(Action::Cocoon {
        op,
        key: None,
        cmd: CocoonCmd::VmList,
    });
}

pub(crate) fn stream_connected(s: &mut State) {
    if std::mem::take(&mut s.stream_gap) {
        start(s, false);
    }
}

pub(crate) fn done(s: &mut State, result: Result<CocoonOk, CocoonError>) {
    s.sweeping = false;
    if std::mem::take(&mut s.sweep_rearm) {
        arm(s);
    }
    let vms = match result {
        Ok(CocoonOk::Vms { vms }) => vms,
        Ok(other) => {
            return s.emit(Action::Log {
                level: Level::Warn,
                message: format!("sweep: unexpected answer from cocoon vm list: {other:?}"),
            })
        }
        Err(e) => {
            return s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "sweep: cocoon vm list failed, trying again later: {}",
                    e.message
                ),
            })
        }
    };
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
        let Some(e) = s.pods.get(&key) else { continue };
        if e.busy.is_none() && vmevents::hintable(e) {
            vmevents::hint(s, &key);
        }
    }
}
