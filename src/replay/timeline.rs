//! The human form of a journal: one line per event, its actions indented below it. Events and
//! actions use the core's own one-line forms (`reconcilers::render`), so a timeline
//! reads like the scenario files; cocoon calls show their exact argv.

use std::io::{self, Write};

use reconcilers::render;
use reconcilers::time::{rfc3339_seconds, Millis};
use reconcilers::{Action, Envelope};

use crate::journal::{Header, Loc, Start};

/// Width of `HH:MM:SS.mmm  seq` so action lines line up under the event text.
const INDENT: usize = 12 + 2 + 6 + 2;

pub struct Timeline<'a> {
    out: &'a mut dyn Write,
    day: Option<String>,
}

pub(super) fn clock(at: Millis) -> (String, String) {
    let s = rfc3339_seconds(at);
    let ms = at.rem_euclid(1000);
    (s[..10].to_string(), format!("{}.{ms:03}", &s[11..19]))
}

impl<'a> Timeline<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        Self { out, day: None }
    }

    pub fn header(&mut self, loc: &Loc, h: &Header) -> io::Result<()> {
        let start = match h.start {
            Start::Open => "process start".to_string(),
            Start::Rotate => match h.after_seq {
                Some(s) => format!("rotation after seq {s}"),
                None => "rotation".to_string(),
            },
            Start::Resume => match h.after_seq {
                Some(s) => {
                    format!("journal resumed after seq {s} (steps before it were not journaled)")
                }
                None => "journal resumed".to_string(),
            },
        };
        writeln!(
            self.out,
            "== {}:{}: file {} of node {}, {} at {} by {}; state holds {} pods",
            loc.file.display(),
            loc.line,
            h.file_no,
            h.node,
            start,
            rfc3339_seconds(h.created_at),
            h.writer,
            h.state.pods.len()
        )?;
        self.day = None;
        Ok(())
    }

    pub fn event(&mut self, env: &Envelope) -> io::Result<()> {
        let (day, time) = clock(env.at);
        if self.day.as_deref() != Some(day.as_str()) {
            writeln!(self.out, "-- {day}")?;
            self.day = Some(day);
        }
        writeln!(
            self.out,
            "{time}  {:>6}  {}",
            env.seq,
            render::event(&env.event)
        )
    }

    pub fn action(&mut self, a: &Action) -> io::Result<()> {
        writeln!(self.out, "{:INDENT$}→ {}", "", render::action(a))
    }

    pub fn note(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.out, "{:INDENT$}! {text}", "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_shows_milliseconds_in_utc() {
        let (day, time) = clock(1_777_600_000_123);
        assert_eq!(day, "2026-05-01");
        assert_eq!(time, "01:46:40.123");
    }
}
