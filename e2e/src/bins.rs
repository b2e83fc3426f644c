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

/// A binary of this workspace, for the harness to run: the path in `override_var` if set;
/// otherwise `cargo build -p <package> --bin <bin>` into the target directory (and profile) of
/// the running test or testbed binary — a no-op when fresh, so nothing stale ever runs, and
/// cargo holds no lock while tests run.
pub fn workspace_binary(
    package: &str,
    bin: &str,
    override_var: &str,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    use std::process::{Command, Stdio};
    if let Some(b) = std::env::var_os(override_var) {
        return Ok(b.into());
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .context("current exe has no parent")?
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if workspace.join("Cargo.toml").exists() {
        crate::step!("cargo build -p {package} --bin {bin} (a no-op when fresh)");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-j2", "-p", package, "--bin", bin])
            .current_dir(&workspace)
            .stdin(Stdio::null());
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .with_context(|| format!("running cargo build -p {package}"))?;
        if !status.success() {
            anyhow::bail!("building {package} failed ({status})");
        }
    }
    let path = dir.join(bin);
    if !path.exists() {
        anyhow::bail!(
            "{} is missing: build it with `cargo build -p {package}` or set {override_var}",
            path.display()
        );
    }
    Ok(path)
}
