//! The real cocoon CLI as the testbed's cocoon host (`TESTBED_COCOON=real`): the binary `make
//! deps` builds from shared/vendor, launching the cloud-hypervisor stand-in (crate
//! e2e/ch-standin) for every VM, with a CNI network of the run's own ([`crate::cni`]).
//!
//! Everything cocoon keeps lives under `<run>/cocoon/` (root, run and log directories, the
//! conflist, host-local's allocations); outside it, cocoon creates a netns `cocoon-<ID>` per VM
//! with a veth on the run's bridge and the VM's TAP inside. [`teardown_in`] undoes all of it and
//! runs in every teardown of the run directory, also the sweep of a run whose owner died.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cni::CniNetwork;
use crate::rundir::RunDir;
use crate::step;

/// The environment variable that picks the testbed's cocoon: `real`, or `sim` (the default).
pub const BACKEND_ENV: &str = "TESTBED_COCOON";

/// Under the run directory: cocoon's directories and the record [`teardown_in`] reads.
const SUBDIR: &str = "cocoon";
const RECORD: &str = "real-cocoon.json";

/// Whether `TESTBED_COCOON` asks for the real cocoon.
pub fn requested() -> Result<bool> {
    match std::env::var(BACKEND_ENV).as_deref() {
        Ok("real") => Ok(true),
        Ok("sim") | Ok("") | Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(other) => bail!("{BACKEND_ENV}={other:?}: must be `real` or `sim`"),
        Err(e) => bail!("{BACKEND_ENV}: {e}"),
    }
}

pub struct RealCocoon {
    /// The CLI (`~/.cache/vk-cocoon/bin/cocoon-real`), what the daemon's `VK_COCOON_BIN` names.
    pub bin: PathBuf,
    /// The stand-in cocoon launches as `cloud-hypervisor` (`COCOON_CH_BINARY`).
    pub standin: PathBuf,
    pub root: PathBuf,
    pub run_dir: PathBuf,
    pub log_dir: PathBuf,
    pub network: CniNetwork,
    run: PathBuf,
}

impl RealCocoon {
    /// Checks the binaries, builds the stand-in, claims the network and records how to tear it
    /// all down before anything can create a VM.
    pub fn start(run: &RunDir) -> Result<RealCocoon> {
        Self::start_in(run, SUBDIR)
    }

    /// Another cocoon host of the same run (a second node): its own root and network.
    pub fn host(run: &RunDir, name: &str) -> Result<RealCocoon> {
        Self::start_in(run, &format!("{SUBDIR}-{name}"))
    }

    fn start_in(run: &RunDir, subdir: &str) -> Result<RealCocoon> {
        let bin = crate::bins::built("cocoon-real")?;
        let erofs = crate::bins::built("mkfs.erofs")?;
        let standin = standin_binary()?;
        let dir = run.subdir(subdir)?;
        let root = dir.join("root");
        // A cloud image boots through UEFI firmware; the stand-in only checks the file exists.
        let firmware = root.join("firmware");
        std::fs::create_dir_all(&firmware)?;
        std::fs::write(firmware.join("CLOUDHV.fd"), b"placeholder firmware")?;
        let network = CniNetwork::create(&dir)?;
        let real = RealCocoon {
            bin,
            standin,
            root,
            run_dir: dir.join("run"),
            log_dir: dir.join("log"),
            network,
            run: run.path().to_path_buf(),
        };
        let record = serde_json::json!({
            "bin": real.bin,
            "env": real.env(),
            "bridge": real.network.name,
        });
        std::fs::write(dir.join(RECORD), serde_json::to_vec_pretty(&record)?)?;
        step!(
            "real cocoon {} (stand-in {}, {}) with root {}",
            real.bin.display(),
            real.standin.display(),
            erofs.display(),
            real.root.display()
        );
        Ok(real)
    }

    /// The environment a process needs to use this cocoon: the daemon under test gets exactly
    /// this, with `VK_COCOON_BIN` naming [`RealCocoon::bin`]. PATH has the cache first, for
    /// the mkfs.erofs that `image pull` runs.
    pub fn env(&self) -> Vec<(String, String)> {
        let s = |p: &Path| p.display().to_string();
        vec![
            ("COCOON_ROOT_DIR".into(), s(&self.root)),
            ("COCOON_RUN_DIR".into(), s(&self.run_dir)),
            ("COCOON_LOG_DIR".into(), s(&self.log_dir)),
            ("COCOON_CH_BINARY".into(), s(&self.standin)),
            ("COCOON_CNI_CONF_DIR".into(), s(&self.network.conf_dir)),
            ("COCOON_CNI_BIN_DIR".into(), s(&self.network.bin_dir)),
            (
                "PATH".into(),
                crate::bins::path_env().to_string_lossy().into_owned(),
            ),
        ]
    }

