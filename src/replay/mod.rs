//! `vk-cocoon replay`: read a journal (checking its chain), feed every event through the same
//! reducer starting from the first file's header state, and compare the actions it produces
//! with the journaled ones. A difference is a determinism bug, and this says where.

mod focus;
mod html;
mod json_diff;
mod owners;
mod replayer;
mod rows;
mod timeline;

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;

use reconcilers::pod::PodKey;
use reconcilers::render;
use reconcilers::{Action, Envelope, State};

use crate::journal::{Entry, JournalError, Reader, Start};

pub use focus::Focus;
pub use replayer::Replayer;
use rows::Rows;
pub use timeline::Timeline;

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub files: Vec<PathBuf>,
    /// Show only what concerns this pod (everything is still reduced).
    pub pod: Option<PodKey>,
    /// Stop after the event with this seq.
    pub until: Option<u64>,
    /// Stop at the first difference instead of noting it and going on.
    pub verify: bool,
    /// No timeline (benchmarks, `--state` alone).
    pub quiet: bool,
    /// Write one HTML page, a row per pod, instead of the timeline.
    pub html: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub files: usize,
    pub steps: u64,
    pub actions: u64,
    /// Steps whose replayed actions differ (only without `verify`, which stops at the first).
    pub differing: u64,
    /// Rotations whose header state differs from the replayed state.
    pub state_differences: u64,
    /// Headers that resume journaling after steps that were not journaled.
    pub gaps: u64,
    pub last_seq: Option<u64>,
}

/// The reducer disagreed with the journal at one step.
#[derive(Clone, Debug)]
pub struct Divergence {
    pub file: PathBuf,
    pub line: u64,
    pub envelope: Envelope,
    pub journaled: Vec<Action>,
    pub replayed: Vec<Action>,
}

#[derive(Debug)]
pub enum Failure {
    Journal(JournalError),
    Actions(Box<Divergence>),
    State {
        file: PathBuf,
        differences: Vec<String>,
    },
    Output(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Output(e)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Journal(e) => write!(f, "journal check failed: {e}"),
            Failure::Actions(d) => fmt_divergence(d, f),
            Failure::State { file, differences } => {
                writeln!(
                    f,
                    "{}:1: the state this rotated file starts from differs from the replayed state:",
                    file.display()
                )?;
                for d in differences {
                    writeln!(f, "    {d}")?;
                }
                f.write_str(
                    "the reducer is not deterministic, or it changed since the journal was written",
                )
            }
            Failure::Output(e) => write!(f, "cannot write the timeline: {e}"),
        }
    }
}

fn fmt_divergence(d: &Divergence, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    writeln!(
        f,
        "{}:{} (seq {}): the reducer's actions differ from the journaled ones",
        d.file.display(),
        d.line + 1,
        d.envelope.seq
    )?;
    writeln!(f, "  event: {}", render::event(&d.envelope.event))?;
    let first = d
        .journaled
        .iter()
        .zip(&d.replayed)
        .position(|(a, b)| a != b)
        .unwrap_or(d.journaled.len().min(d.replayed.len()));
    for (name, list, other) in [
        ("journaled", &d.journaled, &d.replayed),
        ("replayed", &d.replayed, &d.journaled),
    ] {
        writeln!(f, "  {name} ({} actions):", list.len())?;
        for (i, a) in list.iter().enumerate() {
            let differs = other.get(i) != Some(a);
            let mark = if differs { '*' } else { ' ' };
            writeln!(f, "   {mark}[{i}] {}", render::action(a))?;
            if differs {
                let json = serde_json::to_string(a).unwrap_or_default();
                writeln!(f, "        {json}")?;
            }
        }
    }
    write!(
        f,
        "first difference at action {first}; a determinism bug in reconcilers, or a journal \
         edited with its hashes recomputed"
    )
}

