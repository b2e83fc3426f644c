//! `replay --verify` on the sample journal: it passes as committed, and it fails — naming the
//! record — when a byte is changed, a record is removed, the file is cut short, or the
//! actions are altered with the hash chain recomputed (only the reducer can catch that). The
//! `--json` export is a journal of plain lines that verifies the same way.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use reconcilers::cocoon::CocoonCmd;
use reconcilers::Action;
use vk_cocoon::journal::{Problem, Reader};
use vk_cocoon::replay::Failure;

use support::{rewrite, sample_path, verify, vk_cocoon};

fn lines(path: &Path) -> Vec<Vec<u8>> {
    support::read_lines(path)
        .split_inclusive(|&c| c == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

fn journal_error(files: &[PathBuf]) -> vk_cocoon::journal::JournalError {
    match verify(files) {
        Err(Failure::Journal(e)) => e,
        other => panic!("expected a journal error, got {other:?}"),
    }
}

#[test]
fn the_sample_verifies() {
    let s = verify(&[sample_path()]).expect("the sample replays identically");
    assert_eq!(s.files, 1);
    assert!(s.steps > 50, "{s:?}");
    assert_eq!(s.differing, 0);

    let out = vk_cocoon()
        .args(["replay", "--verify"])
        .arg(sample_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timeline = String::from_utf8(out.stdout).unwrap();
    // The timeline shows cocoon argv as it would run, indented under its event.
    assert!(timeline.contains("vm clone --output json --name vk-worker"));
    assert!(timeline.contains("stream Deleted V002 vk-worker"));
    let verdict = String::from_utf8(out.stderr).unwrap();
    assert!(verdict.contains("every action list identical"), "{verdict}");
}

#[test]
fn reading_and_rewriting_the_sample_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.journal");
    rewrite(&sample_path(), &copy, |_, _| {});
    assert!(fs::read(&copy).unwrap() == fs::read(sample_path()).unwrap());
}

#[test]
fn every_changed_byte_is_caught_at_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let original = lines(&sample_path());
    for (i, line) in original.iter().enumerate() {
        // Three places per line: inside the body, inside `prev`, inside `hash`.
        for pos in [line.len() / 3, line.len() - 120, line.len() - 20] {
            let mut bad = original.clone();
            bad[i][pos] ^= 0x01;
            let path = dir.path().join("bad.journal");
            support::write_lines(&path, &bad.concat());
            let e = journal_error(&[path]);
            assert_eq!(e.line, i as u64 + 1, "byte {pos} of line {}: {e}", i + 1);
        }
    }
}

/// The file holds the lines compressed: a changed byte there either fails the check (a frame
/// that does not decompress, or lines whose hashes no longer hold) or changes nothing the
/// records say.
#[test]
fn a_changed_byte_of_the_compressed_file_never_passes_as_another_record() {
    let dir = tempfile::tempdir().unwrap();
    let original = fs::read(sample_path()).unwrap();
    let text = support::read_lines(&sample_path());
    let path = dir.path().join("flipped.journal");
    let (mut caught, mut same) = (0, 0);
    for pos in (0..original.len()).step_by(23) {
        let mut bad = original.clone();
        bad[pos] ^= 0x04;
        fs::write(&path, &bad).unwrap();
        if verify(std::slice::from_ref(&path)).is_err() {
            caught += 1;
        } else {
            let lines = vk_cocoon::journal::frame::lines_of_file(&bad).map_err(|(_, e)| e);
            assert_eq!(
                lines.ok().as_ref(),
                Some(&text),
                "byte {pos} passed as other records"
            );
            same += 1;
        }
    }
    assert!(caught > 10 * same, "caught {caught}, unchanged {same}");
}

#[test]
fn a_changed_byte_fails_the_binary_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = lines(&sample_path());
    // Line 40 is the event record of seq 20 (line 1 is the header); change its time.
    let text = String::from_utf8(bad[39].clone()).unwrap();
    assert!(
        text.starts_with("{\"kind\":\"event\",\"seq\":20,"),
        "{text}"
    );
    bad[39] = text
        .replacen("\"at\":17776", "\"at\":17777", 1)
        .into_bytes();
    let path = dir.path().join("demo.journal");
    support::write_lines(&path, &bad.concat());
    let out = vk_cocoon()
        .args(["replay", "--verify"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("demo.journal:40 (seq 20): hash mismatch"),
        "{err}"
    );
}

#[test]
fn a_removed_record_breaks_the_link_of_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = lines(&sample_path());
    bad.remove(10);
    let path = dir.path().join("gap.journal");
    support::write_lines(&path, &bad.concat());
    let e = journal_error(&[path]);
    assert_eq!(e.line, 11);
    assert!(matches!(e.problem, Problem::BrokenLink { .. }), "{e}");
}

