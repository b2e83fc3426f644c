//! A run whose owner died by SIGKILL (no Drop ran) is swept by the next run: its process
//! groups, processes that escaped them, and its cleanup commands.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::procs::processes_of;
use e2e::rundir::{sweep_leftovers, RunDir};

const CHILD: &str = "E2E_LEFTOVER_CHILD";

/// The victim: run in a child process by the test below, never on its own.
#[test]
#[ignore = "helper process for a_killed_run_is_swept_by_the_next"]
fn leftover_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let run = RunDir::create().unwrap();
    let mut sleeper = Command::new("sleep");
    sleeper.arg("300");
    run.spawn("sleeper", sleeper).unwrap().disarm();
    // Leaves the recorded process group: only the environment marker still finds it.
    let mut escaper = Command::new("setsid");
    escaper.args(["sleep", "301"]);
    run.spawn("escaper", escaper).unwrap().disarm();
    let flag = run.path().parent().unwrap().join("cleanup-ran");
    run.add_cleanup(&["touch".into(), flag.display().to_string()], &[])
        .unwrap();
    println!("READY {}", run.path().display());
    std::mem::forget(run);
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_run_is_swept_by_the_next() {
    let base = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "leftover_child", "--ignored", "--nocapture"])
        .env(CHILD, "1")
        .env("VK_COCOON_TESTBED_DIR", base.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut run = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        if let Some(p) = line.unwrap().strip_prefix("READY ") {
            run = Some(PathBuf::from(p));
            break;
        }
    }
    let run = run.expect("the child reports its run directory");
    // `setsid` forks when it is already a group leader: for a moment the escaper is a parent
    // on its way out plus a child mid-exec (whose environ may read empty), so wait for the
    // settled state — both sleeps exec'd — rather than for a process count.
    let settled = |procs: &[(i32, String)]| {
        let mut cmds: Vec<&str> = procs.iter().map(|(_, c)| c.as_str()).collect();
        cmds.sort_unstable();
        cmds == ["sleep 300", "sleep 301"]
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut before = processes_of(&run);
    while !settled(&before) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        before = processes_of(&run);
    }
    assert!(
        settled(&before),
        "sleeper and escaper carry the marker: {before:?}"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    let orphans = processes_of(&run);
    assert!(
        orphans.iter().any(|(_, c)| c.contains("sleep 300"))
            && orphans.iter().any(|(_, c)| c.contains("sleep 301")),
        "SIGKILL left the children running: {orphans:?}"
    );

    sweep_leftovers(base.path());

    assert!(
        processes_of(&run).is_empty(),
        "left: {:?}",
        processes_of(&run)
    );
    assert!(!run.exists(), "run directory swept");
    assert!(
        base.path().join("cleanup-ran").exists(),
        "cleanup command ran"
    );
}

#[test]
fn a_live_run_is_not_swept() {
    let base = tempfile::tempdir().unwrap();
    let run = {
        // RunDir reads its base from the environment only at creation; build it by hand here
        // instead of mutating this multi-threaded process's environment.
        let dir = base.path().join("run-live");
        std::fs::create_dir_all(&dir).unwrap();
        let start = std::fs::read_to_string("/proc/self/stat").unwrap();
        let start = start[start.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .nth(19)
            .unwrap()
            .to_string();
        std::fs::write(
            dir.join("owner"),
            format!("pid={} start={start}\n", std::process::id()),
        )
        .unwrap();
        dir
    };
    sweep_leftovers(base.path());
    assert!(run.exists(), "a run whose owner lives is left alone");
}
