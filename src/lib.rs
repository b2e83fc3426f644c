//! vk-cocoon, the shell around the pure core in `reconcilers`.

pub mod backoff;
pub mod caps;
pub mod cocoon;
pub mod config;
pub mod effects;
pub mod heap;
pub mod journal;
pub mod kubelet;
pub mod metrics;
pub mod node_resources;
pub mod peer;
pub mod pod_patch;
pub mod registry;
pub mod replay;
pub mod runtime;
pub mod snapshot_owner;
pub mod sources;
pub mod stats;
pub mod stats_collector;
pub mod version;
pub mod views;
