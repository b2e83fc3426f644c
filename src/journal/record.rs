//! The three kinds of journal line and their exact bytes.
//!
//! Every line is one JSON object whose first member is `"kind"` and whose last two members are
//! `"prev"` and `"hash"`:
//!
//! ```text
//! {"kind":"header","version":5,"file_no":0,…,"state":{…},"prev":"000…","hash":"9f2…"}
//! {"kind":"event","seq":1,"at":1777622400000,"event":{…},"prev":"9f2…","hash":"41c…"}
//! {"kind":"actions","seq":1,"actions":[…],"prev":"41c…","hash":"d07…"}
//! ```
//!
//! `hash` = sha256(prev ‖ body) in lowercase hex, where `prev` is the 64 hex digits of the
//! previous record's hash and `body` is the line exactly as written with its final
//! `,"hash":"…"` member removed (so it ends in `"prev":"…"}`). Hashing the written bytes,
//! not a re-serialization, means any change to any byte of a record is caught, and another
//! tool can check a journal with nothing but sha256 and string slicing.

use serde::{Deserialize, Serialize};

use reconcilers::time::Millis;
use reconcilers::{Action, Config, Envelope, Event, State};

use super::digest::Digest;
use super::problem::Problem;

/// Bumped on any change an older reader could misread. 5: a file may hold several runs
/// (a header after records), and a header may start with `resume`. 6: the lines are stored
/// in zstd frames ([`super::frame`]); files of version 5 are plain lines and still read, and so
/// are version 6 lines written out plain ([`Form::versions`]).
pub const FORMAT_VERSION: u32 = 6;

/// The line format's last version, read by this build and never written.
pub const LINES_VERSION: u32 = 5;

/// How a file stores its lines, which decides the header versions it may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Each record is a line of the file.
    Lines,
    /// The lines are compressed in zstd frames ([`super::frame`]).
    Frames,
}

impl Form {
    pub const ALL: [Form; 2] = [Form::Frames, Form::Lines];

    /// Some form holds `version`: this build reads it at all.
    pub fn known(version: u32) -> bool {
        Form::ALL.iter().any(|f| f.versions().contains(&version))
    }

    /// The header versions a file of this form may hold. Version 6 changed how lines are
    /// stored, not the lines, so its records written out as plain lines (`replay --json`)
    /// are a journal too: reading them as they are, rather than re-encoding the export as
    /// version 5, keeps its bytes, hashes and line numbers those of the journal it came
    /// from. Frames were never written around version 5 lines.
    pub fn versions(self) -> &'static [u32] {
        match self {
            Form::Lines => &[LINES_VERSION, FORMAT_VERSION],
            Form::Frames => &[FORMAT_VERSION],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Form::Lines => "plain JSON lines",
            Form::Frames => "zstd frames",
        }
    }
}

/// `,"hash":"` + 64 digits + `"}`: the fixed-size end of every line.
const HASH_SUFFIX_LEN: usize = 9 + 64 + 2;

/// Why a header is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// A process starts; its State is fresh. First in a file, or appended to the current one.
    Open,
    /// The file before this one reached its size; the State is the one it ended with. Always
    /// the first line of a file.
    Rotate,
    /// The process journals again after steps that were not journaled (a write failed, or
    /// the journal could not be opened); the State is the loop's at that moment, `after_seq`
    /// the last event it had reduced. First in a file, or appended to the current one.
    Resume,
}

/// The first line of every file, and of every run inside one: enough to replay what follows
/// on its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub version: u32,
    /// Counts files over the journal's whole life; rotation renames files, this never changes.
    /// Every header in one file carries the file's number.
    pub file_no: u64,
    pub node: String,
    pub created_at: Millis,
    /// `vk-cocoon <version>` of the process that wrote the file.
    pub writer: String,
    pub start: Start,
    /// Seq of the last event reduced before this header: a rotation or a resume continues
    /// from it. `None` for a process start.
    pub after_seq: Option<u64>,
    pub config: Config,
    pub state: State,
}

