//! Appending to the journal, and rotation by size and age.
//!
//! The loop owns one `Journal` while journaling works (`runtime::evidence` decides what
//! happens when it does not). For every envelope it reduces it calls [`Journal::record`]
//! *before* it executes the actions, then [`Journal::rotate_if_needed`] with the state the
//! reduce left, so a new file's header holds exactly the state its first event meets.
//!
//! Each `record` is one `write(2)` of one frame holding two lines (event + actions; see
//! [`super::frame`]). There is no fsync per
//! record: the journal explains a run, it is not the source of truth (the cluster and cocoon
//! are), so a power cut may lose the tail; a crash of the process loses nothing written.
//!
//! A file begins when the current one reaches its size or its age. A process that starts (or
//! journals again after losing records) appends its header to the current file when that file
//! is of this format, its last record verifies and it has room and time left; otherwise the
//! file is rotated away and a new one begun.
//! So a daemon restarting in a loop adds a header per start instead of pushing the older
//! files, and the evidence of why it restarts, out of the kept set.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use reconcilers::time::Millis;
use reconcilers::{Action, Config, Envelope, State};

use super::digest::Digest;
use super::files::rotated_path;
use super::frame::{self, Compressor, FrameError};
use super::record::{self, HeaderFields, Record, Start, FORMAT_VERSION};

/// The journal holds pod specs, annotations and error texts: readable by root alone.
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

/// Where and how much (from `VK_JOURNAL_PATH`, `VK_JOURNAL_MAX_BYTES`, `VK_JOURNAL_MAX_AGE`,
/// `VK_JOURNAL_FILES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSettings {
    /// The file being written; rotated files are `<path>.1` (newest) … `<path>.<files-1>`.
    pub path: PathBuf,
    /// A file is rotated once it holds at least this many bytes.
    pub max_bytes: u64,
    /// A file is rotated once its first record is this old (by the records' own times), so a
    /// quiet node keeps one file per period and `files` of them reach that far back.
    pub max_age_ms: Millis,
    /// Files kept, the current one included (≥ 1).
    pub files: u32,
}

pub struct Journal {
    settings: JournalSettings,
    config: Config,
    file: File,
    /// Bytes in the current file.
    bytes: u64,
    /// When the current file's first header was written.
    file_started: Millis,
    /// Records written to the current file after its last header.
    records: u64,
    file_no: u64,
    last: Digest,
    last_seq: Option<u64>,
    last_at: Millis,
    /// Reused for every record so the hot path does not allocate: the lines, then their frame.
    buf: Vec<u8>,
    framed: Vec<u8>,
    zstd: Compressor,
    /// Set after a failed write: nothing more is appended through this value; its owner
    /// attaches a new one, which checks the file's end again.
    broken: Option<String>,
}

impl Journal {
    /// Journals a process from its start (its header says `"start":"open"`), chained to the
    /// last record of the previous run when there is one.
    pub fn open(settings: &JournalSettings, config: &Config, state: &State) -> Result<Journal> {
        Self::open_at(settings, config, state, wall_clock_ms())
    }

    /// [`Journal::open`] with the header's `created_at` given (tests, generated journals).
    pub fn open_at(
        settings: &JournalSettings,
        config: &Config,
        state: &State,
        created_at: Millis,
    ) -> Result<Journal> {
        Self::attach(settings, config, state, Start::Open, None, created_at)
    }

    /// [`Journal::resume_at`] at the wall clock's time.
    pub fn resume(
        settings: &JournalSettings,
        config: &Config,
        state: &State,
        after_seq: Option<u64>,
    ) -> Result<Journal> {
        Self::resume_at(settings, config, state, after_seq, wall_clock_ms())
    }

    /// Journals again after steps were not journaled (a failed write, or a journal that
    /// could not be opened): the header says `"start":"resume"`, carries the loop's `state`
    /// as it is now and `after_seq`, the seq of the last event reduced, so the next event
    /// replays from it.
    pub fn resume_at(
        settings: &JournalSettings,
        config: &Config,
        state: &State,
        after_seq: Option<u64>,
        created_at: Millis,
    ) -> Result<Journal> {
        Self::attach(
            settings,
            config,
            state,
            Start::Resume,
            after_seq,
            created_at,
        )
    }

