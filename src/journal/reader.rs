//! Reading a journal back and proving it is the one that was written: every line's hash, every
//! `prev` link (across files too), seq continuity and the header → (event, actions)* shape,
//! where a file may hold several such runs. The first problem ends the read and names its
//! file, line and seq.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use reconcilers::{Action, Envelope};

use super::digest::Digest;
use super::frame::{self, FrameError, FrameReader};
use super::problem::{JournalError, Problem};
use super::record::{self, Form, Header, Record, Start};

/// Where a record is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub file: Arc<Path>,
    /// 1-based.
    pub line: u64,
}

// `Step` is the large variant and also the common one: boxing it would add an allocation
// per event to save space in a value that lives for one loop iteration.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Entry {
    /// A header: a file begins (line 1), or a process starts or resumes inside the current
    /// file. For `start: open` its state is a fresh process's.
    Header { loc: Loc, header: Box<Header> },
    /// One reduce step as the loop journaled it; `loc` is the event's line.
    Step {
        loc: Loc,
        envelope: Envelope,
        actions: Vec<Action>,
        /// Microseconds the daemon took to reduce the event, when it recorded them.
        reduce_us: Option<u64>,
    },
}

/// Where a file's lines come from: frames (this format) or the file's own lines (version 5, or
/// this format's lines written out plain by `replay --json`).
enum Source {
    Lines(BufReader<File>),
    Frames {
        frames: Box<FrameReader<BufReader<File>>>,
        /// The current frame's lines, and how far they have been read.
        lines: Vec<u8>,
        pos: usize,
    },
}

impl Source {
    fn open(f: File) -> std::io::Result<Source> {
        let mut rd = BufReader::with_capacity(1 << 20, f);
        let framed = rd.fill_buf()?.first().is_some_and(|&b| frame::is_framed(b));
        Ok(if framed {
            Source::Frames {
                frames: Box::new(FrameReader::new(rd)?),
                lines: Vec::new(),
                pos: 0,
            }
        } else {
            Source::Lines(rd)
        })
    }

    fn form(&self) -> Form {
        match self {
            Source::Lines(_) => Form::Lines,
            Source::Frames { .. } => Form::Frames,
        }
    }

    /// Appends the next line (with its newline, when it has one) to `out`; `Ok(false)` at the
    /// end of the file.
    fn next_line(&mut self, out: &mut Vec<u8>) -> Result<bool, Problem> {
        match self {
            Source::Lines(rd) => match rd.read_until(b'\n', out) {
                Ok(n) => Ok(n > 0),
                Err(e) => Err(Problem::Io(e.to_string())),
            },
            Source::Frames { frames, lines, pos } => {
                while *pos == lines.len() {
                    lines.clear();
                    *pos = 0;
                    if !frames.next_frame(lines).map_err(frame_problem)? {
                        return Ok(false);
                    }
                }
                // A frame holds whole lines only (`Decompressor::frame` checks), so a newline
                // ends this one.
                let rest = &lines[*pos..];
                let n = rest
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(rest.len(), |i| i + 1);
                out.extend_from_slice(&rest[..n]);
                *pos += n;
                Ok(true)
            }
        }
    }
}

fn frame_problem(e: FrameError) -> Problem {
    match e {
        FrameError::Io(e) => Problem::Io(e.to_string()),
        FrameError::Torn => Problem::Truncated,
        FrameError::Corrupt(why) => Problem::BadFrame(why),
    }
}

pub struct Reader {
    files: Vec<PathBuf>,
    next_file: usize,
    cur: Option<(Arc<Path>, Source)>,
    line_no: u64,
    buf: Vec<u8>,
    /// Hash of the last record read; `None` before the first header.
    last: Option<Digest>,
    last_file_no: Option<u64>,
    /// Seq of the last event of the current process's run.
    last_seq: Option<u64>,
    /// The current file has produced its header.
    in_file: bool,
    done: bool,
}

