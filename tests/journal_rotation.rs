//! Rotation: the chain runs across files, each file replays on its own from its header
//! state, a missing file is named, a restarted process continues the chain, and a record the
//! previous process left half-written is cut off.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use reconcilers::{Config, Envelope, Event, State};
use vk_cocoon::journal::record::{encode_actions, encode_event};
use vk_cocoon::journal::{
    existing_files, rotated_path, Entry, Journal, JournalSettings, Problem, Reader, Start,
};
use vk_cocoon::replay::Failure;

use support::{scenarios, verify};

fn headers(files: &[PathBuf]) -> Vec<(u64, Start)> {
    Reader::open(files)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entry::File { header, .. } => Some((header.file_no, header.start)),
            Entry::Step { .. } => None,
        })
        .collect()
}

/// Files of this size hold a few hundred steps of the churn run beside their header's state.
const FILE_BYTES: u64 = 48 * 1024;

/// 12 pods through create → ready → delete, in several files.
fn rotated_journal(dir: &Path, files: u32) -> (PathBuf, u64) {
    let w = scenarios::churn(12);
    let path = dir.join("events.jsonl");
    support::journal_world(&w, &path, FILE_BYTES, files);
    (path, w.log.len() as u64)
}

#[test]
fn the_chain_and_the_state_carry_across_rotations() {
    let dir = tempfile::tempdir().unwrap();
    let (path, steps) = rotated_journal(dir.path(), 1000);
    let files = existing_files(&path, 1000);
    assert!(
        (4..=40).contains(&files.len()),
        "expected several files, got {files:?}"
    );
    // Oldest first, numbered without gaps, all but the first started by rotation.
    let h = headers(&files);
    assert_eq!(h[0], (0, Start::Open));
    for (i, (no, start)) in h.iter().enumerate().skip(1) {
        assert_eq!((*no, *start), (i as u64, Start::Rotate));
    }
    // Every file is bounded: rotation happens once a file reaches the limit.
    for f in &files[..files.len() - 1] {
        let len = fs::metadata(f).unwrap().len();
        assert!(len >= FILE_BYTES, "{} is {len} bytes", f.display());
    }
    let s = verify(&files).expect("replay across rotations");
    assert_eq!(s.steps, steps);
    assert_eq!(s.files, files.len());
    assert_eq!((s.differing, s.state_differences), (0, 0));
}

#[test]
fn files_are_read_in_journal_order_whatever_order_they_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let (path, steps) = rotated_journal(dir.path(), 1000);
    let mut files = existing_files(&path, 1000);
    files.reverse();
    assert_eq!(verify(&files).unwrap().steps, steps);
}

#[test]
fn a_rotated_file_replays_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = rotated_journal(dir.path(), 1000);
    let files = existing_files(&path, 1000);
    for f in &files[1..] {
        let s = verify(std::slice::from_ref(f)).expect("one rotated file");
        assert!(s.steps > 0);
    }
    // The newest two together, with the older ones gone (as with VK_JOURNAL_FILES=2).
    let tail = files[files.len() - 2..].to_vec();
    verify(&tail).expect("the newest files");
}

#[test]
fn only_the_configured_number_of_files_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = rotated_journal(dir.path(), 3);
    let files = existing_files(&path, 100);
    assert_eq!(
        files,
        vec![rotated_path(&path, 2), rotated_path(&path, 1), path.clone()]
    );
    assert!(!rotated_path(&path, 3).exists());
    // The oldest kept file no longer chains from genesis; it anchors the chain.
    assert!(headers(&files)[0].0 > 0);
    verify(&files).expect("the kept files");
}

#[test]
fn a_missing_middle_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = rotated_journal(dir.path(), 1000);
    let mut files = existing_files(&path, 1000);
    let removed = files.remove(2);
    let e = match verify(&files) {
        Err(Failure::Journal(e)) => e,
        other => panic!("expected a journal error, got {other:?}"),
    };
    assert_eq!(e.file, files[2]);
    assert_eq!(e.line, 1);
    assert_eq!(
        e.problem,
        Problem::FileGap {
            expected: 2,
            found: 3
        },
        "after removing {}",
        removed.display()
    );
}

#[test]
fn a_changed_byte_in_a_rotated_file_names_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = rotated_journal(dir.path(), 1000);
    let files = existing_files(&path, 1000);
    let target = &files[1];
    let mut bytes = fs::read(target).unwrap();
    let third_line = bytes
        .iter()
        .enumerate()
        .filter(|(_, &c)| c == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 30;
    bytes[third_line] ^= 0x01;
    fs::write(target, bytes).unwrap();
    let e = match verify(&files) {
        Err(Failure::Journal(e)) => e,
        other => panic!("expected a journal error, got {other:?}"),
    };
    assert_eq!((&e.file, e.line), (target, 3), "{e}");
}