    fn attach(
        settings: &JournalSettings,
        config: &Config,
        state: &State,
        start: Start,
        after_seq: Option<u64>,
        created_at: Millis,
    ) -> Result<Journal> {
        if settings.files == 0 {
            bail!("the journal needs at least one file (VK_JOURNAL_FILES ≥ 1)");
        }
        let path = &settings.path;
        ensure_dir(path)?;
        tighten_modes(settings);
        let oldest_start = created_at.saturating_sub(settings.max_age_ms);
        let (file, file_no, prev, bytes, file_started) =
            match current_file(path, settings.max_bytes, oldest_start)? {
                Current::Append { tail, len } => {
                    (append(path)?, tail.file_no, tail.hash, len, tail.started)
                }
                Current::Retire { tail } => {
                    shift_files(settings)?;
                    let (file_no, prev) = next_file_after(tail);
                    (create(path)?, file_no, prev, 0, created_at)
                }
                Current::Absent => {
                    let before = previous_tail(&rotated_path(path, 1))?;
                    let (file_no, prev) = next_file_after(before);
                    (create(path)?, file_no, prev, 0, created_at)
                }
            };
        let mut j = Journal {
            settings: settings.clone(),
            config: config.clone(),
            file,
            bytes,
            file_started,
            records: 0,
            file_no,
            last: prev,
            last_seq: after_seq,
            last_at: created_at,
            buf: Vec::with_capacity(64 * 1024),
            framed: Vec::with_capacity(16 * 1024),
            zstd: Compressor::new().context("journal: cannot set up zstd")?,
            broken: None,
        };
        j.write_header(start, state, created_at)?;
        Ok(j)
    }
    /// Writes the event and the actions it produced, and returns once both lines are handed
    /// to the kernel. Seqs must be consecutive within a process.
    pub fn record(&mut self, envelope: &Envelope, actions: &[Action]) -> Result<()> {
        self.record_step(envelope, actions, None)
    }

    /// [`Journal::record`] with the microseconds the reduce took, which the daemon records
    /// so a pod's wait can be split into the daemon's share and the rest.
    pub fn record_timed(
        &mut self,
        envelope: &Envelope,
        actions: &[Action],
        reduce_us: u64,
    ) -> Result<()> {
        self.record_step(envelope, actions, Some(reduce_us))
    }

    fn record_step(
        &mut self,
        envelope: &Envelope,
        actions: &[Action],
        reduce_us: Option<u64>,
    ) -> Result<()> {
        if let Some(why) = &self.broken {
            bail!("the journal stopped after an earlier write error: {why}");
        }
        if let Some(last) = self.last_seq {
            if envelope.seq != last + 1 {
                bail!(
                    "journal: event seq {} does not follow seq {last}; the loop must number \
                     every envelope it reduces consecutively",
                    envelope.seq
                );
            }
        }
        self.buf.clear();
        let ev = record::encode_event(&mut self.buf, envelope, &self.last)
            .context("journal: cannot serialize the event")?;
        let acts = record::encode_actions(&mut self.buf, envelope.seq, actions, reduce_us, &ev)
            .context("journal: cannot serialize the actions")?;
        self.write_buf(false)?;
        self.last = acts;
        self.last_seq = Some(envelope.seq);
        self.last_at = envelope.at;
        self.records += 2;
        Ok(())
    }

    /// Starts the next file when the current one is full or old. `state` must be the state
    /// after the last recorded envelope was reduced: it becomes the new file's starting point.
    pub fn rotate_if_needed(&mut self, state: &State) -> Result<bool> {
        let full = self.bytes >= self.settings.max_bytes;
        let old = self.last_at.saturating_sub(self.file_started) >= self.settings.max_age_ms;
        // A file holding only its header is never rotated, or a state larger than the limit
        // would rotate forever.
        if !(full || old) || self.records == 0 || self.broken.is_some() {
            return Ok(false);
        }
        self.file.sync_data().ok();
        shift_files(&self.settings)?;
        self.file = create(&self.settings.path)?;
        (self.file_no, self.last) = match self.file_no.checked_add(1) {
            Some(next) => (next, self.last),
            None => (0, Digest::GENESIS),
        };
        self.bytes = 0;
        self.records = 0;
        self.file_started = self.last_at;
        self.write_header(Start::Rotate, state, self.last_at)?;
        Ok(true)
    }

    pub fn path(&self) -> &Path {
        &self.settings.path
    }

    /// The hash the next record will chain from.
    pub fn last_hash(&self) -> Digest {
        self.last
    }

    pub fn file_no(&self) -> u64 {
        self.file_no
    }