/// What a line holds once decoded.
// `Event` is large and is every other line; boxing it would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Record {
    Header(Box<Header>),
    Event(Envelope),
    Actions {
        seq: u64,
        actions: Vec<Action>,
        /// Microseconds the daemon spent reducing the event (absent in generated journals):
        /// its own share of a pod's wait, which the millisecond `at` cannot show.
        reduce_us: Option<u64>,
    },
}

impl Record {
    pub fn seq(&self) -> Option<u64> {
        match self {
            Record::Header(_) => None,
            Record::Event(e) => Some(e.seq),
            Record::Actions { seq, .. } => Some(*seq),
        }
    }
}

/// One line, decoded, with its chain fields.
#[derive(Debug)]
pub struct Line {
    pub record: Record,
    pub prev: Digest,
    pub hash: Digest,
    /// sha256(prev ‖ body) computed from the bytes read; equal to `hash` when intact.
    pub computed: Digest,
}

#[derive(Serialize)]
struct HeaderOut<'a> {
    kind: &'static str,
    version: u32,
    file_no: u64,
    node: &'a str,
    created_at: Millis,
    writer: &'a str,
    start: Start,
    after_seq: Option<u64>,
    config: &'a Config,
    state: &'a State,
    prev: &'a str,
}

#[derive(Serialize)]
struct EventOut<'a> {
    kind: &'static str,
    seq: u64,
    at: Millis,
    event: &'a Event,
    prev: &'a str,
}

#[derive(Serialize)]
struct ActionsOut<'a> {
    kind: &'static str,
    seq: u64,
    actions: &'a [Action],
    #[serde(skip_serializing_if = "Option::is_none")]
    reduce_us: Option<u64>,
    prev: &'a str,
}

// No `#[serde(flatten)]`: it buffers the value and then cannot read State's integer map keys.
#[derive(Deserialize)]
struct HeaderIn {
    version: u32,
    file_no: u64,
    node: String,
    created_at: Millis,
    writer: String,
    start: Start,
    after_seq: Option<u64>,
    config: Config,
    state: State,
    prev: String,
}

#[derive(Deserialize)]
struct EventIn {
    seq: u64,
    at: Millis,
    event: Event,
    prev: String,
}

#[derive(Deserialize)]
struct ActionsIn {
    seq: u64,
    actions: Vec<Action>,
    #[serde(default)]
    reduce_us: Option<u64>,
    prev: String,
}

/// The header fields a writer supplies; `state` is borrowed so a snapshot costs no clone.
pub struct HeaderFields<'a> {
    pub file_no: u64,
    pub created_at: Millis,
    pub start: Start,
    pub after_seq: Option<u64>,
    pub config: &'a Config,
    pub state: &'a State,
}

pub fn encode_header(
    out: &mut Vec<u8>,
    h: &HeaderFields<'_>,
    prev: &Digest,
) -> serde_json::Result<Digest> {
    let writer = format!("vk-cocoon {}", crate::version::VERSION);
    let prev_hex = prev.hex();
    let body = HeaderOut {
        kind: "header",
        version: FORMAT_VERSION,
        file_no: h.file_no,
        node: &h.config.node_name,
        created_at: h.created_at,
        writer: &writer,
        start: h.start,
        after_seq: h.after_seq,
        config: h.config,
        state: h.state,
        prev: prev_hex.as_str(),
    };
    encode(out, &body, prev)
}

pub fn encode_event(out: &mut Vec<u8>, e: &Envelope, prev: &Digest) -> serde_json::Result<Digest> {
    let prev_hex = prev.hex();
    let body = EventOut {
        kind: "event",
        seq: e.seq,
        at: e.at,
        event: &e.event,
        prev: prev_hex.as_str(),
    };
    encode(out, &body, prev)
}

