//! Harness for the contract tests: a private state root per test, the built `cocoon` binary,
//! and a Drop guard that runs `cocoon sim cleanup` so no guest, netns or scope outlives a test.
#![allow(dead_code)]

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cocoon");
pub const IMAGE: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct Sim {
    pub root: PathBuf,
    extra_env: Vec<(String, String)>,
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?} / {:?}",
                self.stdout, self.stderr
            )
        })
    }

    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "expected success; stderr: {}", self.stderr);
        self
    }

    /// Exit 1 with cocoon's final error line `Error: <expected…>` on stderr.
    #[track_caller]
    pub fn err(self, expected: &str) -> Run {
        assert_eq!(
            self.code, 1,
            "expected exit 1; stdout {:?} stderr {:?}",
            self.stdout, self.stderr
        );
        let last = self.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("Error: ") && last.contains(expected),
            "last stderr line {last:?} lacks {expected:?}"
        );
        self
    }
}

fn from_output(o: Output) -> Run {
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

impl Sim {
    pub fn new() -> Sim {
        Sim::with_env(&[])
    }

    pub fn with_env(extra: &[(&str, &str)]) -> Sim {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("cocoon-sim-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Sim {
            root,
            extra_env: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env_remove("COCOON_ROOT_DIR")
            .env("COCOON_SIM_ROOT", &self.root)
            .env("COCOON_SIM_LEASE_DELAY_MS", "100");
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        from_output(self.cmd(args).stdin(Stdio::null()).output().unwrap())
    }

    pub fn run_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        from_output(child.wait_with_output().unwrap())
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn pull(&self, image: &str) {
        self.run(&["image", "pull", image]).ok();
    }

    /// `vm run` of a pulled image; returns the printed record.
    pub fn run_vm(&self, name: &str, extra: &[&str]) -> Value {
        self.pull(IMAGE);
        let mut args = vec!["vm", "run", "--output", "json", "--name", name];
        args.extend_from_slice(extra);
        args.push(IMAGE);
        self.run(&args).ok().json()
    }

    pub fn inspect(&self, reference: &str) -> Value {
        self.run(&["vm", "inspect", reference]).ok().json()
    }

    pub fn info(&self, reference: &str) -> Value {
        self.run(&["sim", "info", reference]).ok().json()
    }

    pub fn leases_path(&self) -> PathBuf {
        self.root.join("net").join("leases.json")
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.run(&["sim", "cleanup"]);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Where a test cannot go on for lack of `reason` (privileges, a package), which names what
/// provides it: the test fails, CI or not.
#[track_caller]
pub fn required(reason: &str) -> ! {
    panic!("this test needs what the machine lacks: {reason}");
}

/// Bounded poll: behaviour is asserted, never elapsed time.
#[track_caller]
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn is_id(s: &str) -> bool {
    s.len() == 26
        && s.bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