    fn write_header(&mut self, start: Start, state: &State, created_at: Millis) -> Result<()> {
        self.buf.clear();
        let fields = HeaderFields {
            file_no: self.file_no,
            created_at,
            start,
            after_seq: self.last_seq,
            config: &self.config,
            state,
        };
        let h = record::encode_header(&mut self.buf, &fields, &self.last)
            .context("journal: cannot serialize the state snapshot for the file header")?;
        self.write_buf(true)?;
        self.last = h;
        Ok(())
    }

    /// Writes the lines in `buf` as one frame; a header starts a new stream (`segment`), so
    /// each run in a file decodes on its own.
    fn write_buf(&mut self, segment: bool) -> Result<()> {
        self.framed.clear();
        if let Err(e) = self.zstd.frame(&self.buf, segment, &mut self.framed) {
            // The stream may hold part of these lines: nothing more goes through it.
            self.broken = Some(format!("zstd: {e}"));
            bail!("journal: cannot compress a record: {e}");
        }
        if let Err(e) = self.file.write_all(&self.framed) {
            let why = format!("write to {}: {e}", self.settings.path.display());
            // A short write leaves half a line; cut it so the file still ends on a whole
            // record and can be continued once writes work again. If even that fails, the
            // next attach finds the torn line and cuts it (`previous_tail`).
            let _ = self.file.set_len(self.bytes);
            self.broken = Some(why.clone());
            bail!("journal: {why}");
        }
        self.bytes += self.framed.len() as u64;
        Ok(())
    }

    /// Replaces the file handle (tests: a handle whose writes fail, as on a full disk).
    #[cfg(test)]
    pub(crate) fn swap_file_for_test(&mut self, file: File) {
        self.file = file;
    }
}

/// Creates the journal's directory, for root alone, when it does not exist. An existing
/// directory is left as the operator made it.
fn ensure_dir(path: &Path) -> Result<()> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .with_context(|| {
            format!(
                "cannot create the journal directory {}; make it writable, point \
                 VK_JOURNAL_PATH elsewhere, or set VK_JOURNAL_PATH= (empty) to disable the journal",
                dir.display()
            )
        })
}

/// Files an older build left group- or world-readable are narrowed to the owner.
fn tighten_modes(s: &JournalSettings) {
    for k in 0..s.files as u64 {
        let p = rotated_path(&s.path, k);
        let Ok(meta) = fs::metadata(&p) else { continue };
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            if let Err(e) = fs::set_permissions(&p, fs::Permissions::from_mode(FILE_MODE)) {
                tracing::warn!(file = %p.display(), error = %e, "cannot narrow the journal file's mode to 0600");
            }
        }
    }
}

fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
        .with_context(|| format!("cannot create the journal file {}", path.display()))
}

fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the journal file {} to append", path.display()))
}

/// `<path>` becomes `<path>.1`, `.1` becomes `.2`, …; the oldest beyond `files` is deleted.
fn shift_files(s: &JournalSettings) -> Result<()> {
    let oldest = rotated_path(&s.path, s.files as u64 - 1);
    match fs::remove_file(&oldest) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", oldest.display())),
    }
    for k in (0..s.files as u64 - 1).rev() {
        let from = rotated_path(&s.path, k);
        let to = rotated_path(&s.path, k + 1);
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot rotate {} to {}", from.display(), to.display())
                })
            }
        }
    }
    Ok(())
}

/// The end of an existing journal file.
struct Tail {
    hash: Digest,
    file_no: u64,
    /// The file's first header is of this build's format, and its last record decodes and
    /// hashes to the hash it carries: a new header may follow it.
    continuable: bool,
    /// The `created_at` of the file's first header (0 when unknown).
    started: Millis,
}

/// What to do with the file at the journal's path.
enum Current {
    /// Missing or empty: begin it.
    Absent,
    /// Append to it: it has room, and its end verifies.
    Append { tail: Tail, len: u64 },
    /// Rotate it away and begin a new file, chained to its end when that is readable.
    Retire { tail: Option<Tail> },
}

/// `oldest_start`: a file whose first header is older than this is rotated away.
fn current_file(path: &Path, max_bytes: u64, oldest_start: Millis) -> Result<Current> {
    let Some(tail) = previous_tail(path)? else {
        let present = fs::metadata(path).map(|m| m.len() > 0).unwrap_or(false);
        return Ok(if present {
            Current::Retire { tail: None }
        } else {
            Current::Absent
        });
    };
    // After `previous_tail` cut any torn record, so this is the length appending starts at.
    let len = fs::metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    if !tail.continuable {
        tracing::info!(file = %path.display(), "the current journal file is of another format or its end does not verify; starting a new file");
        return Ok(Current::Retire { tail: Some(tail) });
    }
    if len >= max_bytes || tail.started < oldest_start {
        return Ok(Current::Retire { tail: Some(tail) });
    }
    Ok(Current::Append { tail, len })
}