/// Replays `opts.files`, writing the timeline to `out`. The final state is returned for
/// `--state`.
pub fn run(opts: &Options, out: &mut dyn Write) -> Result<(Summary, Option<State>), Failure> {
    let reader = Reader::open(&opts.files).map_err(Failure::Journal)?;
    let mut summary = Summary::default();
    let mut replayer = Replayer::new();
    let mut focus = opts.pod.clone().map(Focus::new);
    let mut rows = opts.html.then(Rows::new);
    let mut timeline = Timeline::new(&mut *out);
    let show = !opts.quiet && !opts.html;
    for entry in reader {
        match entry.map_err(Failure::Journal)? {
            Entry::Header { loc, header } => {
                if loc.line == 1 {
                    summary.files += 1;
                }
                if header.start == Start::Resume {
                    summary.gaps += 1;
                }
                if show {
                    timeline.header(&loc, &header)?;
                }
                if let Some(rows) = &mut rows {
                    rows.note(header.created_at, header_note(&loc, &header));
                }
                if let Err(differences) = replayer.begin(&header) {
                    summary.state_differences += 1;
                    if opts.verify {
                        return Err(Failure::State {
                            file: loc.file.to_path_buf(),
                            differences,
                        });
                    }
                    const NOTE: &str = "the state this file starts from differs from the replayed state; continuing from the file's";
                    if show {
                        timeline.note(NOTE)?;
                    }
                    if let Some(rows) = &mut rows {
                        rows.note(header.created_at, NOTE.into());
                    }
                }
            }
            Entry::Step {
                loc,
                envelope,
                actions,
                ..
            } => {
                if opts.until.is_some_and(|u| envelope.seq > u) {
                    break;
                }
                let seq = envelope.seq;
                let (event_mine, shown): (bool, Vec<bool>) = match &mut focus {
                    Some(f) => {
                        let before = replayer.state().expect("a header came first");
                        let ev = f.event(&envelope.event, before);
                        let acts: Vec<bool> = actions.iter().map(|a| f.action(a)).collect();
                        (ev || acts.contains(&true), acts)
                    }
                    None => (true, vec![true; actions.len()]),
                };
                let event_shown = show && event_mine;
                if event_shown {
                    timeline.event(&envelope)?;
                    for (a, s) in actions.iter().zip(&shown) {
                        if *s {
                            timeline.action(a)?;
                        }
                    }
                }
                let kept = opts.verify.then(|| envelope.clone());
                let pending = rows.as_mut().map(|r| {
                    let before = replayer.state().expect("a header came first");
                    r.step(&envelope, &actions, before)
                });
                let replayed = replayer.step(envelope);
                if let (Some(rows), Some(p)) = (&mut rows, pending) {
                    let after = replayer.state().expect("a header came first");
                    rows.settle(p, after, replayed != actions);
                }
                summary.steps += 1;
                summary.actions += actions.len() as u64;
                summary.last_seq = Some(seq);
                if replayed != actions {
                    summary.differing += 1;
                    if let Some(envelope) = kept {
                        return Err(Failure::Actions(Box::new(Divergence {
                            file: loc.file.to_path_buf(),
                            line: loc.line,
                            envelope,
                            journaled: actions,
                            replayed,
                        })));
                    }
                    if event_shown {
                        timeline.note("the reducer now produces different actions for this event (run with --verify for details)")?;
                    }
                }
            }
        }
    }
    if let Some(rows) = rows {
        let names: Vec<String> = opts.files.iter().map(|p| p.display().to_string()).collect();
        let heading = html::Heading {
            title: &format!("vk-cocoon replay {}", names.join(" ")),
            verdict: &verdict(&summary, opts.verify, &opts.files),
            only: opts.pod.as_ref(),
        };
        html::write(&rows, &heading, out)?;
    }
    Ok((summary, replayer.state().cloned()))
}

/// A header in the page: the node's row shows where files begin and journaling resumed.
fn header_note(loc: &crate::journal::Loc, h: &crate::journal::Header) -> String {
    let mut line = Vec::new();
    let mut t = Timeline::new(&mut line);
    // Writing to a Vec cannot fail.
    let _ = t.header(loc, h);
    String::from_utf8_lossy(&line)
        .trim_end()
        .trim_start_matches("== ")
        .to_string()
}

/// The one-line verdict printed after a replay.
pub fn verdict(s: &Summary, verify: bool, files: &[PathBuf]) -> String {
    let names: Vec<String> = files
        .iter()
        .map(|p| {
            p.file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
        })
        .collect();
    let outcome = if s.differing == 0 && s.state_differences == 0 {
        if verify {
            "chain intact, every action list identical".to_string()
        } else {
            "chain intact, actions identical".to_string()
        }
    } else {
        format!(
            "chain intact, but {} steps produce different actions and {} rotated states differ",
            s.differing, s.state_differences
        )
    };
    let gaps = match s.gaps {
        0 => String::new(),
        1 => "; 1 gap where steps were not journaled".to_string(),
        n => format!("; {n} gaps where steps were not journaled"),
    };
    format!(
        "replayed {} events ({} actions) from {} file(s) [{}]: {outcome}{gaps}",
        s.steps,
        s.actions,
        s.files,
        names.join(", ")
    )
}