impl Reader {
    /// Reads the given files in journal order: sorted by the `file_no` in their headers, so
    /// a shell glob (`events.journal*`) is enough.
    pub fn open(paths: &[PathBuf]) -> Result<Reader, JournalError> {
        let mut keyed = Vec::with_capacity(paths.len());
        for p in paths {
            keyed.push((file_no_of(p)?, p.clone()));
        }
        keyed.sort();
        // A file named twice (a glob and a path) is read once.
        keyed.dedup_by(|a, b| a.1 == b.1);
        Ok(Reader {
            files: keyed.into_iter().map(|(_, p)| p).collect(),
            next_file: 0,
            cur: None,
            line_no: 0,
            buf: Vec::with_capacity(1 << 20),
            last: None,
            last_file_no: None,
            last_seq: None,
            in_file: false,
            done: false,
        })
    }

    /// The files in the order they are read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn err(&self, file: &Path, line: u64, seq: Option<u64>, problem: Problem) -> JournalError {
        JournalError {
            file: file.to_path_buf(),
            line,
            seq,
            problem,
        }
    }

    /// The next line of the current file, decoded and checked against the chain; `None` at
    /// the end of the file.
    fn next_line(&mut self) -> Option<Result<(Loc, record::Line), JournalError>> {
        let (path, src) = self.cur.as_mut()?;
        let path = path.clone();
        let form = src.form();
        self.buf.clear();
        match src.next_line(&mut self.buf) {
            Ok(false) => return None,
            Ok(true) => {}
            Err(p) => {
                let line = self.line_no + 1;
                return Some(Err(self.err(&path, line, None, p)));
            }
        }
        self.line_no += 1;
        let loc = Loc {
            file: path.clone(),
            line: self.line_no,
        };
        let Some(bytes) = self.buf.strip_suffix(b"\n") else {
            return Some(Err(self.err(&path, loc.line, None, Problem::Truncated)));
        };
        let line = match record::decode(bytes) {
            Ok(l) => l,
            Err(Problem::UnsupportedVersion { version, form: _ }) => {
                let p = Problem::UnsupportedVersion {
                    version,
                    form: Some(form),
                };
                return Some(Err(self.err(&path, loc.line, None, p)));
            }
            Err(p) => return Some(Err(self.err(&path, loc.line, None, p))),
        };
        // A header of the line format inside frames was never written so.
        if let Record::Header(h) = &line.record {
            if !form.versions().contains(&h.version) {
                let p = Problem::UnsupportedVersion {
                    version: h.version,
                    form: Some(form),
                };
                return Some(Err(self.err(&path, loc.line, None, p)));
            }
        }
        let seq = line.record.seq();
        // A header's link is checked in `header`, after the more telling file-order checks.
        let is_header = matches!(line.record, Record::Header(_));
        if let Some(expected) = self.last.filter(|_| !is_header) {
            if line.prev != expected {
                let p = Problem::BrokenLink {
                    expected,
                    found: line.prev,
                };
                return Some(Err(self.err(&path, loc.line, seq, p)));
            }
        }
        if line.computed != line.hash {
            let p = Problem::HashMismatch {
                stored: line.hash,
                computed: line.computed,
            };
            return Some(Err(self.err(&path, loc.line, seq, p)));
        }
        // Not yet `self.last = line.hash`: a header's link is checked against the record
        // before it, in `header`; every caller advances the chain once the line is accepted.
        Some(Ok((loc, line)))
    }

    fn open_next_file(&mut self) -> Option<Result<(), JournalError>> {
        let path = self.files.get(self.next_file)?.clone();
        self.next_file += 1;
        self.line_no = 0;
        self.in_file = false;
        match File::open(&path).and_then(Source::open) {
            Ok(src) => {
                self.cur = Some((Arc::from(path.as_path()), src));
                Some(Ok(()))
            }
            Err(e) => Some(Err(self.err(&path, 0, None, Problem::Io(e.to_string())))),
        }
    }

    /// `first_in_file`: the file's line 1, or where `replay --json` joined the next file on;
    /// otherwise a header after records of the same file.
    fn header(
        &mut self,
        loc: Loc,
        header: Box<Header>,
        prev: Digest,
        hash: Digest,
        first_in_file: bool,
    ) -> Result<Entry, JournalError> {
        let e = |p| self.err(&loc.file, loc.line, None, p);
        // Past these checks every number read has a successor, so the `+ 1`s below cannot
        // overflow (inputs run through the journal_record fuzz target showed that they could).
        if header.file_no == u64::MAX {
            return Err(e(Problem::NumberTooLarge { field: "file_no" }));
        }
        if header.after_seq == Some(u64::MAX) {
            return Err(e(Problem::NumberTooLarge { field: "after_seq" }));
        }
        if first_in_file {
            if let Some(before) = self.last_file_no {
                if before.checked_add(1) != Some(header.file_no) {
                    return Err(e(Problem::FileGap {
                        expected: before.wrapping_add(1),
                        found: header.file_no,
                    }));
                }
            }
        } else {
            let file_no = self
                .last_file_no
                .expect("a file's first line is its header");
            if header.file_no != file_no {
                return Err(e(Problem::HeaderFileNo {
                    file: file_no,
                    found: header.file_no,
                }));
            }
            if header.start == Start::Rotate {
                return Err(e(Problem::OutOfOrder {
                    expected: "event or a process's header",
                    found: "rotation header",
                }));
            }
        }
        // The very first file of a journal chains from 64 zeros. When older files were
        // rotated away, the first file given is the anchor and its prev cannot be checked.
        let expected = match self.last {
            Some(last) => Some(last),
            None if header.file_no == 0 => Some(Digest::GENESIS),
            None => None,
        };
        if let Some(expected) = expected.filter(|x| *x != prev) {
            return Err(e(Problem::BrokenLink {
                expected,
                found: prev,
            }));
        }
        if header.config != header.state.config {
            return Err(e(Problem::ConfigMismatch));
        }
        match header.start {
            Start::Open => self.last_seq = None,
            // Steps were not journaled before it, by this process or (when the journal could
            // not be opened at its start) by a new one: the seq may jump either way. The
            // chain link above still proves no journaled record is missing.
            Start::Resume => self.last_seq = header.after_seq,
            Start::Rotate => {
                if self.last_file_no.is_some() && header.after_seq != self.last_seq {
                    let expected = self.last_seq.map_or(0, |s| s + 1);
                    let found = header.after_seq.map_or(0, |s| s + 1);
                    return Err(e(Problem::SeqGap { expected, found }));
                }
                self.last_seq = header.after_seq;
            }
        }
        self.last = Some(hash);
        self.last_file_no = Some(header.file_no);
        self.in_file = true;
        Ok(Entry::Header { loc, header })
    }
}

