//! vk-cocoon, the shell around the pure core in `reconcilers`.

pub mod effects;
pub mod metrics;
pub mod node_resources;
pub mod runtime;
pub mod sources;
