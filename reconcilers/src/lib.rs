//! The pure core of vk-cocoon. Every input is an [`Event`]; [`reduce`] turns it into
//! [`Action`]s and keeps the desired pod status in [`State`]. No clock, no I/O, no randomness:
//! the same events always give the same actions, which is what makes `vk-cocoon replay` work.

pub mod action;
pub mod annotations;
pub mod cocoon;
mod cocoon_outcome;
pub mod config;
mod create;
mod delete;
pub mod event;
mod intake;
pub mod keys;
mod kube_outcome;
mod lease_release;
pub mod leases;
pub mod lifecycle;
pub mod names;
pub mod pod;
pub mod pod_table;
mod pod_write;
mod probe;
pub mod quantity;
mod reduce;
pub mod small_str;
pub mod spec;
mod stale_create;
mod startup;
pub mod state;
pub mod status;
mod sweep;
pub mod time;
mod timers;
pub mod vm;
mod vmevents;

pub use action::{Action, OpId, Timer};
pub use config::Config;
pub use event::{Envelope, Event};
pub use reduce::reduce;
pub use state::State;
#[cfg(feature = "testkit")]
pub mod testkit;
