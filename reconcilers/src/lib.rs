//! The pure core of vk-cocoon. Every input is an [`Event`]; [`reduce`] turns it into
//! [`Action`]s and keeps the desired pod status in [`State`]. No clock, no I/O, no randomness:
//! the same events always give the same actions, which is what makes `vk-cocoon replay` work.
//!
//! - `input/`: what comes in (events, and the outcomes of the actions that have one);
//! - `output/`: what goes out (actions, cocoon argv, their one-line forms);
//! - `model/`: what the core knows (the state, a pod's entry and phase, its writer, the
//!   decoded spec, the derived status and annotations);
//! - `handle/`: how each input changes the model, one module per phase or concern, and
//!   `reduce`, which routes an event to them.

mod handle;
mod input;
mod model;
mod output;

pub use input::event;
pub use model::macos as macos_model;
pub use model::{
    annotations, backoff, cocoon_caps, config, entry, holders, keys, moments, names, node_vms, ops,
    owner, phase, pod, pod_table, quantity, small_str, spec, state, status, time, vm, writer,
};
pub(crate) use output::macos_cmd;
pub use output::{action, cocoon, fixup, labels, render};

pub use handle::dhcp;
pub use handle::lifecycle;
use handle::{
    create, delete, evict, guest, hibernate, intake, kept, latency, macos, outcome, probe,
    provider, publish, snapshot, stale_create, startup, sweep, timers, tracking, trust, unmanaged,
    vm_events,
};

pub use action::{Action, OpId, Timer};
pub use config::Config;
pub use event::{Envelope, Event};
pub use handle::reduce::{reduce, reduce_touching};
pub use state::State;
#[cfg(feature = "testkit")]
pub mod testkit;
