//! The cocoon simulator (crate e2e/cocoon-sim, binary `cocoon`), which stands in for the real
//! cocoon CLI: the daemon runs it exactly as it would run cocoon.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::rundir::RunDir;
use crate::step;

/// The simulator's cargo package.
pub const PACKAGE: &str = "cocoon-sim";

/// One simulator instance: its state root and lease file, both inside the run directory.
pub struct CocoonSim {
    pub bin: PathBuf,
    pub root: PathBuf,
    pub leases: PathBuf,
    /// Relative to the cgroup2 mount. One per run, so a test can check that exactly its own
    /// VM scopes are gone and parallel runs never share a parent.
    pub cgroup_parent: String,
    /// cocoon-net's lease release API, served by `cocoon sim net-control` for this run.
    pub control_socket: PathBuf,
    net_control: Option<crate::procs::Proc>,
    run: PathBuf,
    cleaned: bool,
}

impl CocoonSim {
    /// Builds (or finds) the `cocoon` binary and prepares a fresh root. The cleanup command is
    /// recorded in the run directory first, so even a run killed right now gets swept.
    pub fn new(run: &RunDir) -> Result<CocoonSim> {
        CocoonSim::host(run, "sim")
    }

    /// Another cocoon host in the same run (its own root, leases and cgroup parent, the shared
    /// bridge and address pool), for tests with more than one node. `name` is its
    /// subdirectory of the run.
    pub fn host(run: &RunDir, name: &str) -> Result<CocoonSim> {
        let bin = binary()?;
        let dir = run.subdir(name)?;
        let root = dir.join("root");
        std::fs::create_dir_all(&root)?;
        let run_name = run.path().file_name().unwrap_or_default().to_string_lossy();
        let suffix = if name == "sim" {
            String::new()
        } else {
            format!("-{name}")
        };
        let mut sim = CocoonSim {
            bin,
            root,
            leases: dir.join("leases.json"),
            cgroup_parent: format!("vk-cocoon-testbed-{run_name}{suffix}.slice"),
            control_socket: dir.join("net-control.sock"),
            net_control: None,
            run: run.path().to_path_buf(),
            cleaned: false,
        };
        run.add_cleanup(&sim.cleanup_argv(), &sim.env())?;
        let mut serve = sim.command();
        serve
            .args(["sim", "net-control", "--socket"])
            .arg(&sim.control_socket);
        sim.net_control = Some(run.spawn("cocoon-net-control", serve)?);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !sim.control_socket.exists() {
            if std::time::Instant::now() > deadline {
                bail!(
                    "cocoon sim net-control did not create {} within 10 s",
                    sim.control_socket.display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        step!(
            "cocoon simulator {} with root {}",
            sim.bin.display(),
            sim.root.display()
        );
        Ok(sim)
    }

    /// The environment a process needs to use this simulator as its `cocoon`: the daemon under
    /// test gets exactly this.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut path = vec![self.bin.parent().unwrap_or(Path::new("/")).to_path_buf()];
        if let Some(p) = std::env::var_os("PATH") {
            path.extend(std::env::split_paths(&p));
        }
        vec![
            ("COCOON_SIM_ROOT".into(), self.root.display().to_string()),
            (
                "COCOON_SIM_LEASES".into(),
                self.leases.display().to_string(),
            ),
            (
                "COCOON_SIM_CGROUP_PARENT".into(),
                self.cgroup_parent.clone(),
            ),
            (
                "PATH".into(),
                std::env::join_paths(path)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        ]
    }

    /// Settings for measuring the daemon rather than the simulator: VMs answer at once (no
    /// boot or lease delay), every guest is a thread of one hub process per root, so a
    /// thousand idle guests fit on a small machine, and guests listen on loopback addresses:
    /// a network namespace per VM costs the kernel more than everything else in `vm run`,
    /// and the daemon never looks inside one. Give them to the daemon's environment.
    pub fn at_scale_env() -> Vec<(String, String)> {
        vec![
            ("COCOON_SIM_ZERO_BOOT".into(), "1".into()),
            ("COCOON_SIM_GUESTS".into(), "shared".into()),
            ("COCOON_SIM_NET".into(), "loopback".into()),
        ]
    }

    /// A `cocoon` command bound to this simulator (for tests that drive it directly). It carries
    /// the run's marker, so guests it starts are found by a sweep even if `sim cleanup` fails.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.envs(self.env()).env(crate::procs::MARKER, &self.run);
        c
    }

    /// Runs `cocoon <args>` against this simulator and returns stdout; non-zero exit is an
    /// error carrying stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        step!("cocoon {}", args.join(" "));
        let out = self
            .command()
            .args(args)
            .stdin(Stdio::null())
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

    /// Ids of the VMs this simulator knows (its `vms/<id>` state directories).
    pub fn vm_ids(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.root.join("vms")) else {
            return Vec::new();
        };
        rd.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// The network namespace the simulator gives VM `id`.
    pub fn netns_name(id: &str) -> String {
        format!("vksim-{id}")
    }

    /// Absolute path of this run's cgroup parent, if the host has a cgroup2 mount.
    pub fn cgroup_parent_dir(&self) -> Option<PathBuf> {
        Some(cgroup2_mount()?.join(&self.cgroup_parent))
    }

    fn cleanup_argv(&self) -> Vec<String> {
        vec![
            self.bin.display().to_string(),
            "sim".into(),
            "cleanup".into(),
        ]
    }

    /// `cocoon sim cleanup`: removes the network namespaces, cgroups and processes this root
    /// created. Idempotent; also run by the teardown of the run directory.
    pub fn cleanup(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.cleaned, true) {
            return Ok(());
        }
        step!("cocoon sim cleanup ({})", self.root.display());
        let out = self
            .command()
            .args(["sim", "cleanup"])
            .stdin(Stdio::null())
            .output()
            .context("running cocoon sim cleanup")?;
        if !out.status.success() {
            bail!(
                "cocoon sim cleanup failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

impl Drop for CocoonSim {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            step!("{e:#}");
        }
    }
}

/// `COCOON_SIM_BIN` if set; otherwise `cargo build -p cocoon-sim --bin cocoon` into the same
/// target directory as the running test or testbed binary (a no-op when it is fresh, so tests
/// never run a stale simulator; cargo holds no lock while tests run).
pub fn binary() -> Result<PathBuf> {
    crate::bins::workspace_binary(PACKAGE, "cocoon", "COCOON_SIM_BIN")
}

/// Where cgroup2 is mounted: /sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on
/// hybrid ones (like this CI image).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(
            pre.split_whitespace().nth(4)?.replace("\\040", " "),
        ))
    })
}

/// `ip netns list`, names only.
pub fn netns_list() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .stdin(Stdio::null())
        .output();
    let Ok(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Whether the simulator gives VMs real network namespaces here (root and `ip` present);
/// otherwise it falls back to loopback networking.
pub fn netns_supported() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// Simulated guest processes (`cocoon sim guest --id <ID> ...`), as (pid, VM id).
pub fn guest_processes() -> Vec<(i32, String)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let at = args
                .windows(2)
                .position(|w| w[0] == "sim" && w[1] == "guest")?;
            let id = args[at..].windows(2).find(|w| w[0] == "--id")?[1].clone();
            Some((pid, id))
        })
        .collect()
}
