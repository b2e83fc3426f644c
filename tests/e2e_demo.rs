//! `DEMO_ONCE=1 make demo` as a newcomer runs it: the three binaries built the way the
//! Makefile builds them, then the `demo` binary run from the target directory with nothing but
//! `DEMO_ONCE=1` added to the environment. What it prints is what the README promises: the
//! three sample pods Ready in `kubectl get pods -o wide`, the node in `kubectl get node -o
//! wide`, the journal's path, and exit 0.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PODS: [&str; 3] = ["demo-clone", "demo-probe", "demo-run"];
const NODE: &str = "cocoon-demo";
/// A guard against a hung demo, not a measure: the demo bounds its own wait (2 minutes) and a
/// testbed starts in seconds once `make deps` has run.
const HANG: Duration = Duration::from_secs(600);

/// The directory the Makefile's `$(TARGET_DIR)/debug` names: where this test runs from.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let mut dir = exe.parent().expect("its directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The Makefile's `demo` recipe, first line: one cargo build of the daemon, the simulator and
/// the demo (cargo holds no lock while tests run).
fn build_as_the_makefile_does(dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-j2",
            "-p",
            "vk-cocoon",
            "--bin",
            "vk-cocoon",
            "-p",
            "cocoon-sim",
            "--bin",
            "cocoon",
            "-p",
            "vk-cocoon-e2e",
            "--bin",
            "demo",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env(
            "CARGO_TARGET_DIR",
            dir.parent().expect("the target directory"),
        )
        .stdin(Stdio::null())
        .status()
        .expect("running cargo build");
    assert!(status.success(), "the Makefile's build failed: {status}");
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// The second line of the recipe, `$(TARGET_DIR)/debug/demo`, with `DEMO_ONCE=1`.
fn run_demo(dir: &Path) -> Run {
    let mut child = Command::new(dir.join("demo"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("DEMO_ONCE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the demo");
    // Drained on their own threads, so a chatty demo never blocks on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).map(|_| s)
    });
    let deadline = Instant::now() + HANG;
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the demo") {
            break s;
        }
        if Instant::now() > deadline {
            // SIGINT, as Ctrl-C: the demo tears its testbed down on it.
            // SAFETY: kill has no memory preconditions; the pid is our own child's.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let s = child.wait().expect("waiting for the demo");
            let stderr = err.join().unwrap().unwrap_or_default();
            panic!("the demo hung and was interrupted ({s}); its log:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    Run {
        ok: status.success(),
        stdout: out.join().unwrap().unwrap_or_default(),
        stderr: err.join().unwrap().unwrap_or_default(),
    }
}

/// The rows of the last table printed under `heading`, each split into its columns.
fn last_table<'a>(stdout: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    let at = stdout
        .rfind(heading)
        .unwrap_or_else(|| panic!("no `{heading}` in:\n{stdout}"));
    stdout[at..]
        .lines()
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn demo_once_shows_three_ready_pods_the_node_and_the_journal() {
    let dir = profile_dir();
    build_as_the_makefile_does(&dir);
    let run = run_demo(&dir);
    let both = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.ok, "the demo did not exit 0\n{both}");

    // NAME READY STATUS …: the last table shows every sample pod 1/1 Running.
    let pods = last_table(&run.stdout, "$ kubectl get pods -o wide");
    for name in PODS {
        let row = pods
            .iter()
            .find(|r| r.first() == Some(&name))
            .unwrap_or_else(|| panic!("{name} is not in the last pod table\n{both}"));
        assert_eq!(
            row.get(1..3),
            Some(&["1/1", "Running"][..]),
            "{name}\n{both}"
        );
        assert!(row.contains(&NODE), "{name} is not on {NODE}\n{both}");
    }
    assert!(
        run.stdout.contains("every sample pod is Ready after"),
        "{both}"
    );

    // NAME STATUS ROLES …: the virtual node, Ready.
    let nodes = last_table(&run.stdout, "$ kubectl get node -o wide");
    assert!(
        nodes
            .iter()
            .any(|r| r.get(..2) == Some(&[NODE, "Ready"][..])),
        "the node is not shown Ready\n{both}"
    );

    // The journal's path, where the daemon was told to write it.
    let journal = run
        .stderr
        .lines()
        .find_map(|l| l.split_once("its journal: ").map(|(_, p)| p.trim()))
        .unwrap_or_else(|| panic!("the journal's path is not printed\n{both}"));
    let journal = Path::new(journal);
    assert!(
        journal.is_absolute() && journal.ends_with("journal/events.journal"),
        "journal path {}\n{both}",
        journal.display()
    );

    // The run directory is gone with the testbed; the journal is kept, and replays.
    let kept = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("the run's journal is kept in "))
        .and_then(|l| l.split(';').next())
        .unwrap_or_else(|| panic!("the kept journal is not named\n{both}"));
    e2e::daemon::replay_verify(Path::new(kept)).unwrap_or_else(|e| panic!("{e:#}\n{both}"));
}
