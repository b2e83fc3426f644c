//! The loop's record of every event it consumed and every action it produced (INV-4):
//! versioned JSON lines, each chained to the one before by sha256, rotated by
//! size. `vk-cocoon replay` feeds it back through the same reducer.
//!
//! A file is a `header` line (format version, node, core config, created-at and a snapshot
//! of the `State` the file starts from, so every file replays on its own) followed by an
//! `event` line and an `actions` line per reduce step. A later process start, or journaling
//! again after a gap, appends another header to the same file and replay starts over from its
//! state; so a file holds one run or several, and the chain runs through all of them.
//! Byte-level format: [`record`].

mod digest;
mod export;
mod files;
pub mod frame;
pub mod holders;
mod problem;
mod reader;
pub mod record;
mod writer;

pub use digest::Digest;
pub use export::write_run;
pub use files::{existing as existing_files, rotated_path};
pub use problem::{JournalError, Problem};
pub use reader::{Entry, Loc, Reader, Step};
pub use record::{Header, Start, FORMAT_VERSION};
pub use writer::{Journal, JournalSettings};
