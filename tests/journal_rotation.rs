//! Rotation: the chain runs across files, each file replays on its own from its header
//! state, a missing file is named, a restarted process continues the chain in the current file
//! (a new file only by size, or when the current one cannot be continued), and a record the
//! previous process left half-written is cut off.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use reconcilers::{Config, Envelope, Event, State};
use vk_cocoon::journal::{
    existing_files, rotated_path, Entry, Journal, JournalSettings, Problem, Reader, Start,
    FORMAT_VERSION,
};
use vk_cocoon::replay::Failure;

use support::{scenarios, verify};

fn headers(files: &[PathBuf]) -> Vec<(u64, Start)> {
    Reader::open(files)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entry::Header { header, .. } => Some((header.file_no, header.start)),
            Entry::Step { .. } => None,
        })
        .collect()
}

/// Files of this size hold a few hundred steps of the churn run beside their header's state.
const FILE_BYTES: u64 = 4 * 1024;

/// 12 pods through create → ready → delete, in several files.
fn rotated_journal(dir: &Path, files: u32) -> (PathBuf, u64) {
    let w = scenarios::churn(12);
    let path = dir.join("events.journal");
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
    let mut bytes = support::read_lines(target);
    let third_line = bytes
        .iter()
        .enumerate()
        .filter(|(_, &c)| c == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 30;
    bytes[third_line] ^= 0x01;
    support::write_lines(target, &bytes);
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
        path: dir.join("j/events.journal"),
        max_bytes: 1 << 20,
        max_age_ms: i64::MAX,
        files: 4,
    }
}

/// One process: opens the journal and journals `steps` events numbered from 1.
fn process(s: &JournalSettings, steps: u64) {
    let config = Config::default();
    let mut state = State::new(config.clone());
    let mut j = Journal::open_at(s, &config, &state, 1_777_600_000_000).unwrap();
    for seq in 1..=steps {
        let actions = reconcilers::reduce(&mut state, envelope(seq));
        j.record(&envelope(seq), &actions).unwrap();
        j.rotate_if_needed(&state).unwrap();
    }
}

#[test]
fn a_restarted_process_continues_the_chain_in_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    // Each process numbers its events from 1.
    process(&s, 3);
    process(&s, 3);
    let files = existing_files(&s.path, 4);
    assert_eq!(files, vec![s.path.clone()]);
    assert_eq!(headers(&files), vec![(0, Start::Open), (0, Start::Open)]);
    let summary = verify(&files).expect("a restart keeps the chain");
    assert_eq!((summary.steps, summary.files), (6, 1));
}

#[test]
fn a_crash_loop_does_not_push_older_files_out() {
    let dir = tempfile::tempdir().unwrap();
    let s = JournalSettings {
        files: 2,
        ..settings(dir.path())
    };
    // Before the loop: a run that filled a file, whose evidence must survive.
    process(
        &JournalSettings {
            max_bytes: 2_000,
            max_age_ms: i64::MAX,
            ..s.clone()
        },
        40,
    );
    let kept = fs::read(rotated_path(&s.path, 1)).unwrap();
    for _ in 0..50 {
        process(&s, 1);
    }
    assert_eq!(fs::read(rotated_path(&s.path, 1)).unwrap(), kept);
    let files = existing_files(&s.path, 2);
    // Every start of the loop is in the current file, after the first run's last rotation.
    let h = headers(&files);
    assert_eq!(
        h.iter().filter(|(_, start)| *start == Start::Open).count(),
        50
    );
    assert!(verify(&files).is_ok());
}

#[test]
fn a_current_file_whose_end_does_not_verify_is_rotated_away() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    process(&s, 3);
    let mut text = support::read_lines(&s.path);
    // A byte of the last record's body changed: its stored hash no longer matches.
    let at = text.len() - 100;
    text[at] ^= 0x01;
    support::write_lines(&s.path, &text);
    let bytes = fs::read(&s.path).unwrap();
    process(&s, 2);
    assert_eq!(fs::read(rotated_path(&s.path, 1)).unwrap(), bytes);
    assert_eq!(
        headers(std::slice::from_ref(&s.path)),
        vec![(1, Start::Open)]
    );
    verify(std::slice::from_ref(&s.path)).expect("the new file on its own");
}