pub fn encode_actions(
    out: &mut Vec<u8>,
    seq: u64,
    actions: &[Action],
    reduce_us: Option<u64>,
    prev: &Digest,
) -> serde_json::Result<Digest> {
    let prev_hex = prev.hex();
    let body = ActionsOut {
        kind: "actions",
        seq,
        actions,
        reduce_us,
        prev: prev_hex.as_str(),
    };
    encode(out, &body, prev)
}

/// Appends one complete line (with its newline) to `out` and returns its hash. On error
/// `out` is left as it was.
fn encode(out: &mut Vec<u8>, body: &impl Serialize, prev: &Digest) -> serde_json::Result<Digest> {
    let start = out.len();
    if let Err(e) = serde_json::to_writer(&mut *out, body) {
        out.truncate(start);
        return Err(e);
    }
    let hash = Digest::chain(prev, &out[start..], b"");
    // The body ends in `}`; the hash goes in as the last member.
    out.pop();
    out.extend_from_slice(b",\"hash\":\"");
    out.extend_from_slice(hash.hex().as_str().as_bytes());
    out.extend_from_slice(b"\"}\n");
    Ok(hash)
}

/// Decodes one line (without its newline) and recomputes its hash from the bytes.
pub fn decode(line: &[u8]) -> Result<Line, Problem> {
    let (head, hash) = split_line(line)?;
    let kind = kind_of(line)?;
    let bad_json = |e: serde_json::Error| Problem::BadJson(e.to_string());
    let (record, prev) = match kind {
        "header" => {
            // The version first: a newer header may not parse as this version's fields.
            let version = match header_prefix(line) {
                Some((v, _)) => v,
                None => {
                    #[derive(Deserialize)]
                    struct VersionOnly {
                        version: u32,
                    }
                    let v: VersionOnly = serde_json::from_slice(line).map_err(bad_json)?;
                    v.version
                }
            };
            if !Form::known(version) {
                // The reader, which knows the file's form, names it.
                let form = None;
                return Err(Problem::UnsupportedVersion { version, form });
            }
            let h: HeaderIn = serde_json::from_slice(line).map_err(bad_json)?;
            let header = Header {
                version: h.version,
                file_no: h.file_no,
                node: h.node,
                created_at: h.created_at,
                writer: h.writer,
                start: h.start,
                after_seq: h.after_seq,
                config: h.config,
                state: h.state,
            };
            (Record::Header(Box::new(header)), h.prev)
        }
        "event" => {
            let e: EventIn = serde_json::from_slice(line).map_err(bad_json)?;
            let env = Envelope {
                seq: e.seq,
                at: e.at,
                event: e.event,
            };
            (Record::Event(env), e.prev)
        }
        "actions" => {
            let a: ActionsIn = serde_json::from_slice(line).map_err(bad_json)?;
            (
                Record::Actions {
                    seq: a.seq,
                    actions: a.actions,
                    reduce_us: a.reduce_us,
                },
                a.prev,
            )
        }
        other => return Err(Problem::UnknownKind(other.to_string())),
    };
    let prev = Digest::parse(&prev).ok_or(Problem::BadPrevField(prev))?;
    let computed = Digest::chain(&prev, head, b"}");
    Ok(Line {
        record,
        prev,
        hash,
        computed,
    })
}

/// `version` and `file_no` from the fixed start the writer gives every header
/// (`{"kind":"header","version":3,"file_no":7,…`), so files can be ordered and checked
/// without parsing the state snapshot behind them. `None` when a line does not start so.
pub fn header_prefix(line: &[u8]) -> Option<(u32, u64)> {
    fn number(b: &[u8]) -> Option<(u64, &[u8])> {
        let end = b.iter().position(|c| !c.is_ascii_digit())?;
        let n = std::str::from_utf8(&b[..end]).ok()?.parse().ok()?;
        Some((n, &b[end..]))
    }
    let rest = line.strip_prefix(b"{\"kind\":\"header\",\"version\":")?;
    let (version, rest) = number(rest)?;
    let rest = rest.strip_prefix(b",\"file_no\":")?;
    let (file_no, _) = number(rest)?;
    Some((u32::try_from(version).ok()?, file_no))
}

