//! Where the built control-plane binaries live (e2e/scripts/build-deps.sh puts them there).

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Result};

/// `$VK_COCOON_CACHE/bin`, by default `~/.cache/vk-cocoon/bin`: outside the checkout because CI
/// clones afresh on every run and the cold build takes ~10 minutes.
pub fn cache_bin_dir() -> PathBuf {
    let cache = match std::env::var_os("VK_COCOON_CACHE") {
        Some(c) => PathBuf::from(c),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/vk-cocoon"),
    };
    cache.join("bin")
}

/// Path of one built binary (`kube-apiserver`, `kube-scheduler`, `kube-controller-manager`,
/// `kubectl`, `etcd`, `registry`, `metrics-server`), or an error that says how to build it.
pub fn built(name: &str) -> Result<PathBuf> {
    let p = cache_bin_dir().join(name);
    if !p.exists() {
        bail!(
            "{} is missing: run `make deps` (e2e/scripts/build-deps.sh) to build kube-apiserver, \
             kube-scheduler, kube-controller-manager, kubectl, etcd, registry and metrics-server \
             into {}",
            p.display(),
            cache_bin_dir().display()
        );
    }
    Ok(p)
}

/// Fails early, with the `make deps` hint, when any built binary is missing.
pub fn require_all() -> Result<()> {
    for b in [
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "kubectl",
        "etcd",
        "registry",
    ] {
        built(b)?;
    }
    Ok(())
}

/// Debian's package: the harness does not build it.
pub fn prometheus() -> Result<PathBuf> {
    let p = PathBuf::from("/usr/bin/prometheus");
    if !p.exists() {
        bail!("/usr/bin/prometheus is missing: run e2e/scripts/ci-setup.sh (apt-get install -y prometheus)");
    }
    Ok(p)
}

/// PATH with the cache first: the image ships an older /usr/bin/kubectl (v1.32) that must never
/// win over the v1.37 build.
pub fn path_env() -> OsString {
    let mut parts = vec![cache_bin_dir()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap_or_else(|_| cache_bin_dir().into_os_string())
}