#[test]
fn a_current_file_of_another_format_is_rotated_away() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    // A journal of the line format (version 5), as an older build left it.
    let older =
        fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal-v5.jsonl"))
            .unwrap();
    fs::create_dir_all(s.path.parent().unwrap()).unwrap();
    fs::write(&s.path, &older).unwrap();
    process(&s, 2);
    assert_eq!(fs::read(rotated_path(&s.path, 1)).unwrap(), older);
    let files = existing_files(&s.path, 4);
    assert_eq!(headers(&files), vec![(0, Start::Open), (1, Start::Open)]);
    let versions: Vec<u32> = Reader::open(&files)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entry::Header { header, .. } => Some(header.version),
            Entry::Step { .. } => None,
        })
        .collect();
    assert_eq!(versions, vec![FORMAT_VERSION - 1, FORMAT_VERSION]);
    // The old file is still read, and the chain runs from its last record into the new one.
    assert!(Reader::open(&files).unwrap().all(|e| e.is_ok()));
}

#[test]
fn a_full_current_file_is_rotated_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = JournalSettings {
        max_bytes: 1_000,
        max_age_ms: i64::MAX,
        ..settings(dir.path())
    };
    // One step short of rotating by itself: the file is past its size when the process ends.
    process(
        &JournalSettings {
            max_bytes: u64::MAX,
            max_age_ms: i64::MAX,
            ..s.clone()
        },
        12,
    );
    assert!(fs::metadata(&s.path).unwrap().len() >= s.max_bytes);
    process(&s, 1);
    let files = existing_files(&s.path, 4);
    assert_eq!(headers(&files), vec![(0, Start::Open), (1, Start::Open)]);
    verify(&files).expect("the chain runs into the new file");
}

#[test]
fn journal_files_are_for_root_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    process(&s, 1);
    assert_eq!(mode(s.path.parent().unwrap()), 0o700);
    assert_eq!(mode(&s.path), 0o600);
    // A file an older build left readable to all is narrowed, and so is a rotated one.
    fs::set_permissions(&s.path, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(rotated_path(&s.path, 1), b"").unwrap();
    fs::set_permissions(rotated_path(&s.path, 1), fs::Permissions::from_mode(0o644)).unwrap();
    process(&s, 1);
    assert_eq!(mode(&s.path), 0o600);
    assert_eq!(mode(&rotated_path(&s.path, 1)), 0o600);
    // An existing directory is the operator's: left as it is.
    let shared = tempfile::tempdir().unwrap();
    fs::set_permissions(shared.path(), fs::Permissions::from_mode(0o755)).unwrap();
    process(&settings_at(shared.path().join("events.journal")), 1);
    assert_eq!(mode(shared.path()), 0o755);
}

fn settings_at(path: PathBuf) -> JournalSettings {
    JournalSettings {
        path,
        max_bytes: 1 << 20,
        max_age_ms: i64::MAX,
        files: 4,
    }
}

#[test]
fn a_resumed_journal_replays_across_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    let w = scenarios::churn(3);
    let config = w.state.config.clone();
    let mut state = State::new(config.clone());
    let mut j = Some(Journal::open_at(&s, &config, &state, 0).unwrap());
    let (lost_from, lost_to) = (20, 40);
    assert!(w.log.len() > 60, "{} steps", w.log.len());
    for (env, actions) in &w.log {
        let again = reconcilers::reduce(&mut state, env.clone());
        assert_eq!(&again, actions);
        if (lost_from..=lost_to).contains(&env.seq) {
            // The journal is down: these steps are reduced and executed, not journaled.
            j = None;
            if env.seq == lost_to {
                j = Some(Journal::resume_at(&s, &config, &state, Some(lost_to), 0).unwrap());
            }
            continue;
        }
        j.as_mut().unwrap().record(env, actions).unwrap();
    }
    let files = existing_files(&s.path, 4);
    assert_eq!(headers(&files), vec![(0, Start::Open), (0, Start::Resume)]);
    let summary = verify(&files).expect("replay takes the resumed state");
    assert_eq!(summary.gaps, 1);
    assert_eq!(
        summary.steps,
        w.log.len() as u64 - (lost_to - lost_from + 1)
    );
}