/// The header's `created_at`, from the fixed start the writer gives it (`…,"file_no":7,
/// "node":"<name>","created_at":<ms>,…`): node names never hold a quote.
pub fn header_created_at(line: &[u8]) -> Option<Millis> {
    const KEY: &[u8] = b",\"created_at\":";
    header_prefix(line)?;
    let at = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &line[at..];
    let end = rest.iter().position(|c| !c.is_ascii_digit())?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Splits `…,"hash":"<64 hex>"}` into the body without its closing brace, and the hash.
fn split_line(line: &[u8]) -> Result<(&[u8], Digest), Problem> {
    let missing = || Problem::NoHash;
    if line.len() < HASH_SUFFIX_LEN + 2 {
        return Err(missing());
    }
    let (head, suffix) = line.split_at(line.len() - HASH_SUFFIX_LEN);
    if !suffix.starts_with(b",\"hash\":\"") || !suffix.ends_with(b"\"}") {
        return Err(missing());
    }
    let hex = std::str::from_utf8(&suffix[9..73]).map_err(|_| missing())?;
    let hash = Digest::parse(hex).ok_or_else(missing)?;
    Ok((head, hash))
}

/// The writer always puts `kind` first, so the kind is read without parsing the line.
fn kind_of(line: &[u8]) -> Result<&str, Problem> {
    let rest = line
        .strip_prefix(b"{\"kind\":\"")
        .ok_or_else(|| Problem::BadJson("the line does not begin with {\"kind\":\"…\"".into()))?;
    let end = rest
        .iter()
        .position(|&c| c == b'"')
        .ok_or_else(|| Problem::BadJson("unterminated kind".into()))?;
    std::str::from_utf8(&rest[..end]).map_err(|_| Problem::BadJson("kind is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(seq: u64) -> Envelope {
        Envelope {
            seq,
            at: 1_000 + seq as i64,
            event: Event::PodRelistBegin,
        }
    }

    #[test]
    fn a_line_round_trips_and_its_hash_covers_the_written_bytes() {
        let mut out = Vec::new();
        let h = encode_event(&mut out, &env(7), &Digest::GENESIS).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        let line = &out[..out.len() - 1];
        let text = std::str::from_utf8(line).unwrap();
        assert!(text.starts_with("{\"kind\":\"event\",\"seq\":7,"), "{text}");
        // An independent check: strip the hash member, hash prev ‖ rest.
        let body = format!("{}}}", &text[..text.len() - HASH_SUFFIX_LEN]);
        assert_eq!(h, Digest::chain(&Digest::GENESIS, body.as_bytes(), b""));
        let d = decode(line).unwrap();
        assert_eq!(d.hash, h);
        assert_eq!(d.computed, h);
        assert_eq!(d.prev, Digest::GENESIS);
        assert!(matches!(d.record, Record::Event(e) if e == env(7)));
    }

    #[test]
    fn a_changed_byte_changes_the_computed_hash() {
        let mut out = Vec::new();
        encode_actions(&mut out, 3, &[], None, &Digest::GENESIS).unwrap();
        out.pop();
        let pos = out.iter().position(|&c| c == b'3').unwrap();
        out[pos] = b'4';
        let d = decode(&out).unwrap();
        assert_ne!(d.computed, d.hash);
    }

    #[test]
    fn malformed_lines_are_named() {
        assert_eq!(decode(b"{}").unwrap_err(), Problem::NoHash);
        let mut out = Vec::new();
        encode_actions(&mut out, 1, &[], None, &Digest::GENESIS).unwrap();
        let text = String::from_utf8(out).unwrap().replace("actions", "action");
        let err = decode(text.trim_end().as_bytes()).unwrap_err();
        assert!(
            matches!(err, Problem::UnknownKind(ref k) if k == "action"),
            "{err:?}"
        );
    }
}
