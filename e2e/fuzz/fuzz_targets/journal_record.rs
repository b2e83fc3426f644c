//! The journal (`src/journal/`): one line decoded and its hash recomputed (`record::decode`),
//! a whole file read and verified (`Reader`), and a new process continuing the chain from a
//! previous file it finds (`Journal::open_at`, which reads and trims that file's tail).
//!
//! Mutated lines almost never carry a matching hash, so the input is also "re-chained": every
//! line shaped like a record gets its `prev` and `hash` recomputed (independently, with sha2)
//! before the line checks and the reader see it. NUL bytes split it into up to four files,
//! read as they are and framed as the writer stores them (zstd frames); the input and the
//! first framed file each stand as a previous file a new process continues. Files go to a
//! directory of this process's own under /dev/shm (else the system temp dir).

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use reconcilers::{Config, State};
use sha2::{Digest as _, Sha256};
use vk_cocoon::journal::record::{self, HeaderFields, Record};
use vk_cocoon::journal::{frame, Entry, Journal, JournalSettings, Reader, Start};

/// `"prev":"` + 64 hex + `"`, then `,"hash":"` + 64 hex + `"}`: the fixed end of a record.
const PREV_LEN: usize = 8 + 64 + 1;
const HASH_LEN: usize = 9 + 64 + 2;
const MAX_FILES: usize = 4;

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&c| c == b'\n') {
        check_line(line);
    }
    // NUL bytes split the input into consecutive files of one journal, chained across.
    let mut prev = "0".repeat(64);
    let mut files = Vec::new();
    for part in data.split(|&c| c == 0).take(MAX_FILES) {
        let (chained, shaped) = rechain(part, &mut prev);
        for (line, shaped) in chained.split(|&c| c == b'\n').zip(shaped) {
            if let Some(l) = check_line(line) {
                if shaped {
                    assert_eq!(l.computed, l.hash, "a re-chained line must verify");
                }
                round_trips(&l);
            }
        }
        files.push(chained);
    }
    read_files(&files);
    // The same lines as the writer stores them: compressed frames.
    let framed: Vec<Vec<u8>> = files.iter().filter_map(|f| frame::frame_lines(f).ok()).collect();
    read_files(&framed);
    continue_chain(data);
    if let Some(first) = framed.first() {
        continue_chain(first);
    }
});

/// `decode` hashes exactly `prev ‖ line without its hash member`.
fn check_line(line: &[u8]) -> Option<record::Line> {
    let l = record::decode(line).ok()?;
    let body = [&line[..line.len() - HASH_LEN], b"}"].concat();
    assert_eq!(
        l.computed.to_string(),
        sha256_hex(&l.prev.to_string(), &body)
    );
    Some(l)
}

fn sha256_hex(prev: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(body);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Every line ending like a record gets `prev` = the hash of the record before and its own
/// hash recomputed; other lines are kept as they are (the decoder reads `prev` wherever it
/// is, so some of those decode too). Also says which were redone.
fn rechain(data: &[u8], prev: &mut String) -> (Vec<u8>, Vec<bool>) {
    let mut out = Vec::with_capacity(data.len());
    let mut redone = Vec::new();
    for (i, line) in data.split(|&c| c == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        let mut line = line.to_vec();
        let n = line.len();
        if n >= PREV_LEN + HASH_LEN {
            let p = n - HASH_LEN - PREV_LEN;
            let h = n - HASH_LEN;
            let shaped = line[p..].starts_with(b"\"prev\":\"")
                && line[h - 1] == b'"'
                && line[h..].starts_with(b",\"hash\":\"")
                && line.ends_with(b"\"}");
            if shaped {
                line[p + 8..p + 72].copy_from_slice(prev.as_bytes());
                let body = [&line[..h], b"}"].concat();
                *prev = sha256_hex(prev, &body);
                line[h + 9..h + 73].copy_from_slice(prev.as_bytes());
            }
            redone.push(shaped);
        } else {
            redone.push(false);
        }
        out.extend_from_slice(&line);
    }
    (out, redone)
}

/// A verified record survives being written again: re-encoded with the same `prev`, it
/// decodes to the same record.
fn round_trips(l: &record::Line) {
    let mut out = Vec::new();
    let again = match &l.record {
        Record::Event(env) => record::encode_event(&mut out, env, &l.prev),
        Record::Actions {
            seq,
            actions,
            reduce_us,
        } => record::encode_actions(&mut out, *seq, actions, *reduce_us, &l.prev),
        Record::Header(h) => record::encode_header(
            &mut out,
            &HeaderFields {
                file_no: h.file_no,
                created_at: h.created_at,
                start: h.start,
                after_seq: h.after_seq,
                config: &h.config,
                state: &h.state,
            },
            &l.prev,
        ),
    }
    .expect("a decoded record encodes");
    let back = record::decode(&out[..out.len() - 1]).expect("an encoded record decodes");
    assert_eq!(
        (back.hash, back.computed, back.prev),
        (again, again, l.prev)
    );
    match (&l.record, &back.record) {
        (Record::Event(a), Record::Event(b)) => assert_eq!(a, b),
        (
            Record::Actions {
                seq: s,
                actions: a,
                reduce_us: u,
            },
            Record::Actions {
                seq: t,
                actions: b,
                reduce_us: v,
            },
        ) => assert_eq!((s, a, u), (t, b, v)),
        (Record::Header(a), Record::Header(b)) => {
            assert_eq!(
                (
                    a.file_no,
                    a.created_at,
                    a.start,
                    a.after_seq,
                    &a.config,
                    &a.state
                ),
                (
                    b.file_no,
                    b.created_at,
                    b.start,
                    b.after_seq,
                    &b.config,
                    &b.state
                )
            );
        }
        (a, b) => panic!("{a:?} came back as {b:?}"),
    }
}

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tmpfs when there is one: on a disk, the writer's truncations wait for writeback.
        let shm = Path::new("/dev/shm");
        let base = match shm.is_dir() {
            true => shm.to_path_buf(),
            false => std::env::temp_dir(),
        };
        let d = base.join(format!("vk-cocoon-fuzz-journal-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a temp dir");
        d
    })
}