#[test]
fn a_header_inside_a_file_must_be_a_start_or_resume_of_that_file() {
    use vk_cocoon::journal::record::{decode, encode_header, HeaderFields};
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    process(&s, 2);
    let bytes = support::read_lines(&s.path);
    let last = bytes[..bytes.len() - 1]
        .rsplit(|&c| c == b'\n')
        .next()
        .unwrap();
    let prev = decode(last).unwrap().hash;
    let config = Config::default();
    let state = State::new(config.clone());
    let append = |file_no, start| {
        let mut out = bytes.clone();
        let h = HeaderFields {
            file_no,
            created_at: 0,
            start,
            after_seq: Some(2),
            config: &config,
            state: &state,
        };
        encode_header(&mut out, &h, &prev).unwrap();
        let p = dir.path().join(format!("case-{file_no}-{start:?}.journal"));
        support::write_lines(&p, &out);
        match verify(&[p]) {
            Err(Failure::Journal(e)) => (e.line, e.problem),
            other => panic!("expected a journal error, got {other:?}"),
        }
    };
    assert_eq!(
        append(0, Start::Rotate),
        (
            6,
            Problem::OutOfOrder {
                expected: "event or a process's header",
                found: "rotation header"
            }
        )
    );
    assert_eq!(
        append(1, Start::Open),
        (6, Problem::HeaderFileNo { file: 0, found: 1 })
    );
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
    // A crash mid-write: the frame of seq 3 (its event and actions) half written.
    let complete = fs::read(&s.path).unwrap();
    let actions = reconcilers::reduce(&mut state, envelope(3));
    j.record(&envelope(3), &actions).unwrap();
    drop(j);
    let whole = fs::read(&s.path).unwrap();
    let torn = &whole[..complete.len() + (whole.len() - complete.len()) / 2];
    fs::write(&s.path, torn).unwrap();
    assert!(matches!(
        verify(std::slice::from_ref(&s.path)),
        Err(Failure::Journal(e)) if e.problem == Problem::Truncated
    ));

    let state = State::new(config.clone());
    Journal::open_at(&s, &config, &state, 0).unwrap();
    // The file lost exactly the unfinished step, and the next process continues after it.
    let now = fs::read(&s.path).unwrap();
    assert_eq!(&now[..complete.len()], &complete[..]);
    let files = existing_files(&s.path, 4);
    assert_eq!(files, vec![s.path.clone()]);
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
        path: blocker.join("events.journal"),
        max_bytes: 1 << 20,
        max_age_ms: i64::MAX,
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

/// A quiet node writes little: a file also ends once it is `max_age_ms` old (by its records'
/// times), and a process starting after that begins a new file instead of appending.
#[test]
fn a_file_is_rotated_by_age_as_well_as_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let s = JournalSettings {
        max_age_ms: 10_000,
        ..settings(dir.path())
    };
    let t0 = 1_777_600_000_000;
    let at = |seq: u64| Envelope {
        seq,
        at: t0 + seq as i64 * 1_000,
        event: Event::PodRelistBegin,
    };
    let config = Config::default();
    let mut state = State::new(config.clone());
    let mut j = Journal::open_at(&s, &config, &state, t0).unwrap();
    for seq in 1..=25 {
        let actions = reconcilers::reduce(&mut state, at(seq));
        j.record(&at(seq), &actions).unwrap();
        j.rotate_if_needed(&state).unwrap();
    }
    drop(j);
    let files = existing_files(&s.path, 4);
    let started = [(0, Start::Open), (1, Start::Rotate), (2, Start::Rotate)];
    assert_eq!(headers(&files), started);
    // Within the age the next start appends; past it, it begins file 3.
    Journal::open_at(&s, &config, &State::new(config.clone()), t0 + 26_000).unwrap();
    assert_eq!(headers(&existing_files(&s.path, 4)).len(), 4);
    assert_eq!(
        headers(std::slice::from_ref(&s.path)),
        vec![(2, Start::Rotate), (2, Start::Open)]
    );
    Journal::open_at(&s, &config, &State::new(config.clone()), t0 + 31_000).unwrap();
    assert_eq!(
        headers(std::slice::from_ref(&s.path)),
        vec![(3, Start::Open)]
    );
    verify(&existing_files(&s.path, 4)).expect("the chain runs through every file");
}
