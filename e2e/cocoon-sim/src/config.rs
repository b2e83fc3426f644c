//! Where the simulator keeps state and how it behaves, from flags and environment.
//! Root precedence: `--root-dir` > `COCOON_SIM_ROOT` > `COCOON_ROOT_DIR`; there is no default,
//! so the simulator can never touch a real cocoon's /var/lib/cocoon by accident.
//! Opt-in scale knobs: `COCOON_SIM_ZERO_BOOT=1` (no boot or lease delay) and
//! `COCOON_SIM_GUESTS=shared` (every guest a thread of one hub process per root, see `hub`).
//! Opt-in guest behaviour: `COCOON_SIM_GUEST_FIXUP=1` (clones owe the post-clone fixup, see
//! `fixup`) and `COCOON_SIM_SAC=1` (Windows SAC console, see `sac`); unset, guests behave as
//! plain copies that come up at once.

use std::path::{Path, PathBuf};

use crate::error::{fail, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetMode {
    Netns,
    Loopback,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    Record,
    Host,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guests {
    /// One process per guest.
    Process,
    /// One hub process per root; each guest is a thread of it.
    Shared,
}

#[derive(Clone, Debug)]
pub struct Env {
    pub root: PathBuf,
    pub run_dir: PathBuf,
    pub log_dir: PathBuf,
    pub leases: PathBuf,
    pub lease_delay_ms: u64,
    pub net: NetMode,
    pub boot_ms: u64,
    /// `COCOON_SIM_EVENT_POLL_MS` (200): how often the event stream compares the records;
    /// a record removed wakes it at once.
    pub event_poll_ms: u64,
    pub cgroup_parent: Option<String>,
    pub guest_ports: Vec<u16>,
    pub ipam_dir: PathBuf,
    pub exec: ExecMode,
    pub disk_bytes: u64,
    pub disk_data_bytes: u64,
    /// `COCOON_SIM_GUEST_FIXUP`: clones that need the daemon's post-clone fixup keep the source's
    /// network identity until the right `vm exec` script has run.
    pub guest_fixup: bool,
    /// `COCOON_SIM_SAC` (also on with the fixup knob): Windows guests serve a SAC console.
    pub sac: bool,
    pub guests: Guests,
}

#[derive(Default, Clone, Debug)]
pub struct DirFlags {
    pub root_dir: Option<String>,
    pub run_dir: Option<String>,
    pub log_dir: Option<String>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A byte count as cocoon spells sizes (`1073741824`, `64M`, `1GiB`).
fn bytes(name: &str, default: u64) -> Result<u64> {
    match var(name) {
        None => Ok(default),
        Some(v) => match crate::names::ram_in_bytes(&v) {
            Ok(n) if n >= 0 => Ok(n as u64),
            _ => fail(format!("{name}={v:?}: not a byte size")),
        },
    }
}

fn flag(name: &str) -> Result<bool> {
    match var(name).as_deref() {
        None | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => fail(format!("{name}={other:?}: want 1 or 0")),
    }
}

/// `COCOON_SIM_ZERO_BOOT`: also read by the hub, which inherits the environment of the call
/// that started it.
pub fn zero_boot() -> Result<bool> {
    flag("COCOON_SIM_ZERO_BOOT")
}

fn ms(name: &str, default: u64) -> Result<u64> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.parse() {
            Ok(n) => Ok(n),
            Err(_) => fail(format!("{name}={v:?}: not a number of milliseconds")),
        },
    }
}

pub fn parse_ports(s: &str) -> Result<Vec<u16>> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => out.push(n),
            _ => return fail(format!("invalid port {p:?}")),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn default_ipam_dir() -> PathBuf {
    // /run is per-boot, so allocations from a previous boot vanish on their own.
    let run = Path::new("/run");
    if run.is_dir() && unsafe { libc::access(c"/run".as_ptr(), libc::W_OK) } == 0 {
        run.join("vksim")
    } else {
        std::env::temp_dir().join("vksim")
    }
}

impl Env {
    pub fn load(flags: &DirFlags) -> Result<Env> {
        let root = flags
            .root_dir
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| var("COCOON_SIM_ROOT"))
            .or_else(|| var("COCOON_ROOT_DIR"));
        let Some(root) = root else {
            return fail(
                "cocoon-sim: no state dir: set COCOON_SIM_ROOT (or --root-dir / COCOON_ROOT_DIR)",
            );
        };
        let root = absolute(PathBuf::from(root));
        let run_dir = flags
            .run_dir
            .clone()
            .or_else(|| var("COCOON_RUN_DIR"))
            .map(|p| absolute(p.into()))
            .unwrap_or_else(|| root.join("run"));
        let log_dir = flags
            .log_dir
            .clone()
            .or_else(|| var("COCOON_LOG_DIR"))
            .map(|p| absolute(p.into()))
            .unwrap_or_else(|| root.join("log"));
        let leases = var("COCOON_SIM_LEASES")
            .map(|p| absolute(p.into()))
            .unwrap_or_else(|| root.join("net").join("leases.json"));
        let net = match var("COCOON_SIM_NET").as_deref() {
            None | Some("auto") => NetMode::Auto,
            Some("netns") => NetMode::Netns,
            Some("loopback") => NetMode::Loopback,
            Some(other) => {
                return fail(format!(
                    "COCOON_SIM_NET={other:?}: want netns|loopback|auto"
                ))
            }
        };
        let exec = match var("COCOON_SIM_EXEC").as_deref() {
            None | Some("record") => ExecMode::Record,
            Some("host") => ExecMode::Host,
            Some(other) => return fail(format!("COCOON_SIM_EXEC={other:?}: want record|host")),
        };
        let cgroup_parent = match std::env::var("COCOON_SIM_CGROUP_PARENT") {
            Ok(v) if v.is_empty() || v == "none" => None,
            Ok(v) => Some(v.trim_matches('/').to_string()),
            Err(_) => Some("cocoon.slice".to_string()),
        };
        let guest_ports =
            parse_ports(&var("COCOON_SIM_GUEST_PORTS").unwrap_or_else(|| "22,8080".into()))?;
        let ipam_dir = var("COCOON_SIM_IPAM_DIR")
            .map(|p| absolute(p.into()))
            .unwrap_or_else(default_ipam_dir);
        let disk_bytes = bytes("COCOON_SIM_DISK_BYTES", 8 << 20)?;
        if disk_bytes < crate::disk::GUESTFS_REGION {
            return fail(format!(
                "COCOON_SIM_DISK_BYTES={disk_bytes}: below the {} bytes the guest filesystem needs",
                crate::disk::GUESTFS_REGION
            ));
        }
        let guest_fixup = flag("COCOON_SIM_GUEST_FIXUP")?;
        let guests = match var("COCOON_SIM_GUESTS").as_deref() {
            None | Some("process") => Guests::Process,
            Some("shared") => Guests::Shared,
            Some(other) => {
                return fail(format!("COCOON_SIM_GUESTS={other:?}: want process|shared"))
            }
        };
        // Zero boot overrides both delays: nothing between a call and a guest that answers.
        let zero_boot = zero_boot()?;
        crate::lock::set_durable(!zero_boot);
        let delay = |name: &str, default: u64| -> Result<u64> {
            let v = ms(name, default)?;
            Ok(if zero_boot { 0 } else { v })
        };
        let sac = guest_fixup || flag("COCOON_SIM_SAC")?;
        Ok(Env {
            guest_fixup,
            sac,
            disk_bytes,
            disk_data_bytes: bytes("COCOON_SIM_DISK_DATA_BYTES", 0)?,
            run_dir,
            log_dir,
            leases,
            lease_delay_ms: delay("COCOON_SIM_LEASE_DELAY_MS", 300)?,
            net,
            boot_ms: delay("COCOON_SIM_BOOT_MS", 0)?,
            event_poll_ms: delay("COCOON_SIM_EVENT_POLL_MS", 200)?,
            guests,
            cgroup_parent,
            guest_ports,
            ipam_dir,
            exec,
            root,
        })
    }

    /// Whether this VM's guest runs in the hub. A Windows guest with a SAC console keeps a
    /// process of its own: the console is served per process.
    pub fn shared_guest(&self, vm: &crate::model::StoredVm) -> bool {
        self.guests == Guests::Shared && vm.sim.sac.is_none()
    }

    pub fn vm_state_dir(&self, id: &str) -> PathBuf {
        self.root.join("vms").join(id)
    }

    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(id)
    }
}

fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}
