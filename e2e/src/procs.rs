//! Process groups, the run directory, and sweeping what a killed run left behind.
//!
//! Every child is started in its own session (setsid), so stopping it means signalling its
//! whole process group, and a terminal's Ctrl-C or a dying parent never half-kills it. Every
//! child also carries `VK_COCOON_TESTBED_RUN=<run dir>` in its environment: after a `kill -9`
//! of the test process, that marker is how the next run finds the orphans, even ones that left
//! their group.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::step;

/// The environment variable that ties a process to its run directory.
pub const MARKER: &str = "VK_COCOON_TESTBED_RUN";

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
    pub fn spawn(&self, name: &str, mut cmd: Command) -> Result<Proc> {
        let log_path = self.logs_dir().join(format!("{name}.log"));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        cmd.env(MARKER, &self.path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        let pid = child.id();
        let mut pids = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path.join(PIDS))?;
        writeln!(pids, "{pid} {name}")?;
        Ok(Proc {
            name: name.to_string(),
            pid,
            child: Some(child),
            log: log_path,
            armed: true,
        })
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

/// A started child process, leader of its own process group.
pub struct Proc {
    name: String,
    pid: u32,
    child: Option<Child>,
    log: PathBuf,
    armed: bool,
}

impl Proc {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the leader still runs (reaps it if it exited).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `sig` to the whole group (e.g. SIGKILL to simulate a crash).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall; a stale pgid only yields ESRCH.
        unsafe { libc::kill(-(self.pid as i32), sig) };
    }

    /// The last `n` lines of the log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM to the group, SIGKILL to what is left after a grace period; reaps the leader.
    pub fn stop(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        let mut child = self.child.take();
        stop_group(self.pid as i32, &mut || {
            if let Some(c) = child.as_mut() {
                let _ = c.try_wait();
            }
        });
        if let Some(mut c) = child {
            let _ = c.wait();
        }
    }

    /// Leaves the process running when this value is dropped (the `testbed up` daemon mode).
    pub fn disarm(&mut self) {
        self.armed = false;
        self.child = None;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn owner_line(pid: u32) -> String {
    format!("pid={pid} start={}\n", start_time(pid).unwrap_or(0))
}

/// What /proc/<pid>/stat says after the command name (which may itself contain spaces).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Start time in clock ticks since boot: together with the pid it names a process uniquely,
/// so a recycled pid is not mistaken for a live owner.
fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid as i32)?.get(19)?.parse().ok()
}

/// `pid` runs and is the process that started at `start`. A zombie counts as dead: a test
/// killed with SIGKILL stays one until its parent (or a lazy init) reaps it.
fn is_running(pid: i32, start: u64) -> bool {
    stat_fields(pid).is_some_and(|f| {
        !matches!(f[0].as_str(), "Z" | "X") && f.get(19).and_then(|s| s.parse().ok()) == Some(start)
    })
}

fn all_pids() -> Vec<i32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live (non-zombie) members of a process group.
fn group_members(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| {
            stat_fields(p).is_some_and(|f| {
                f[0] != "Z" && f.get(2).map(String::as_str) == Some(&pgid.to_string())
            })
        })
        .collect()
}

/// Whether `pid`'s environment carries `MARKER=<run>`.
fn has_marker(pid: i32, run: &Path) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{MARKER}={}", run.display());
    env.split(|&b| b == 0).any(|kv| kv == want.as_bytes())
}

/// This process and its ancestors: a shell or tool that inherited a run's marker must never
/// be killed by the teardown it runs itself.
fn self_and_ancestors() -> Vec<i32> {
    let mut v = vec![std::process::id() as i32];
    while let Some(ppid) =
        stat_fields(*v.last().unwrap()).and_then(|f| f.get(1)?.parse::<i32>().ok())
    {
        if ppid <= 1 || v.contains(&ppid) {
            break;
        }
        v.push(ppid);
    }
    v
}

/// Live processes that belong to the run `run`, with their command lines (never this process
/// or its ancestors).
pub fn processes_of(run: &Path) -> Vec<(i32, String)> {
    let me = self_and_ancestors();
    all_pids()
        .into_iter()
        .filter(|p| !me.contains(p))
        .filter(|&p| has_marker(p, run))
        .filter(|&p| stat_fields(p).is_some_and(|f| f[0] != "Z"))
        .map(|p| {
            let cmd = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (p, cmd.trim().to_string())
        })
        .collect()
}

fn stop_group(pgid: i32, reap: &mut dyn FnMut()) {
    // SAFETY: plain syscalls on a process group id.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    // Bounded: etcd and the apiserver exit within a second or two of SIGTERM; whatever ignores
    // it gets SIGKILL rather than holding up the teardown.
    if group_gone(pgid, Duration::from_secs(10), reap) {
        return;
    }
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    if !group_gone(pgid, Duration::from_secs(5), reap) {
        step!("process group {pgid} survived SIGKILL");
    }
}

fn group_gone(pgid: i32, within: Duration, reap: &mut dyn FnMut()) -> bool {
    let deadline = Instant::now() + within;
    loop {
        reap();
        if group_members(pgid).is_empty() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Tears down a run directory whether or not its owner is alive: the process groups it
/// recorded (only if they still carry its marker: pids get recycled), any other process with
/// its marker, then its cleanup commands, then the directory.
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
pub fn write_file(path: &Path, content: &str) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("writing {}", path.display()))?;
    f.write_all(content.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_its_recorded_start_matters() {
        let me = std::process::id();
        let start = start_time(me).expect("own /proc/self/stat");
        assert!(is_running(me as i32, start));
        // Same pid, other start time: a recycled pid is not the owner.
        assert!(!is_running(me as i32, start + 1));
    }

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