    /// A `cocoon` command bound to this root, carrying the run's marker so the stand-ins it
    /// launches are found by a sweep.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.envs(self.env())
            .env(crate::procs::MARKER, &self.run)
            .stdin(Stdio::null());
        c
    }

    /// Runs `cocoon <args>` and returns stdout; a non-zero exit is an error carrying stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        step!("cocoon {}", args.join(" "));
        let out = self
            .command()
            .args(args)
            .output()
            .with_context(|| format!("running cocoon {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "cocoon {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// [`RealCocoon::run`] of a verb that prints one JSON document.
    pub fn json(&self, args: &[&str]) -> Result<Value> {
        let out = self.run(args)?;
        serde_json::from_str(&out).with_context(|| format!("cocoon {}: {out}", args.join(" ")))
    }

    /// Ids of every VM of this root (`vm list`).
    pub fn vm_ids(&self) -> Result<Vec<String>> {
        Ok(parse_vm_list(&self.run(&["vm", "list", "-o", "json"])?))
    }
}

/// The netns cocoon's CNI provider gives VM `id`.
pub fn netns_name(id: &str) -> String {
    format!("cocoon-{id}")
}

/// The TAP of NIC `nic` of VM `id`, inside the VM's netns.
pub fn tap_name(id: &str, nic: usize) -> String {
    format!("tap{}-{nic}", &id[..id.len().min(8)])
}

fn parse_vm_list(out: &str) -> Vec<String> {
    // An empty root prints `No VMs found.` even with `-o json`.
    let Ok(Value::Array(vms)) = serde_json::from_str::<Value>(out) else {
        return Vec::new();
    };
    vms.iter()
        .filter_map(|v| v["id"].as_str().filter(|s| !s.is_empty()).map(String::from))
        .collect()
}

/// Undoes what the real cocoon of run `run` left outside the run directory: `vm rm --force`
/// of every VM of its root (CNI DEL releases the address and the veth, then the netns goes),
/// any netns its network index still names, then the bridge. Run after the run's processes
/// are stopped; a run without the real cocoon is left alone. Idempotent.
pub fn teardown_in(run: &Path) {
    let Ok(entries) = std::fs::read_dir(run) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == SUBDIR || name.starts_with(&format!("{SUBDIR}-")) {
            teardown_host(&e.path());
        }
    }
}

/// [`teardown_in`] for one host's directory.
fn teardown_host(dir: &Path) {
    let Ok(text) = std::fs::read(dir.join(RECORD)) else {
        return;
    };
    let Ok(record) = serde_json::from_slice::<Value>(&text) else {
        return;
    };
    let bin = record["bin"].as_str().unwrap_or_default().to_string();
    let env: Vec<(String, String)> =
        serde_json::from_value(record["env"].clone()).unwrap_or_default();
    let cocoon = |args: &[&str]| {
        Command::new(&bin)
            .args(args)
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .output()
    };
    let mut ids = match cocoon(&["vm", "list", "-o", "json"]) {
        Ok(out) => parse_vm_list(&String::from_utf8_lossy(&out.stdout)),
        Err(e) => {
            step!("real cocoon teardown: {bin} vm list: {e}");
            Vec::new()
        }
    };
    if !ids.is_empty() {
        let mut args = vec!["vm", "rm", "--force"];
        args.extend(ids.iter().map(String::as_str));
        step!("real cocoon teardown: cocoon {}", args.join(" "));
        match cocoon(&args) {
            Ok(out) if out.status.success() => {}
            Ok(out) => step!(
                "cocoon vm rm --force failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => step!("cocoon vm rm --force could not start: {e}"),
        }
    }
    // A VM whose record is gone but whose network is not (a run killed inside `vm run`).
    let index = dir.join("root/cni/db/networks.json");
    if let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(index).unwrap_or_default()) {
        if let Some(nets) = v["networks"].as_object() {
            ids.extend(
                nets.values()
                    .filter_map(|n| n["vm_id"].as_str().map(String::from)),
            );
        }
    }
    let existing = crate::sim::netns_list();
    for id in ids {
        let ns = netns_name(&id);
        if existing.contains(&ns) {
            crate::cni::delete_netns(&ns);
        }
    }
    if let Some(bridge) = record["bridge"].as_str() {
        crate::cni::delete_bridge(bridge);
    }
    let _ = std::fs::remove_file(dir.join(RECORD));
}

/// The real CLI for tests that drive it by hand, or `None` (skipped; a failure under CI, see
/// `crate::skip`) when it is not built or qemu-img, which its cloud-image import runs, is
/// missing.
pub fn cli_for_tests() -> Option<PathBuf> {
    let bin = match crate::bins::built("cocoon-real") {
        Ok(p) => p,
        Err(e) => {
            crate::skip::required(e);
        }
    };
    if Command::new("qemu-img").arg("--version").output().is_err() {
        crate::skip::required(
            "qemu-img (Debian's qemu-utils) is missing: run e2e/scripts/ci-setup.sh",
        );
    }
    Some(bin)
}

/// `CH_STANDIN_BIN` if set; otherwise `cargo build -p ch-standin --bin cloud-hypervisor` into
/// the target directory of the running binary (a no-op when fresh).
pub fn standin_binary() -> Result<PathBuf> {
    crate::bins::workspace_binary("ch-standin", "cloud-hypervisor", "CH_STANDIN_BIN")
}
