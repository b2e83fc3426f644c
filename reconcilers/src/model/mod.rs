//! What the core knows: the state and its tables, each pod's entry with its phase, writer and
//! probe agent, and what is derived from them (the decoded spec, the desired status and
//! annotations).

pub mod annotations;
pub mod backoff;
pub mod cocoon_caps;
pub mod config;
pub mod entry;
pub mod holders;
pub mod keys;
pub mod lifecycle;
pub mod macos;
pub mod moments;
pub mod names;
pub mod node_vms;
pub mod ops;
pub mod owner;
pub mod phase;
pub mod pod;
pub mod pod_table;
pub mod quantity;
pub mod small_str;
pub mod spec;
pub mod state;
pub mod status;
pub mod time;
pub mod vm;
pub mod writer;
