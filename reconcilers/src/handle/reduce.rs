//! The one entry point: an event in, the actions it causes out. After the handler runs, every
//! pod it touched has its desired status and annotations compared with what the server holds,
//! so each handler only changes state and never has to remember to publish.

use crate::action::{Action, Level};
use crate::event::{Envelope, Event};
use crate::pod::PodKey;
use crate::state::{Startup, State};
use crate::{dhcp, guest, intake, outcome, probe, publish, startup, sweep, timers, vm_events};

pub fn reduce(state: &mut State, envelope: Envelope) -> Vec<Action> {
    reduce_touching(state, envelope).0
}

/// [`reduce`], also naming the pods the event touched: every pod a returned action
/// writes the status or annotations of is among them, so the shell can bring its own read-side
/// views of them up to date before it sends anything the cluster acts on (INV-7).
pub fn reduce_touching(state: &mut State, envelope: Envelope) -> (Vec<Action>, Vec<PodKey>) {
    state.now = envelope.at;
    match envelope.event {
        Event::PodRelistBegin => intake::relist_begin(state),
        Event::PodRelistItem { pod } => {
            state.relist.seen.insert(pod.key());
            intake::pod_applied(state, pod);
        }
        Event::PodRelistEnd => {
            intake::relist_end(state);
            startup::try_start(state);
        }
        Event::PodApplied { pod } => intake::pod_applied(state, pod),
        Event::PodDeleted { pod } => intake::pod_gone(state, &pod.key(), &pod.uid),
        Event::VmListed { vms } => {
            // Only the first list is the startup inventory; later ones are the sweep's.
            if let Startup::Waiting {
                inventory: none @ None,
            } = &mut state.startup
            {
                *none = Some(vms);
                startup::try_start(state);
            }
        }
        // B1: without the VM inventory no adoption or orphan decision is safe, so startup
        // stops and the node is not registered; after startup a failed list changes nothing.
        Event::VmListFailed { error } if !state.started() => state.emit(Action::Abort {
            message: format!(
                "cocoon vm list failed at startup, not registering the node: {}",
                error.message
            ),
        }),
        Event::VmListFailed { error } => state.emit(Action::Log {
            level: Level::Error,
            message: format!("cocoon vm list failed: {}", error.message),
        }),
        Event::VmStreamConnected => sweep::stream_connected(state),
        Event::VmStream { kind, vm } => vm_events::stream_event(state, kind, vm),
        Event::VmStreamClosed { clean, .. } => vm_events::stream_closed(state, clean),
        Event::ProbeDone { key, seq, ok, .. } => probe::done(state, &key, seq, ok),
        Event::DhcpLeasesChanged { upsert, remove } => dhcp::changed(state, upsert, remove),
        Event::TimerFired { timer } => timers::fired(state, timer),
        Event::CocoonDone { op, result } => outcome::cocoon_done(state, op, result),
        Event::KubeDone { op, result } => outcome::kube_done(state, op, result),
        Event::RegistryDone { op, result } => outcome::registry_done(state, op, result),
        Event::DhcpLeaseReleased { op, result } => dhcp::released(state, op, result),
        Event::SacDone { op, result } => guest::sac_done(state, op, result),
        Event::NodeRegistered => {}
        Event::Namespace { name, uid } => {
            state.namespaces.insert(name, uid);
        }
        Event::HoldersRestored { holders, problem } => {
            startup::holders_restored(state, holders, problem)
        }
    }
    // Publishing can touch a pod again (a collected incarnation hands its name to the next
    // one, which is taken in at once); nothing touched may wait for the next event, or the
    // state between events would carry work that a state restored from a journal lacks.
    let mut all: Vec<PodKey> = Vec::new();
    let mut handed = std::collections::BTreeSet::new();
    loop {
        let touched = state.touched.take();
        if touched.is_empty() {
            // Write slots freed by this event go to the pods first in line.
            if publish::hand_on(state, &mut handed) {
                continue;
            }
            break;
        }
        for key in &touched {
            publish(state, key);
        }
        match all.is_empty() {
            true => all = touched,
            false => all.extend(touched),
        }
    }
    (std::mem::take(&mut state.out), all)
}

/// Push what the server lacks, then drop the entry if nothing is left to do for it.
fn publish(s: &mut State, key: &PodKey) {
    let Some(mut p) = s.publishing(key) else {
        return;
    };
    publish::sync(&mut p, key);
    if intake::collectable(p.entry) {
        intake::collect(s, key);
    }
}
