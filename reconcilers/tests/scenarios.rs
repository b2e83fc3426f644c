//! Golden scenario tests: every `tests/scenarios/*.txt` names the spec rules it proves and
//! shows commands in, exact actions out — the actions of the kinds those rules are about (the
//! command language and its filters: `support/runner.rs`). `UPDATE_GOLDEN=1` rewrites the
//! expectations; review each rewrite against docs/rules.md before committing — a golden that
//! encodes a bug is a defect.

mod support;

use std::path::Path;

use support::datadriven::{self, Chunk};
use support::runner::Runner;

fn run_file(path: &Path, update: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut chunks = datadriven::parse(&text);
    let mut runner = Runner::new();
    let mut failures = String::new();
    for c in &mut chunks {
        let Chunk::Block {
            line,
            commands,
            expected,
        } = c
        else {
            continue;
        };
        let mut actual = Vec::new();
        for cmd in commands.iter().filter(|c| !c.starts_with('#')) {
            actual.extend(runner.run(cmd));
        }
        if &actual != expected {
            if update {
                *expected = actual;
            } else {
                failures += &format!(
                    "{}:{line}: `{}`\n{}",
                    path.display(),
                    commands.join(" / "),
                    datadriven::diff(expected, &actual)
                );
            }
        }
    }
    let violations = runner.finish();
    if !violations.is_empty() {
        failures += &format!(
            "{}: invariant violations:\n  {}\n",
            path.display(),
            violations.join("\n  ")
        );
    }
    if update {
        std::fs::write(path, datadriven::format(&chunks)).map_err(|e| e.to_string())?;
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

#[test]
fn scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let only = std::env::var("SCENARIO").ok();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/scenarios")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .filter(|p| {
            only.as_ref()
                .is_none_or(|o| p.to_string_lossy().contains(o.as_str()))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenario files");
    let mut failed = Vec::new();
    for f in &files {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_file(f, update)));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => failed.push(msg),
            Err(p) => failed.push(format!(
                "{}: panicked: {}",
                f.display(),
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} scenario files failed:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    println!("{} scenario files passed", files.len());
}

/// E1, E2: every Event reason the daemon has is emitted, with its type, by some scenario's
/// expected output, so a reason that no code path reaches any more fails here.
#[test]
fn every_event_reason_is_emitted_by_a_scenario() {
    const REASONS: [(&str, &str); 33] = [
        ("Normal", "ProviderCreateSuccess"),
        ("Normal", "ProviderUpdateSuccess"),
        ("Normal", "ProviderDeleteSuccess"),
        ("Warning", "ProviderCreateFailed"),
        ("Warning", "ProviderUpdateFailed"),
        ("Warning", "ProviderDeleteFailed"),
        ("Warning", "CreateBringUpFailed"),
        ("Warning", "HibernateEvidenceFailed"),
        ("Warning", "HibernateEvidenceUnavailable"),
        ("Warning", "HibernateSnapshotExists"),
        ("Warning", "HibernateUnsupported"),
        ("Warning", "HibernateNetResizeFailed"),
        ("Warning", "HibernateSnapshotFailed"),
        ("Warning", "HibernatePushFailed"),
        ("Warning", "HibernateRemoveFailed"),
        ("Warning", "WakePullFailed"),
        ("Warning", "WakeCloneFailed"),
        ("Warning", "WakeIPWaitTimeout"),
        ("Warning", "WindowsStaticIPFailed"),
        ("Warning", "PostCloneIPWaitTimeout"),
        ("Warning", "PostCloneExecAttemptFailed"),
        ("Warning", "PostCloneExecExhausted"),
        ("Warning", "PostCloneSACDialFailed"),
        ("Warning", "PostCloneSACEnumFailed"),
        ("Warning", "PostCloneSACSetFailed"),
        ("Warning", "PostCloneSACVerifyFailed"),
        ("Warning", "ResumeStartFailed"),
        ("Warning", "ResumeClassifyFailed"),
        ("Warning", "DeleteSnapshotKept"),
        ("Normal", "Hibernated"),
        ("Normal", "Woken"),
        ("Normal", "PostCloneSucceeded"),
        ("Normal", "ResumedAfterRestart"),
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).expect("tests/scenarios") {
        text += &std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default();
    }
    let missing: Vec<String> = REASONS
        .iter()
        .filter(|(kind, reason)| !text.contains(&format!(" {kind} {reason} ")))
        .map(|(kind, reason)| format!("{kind} {reason}"))
        .collect();
    assert!(
        missing.is_empty(),
        "no scenario shows these Events: {missing:?}"
    );
}
