//! Sources turn the world into events for the loop. They translate; they never decide.

mod bounded_lines;
pub mod cocoon_stream;
pub mod dhcp_leases;
pub mod namespaces;
pub mod pod_view;
pub mod pods;

/// The loop's queue (F4). Every sender awaits room, so a loop that falls behind slows the pod
/// watch and the VM event stream down (both buffer upstream and lose nothing) instead of
/// growing without bound. Outcomes of actions are sent from the tasks that ran them, never
/// from the loop itself, so a full queue cannot block the only reader it has.
pub type EventTx = tokio::sync::mpsc::Sender<reconcilers::Event>;
pub type EventRx = tokio::sync::mpsc::Receiver<reconcilers::Event>;

/// Room for a relist of every pod a node may hold by default (256), the VM stream's replay
/// of as many VMs on reconnect, and a round of probe outcomes for each, many times over.
/// The loop reduces and journals an event in a few microseconds (docs/benchmarks.md), so a
/// full queue means it has been stopped for a while, not merely outrun.
pub const EVENT_QUEUE: usize = 4096;

pub fn event_queue() -> (EventTx, EventRx) {
    tokio::sync::mpsc::channel(EVENT_QUEUE)
}
