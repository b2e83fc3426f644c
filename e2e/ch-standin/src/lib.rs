//! ch-standin: a cloud-hypervisor stand-in for tests. The real `cocoon` CLI launches it in
//! place of `cloud-hypervisor`; it takes the same arguments, answers the REST API subset
//! cocoon uses on `--api-socket`, and runs a tiny userspace guest on the VM's TAP.

pub mod api;
pub mod cli;
pub mod cmdline;
pub mod config;
pub mod console;
pub mod guest;
pub mod mac;
pub mod memory;
pub mod options;
pub mod program;
pub mod server;
pub mod snapshot;
pub mod tap;
pub mod vmm;
mod vmm_devices;
mod vmm_snapshot;

pub use vmm_snapshot::{MemoryRestoreMode, RestoreRequest, SnapshotRequest};