/// The number and chain start of a new file following `tail`. A number with no successor
/// (a damaged or hostile header) cannot be continued: a new chain starts.
fn next_file_after(tail: Option<Tail>) -> (u64, Digest) {
    match tail.and_then(|t| Some((t.file_no.checked_add(1)?, t.hash))) {
        Some(next) => next,
        None => (0, Digest::GENESIS),
    }
}

/// A previous file numbered this or higher is not continued. The number is the previous
/// process's text, and fuzzing found `file_no + 1` overflowing on u64::MAX, then a new file
/// numbered u64::MAX, which the reader refuses. No journal rotates 2^63 times, and the
/// headroom keeps this writer's numbers, rotations included, below u64::MAX.
const LAST_CONTINUED_FILE_NO: u64 = 1 << 63;

/// The chain end of an existing journal file, so a new process continues the chain. A tail
/// the previous process left mid-write (no newline, or an event without its actions) is cut
/// off: `record` had not returned, so those actions never ran.
fn previous_tail(path: &Path) -> Result<Option<Tail>> {
    let mut f = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot open {}", path.display()));
        }
    };
    if f.metadata()?.len() == 0 {
        return Ok(None);
    }
    let mut first = [0u8; 1];
    f.read_exact(&mut first)?;
    let framed = frame::is_framed(first[0]);
    // The header's fixed start: its version, number and (framed) creation time.
    f.seek(SeekFrom::Start(0))?;
    let start = if framed {
        frame::first_bytes(&mut io::BufReader::new(&mut f), 256)
    } else {
        let mut start = Vec::with_capacity(256);
        (&mut f).take(256).read_to_end(&mut start)?;
        Some(start)
    };
    let Some((version, file_no)) = start.as_deref().and_then(record::header_prefix) else {
        tracing::warn!(
            file = %path.display(),
            "the previous journal file has no readable header; the new file starts a new chain"
        );
        return Ok(None);
    };
    if file_no >= LAST_CONTINUED_FILE_NO {
        tracing::warn!(
            file = %path.display(),
            file_no,
            "the previous journal file claims a file number no journal reaches; the new file starts a new chain"
        );
        return Ok(None);
    }
    if framed {
        let started = start
            .as_deref()
            .and_then(record::header_created_at)
            .unwrap_or(0);
        return framed_tail(path, &mut f, version, file_no, started);
    }
    let mut len = f.metadata()?.len();
    loop {
        let Some((line_start, line)) = last_line(&mut f, len)? else {
            return Ok(None);
        };
        let complete = line.ends_with(b"\n");
        let is_event = line.starts_with(b"{\"kind\":\"event\"");
        let hash = hash_of_line(&line);
        if complete && !is_event {
            if let Some(hash) = hash {
                // Files of plain lines are read, never continued: appending frames would
                // mix the two forms in one file. That holds for version 6 lines too (a
                // `replay --json` export put where the journal goes).
                return Ok(Some(Tail {
                    hash,
                    file_no,
                    continuable: false,
                    started: 0,
                }));
            }
            tracing::warn!(file = %path.display(), "the previous journal file ends in an unreadable record; the new file starts a new chain");
            return Ok(None);
        }
        tracing::warn!(
            file = %path.display(),
            bytes = len - line_start,
            "cutting an unfinished record off the end of the previous journal file"
        );
        f.set_len(line_start)?;
        len = line_start;
    }
}

