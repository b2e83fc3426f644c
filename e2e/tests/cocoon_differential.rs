//! The simulator against the real cocoon CLI (built from shared/vendor by `make deps`): the
//! same argv on an empty root of each must give the same stdout, the same final `Error:` line
//! and the same exit code. Only the final stderr line is compared: cocoon logs free text before
//! it, and clients match only that line (CLI-3). Where the real CLI is of the older tier and
//! the simulator speaks the newer one, the real behaviour is pinned here instead, because the
//! daemon must not read it as success.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What one invocation printed and returned.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    code: i32,
    stdout: String,
    last_stderr_line: String,
}

struct Backend {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Backend {
    fn new(bin: PathBuf) -> Self {
        Self {
            bin,
            dir: tempfile::tempdir().expect("a temp dir"),
        }
    }

    fn run(&self, args: &[&str]) -> Answer {
        let root: &Path = self.dir.path();
        let out = Command::new(&self.bin)
            .args(args)
            .env("COCOON_ROOT_DIR", root.join("root"))
            .env("COCOON_RUN_DIR", root.join("run"))
            .env("COCOON_LOG_DIR", root.join("log"))
            .env("COCOON_SIM_ROOT", root.join("root"))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        Answer {
            code: out.status.code().expect("exited, not killed"),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            last_stderr_line: stderr.lines().last().unwrap_or("").to_string(),
        }
    }
}

/// Both backends, or `None` (skipped, a failure under CI) when the real CLI is not built.
fn backends() -> Option<(Backend, Backend)> {
    let real = match e2e::bins::built("cocoon-real") {
        Ok(p) => p,
        Err(e) => {
            e2e::skip::unless_ci(e);
            return None;
        }
    };
    let sim = e2e::sim::binary().expect("the simulator builds");
    Some((Backend::new(sim), Backend::new(real)))
}

#[test]
fn empty_root_answers_are_identical() {
    let Some((sim, real)) = backends() else {
        return;
    };
    let cases: &[&[&str]] = &[
        &["vm", "list", "-o", "json"],
        &["vm", "inspect", "nope"],
        &["vm", "rm", "--force", "nope"],
        &["vm", "start", "nope"],
        &["vm", "stop", "nope"],
        &["snapshot", "inspect", "nope"],
        &["snapshot", "rm", "nope"],
        &["snapshot", "export", "nope", "-o", "-"],
        &["snapshot", "list"],
        &["image", "inspect", "nope"],
        &["image", "list"],
    ];
    let mut differences = Vec::new();
    for args in cases {
        let (s, r) = (sim.run(args), real.run(args));
        if s != r {
            differences.push(format!(
                "cocoon {}:\n  simulator {s:?}\n  real      {r:?}",
                args.join(" ")
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "the simulator differs from the real cocoon:\n{}",
        differences.join("\n")
    );
    assert_eq!(
        real.run(&["vm", "list", "-o", "json"]).stdout,
        "No VMs found.\n"
    );
    assert_eq!(
        real.run(&["vm", "inspect", "nope"]).last_stderr_line,
        "Error: inspect: vm nope: VM not found"
    );
}

/// The older CLI has no `vm exec`, `vm logs`, `vm net` or `vm reconcile-stale-create`: cobra
/// prints the `vm` help on stdout and exits 0, so an exit status alone would read as success.
/// The daemon has to learn which verbs exist before it trusts a zero.
#[test]
fn real_cli_answers_a_missing_verb_with_help_and_exit_zero() {
    let Some((_sim, real)) = backends() else {
        return;
    };
    for verb in ["exec", "logs", "net", "reconcile-stale-create"] {
        let a = real.run(&["vm", verb, "some-vm", "--", "true"]);
        assert_eq!(a.code, 0, "vm {verb}: {a:?}");
        assert!(
            a.stdout.starts_with("Manage virtual machines")
                && a.stdout.contains("Available Commands:"),
            "vm {verb} printed the vm help: {a:?}"
        );
        assert!(
            !a.stdout.contains(&format!("\n  {verb} ")),
            "vm {verb} is not listed among the real CLI's verbs"
        );
    }
}

/// The newer clone and run flags are refused by the older CLI with cobra's unknown-flag error.
#[test]
fn real_cli_refuses_newer_clone_and_run_flags() {
    let Some((_sim, real)) = backends() else {
        return;
    };
    let clone = real.run(&["vm", "clone", "--restore-mode", "ondemand", "snap"]);
    assert_eq!(clone.code, 1);
    assert_eq!(
        clone.last_stderr_line,
        "Error: unknown flag: --restore-mode"
    );
    let run = real.run(&["vm", "run", "--cpu-weight", "1", "img"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.last_stderr_line, "Error: unknown flag: --cpu-weight");
    let on_demand = real.run(&["vm", "clone", "--on-demand", "--name", "c", "snap"]);
    assert_eq!(on_demand.code, 1, "{on_demand:?}");
    assert_eq!(
        on_demand.last_stderr_line, "Error: inspect snapshot snap: snapshot not found",
        "the older clone flag is accepted and the missing snapshot is what fails"
    );
}
