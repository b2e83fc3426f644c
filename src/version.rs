//! What this build calls itself. `VK_COCOON_VERSION` at build time stamps a release; an
//! unstamped build reports `dev` as the node's kubelet version (N7).

/// The package version, written into journal headers.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The build stamp reported as `nodeInfo.kubeletVersion`.
pub fn kubelet_version() -> &'static str {
    option_env!("VK_COCOON_VERSION").unwrap_or("dev")
}
