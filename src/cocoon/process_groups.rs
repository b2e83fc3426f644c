//! The cocoon processes still running, by process group, so shutdown can end them all (N18).
//!
//! Every cocoon child leads a group of its own, and whatever it starts (a download helper, an
//! image converter) joins that group; killing the leader alone would leave those running,
//! unwatched, after the daemon is gone. A group is ours to kill only while its leader runs: once
//! cocoon has exited, what it left behind in the group (a VM's hypervisor) is the host's, and a
//! VM must survive the daemon.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Shared by every clone of one `CocoonCli`.
#[derive(Clone, Debug, Default)]
pub struct ProcessGroups(Arc<Mutex<HashSet<u32>>>);

impl ProcessGroups {
    /// Records the running child `pgid` (its own pid: it leads its group).
    pub fn track(&self, pgid: u32) -> Tracked {
        self.lock().insert(pgid);
        Tracked {
            groups: self.clone(),
            pgid,
            settled: false,
        }
    }

    /// SIGKILLs every group whose leader still runs; returns how many.
    pub fn kill_all(&self) -> usize {
        let live: Vec<u32> = self.lock().iter().copied().collect();
        for pgid in &live {
            kill_group(*pgid);
        }
        live.len()
    }

    pub fn live(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        // The set is only inserted into and removed from; a panic elsewhere cannot leave it
        // half-changed, so a poisoned lock is still good.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, pgid: u32) {
        self.lock().remove(&pgid);
    }
}

/// One running group. Dropped before its leader was seen to exit (the call was cancelled, its
/// task aborted, the runtime shut down), it kills the group.
#[derive(Debug)]
pub struct Tracked {
    groups: ProcessGroups,
    pgid: u32,
    settled: bool,
}

impl Tracked {
    /// The leader has exited and been reaped: the group is left alone from now on.
    pub fn exited(mut self) {
        self.settled = true;
        self.groups.forget(self.pgid);
    }

    /// Kills the group now (a timeout, a failed transfer).
    pub fn kill(mut self) {
        self.settled = true;
        kill_group(self.pgid);
        self.groups.forget(self.pgid);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.settled {
            kill_group(self.pgid);
            self.groups.forget(self.pgid);
        }
    }
}

pub fn kill_group(pgid: u32) {
    // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid as libc::pid_t, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::time::Duration;

    use reconcilers::cocoon::CocoonCmd;

    use crate::cocoon::CocoonCli;

    /// Alive and not a zombie (a killed orphan waits for init to reap it).
    fn alive(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z')),
            Err(_) => false,
        }
    }

    fn pid_in(path: &Path) -> i32 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    async fn wait_for(path: &Path) {
        for _ in 0..500 {
            if std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n')) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never appeared", path.display());
    }

    async fn gone(pid: i32) -> bool {
        for _ in 0..500 {
            if !alive(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A stand-in `cocoon` that starts a grandchild in its own group, records both pids, then
    /// either waits (a call still running) or exits leaving the grandchild (as `vm run` leaves
    /// a hypervisor).
    fn stand_in(dir: &Path, then: &str) -> CocoonCli {
        let bin = dir.join("cocoon");
        let script = format!(
            "#!/bin/sh\n\
             sleep 300 </dev/null >/dev/null 2>&1 &\n\
             echo $! > {dir}/grandchild.tmp && mv {dir}/grandchild.tmp {dir}/grandchild\n\
             echo $$ > {dir}/child.tmp && mv {dir}/child.tmp {dir}/child\n\
             {then}\n",
            dir = dir.display()
        );
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        CocoonCli::new(bin.display().to_string())
    }

    #[tokio::test]
    async fn shutdown_kills_a_running_call_and_everything_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "wait");
        let call = tokio::spawn({
            let cli = cli.clone();
            async move { cli.call(&CocoonCmd::VmList).await }
        });
        wait_for(&dir.path().join("child")).await;
        wait_for(&dir.path().join("grandchild")).await;
        let (child, grandchild) = (
            pid_in(&dir.path().join("child")),
            pid_in(&dir.path().join("grandchild")),
        );
        assert!(alive(child) && alive(grandchild));
        assert_eq!(cli.groups.live(), 1);
        assert_eq!(cli.groups.kill_all(), 1);
        assert!(gone(child).await, "the cocoon child survived");
        assert!(gone(grandchild).await, "what cocoon started survived");
        let result = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call ends once its child is killed")
            .unwrap();
        assert!(result.is_err());
        assert_eq!(cli.groups.live(), 0);
    }

    #[tokio::test]
    async fn what_a_finished_call_left_running_is_not_killed() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "echo 'No VMs found.'");
        cli.call(&CocoonCmd::VmList).await.unwrap();
        let grandchild = pid_in(&dir.path().join("grandchild"));
        assert_eq!(cli.groups.live(), 0);
        assert_eq!(cli.groups.kill_all(), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            alive(grandchild),
            "a finished call's VM must survive shutdown"
        );
        // SAFETY: ends the test's own stand-in hypervisor.
        unsafe { libc::kill(grandchild, libc::SIGKILL) };
    }

    #[tokio::test]
    async fn a_call_dropped_mid_way_kills_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "wait");
        let call = tokio::spawn({
            let cli = cli.clone();
            async move { cli.call(&CocoonCmd::VmList).await }
        });
        wait_for(&dir.path().join("grandchild")).await;
        let grandchild = pid_in(&dir.path().join("grandchild"));
        call.abort();
        assert!(
            gone(grandchild).await,
            "an aborted call left its grandchild"
        );
        assert_eq!(cli.groups.live(), 0);
    }

    #[tokio::test]
    async fn a_verb_past_its_limit_is_killed_with_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut cli = stand_in(dir.path(), "wait");
        cli.timeouts.read = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = cli.call(&CocoonCmd::VmList).await.unwrap_err();
        assert_eq!(err.kind, reconcilers::vm::CocoonErrorKind::Timeout);
        assert!(err.message.contains("within 300ms"), "{}", err.message);
        assert!(started.elapsed() < Duration::from_secs(10));
        let grandchild = pid_in(&dir.path().join("grandchild"));
        assert!(
            gone(grandchild).await,
            "the timed-out call left its grandchild"
        );
        assert_eq!(cli.groups.live(), 0);
    }
}
