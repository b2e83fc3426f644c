//! How each input changes the model: one module per phase of a pod (create, vm_events for a
//! running pod, evict, delete) or per concern (intake, startup, probe, dhcp, publish…), and
//! `reduce`, which routes every event to them.

pub(crate) mod create;
pub(crate) mod delete;
pub mod dhcp;
pub(crate) mod evict;
pub(crate) mod guest;
pub(crate) mod hibernate;
pub(crate) mod intake;
pub(crate) mod kept;
pub(crate) mod latency;
pub mod lifecycle;
pub(crate) mod macos;
pub(crate) mod outage;
pub(crate) mod outcome;
pub(crate) mod probe;
pub(crate) mod provider;
pub(crate) mod publish;
pub(crate) mod reduce;
pub(crate) mod snapshot;
pub(crate) mod stale_create;
pub(crate) mod startup;
pub(crate) mod sweep;
pub(crate) mod timers;
pub(crate) mod tracking;
pub(crate) mod trust;
pub(crate) mod unmanaged;
pub(crate) mod vm_events;