/// The end of a file of frames: a frame its writer did not finish is cut off; the last line of
/// the last frame is the tail.
fn framed_tail(
    path: &Path,
    f: &mut File,
    version: u32,
    file_no: u64,
    started: Millis,
) -> Result<Option<Tail>> {
    // Find where the last run's stream starts and where the last whole frame ends.
    f.seek(SeekFrom::Start(0))?;
    let mut rd = io::BufReader::with_capacity(1 << 20, &mut *f);
    let mut payload = Vec::new();
    let (mut end, mut last_segment) = (0u64, None);
    let torn = loop {
        match frame::read_frame(&mut rd, &mut payload) {
            Ok(None) => break false,
            Ok(Some(tag)) => {
                if tag == frame::SEGMENT {
                    last_segment = Some(end);
                }
                end += (frame::HEAD_LEN + payload.len()) as u64;
            }
            Err(FrameError::Torn) => break true,
            Err(FrameError::Io(e)) => {
                return Err(e).with_context(|| format!("cannot read {}", path.display()))
            }
            Err(FrameError::Corrupt(why)) => bail!("{}: {why}", path.display()),
        }
    };
    drop(rd);
    if torn {
        let len = f.metadata()?.len();
        tracing::warn!(
            file = %path.display(),
            bytes = len - end,
            "cutting an unfinished record off the end of the previous journal file"
        );
        f.set_len(end)?;
    }
    let unreadable = |why: String| -> Result<Option<Tail>> {
        tracing::warn!(file = %path.display(), %why, "the previous journal file ends in an unreadable record; the new file starts a new chain");
        Ok(None)
    };
    let Some(from) = last_segment else {
        return unreadable("no frame starts a stream".into());
    };
    f.seek(SeekFrom::Start(from))?;
    let rd = io::BufReader::with_capacity(1 << 20, &mut *f).take(end - from);
    let mut frames = frame::FrameReader::new(rd)?;
    // The lines of the last frame that decompressed; a damaged frame after it leaves the file
    // not continuable, but the chain can still run on from the last record that was read.
    let (mut lines, mut next) = (Vec::new(), Vec::new());
    let damaged = loop {
        next.clear();
        match frames.next_frame(&mut next) {
            Ok(true) => std::mem::swap(&mut lines, &mut next),
            Ok(false) => break false,
            Err(_) => break true,
        }
    };
    if damaged {
        tracing::info!(file = %path.display(), "a frame at the end of the previous journal file does not decompress; starting a new file");
    }
    let body = lines.strip_suffix(b"\n").unwrap_or(&lines);
    let last = match body.iter().rposition(|&c| c == b'\n') {
        Some(nl) => &lines[nl + 1..],
        None => &lines[..],
    };
    let Some(hash) = hash_of_line(last) else {
        return unreadable("its last line has no hash".into());
    };
    Ok(Some(Tail {
        hash,
        file_no,
        continuable: !damaged && version == FORMAT_VERSION && verifies(last, hash),
        started,
    }))
}

/// The last record decodes as this format's header or actions and hashes to `hash`.
fn verifies(line: &[u8], hash: Digest) -> bool {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    match record::decode(body) {
        Ok(l) => {
            l.hash == hash
                && l.computed == hash
                && matches!(l.record, Record::Header(_) | Record::Actions { .. })
        }
        Err(_) => false,
    }
}

/// The last line of the first `len` bytes (with its newline if it has one) and where it starts.
fn last_line(f: &mut File, len: u64) -> io::Result<Option<(u64, Vec<u8>)>> {
    if len == 0 {
        return Ok(None);
    }
    // Read backwards in chunks until the newline that ends the line before the last one.
    let mut tail: Vec<u8> = Vec::new();
    let mut pos = len;
    loop {
        let step = pos.min(64 * 1024);
        pos -= step;
        let mut chunk = vec![0u8; step as usize];
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        // Skip the final newline itself: it ends the last line.
        let search = &tail[..tail.len() - usize::from(tail.ends_with(b"\n"))];
        if let Some(nl) = search.iter().rposition(|&c| c == b'\n') {
            let start = pos + nl as u64 + 1;
            return Ok(Some((start, tail[nl + 1..].to_vec())));
        }
        if pos == 0 {
            return Ok(Some((0, tail)));
        }
    }
}

fn hash_of_line(line: &[u8]) -> Option<Digest> {
    // …,"hash":"<64 hex>"}\n
    let body = line.strip_suffix(b"\"}\n")?;
    let hex = body.get(body.len().checked_sub(64)?..)?;
    let before = &body[..body.len() - 64];
    if !before.ends_with(b",\"hash\":\"") {
        return None;
    }
    Digest::parse(std::str::from_utf8(hex).ok()?)
}