fn envelope(seq: u64) -> Envelope {
    Envelope {
        seq,
        at: 1_777_600_000_000 + seq as i64,
        event: Event::PodRelistBegin,
    }
}

fn settings(dir: &Path) -> JournalSettings {
    JournalSettings {
        path: dir.join("j/events.jsonl"),
        max_bytes: 1 << 20,
        files: 4,
    }
}

#[test]
fn a_restarted_process_continues_the_chain_in_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    let config = Config::default();
    for _run in 0..2 {
        let mut state = State::new(config.clone());
        let mut j = Journal::open_at(&s, &config, &state, 1_777_600_000_000).unwrap();
        // Each process numbers its events from 1.
        for seq in 1..=3 {
            let actions = reconcilers::reduce(&mut state, envelope(seq));
            j.record(&envelope(seq), &actions).unwrap();
        }
    }
    let files = existing_files(&s.path, 4);
    assert_eq!(headers(&files), vec![(0, Start::Open), (1, Start::Open)]);
    let summary = verify(&files).expect("a restart keeps the chain");
    assert_eq!(summary.steps, 6);
}

#[test]
fn a_half_written_record_of_the_previous_process_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    let config = Config::default();
    let mut state = State::new(config.clone());
    let mut j = Journal::open_at(&s, &config, &state, 0).unwrap();
    for seq in 1..=2 {
        let actions = reconcilers::reduce(&mut state, envelope(seq));
        j.record(&envelope(seq), &actions).unwrap();
    }
    let last = j.last_hash();
    drop(j);
    // A crash mid-write: the event line of seq 3 complete, its actions line half written.
    let complete = fs::read(&s.path).unwrap();
    let mut torn = complete.clone();
    let ev = encode_event(&mut torn, &envelope(3), &last).unwrap();
    let mut actions = Vec::new();
    encode_actions(&mut actions, 3, &[], &ev).unwrap();
    torn.extend_from_slice(&actions[..actions.len() / 2]);
    fs::write(&s.path, &torn).unwrap();
    assert!(matches!(
        verify(std::slice::from_ref(&s.path)),
        Err(Failure::Journal(e)) if e.problem == Problem::Truncated
    ));

    let state = State::new(config.clone());
    Journal::open_at(&s, &config, &state, 0).unwrap();
    // The old file lost exactly the unfinished step, and the chain continues from it.
    assert_eq!(fs::read(rotated_path(&s.path, 1)).unwrap(), complete);
    let files = existing_files(&s.path, 4);
    assert_eq!(verify(&files).unwrap().steps, 2);
}

#[test]
fn the_writer_refuses_a_seq_that_does_not_follow() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    let config = Config::default();
    let state = State::new(config.clone());
    let mut j = Journal::open_at(&s, &config, &state, 0).unwrap();
    j.record(&envelope(7), &[]).unwrap();
    let err = j.record(&envelope(9), &[]).unwrap_err().to_string();
    assert!(err.contains("seq 9 does not follow seq 7"), "{err}");
}

#[test]
fn an_unwritable_journal_directory_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"").unwrap();
    let s = JournalSettings {
        path: blocker.join("events.jsonl"),
        max_bytes: 1 << 20,
        files: 2,
    };
    let config = Config::default();
    let err = Journal::open(&s, &config, &State::new(config.clone()))
        .err()
        .expect("a file is in the way");
    let text = format!("{err:#}");
    assert!(text.contains("VK_JOURNAL_PATH"), "{text}");
}

#[test]
fn a_rotated_header_whose_state_differs_from_the_replayed_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = rotated_journal(dir.path(), 1000);
    let files = existing_files(&path, 1000);
    // The second file with its header's state changed and its chain recomputed from the
    // same anchor: every hash and link is intact, only the state check objects.
    let target = files[1].clone();
    let out = support::reencode(&target, |state| state.now += 1, |_| {});
    fs::write(&target, out).unwrap();
    match verify(&files) {
        Err(Failure::State { file, differences }) => {
            assert_eq!(file, target);
            assert!(
                differences.iter().any(|d| d.starts_with(".now:")),
                "{differences:?}"
            );
        }
        other => panic!("expected a state divergence, got {other:?}"),
    }
}
