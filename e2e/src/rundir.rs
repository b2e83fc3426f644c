//! The run directory: one per testbed run, and the sweep of runs whose owner died.
//!
//! `/tmp/vk-cocoon-testbed/run-XXXXXX/` holds the owner (pid + start time, or `detached` for
//! `testbed up`), the recorded process groups, cleanup commands, logs and every component's
//! data. Removing it is the last step of a teardown.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::procs::{
    group_members, has_marker, is_running, processes_of, self_and_ancestors, start_time,
    stat_fields, stop_group, Proc,
};
use crate::step;

/// Where run directories live; overridable so tests of the sweep itself can use their own.
pub fn base_dir() -> PathBuf {
    std::env::var_os("VK_COCOON_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/vk-cocoon-testbed"))
}

/// One directory per testbed run: state (owner, pids, cleanup commands), logs and every
/// component's data. Removing it is the last step of a teardown.
pub struct RunDir {
    path: PathBuf,
    armed: bool,
}

const OWNER: &str = "owner";
const PIDS: &str = "pids";
const CLEANUP: &str = "cleanup.jsonl";
const DETACHED: &str = "detached";

impl RunDir {
    /// Sweeps leftovers of dead runs, then creates a fresh run directory owned by this process.
    pub fn create() -> Result<RunDir> {
        let base = base_dir();
        fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
        sweep_leftovers(&base);
        // Built under a dot name and renamed once the owner file exists, so a concurrent sweep
        // never sees a run directory without an owner and mistakes it for a dead one.
        let tmp = tempfile::Builder::new()
            .prefix(".run-")
            .tempdir_in(&base)?
            .keep();
        fs::write(tmp.join(OWNER), owner_line(std::process::id()))?;
        fs::create_dir_all(tmp.join("logs"))?;
        let name = tmp.file_name().unwrap().to_string_lossy();
        let path = base.join(name.trim_start_matches('.'));
        fs::rename(&tmp, &path)?;
        step!("run directory {}", path.display());
        Ok(RunDir { path, armed: true })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether dropping this value tears the run down (false once detached or torn down).
    pub fn armed(&self) -> bool {
        self.armed
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.path.join("logs")
    }

    /// A fresh subdirectory for one component's data.
    pub fn subdir(&self, name: &str) -> Result<PathBuf> {
        let p = self.path.join(name);
        fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// Starts `cmd` in a new session with its output in `logs/<name>.log` and records its
    /// process group so a later sweep can stop it.
    pub fn spawn(&self, name: &str, cmd: Command) -> Result<Proc> {
        let log = self.logs_dir().join(format!("{name}.log"));
        crate::procs::spawn(&self.path, log, &self.path.join(PIDS), name, cmd)
    }

    /// Records a command that undoes something outside the run directory (the simulator's
    /// network namespaces and cgroups). Teardown runs it after the processes are gone, and so
    /// does the sweep of a run that died.
    pub fn add_cleanup(&self, argv: &[String], env: &[(String, String)]) -> Result<()> {
        let line = serde_json::json!({ "argv": argv, "env": env });
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path.join(CLEANUP))?;
        writeln!(f, "{line}")?;
        Ok(())
    }

    /// Hands the run over to `testbed down`: sweeps skip it and dropping this value no longer
    /// tears it down.
    pub fn detach(&mut self) -> Result<()> {
        fs::write(self.path.join(OWNER), format!("{DETACHED}\n"))?;
        self.armed = false;
        Ok(())
    }

    /// Stops everything the run started, runs its cleanup commands and removes the directory.
    pub fn teardown(&mut self) {
        if std::mem::take(&mut self.armed) {
            teardown_dir(&self.path);
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn owner_line(pid: u32) -> String {
    format!("pid={pid} start={}\n", start_time(pid).unwrap_or(0))
}

/// Tears down a run directory whether or not its owner is alive: the process groups it
/// recorded (only if they still carry its marker: pids get recycled), any other process with
/// its marker, the real cocoon's VMs and network, then its cleanup commands, then the
/// directory.
pub fn teardown_dir(run: &Path) {
    step!("tearing down {}", run.display());
    let recorded: Vec<i32> = fs::read_to_string(run.join(PIDS))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let me = self_and_ancestors();
    let my_groups: Vec<i32> = me
        .iter()
        .filter_map(|&p| stat_fields(p)?.get(2)?.parse().ok())
        .collect();
    for pgid in recorded.into_iter().rev() {
        if my_groups.contains(&pgid) {
            continue;
        }
        if group_members(pgid).iter().any(|&p| has_marker(p, run)) {
            stop_group(pgid, &mut || {});
        }
    }
    // Stragglers: children that started their own session or group.
    for _ in 0..3 {
        let left = processes_of(run);
        if left.is_empty() {
            break;
        }
        for (pid, _) in left {
            if let Some(pgid) = stat_fields(pid).and_then(|f| f.get(2)?.parse::<i32>().ok()) {
                if pgid > 1 && !my_groups.contains(&pgid) {
                    stop_group(pgid, &mut || {});
                }
            }
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    crate::real_cocoon::teardown_in(run);
    run_cleanup_commands(run);
    if let Err(e) = fs::remove_dir_all(run) {
        if e.kind() != std::io::ErrorKind::NotFound {
            step!("could not remove {}: {e}", run.display());
        }
    }
}

fn run_cleanup_commands(run: &Path) {
    let text = fs::read_to_string(run.join(CLEANUP)).unwrap_or_default();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let argv: Vec<String> = serde_json::from_value(v["argv"].clone()).unwrap_or_default();
        let env: Vec<(String, String)> =
            serde_json::from_value(v["env"].clone()).unwrap_or_default();
        let Some((prog, args)) = argv.split_first() else {
            continue;
        };
        step!("cleanup: {}", argv.join(" "));
        let out = Command::new(prog)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => step!(
                "cleanup command failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => step!("cleanup command could not start: {e}"),
        }
    }
}

/// The owner of a run: a live process, or `testbed up` (detached; only `testbed down` ends it).
enum Owner {
    Alive,
    Dead,
    Detached,
}

fn owner_of(run: &Path) -> Owner {
    let text = fs::read_to_string(run.join(OWNER)).unwrap_or_default();
    if text.trim() == DETACHED {
        return Owner::Detached;
    }
    let field = |k: &str| -> Option<u64> {
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
    };
    match (field("pid"), field("start")) {
        (Some(pid), Some(start)) if is_running(pid as i32, start) => Owner::Alive,
        _ => Owner::Dead,
    }
}

/// Run directories under `base` (dot names are runs still being created).
pub fn runs(base: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(base) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Run directories handed to `testbed down`.
pub fn detached_runs(base: &Path) -> Vec<PathBuf> {
    runs(base)
        .into_iter()
        .filter(|r| matches!(owner_of(r), Owner::Detached))
        .collect()
}

/// Tears down every run whose owner process is gone (a test killed with SIGKILL, a crashed
/// `cargo test`), so a new run starts from a clean machine.
pub fn sweep_leftovers(base: &Path) {
    for run in runs(base) {
        if let Owner::Dead = owner_of(&run) {
            step!("sweeping leftovers of a dead run: {}", run.display());
            teardown_dir(&run);
        }
    }
}

/// Writes a config file a component reads, naming the path on failure.
/// Writes a config file a component reads, naming the path on failure.
pub fn write_file(path: &Path, content: &str) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(content.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_files_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(OWNER), owner_line(std::process::id())).unwrap();
        assert!(matches!(owner_of(dir.path()), Owner::Alive));
        fs::write(dir.path().join(OWNER), "detached\n").unwrap();
        assert!(matches!(owner_of(dir.path()), Owner::Detached));
        fs::write(dir.path().join(OWNER), "pid=2147483647 start=0\n").unwrap();
        assert!(matches!(owner_of(dir.path()), Owner::Dead));
        fs::remove_file(dir.path().join(OWNER)).unwrap();
        assert!(matches!(owner_of(dir.path()), Owner::Dead));
    }
}