fn wall_clock_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_after(file_no: u64) -> (u64, String) {
        let dir = tempfile::tempdir().unwrap();
        let settings = JournalSettings {
            path: dir.path().join("events.journal"),
            max_bytes: 1 << 20,
            max_age_ms: i64::MAX,
            files: 2,
        };
        let last = format!(
            "{{\"kind\":\"header\",\"version\":4,\"file_no\":{file_no},\"hash\":\"{}\"}}\n",
            "a".repeat(64)
        );
        fs::write(&settings.path, last).unwrap();
        let config = Config::default();
        let j = Journal::open_at(&settings, &config, &State::new(config.clone()), 0).unwrap();
        let bytes = fs::read(&settings.path).unwrap();
        let text = frame::lines_of_file(&bytes).unwrap();
        (j.file_no(), String::from_utf8(text).unwrap())
    }

    /// The daemon's reduce time travels with the step and comes back from the reader; a
    /// generated journal has none.
    #[test]
    fn a_step_carries_its_reduce_time_when_it_was_measured() {
        use crate::journal::{Entry, Reader};
        let dir = tempfile::tempdir().unwrap();
        let settings = JournalSettings {
            path: dir.path().join("events.journal"),
            max_bytes: 1 << 20,
            max_age_ms: i64::MAX,
            files: 2,
        };
        let config = Config::default();
        let mut j = Journal::open_at(&settings, &config, &State::new(config.clone()), 0).unwrap();
        let env = |seq| Envelope {
            seq,
            at: 0,
            event: reconcilers::Event::PodRelistBegin,
        };
        j.record_timed(&env(1), &[], 37).unwrap();
        j.record(&env(2), &[]).unwrap();
        drop(j);
        let got: Vec<Option<u64>> = Reader::open(std::slice::from_ref(&settings.path))
            .unwrap()
            .filter_map(|e| match e.unwrap() {
                Entry::Step { reduce_us, .. } => Some(reduce_us),
                Entry::Header { .. } => None,
            })
            .collect();
        assert_eq!(got, vec![Some(37), None]);
    }

    /// A `replay --json` export is plain lines of this version; where the journal goes, it is
    /// read and its chain continued in a new file, never appended to with frames.
    #[test]
    fn a_file_of_plain_lines_of_this_version_is_not_appended_to() {
        use crate::journal::{Entry, Reader};
        let dir = tempfile::tempdir().unwrap();
        let settings = JournalSettings {
            path: dir.path().join("events.journal"),
            max_bytes: 1 << 20,
            max_age_ms: i64::MAX,
            files: 3,
        };
        let config = Config::default();
        let state = State::new(config.clone());
        let env = Envelope {
            seq: 1,
            at: 0,
            event: reconcilers::Event::PodRelistBegin,
        };
        let mut j = Journal::open_at(&settings, &config, &state, 0).unwrap();
        j.record(&env, &[]).unwrap();
        drop(j);
        let plain = frame::lines_of_file(&fs::read(&settings.path).unwrap()).unwrap();
        fs::write(&settings.path, &plain).unwrap();

        let j = Journal::open_at(&settings, &config, &state, 0).unwrap();
        assert_eq!(j.file_no(), 1);
        drop(j);
        let kept = rotated_path(&settings.path, 1);
        assert_eq!(fs::read(&kept).unwrap(), plain);
        let new = fs::read(&settings.path).unwrap();
        assert!(frame::is_framed(new[0]));
        // The plain file and the framed one after it read as one chain.
        let starts: Vec<Start> = Reader::open(&[kept, settings.path.clone()])
            .unwrap()
            .filter_map(|e| match e.unwrap() {
                Entry::Header { header, .. } => Some(header.start),
                Entry::Step { .. } => None,
            })
            .collect();
        assert_eq!(starts, [Start::Open, Start::Open]);
    }

    /// A previous file numbered u64::MAX overflowed `file_no + 1` (a panic in debug builds);
    /// one numbered u64::MAX − 1 gave a new file numbered u64::MAX, which the reader refuses.
    /// Numbers from 2^63 on start a new chain; below, the chain continues.
    #[test]
    fn a_previous_file_numbered_near_u64_max_starts_a_new_chain() {
        let genesis = format!("\"prev\":\"{}\"", Digest::GENESIS);
        for huge in [u64::MAX, u64::MAX - 1, LAST_CONTINUED_FILE_NO] {
            let (file_no, header) = open_after(huge);
            assert_eq!(file_no, 0, "after {huge}");
            assert!(header.contains(&genesis), "after {huge}: {header}");
        }
        let (file_no, header) = open_after(LAST_CONTINUED_FILE_NO - 1);
        assert_eq!(file_no, LAST_CONTINUED_FILE_NO);
        assert!(!header.contains(&genesis), "{header}");
    }
}