/// What the reader accepts is a well-formed journal: its files are numbered consecutively,
/// and within a process's run (a `start: open` header begins one) the seqs of consecutive
/// steps follow each other.
fn read_files(files: &[Vec<u8>]) {
    let mut paths = Vec::new();
    for (i, bytes) in files.iter().enumerate() {
        let path = dir().join(format!("read-{i}.journal"));
        std::fs::write(&path, bytes).expect("write a journal file");
        paths.push(path);
    }
    let Ok(reader) = Reader::open(&paths) else {
        return;
    };
    let mut last_file_no: Option<u64> = None;
    let mut last_seq: Option<u64> = None;
    for entry in reader {
        match entry {
            Ok(Entry::Header { loc, header }) => {
                // A file's first line starts the next number; a header further down is a
                // process starting or resuming inside the same file.
                if let Some(before) = last_file_no {
                    let expected = if loc.line == 1 {
                        before.checked_add(1)
                    } else {
                        Some(before)
                    };
                    assert_eq!(Some(header.file_no), expected, "a file gap passed");
                }
                last_file_no = Some(header.file_no);
                if header.start == Start::Open {
                    last_seq = None;
                }
            }
            Ok(Entry::Step { envelope, .. }) => {
                if let Some(last) = last_seq {
                    assert_eq!(Some(envelope.seq), last.checked_add(1), "a seq gap passed");
                }
                last_seq = Some(envelope.seq);
            }
            Err(_) => break,
        }
    }
}

/// The input as the journal file a previous process left: a new process continues it when its
/// end verifies and starts a new file otherwise, and either way the journal it leaves ends
/// with that process's header; a previous file that read cleanly still reads cleanly.
fn continue_chain(previous: &[u8]) {
    let settings = JournalSettings {
        path: dir().join("events.journal"),
        max_bytes: 1 << 20,
        max_age_ms: i64::MAX,
        files: 2,
    };
    let rotated = vk_cocoon::journal::rotated_path(&settings.path, 1);
    let _ = std::fs::remove_file(&rotated);
    std::fs::write(&settings.path, previous).expect("write the previous journal");
    let read_cleanly = |path: &Path| -> Option<Vec<Entry>> {
        Reader::open(&[path.to_path_buf()])
            .ok()?
            .collect::<Result<Vec<_>, _>>()
            .ok()
    };
    let before = read_cleanly(&settings.path).filter(|e| !e.is_empty());
    let config = Config::default();
    let state = State::new(config.clone());
    let journal = Journal::open_at(&settings, &config, &state, 0).expect("the journal opens");
    let file_no = journal.file_no();
    drop(journal);
    let started_anew = rotated.exists();
    if started_anew || before.is_some() {
        let entries = read_cleanly(&settings.path)
            .expect("the journal a new process leaves reads cleanly");
        match entries.last() {
            Some(Entry::Header { header, .. }) => {
                assert_eq!(header.file_no, file_no);
                assert_eq!(header.start, Start::Open);
            }
            other => panic!("the journal does not end with the new header: {other:?}"),
        }
        if started_anew {
            assert_eq!(entries.len(), 1, "a new file holds only its header");
        }
    }
}
