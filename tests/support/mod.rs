//! Helpers shared by the root package's integration tests.

#![allow(dead_code)]

pub mod scenarios;

use std::path::{Path, PathBuf};

use reconcilers::testkit::World;
use vk_cocoon::journal::{write_run, JournalSettings};

/// Where the committed sample journal lives.
pub fn sample_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/sample/demo.journal")
}

/// The wall time the fake world starts at: the journal's `created_at`.
pub const WORLD_START: i64 = 1_777_600_000_000;

/// Journals `w`'s whole run at `path` (no rotation unless `max_bytes` says so).
pub fn journal_world(w: &World, path: &Path, max_bytes: u64, files: u32) {
    let settings = JournalSettings {
        path: path.to_path_buf(),
        max_bytes,
        max_age_ms: i64::MAX,
        files,
    };
    let config = w.state.config.clone();
    write_run(&settings, &config, WORLD_START, &w.log).expect("journal the run");
}

/// Reads the journal at `src` and writes it again at `dst` through the writer, letting
/// `edit` change any step first. The writer does not reduce, so the copy has an intact hash
/// chain whatever `edit` did: only replay can tell.
pub fn rewrite(
    src: &Path,
    dst: &Path,
    mut edit: impl FnMut(&mut reconcilers::Envelope, &mut Vec<reconcilers::Action>),
) {
    use vk_cocoon::journal::{Entry, Journal, Reader, Start};
    let settings = JournalSettings {
        path: dst.to_path_buf(),
        max_bytes: u64::MAX,
        max_age_ms: i64::MAX,
        files: 1,
    };
    let mut journal = None;
    for entry in Reader::open(&[src.to_path_buf()]).expect("open") {
        match entry.expect("the source journal is intact") {
            Entry::Header { header, .. } => {
                let (config, state, at) = (&header.config, &header.state, header.created_at);
                let attached = match header.start {
                    Start::Open => Journal::open_at(&settings, config, state, at),
                    Start::Resume => {
                        Journal::resume_at(&settings, config, state, header.after_seq, at)
                    }
                    Start::Rotate => panic!("rewrite copies one file; a rotation begins another"),
                };
                // The previous run's writer goes first: the next one appends after its end.
                drop(journal.take());
                journal = Some(attached.expect("open the copy"));
            }
            Entry::Step {
                mut envelope,
                mut actions,
                reduce_us,
                ..
            } => {
                edit(&mut envelope, &mut actions);
                let j = journal.as_mut().expect("a header first");
                match reduce_us {
                    Some(us) => j.record_timed(&envelope, &actions, us),
                    None => j.record(&envelope, &actions),
                }
                .expect("record");
            }
        }
    }
}

/// The records of a journal file as the text lines they are written as (the file holds them
/// compressed in frames).
pub fn read_lines(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    vk_cocoon::journal::frame::lines_of_file(&bytes).expect("whole frames")
}

/// Writes journal text lines as a journal file, framed as the writer frames them: the way
/// to hand-edit a record and keep everything else as written.
pub fn write_lines(path: &Path, text: &[u8]) {
    let framed = vk_cocoon::journal::frame::frame_lines(text).unwrap();
    std::fs::write(path, framed).unwrap();
}

/// The binary under test.
pub fn vk_cocoon() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_vk-cocoon"));
    c.env_clear();
    c
}

/// `vk-cocoon replay --verify --quiet` as a library call.
pub fn verify(files: &[PathBuf]) -> Result<vk_cocoon::replay::Summary, vk_cocoon::replay::Failure> {
    let opts = vk_cocoon::replay::Options {
        files: files.to_vec(),
        verify: true,
        quiet: true,
        ..Default::default()
    };
    vk_cocoon::replay::run(&opts, &mut std::io::sink()).map(|(s, _)| s)
}

/// Re-encodes one journal file record by record, chaining from the file's own first `prev`,
/// after `edit_state` changed its header's state and `edit_event` each event. The writer
/// would refuse some edits (a seq gap); the encoder does not, and every hash and link comes
/// out intact, so only the checks beyond the chain can object. Returns the file's bytes,
/// framed.
pub fn reencode(
    path: &Path,
    mut edit_state: impl FnMut(&mut reconcilers::State),
    mut edit_event: impl FnMut(&mut reconcilers::Envelope),
) -> Vec<u8> {
    use vk_cocoon::journal::record::{
        decode, encode_actions, encode_event, encode_header, HeaderFields,
    };
    use vk_cocoon::journal::{Entry, Reader};
    let bytes = read_lines(path);
    let first = &bytes[..bytes.iter().position(|&c| c == b'\n').unwrap()];
    let mut last = decode(first).unwrap().prev;
    let mut out = Vec::new();
    for entry in Reader::open(&[path.to_path_buf()]).unwrap() {
        match entry.unwrap() {
            Entry::Header { header, .. } => {
                let mut state = header.state.clone();
                edit_state(&mut state);
                let h = HeaderFields {
                    file_no: header.file_no,
                    created_at: header.created_at,
                    start: header.start,
                    after_seq: header.after_seq,
                    config: &header.config,
                    state: &state,
                };
                last = encode_header(&mut out, &h, &last).unwrap();
            }
            Entry::Step {
                mut envelope,
                actions,
                reduce_us,
                ..
            } => {
                edit_event(&mut envelope);
                last = encode_event(&mut out, &envelope, &last).unwrap();
                last = encode_actions(&mut out, envelope.seq, &actions, reduce_us, &last).unwrap();
            }
        }
    }
    vk_cocoon::journal::frame::frame_lines(&out).unwrap()
}
