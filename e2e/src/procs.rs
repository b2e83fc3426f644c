//! Child processes in their own session, and finding them again.
//!
//! Every child is started in its own session (setsid), so stopping it means signalling its
//! whole process group, and a terminal's Ctrl-C or a dying parent never half-kills it. Every
//! child also carries `VK_COCOON_TESTBED_RUN=<run dir>` in its environment: after a `kill -9`
//! of the test process, that marker is how the next run finds the orphans, even ones that left
//! their group (see [`crate::rundir`]).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::step;

/// The environment variable that ties a process to its run directory.
pub const MARKER: &str = "VK_COCOON_TESTBED_RUN";

/// Starts `cmd` in a new session, marked as part of `run`, with its output appended to `log`;
/// the pid is appended to `pids_file` so a later sweep can stop its group.
pub(crate) fn spawn(
    run: &Path,
    log_path: PathBuf,
    pids_file: &Path,
    name: &str,
    mut cmd: Command,
) -> Result<Proc> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    cmd.env(MARKER, run)
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
        .open(pids_file)?;
    writeln!(pids, "{pid} {name}")?;
    Ok(Proc {
        name: name.to_string(),
        pid,
        child: Some(child),
        log: log_path,
        armed: true,
    })
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

/// What /proc/<pid>/stat says after the command name (which may itself contain spaces).
pub(crate) fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Start time in clock ticks since boot: together with the pid it names a process uniquely,
/// so a recycled pid is not mistaken for a live owner.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid as i32)?.get(19)?.parse().ok()
}

/// `pid` runs and is the process that started at `start`. A zombie counts as dead: a test
/// killed with SIGKILL stays one until its parent (or a lazy init) reaps it.
pub(crate) fn is_running(pid: i32, start: u64) -> bool {
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
pub(crate) fn group_members(pgid: i32) -> Vec<i32> {
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
pub(crate) fn has_marker(pid: i32, run: &Path) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{MARKER}={}", run.display());
    env.split(|&b| b == 0).any(|kv| kv == want.as_bytes())
}

/// This process and its ancestors: a shell or tool that inherited a run's marker must never
/// be killed by the teardown it runs itself.
pub(crate) fn self_and_ancestors() -> Vec<i32> {
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

pub(crate) fn stop_group(pgid: i32, reap: &mut dyn FnMut()) {
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
}
