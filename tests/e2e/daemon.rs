//! What the e2e tests share lives in the vk-cocoon-e2e crate (`e2e::daemon`).
pub use e2e::daemon::*;