/// One reduce step, without where it was read: what a tool that looks at the daemon's
/// decisions wants of a journal.
#[derive(Debug)]
pub struct Step {
    pub envelope: Envelope,
    pub actions: Vec<Action>,
    pub reduce_us: Option<u64>,
}

impl Reader {
    /// Every file in `dir`, the directory a journal and its rotated files are in.
    pub fn open_dir(dir: &Path) -> Result<Reader, JournalError> {
        let listed = std::fs::read_dir(dir).map_err(|e| JournalError {
            file: dir.to_path_buf(),
            line: 0,
            seq: None,
            problem: Problem::Io(e.to_string()),
        })?;
        let files: Vec<PathBuf> = listed.flatten().map(|e| e.path()).collect();
        Reader::open(&files)
    }

    /// Only the steps, headers skipped; the first problem still ends the read.
    pub fn steps(self) -> impl Iterator<Item = Result<Step, JournalError>> {
        self.filter_map(|entry| match entry {
            Ok(Entry::Step {
                envelope,
                actions,
                reduce_us,
                ..
            }) => Some(Ok(Step {
                envelope,
                actions,
                reduce_us,
            })),
            Ok(Entry::Header { .. }) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

impl Iterator for Reader {
    type Item = Result<Entry, JournalError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let out = self.advance();
        if !matches!(out, Some(Ok(_))) {
            self.done = true;
        }
        out
    }
}

impl Reader {
    fn advance(&mut self) -> Option<Result<Entry, JournalError>> {
        loop {
            if self.cur.is_none() {
                if let Err(e) = self.open_next_file()? {
                    return Some(Err(e));
                }
            }
            let first_line = !self.in_file;
            let Some(next) = self.next_line() else {
                let (path, _) = self.cur.take().expect("a file is open");
                if first_line {
                    return Some(Err(self.err(&path, 0, None, Problem::EmptyFile)));
                }
                continue;
            };
            let (loc, line) = match next {
                Ok(v) => v,
                Err(e) => return Some(Err(e)),
            };
            match line.record {
                Record::Header(h) => {
                    let begins_file = first_line || self.concatenated_rotation(&h);
                    return Some(self.header(loc, h, line.prev, line.hash, begins_file));
                }
                _ if first_line => {
                    let found = kind(&line.record);
                    return Some(Err(self.out_of_order(&loc, "header", found)));
                }
                Record::Actions { seq, .. } => {
                    return Some(Err(self.err(
                        &loc.file,
                        loc.line,
                        Some(seq),
                        Problem::OutOfOrder {
                            expected: "event",
                            found: "actions",
                        },
                    )))
                }
                Record::Event(envelope) => {
                    self.last = Some(line.hash);
                    return Some(self.step(loc, envelope));
                }
            }
        }
    }

    /// `replay --json` writes a journal's files one after the other, so in plain lines a
    /// rotation header after records is where the next file began, and is checked as a
    /// file's first header is. The daemon never writes one there, and in frames it stays an
    /// error.
    fn concatenated_rotation(&self, h: &Header) -> bool {
        let lines = matches!(&self.cur, Some((_, src)) if src.form() == Form::Lines);
        lines && h.start == Start::Rotate
    }

    fn step(&mut self, loc: Loc, envelope: Envelope) -> Result<Entry, JournalError> {
        let seq = envelope.seq;
        if seq == u64::MAX {
            let p = Problem::NumberTooLarge { field: "seq" };
            return Err(self.err(&loc.file, loc.line, Some(seq), p));
        }
        if let Some(last) = self.last_seq {
            if seq != last + 1 {
                let p = Problem::SeqGap {
                    expected: last + 1,
                    found: seq,
                };
                return Err(self.err(&loc.file, loc.line, Some(seq), p));
            }
        }
        let (actions, reduce_us) = match self.next_line() {
            None => return Err(self.err(&loc.file, loc.line, Some(seq), Problem::MissingActions)),
            Some(Err(e)) => return Err(e),
            Some(Ok((aloc, line))) => match line.record {
                Record::Actions {
                    seq: a,
                    actions,
                    reduce_us,
                } if a == seq => {
                    self.last = Some(line.hash);
                    (actions, reduce_us)
                }
                Record::Actions { seq: a, .. } => {
                    let p = Problem::ActionsSeq {
                        event: seq,
                        found: a,
                    };
                    return Err(self.err(&aloc.file, aloc.line, Some(a), p));
                }
                other => {
                    let found = kind(&other);
                    return Err(self.out_of_order(&aloc, "actions", found));
                }
            },
        };
        self.last_seq = Some(seq);
        Ok(Entry::Step {
            loc,
            envelope,
            actions,
            reduce_us,
        })
    }

    fn out_of_order(&self, loc: &Loc, expected: &'static str, found: &'static str) -> JournalError {
        self.err(
            &loc.file,
            loc.line,
            None,
            Problem::OutOfOrder { expected, found },
        )
    }
}

fn kind(r: &Record) -> &'static str {
    match r {
        Record::Header(_) => "header",
        Record::Event(_) => "event",
        Record::Actions { .. } => "actions",
    }
}

/// The header's `file_no`, read to put files in order before they are checked. Only the
/// start of the file is read; a header that does not start as the writer writes it is left
/// to the full check, which will say what is wrong with it.
fn file_no_of(path: &Path) -> Result<u64, JournalError> {
    let err = |line, problem| JournalError {
        file: path.to_path_buf(),
        line,
        seq: None,
        problem,
    };
    let f = File::open(path).map_err(|e| err(0, Problem::Io(e.to_string())))?;
    let mut rd = BufReader::new(f);
    let framed = match rd.fill_buf() {
        Ok([]) => return Err(err(0, Problem::EmptyFile)),
        Ok(b) => frame::is_framed(b[0]),
        Err(e) => return Err(err(1, Problem::Io(e.to_string()))),
    };
    let start = if framed {
        frame::first_bytes(&mut rd, 128).unwrap_or_default()
    } else {
        let mut start = Vec::with_capacity(128);
        rd.take(128)
            .read_to_end(&mut start)
            .map_err(|e| err(1, Problem::Io(e.to_string())))?;
        start
    };
    Ok(record::header_prefix(&start).map_or(0, |(_, file_no)| file_no))
}

#[cfg(test)]
mod tests {
    use reconcilers::{Config, Event, State};

    use super::*;
    use crate::journal::record::{encode_actions, encode_event, encode_header, HeaderFields};

    /// One journal file: a header, then an event and its (empty) actions per seq.
    fn file(dir: &Path, file_no: u64, after_seq: Option<u64>, seqs: &[u64]) -> PathBuf {
        let config = Config::default();
        let state = State::new(config.clone());
        let fields = HeaderFields {
            file_no,
            created_at: 0,
            start: Start::Rotate,
            after_seq,
            config: &config,
            state: &state,
        };
        let mut out = Vec::new();
        let mut prev = encode_header(&mut out, &fields, &Digest::GENESIS).unwrap();
        for &seq in seqs {
            let env = Envelope {
                seq,
                at: 0,
                event: Event::PodRelistBegin,
            };
            prev = encode_event(&mut out, &env, &prev).unwrap();
            prev = encode_actions(&mut out, seq, &[], None, &prev).unwrap();
        }
        let path = dir.join(format!("events-{file_no}.journal"));
        std::fs::write(&path, frame::frame_lines(&out).unwrap()).unwrap();
        path
    }

    fn first_problem(paths: &[PathBuf]) -> Problem {
        let mut reader = Reader::open(paths).unwrap();
        reader.find_map(Result::err).expect("a problem").problem
    }

    /// Found with the journal_record fuzz target: `last + 1` on a seq of u64::MAX overflowed
    /// (a panic in debug builds, a wrapped seq accepted in release). Such a number is refused
    /// where it is read.
    #[test]
    fn a_seq_of_u64_max_is_refused_not_overflowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), 0, None, &[u64::MAX, 0]);
        let field = "seq";
        assert_eq!(first_problem(&[path]), Problem::NumberTooLarge { field });
    }

    /// The same for a header's `file_no` (the next file's `before + 1`) and `after_seq`.
    #[test]
    fn a_header_number_of_u64_max_is_refused_not_overflowed() {
        let dir = tempfile::tempdir().unwrap();
        let last = file(dir.path(), u64::MAX, None, &[]);
        let field = "file_no";
        assert_eq!(first_problem(&[last]), Problem::NumberTooLarge { field });
        let after = file(dir.path(), 3, Some(u64::MAX), &[]);
        let field = "after_seq";
        assert_eq!(first_problem(&[after]), Problem::NumberTooLarge { field });
    }
}