#[test]
fn a_journal_cut_mid_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let all = fs::read(sample_path()).unwrap();
    let path = dir.path().join("cut.journal");
    fs::write(&path, &all[..all.len() - 10]).unwrap();
    // The last frame holds the last step, its event and its actions: the file ends inside
    // it, and the error names the first line it would have given.
    let n = lines(&sample_path()).len() as u64;
    let e = journal_error(&[path]);
    assert_eq!((e.line, e.problem), (n - 1, Problem::Truncated));
}

#[test]
fn a_seq_gap_is_named_even_with_an_intact_chain() {
    // The writer refuses a gap, so re-encode: every later event is renumbered and the chain
    // recomputed, so only the seq check can object.
    let out = support::reencode(
        &sample_path(),
        |_| {},
        |env| {
            if env.seq >= 30 {
                env.seq += 1;
            }
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gap.journal");
    fs::write(&path, out).unwrap();
    let e = journal_error(&[path]);
    assert_eq!(
        e.problem,
        Problem::SeqGap {
            expected: 30,
            found: 31
        }
    );
    assert_eq!((e.line, e.seq), (60, Some(31)));
}

#[test]
fn altered_actions_with_a_recomputed_chain_fail_in_the_reducer_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forged.journal");
    let mut forged_seq = None;
    rewrite(&sample_path(), &path, |env, actions| {
        for a in actions.iter_mut() {
            if let Action::RunCocoon {
                cmd: CocoonCmd::ImagePull { image, .. },
                ..
            } = a
            {
                if forged_seq.is_none() {
                    *image = "evil/image:1".into();
                    forged_seq = Some(env.seq);
                }
            }
        }
    });
    let seq = forged_seq.expect("the sample pulls an image");
    // The chain is intact: only replay can tell.
    assert!(Reader::open(std::slice::from_ref(&path))
        .unwrap()
        .all(|e| e.is_ok()));
    match verify(std::slice::from_ref(&path)) {
        Err(Failure::Actions(d)) => {
            assert_eq!(d.envelope.seq, seq);
            assert_ne!(d.journaled, d.replayed);
        }
        other => panic!("expected an action divergence, got {other:?}"),
    }

    let out = vk_cocoon()
        .args(["replay", "--verify", "--quiet"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&format!("(seq {seq}): the reducer's actions differ")),
        "{err}"
    );
    assert!(err.contains("image pull -- evil/image:1"), "{err}");
    assert!(err.contains("image pull -- ubuntu:24.04"), "{err}");

    // Without --verify the difference is noted in the timeline and the replay goes on.
    let out = vk_cocoon().arg("replay").arg(&path).output().unwrap();
    assert!(out.status.success());
    let timeline = String::from_utf8(out.stdout).unwrap();
    assert!(timeline.contains("the reducer now produces different actions"));
}

#[test]
fn pod_filter_and_until_narrow_the_timeline() {
    let out = vk_cocoon()
        .args(["replay", "--pod", "default/worker", "--until", "40"])
        .arg(sample_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let timeline = String::from_utf8(out.stdout).unwrap();
    assert!(timeline.contains("vm clone"));
    assert!(!timeline.contains("default/web"), "{timeline}");
    assert!(!timeline.contains("default/api"), "{timeline}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("replayed 40 events"), "{err}");
}

#[test]
fn state_dump_is_the_state_after_the_last_event() {
    let out = vk_cocoon()
        .args(["replay", "--quiet", "--state"])
        .arg(sample_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let state: reconcilers::State = serde_json::from_slice(&out.stdout).unwrap();
    let w = support::scenarios::demo();
    assert_eq!(state, w.state);
}

/// `replay --json FILE…` as bytes, written to `path`.
fn export(files: &[PathBuf], path: &Path) -> Vec<Vec<u8>> {
    let out = vk_cocoon()
        .args(["replay", "--json"])
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(path, &out.stdout).unwrap();
    out.stdout
        .split_inclusive(|&c| c == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

/// `replay --verify` run by the binary on `path`: its exit code and stderr.
fn verify_binary(path: &Path) -> (Option<i32>, String) {
    let out = vk_cocoon()
        .args(["replay", "--verify", "--quiet"])
        .arg(path)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn the_json_export_is_a_journal_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.jsonl");
    let exported = export(&[sample_path()], &path);
    // The records as written, hashes and all: the same lines the compressed file holds.
    assert_eq!(exported.concat(), support::read_lines(&sample_path()));
    let s = verify(std::slice::from_ref(&path)).expect("the export replays identically");
    let sample = verify(&[sample_path()]).unwrap();
    assert_eq!((s.steps, s.actions), (sample.steps, sample.actions));
    let (code, err) = verify_binary(&path);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("every action list identical"), "{err}");
}

#[test]
fn a_record_dropped_from_the_json_export_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.jsonl");
    let mut bad = export(&[sample_path()], &path);
    bad.remove(10);
    fs::write(&path, bad.concat()).unwrap();
    let e = journal_error(std::slice::from_ref(&path));
    assert_eq!(e.line, 11, "{e}");
    assert!(matches!(e.problem, Problem::BrokenLink { .. }), "{e}");
    let (code, err) = verify_binary(&path);
    assert_eq!(code, Some(1));
    assert!(err.contains("demo.jsonl:11"), "{err}");
    assert!(err.contains("broken prev link"), "{err}");
}

#[test]
fn two_records_swapped_in_the_json_export_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.jsonl");
    let original = export(&[sample_path()], &path);
    // An event and its actions, and two events far apart: each is caught where the first
    // moved record now stands.
    for (a, b) in [(9, 10), (19, 39)] {
        let mut bad = original.clone();
        bad.swap(a, b);
        fs::write(&path, bad.concat()).unwrap();
        let e = journal_error(std::slice::from_ref(&path));
        assert_eq!(e.line, a as u64 + 1, "{e}");
        assert!(matches!(e.problem, Problem::BrokenLink { .. }), "{e}");
        let (code, err) = verify_binary(&path);
        assert_eq!(code, Some(1));
        assert!(err.contains(&format!("demo.jsonl:{}", a + 1)), "{err}");
    }
}

#[test]
fn a_rotated_journal_exports_as_one_journal_that_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let w = support::scenarios::churn(12);
    let journal = dir.path().join("events.journal");
    support::journal_world(&w, &journal, 4 * 1024, 1000);
    let files = vk_cocoon::journal::existing_files(&journal, 1000);
    assert!(files.len() > 2, "{files:?}");
    let path = dir.path().join("all.jsonl");
    let exported = export(&files, &path);
    let s = verify(std::slice::from_ref(&path)).expect("the export replays identically");
    assert_eq!(s.steps, w.log.len() as u64);
    // Dropping the second file's header leaves its records chained to nothing before them.
    let second = exported
        .iter()
        .skip(1)
        .position(|l| l.starts_with(b"{\"kind\":\"header\""))
        .expect("a rotation header")
        + 1;
    let mut bad = exported.clone();
    bad.remove(second);
    fs::write(&path, bad.concat()).unwrap();
    let e = journal_error(std::slice::from_ref(&path));
    assert_eq!(e.line, second as u64 + 1, "{e}");
}

/// A header of a version this build does not read, in either form, names the version found,
/// the form, and the versions this build reads in each form.
#[test]
fn an_unsupported_version_says_what_was_found_and_what_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = support::read_lines(&sample_path());
    let newer =
        String::from_utf8(text.clone())
            .unwrap()
            .replacen("\"version\":6,", "\"version\":7,", 1);
    let older = String::from_utf8(text)
        .unwrap()
        .replacen("\"version\":6,", "\"version\":5,", 1);
    let plain = dir.path().join("plain.jsonl");
    fs::write(&plain, &newer).unwrap();
    let framed = dir.path().join("framed.journal");
    support::write_lines(&framed, newer.as_bytes());
    let reads = "which reads version 6 in zstd frames and versions 5 and 6 in plain JSON lines";
    for (path, form) in [(&plain, "plain JSON lines"), (&framed, "zstd frames")] {
        let (code, err) = verify_binary(path);
        assert_eq!(code, Some(1));
        assert!(
            err.contains(&format!(
                ":1: journal format version 7 in {form} is not supported"
            )),
            "{err}"
        );
        assert!(err.contains(reads), "{err}");
        assert!(err.contains("the vk-cocoon that wrote it"), "{err}");
    }
    // Version 5 is read, but only as plain lines: frames around it were never written.
    support::write_lines(&framed, older.as_bytes());
    let (code, err) = verify_binary(&framed);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("journal format version 5 in zstd frames is not supported"),
        "{err}"
    );
    assert!(err.contains(reads), "{err}");
    assert!(!err.contains("the vk-cocoon that wrote it"), "{err}");
}
