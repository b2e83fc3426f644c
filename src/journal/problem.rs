//! What can be wrong with a journal, and where: every check names the file, the line and, when
//! it is known, the seq, so a person can open the file at the record.

use std::fmt;
use std::path::PathBuf;

use super::digest::Digest;
use super::record::Form;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    Io(String),
    /// The last line has no newline: the writer stopped in the middle of a record.
    Truncated,
    EmptyFile,
    /// A frame that does not decompress to whole lines (see `frame`): a changed byte.
    BadFrame(String),
    NoHash,
    BadJson(String),
    UnknownKind(String),
    BadPrevField(String),
    /// A header version this build does not read in the file's form (`None` before the form
    /// is known).
    UnsupportedVersion {
        version: u32,
        form: Option<Form>,
    },
    /// The record's bytes do not hash to its `hash`: it was changed after it was written.
    HashMismatch {
        stored: Digest,
        computed: Digest,
    },
    /// The record's `prev` is not the hash of the record before it.
    BrokenLink {
        expected: Digest,
        found: Digest,
    },
    SeqGap {
        expected: u64,
        found: u64,
    },
    /// A record of the wrong kind where another was due.
    OutOfOrder {
        expected: &'static str,
        found: &'static str,
    },
    ActionsSeq {
        event: u64,
        found: u64,
    },
    /// The journal ends after an event whose actions were never written.
    MissingActions,
    /// Files are not consecutive: one in between is missing (or the order is wrong).
    FileGap {
        expected: u64,
        found: u64,
    },
    /// The header's `config` and its `state.config` disagree.
    ConfigMismatch,
    /// A header inside a file carries another file's number.
    HeaderFileNo {
        file: u64,
        found: u64,
    },
    /// A seq or file number of u64::MAX: no journal gets there, and nothing could follow it.
    NumberTooLarge {
        field: &'static str,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Io(e) => write!(f, "cannot read: {e}"),
            Problem::Truncated => f.write_str(
                "truncated record: the file ends inside its last record (the writer stopped mid-write)",
            ),
            Problem::EmptyFile => f.write_str("empty file: a journal file starts with a header"),
            Problem::BadFrame(why) => write!(f, "damaged frame: {why}"),
            Problem::NoHash => {
                f.write_str("bad record: the line does not end with a \"hash\" member")
            }
            Problem::BadJson(e) => write!(f, "bad JSON: {e}"),
            Problem::UnknownKind(k) => write!(
                f,
                "unknown record kind {k:?} (expected header, event or actions)"
            ),
            Problem::BadPrevField(p) => write!(f, "bad prev field {p:?}: not 64 hex digits"),
            Problem::UnsupportedVersion { version, form } => unsupported(f, *version, *form),
            Problem::HashMismatch { stored, computed } => write!(
                f,
                "hash mismatch: the record was changed after it was written (stored {}…, its bytes hash to {}…)",
                stored.short(),
                computed.short()
            ),
            Problem::BrokenLink { expected, found } => write!(
                f,
                "broken prev link: prev is {}… but the record before it hashes to {}… \
                 (a record was removed, inserted or reordered)",
                found.short(),
                expected.short()
            ),
            Problem::SeqGap { expected, found } => write!(
                f,
                "seq gap: expected event seq {expected}, found {found} (events are missing)"
            ),
            Problem::OutOfOrder { expected, found } => {
                write!(f, "out of order: expected a {expected} record, found {found}")
            }
            Problem::ActionsSeq { event, found } => write!(
                f,
                "actions record has seq {found} but follows the event with seq {event}"
            ),
            Problem::MissingActions => f.write_str(
                "the journal ends after an event without its actions record (the writer stopped mid-write)",
            ),
            Problem::FileGap { expected, found } => write!(
                f,
                "file_no {found} follows file_no {}: file {expected} is missing; \
                 pass every rotated file (replay sorts them)",
                expected.wrapping_sub(1)
            ),
            Problem::ConfigMismatch => {
                f.write_str("the header's config differs from the config inside its state")
            }
            Problem::HeaderFileNo { file, found } => write!(
                f,
                "a header inside file_no {file} says file_no {found}: every header of a file \
                 carries the file's number"
            ),
            Problem::NumberTooLarge { field } => write!(
                f,
                "{field} is {}, a number no journal reaches (nothing could follow it)",
                u64::MAX
            ),
        }
    }
}

/// Names the version found, the form it was found in, and what this build reads in each form,
/// so the message says why a version this build knows can still be refused (version 5 inside
/// frames).
fn unsupported(f: &mut fmt::Formatter<'_>, version: u32, form: Option<Form>) -> fmt::Result {
    fn versions(v: &[u32]) -> String {
        match v {
            [one] => format!("version {one}"),
            [rest @ .., last] => {
                let rest: Vec<String> = rest.iter().map(u32::to_string).collect();
                format!("versions {} and {last}", rest.join(", "))
            }
            [] => "no version".into(),
        }
    }
    write!(f, "journal format version {version}")?;
    if let Some(form) = form {
        write!(f, " in {}", form.name())?;
    }
    let reads: Vec<String> = Form::ALL
        .iter()
        .map(|form| format!("{} in {}", versions(form.versions()), form.name()))
        .collect();
    write!(
        f,
        " is not supported by this vk-cocoon, which reads {}",
        reads.join(" and ")
    )?;
    if !Form::known(version) {
        f.write_str("; replay it with the vk-cocoon that wrote it")?;
    }
    Ok(())
}

/// A problem at a place in the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is with the file as a whole.
    pub line: u64,
    pub seq: Option<u64>,
    pub problem: Problem,
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if let Some(seq) = self.seq {
            write!(f, " (seq {seq})")?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl std::error::Error for JournalError {}
