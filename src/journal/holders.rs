//! T11: the VM holder records, read back from the journal by a process that starts, before
//! it decides anything. The table is part of the core's state, so it is in every header a
//! rotation or a resume writes; each change after that is a `hold` action, and a process start
//! hands the table it read to the core as its first event. So the newest header that is not
//! a fresh process's, then every `hold` and every restore after it, give the table as the last
//! process left it.

use std::path::{Path, PathBuf};

use reconcilers::holders::Holders;
use reconcilers::{Action, Event};

use super::reader::{Entry, Reader};
use super::record::Start;
use super::writer::JournalSettings;

/// The records, and why they may be incomplete when they may be.
pub struct ReadBack {
    pub holders: Holders,
    pub problem: Option<String>,
    /// Lines' worth of steps read, for the log.
    pub steps: u64,
}

/// Reads the journal at `settings.path` and its rotated files. A journal that does not exist
/// yet is a first start: no records and no problem.
pub fn read_back(settings: &JournalSettings) -> ReadBack {
    let files = super::files::existing(&settings.path, settings.files);
    if files.is_empty() {
        return ReadBack {
            holders: Holders::default(),
            problem: None,
            steps: 0,
        };
    }
    let from = files
        .iter()
        .rposition(|f| starts_with_a_whole_state(f))
        .unwrap_or(0);
    read_from(&files[from..])
}

/// Whether the file's first header carries the state the previous one ended with (a
/// rotation or a resume), not a fresh process's.
fn starts_with_a_whole_state(file: &Path) -> bool {
    let Ok(mut r) = Reader::open(&[file.to_path_buf()]) else {
        return false;
    };
    matches!(r.next(), Some(Ok(Entry::Header { header, .. })) if header.start != Start::Open)
}

fn read_from(files: &[PathBuf]) -> ReadBack {
    let mut out = ReadBack {
        holders: Holders::default(),
        problem: None,
        steps: 0,
    };
    let reader = match Reader::open(files) {
        Ok(r) => r,
        Err(e) => {
            out.problem = Some(e.to_string());
            return out;
        }
    };
    for entry in reader {
        match entry {
            // A fresh process's header holds an empty table; its restore event follows.
            Ok(Entry::Header { header, .. }) => match header.start {
                Start::Open => {}
                Start::Rotate | Start::Resume => out.holders = header.state.holders.clone(),
            },
            Ok(Entry::Step {
                envelope, actions, ..
            }) => {
                out.steps += 1;
                if let Event::HoldersRestored { holders, .. } = envelope.event {
                    out.holders = holders;
                }
                for a in actions {
                    if let Action::Hold { vm, held } = a {
                        out.holders.set(&vm, held);
                    }
                }
            }
            // What was read before the problem is proven by its chain; the rest is lost.
            Err(e) => {
                out.problem = Some(e.to_string());
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::holders::{Held, Holder};
    use reconcilers::{Config, Envelope, State};

    fn held(ns: &str, pod: &str, id: Option<&str>) -> Held {
        Held {
            holder: Holder {
                uid: format!("uid-{pod}"),
                namespace: ns.into(),
                pod: pod.into(),
                namespace_uid: None,
            },
            id: id.map(str::to_string),
            kept: false,
        }
    }

    fn hold(vm: &str, h: Option<Held>) -> Action {
        Action::Hold {
            vm: vm.into(),
            held: h,
        }
    }

    fn settings(dir: &Path) -> JournalSettings {
        JournalSettings {
            path: dir.join("events.journal"),
            max_bytes: 1 << 20,
            max_age_ms: i64::MAX,
            files: 4,
        }
    }

    fn step(j: &mut super::super::Journal, seq: u64, event: Event, actions: &[Action]) {
        let e = Envelope {
            seq,
            at: seq as i64,
            event,
        };
        j.record(&e, actions).unwrap();
    }

    #[test]
    fn the_table_is_what_the_holds_and_restores_left() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let config = Config::default();
        // First process: two VMs recorded, one let go.
        let mut j =
            super::super::Journal::open_at(&s, &config, &State::new(config.clone()), 0).unwrap();
        step(
            &mut j,
            1,
            Event::NodeRegistered,
            &[
                hold("a", Some(held("ns-a", "pa", None))),
                hold("b", Some(held("ns-b", "pb", Some("VB")))),
            ],
        );
        step(
            &mut j,
            2,
            Event::NodeRegistered,
            &[
                hold("a", Some(held("ns-a", "pa", Some("VA")))),
                hold("b", None),
            ],
        );
        drop(j);
        let back = read_back(&s);
        assert_eq!(back.problem, None);
        let want: Holders = [("a".to_string(), held("ns-a", "pa", Some("VA")))]
            .into_iter()
            .collect();
        assert_eq!(back.holders, want);
        // Second process: its own restore, then one more VM.
        let mut j =
            super::super::Journal::open_at(&s, &config, &State::new(config.clone()), 3).unwrap();
        step(
            &mut j,
            1,
            Event::HoldersRestored {
                holders: want.clone(),
                problem: None,
            },
            &[],
        );
        step(
            &mut j,
            2,
            Event::NodeRegistered,
            &[hold("c", Some(held("ns-c", "pc", None)))],
        );
        drop(j);
        let back = read_back(&s);
        assert_eq!(back.problem, None);
        assert_eq!(back.holders.len(), 2);
        assert!(back.holders.get("a").is_some() && back.holders.get("c").is_some());
    }

    #[test]
    fn a_rotated_file_starts_from_the_table_in_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let config = Config::default();
        let mut state = State::new(config.clone());
        state.holders.set("kept", Some(held("ns", "p", Some("V1"))));
        // A resumed journal: its header carries the table; the file before it is gone.
        let mut j = super::super::Journal::resume_at(&s, &config, &state, Some(7), 0).unwrap();
        step(&mut j, 8, Event::NodeRegistered, &[]);
        drop(j);
        let back = read_back(&s);
        assert_eq!(back.problem, None);
        assert_eq!(back.holders, state.holders);
    }

    #[test]
    fn no_journal_yet_is_a_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let back = read_back(&settings(dir.path()));
        assert!(back.holders.is_empty());
        assert_eq!(back.problem, None);
    }

    #[test]
    fn a_damaged_journal_keeps_what_was_proven_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        std::fs::write(&s.path, b"not a journal\n").unwrap();
        let back = read_back(&s);
        assert!(back.holders.is_empty());
        assert!(back.problem.is_some());
    }
}
