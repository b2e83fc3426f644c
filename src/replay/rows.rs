//! `--html`: the journal regrouped by pod. Each row holds, in time order, one entry per step
//! that concerned the pod: the event (the pod's own, or the node's or another pod's that
//! caused its actions), the pod's phase change, and the actions returned for it.
//!
//! A pod in a steady loop (a probe answering, a retry failing the same way) repeats one
//! entry thousands of times; consecutive entries of the same shape (the same text once its
//! numbers are ignored) fold into the first with a count and the last, so a long journal
//! stays a page one can read.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use reconcilers::pod::PodKey;
use reconcilers::render;
use reconcilers::time::Millis;
use reconcilers::{Action, Envelope, State};

use super::owners::{Owner, Owners};

/// What an item is, for its colour and the row's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cocoon,
    /// A status write carrying the status pushed.
    Status,
    /// A status-subresource write carrying only annotations.
    Annotate,
    /// A Kubernetes Event.
    Event,
    Timer,
    Probe,
    Delete,
    Registry,
    /// Counts, histograms, log lines, SAC, leases.
    Other,
    Note,
}

impl Kind {
    fn of(a: &Action) -> Kind {
        match a {
            Action::RunCocoon { .. } => Kind::Cocoon,
            Action::PatchPod {
                status: Some(_), ..
            } => Kind::Status,
            Action::PatchPod { .. } => Kind::Annotate,
            Action::RecordEvent { .. } => Kind::Event,
            Action::ArmTimer { .. } => Kind::Timer,
            Action::RunProbe { .. } | Action::StopProbe { .. } => Kind::Probe,
            Action::DeletePod { .. } => Kind::Delete,
            Action::CallRegistry { .. } => Kind::Registry,
            _ => Kind::Other,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The row's own event.
    Own,
    /// Another row's event (the node's sweep, a relist) that returned actions for this pod.
    Other,
    /// Not a step: a journal header, a divergence.
    Note,
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub seq: u64,
    pub at: Millis,
    pub cause: Cause,
    pub event: String,
    /// Phase names before and after; `None` is "not in the pod table".
    pub phase: Option<(Option<&'static str>, Option<&'static str>)>,
    pub items: Vec<(Kind, String)>,
    /// How many entries of this shape in a row this one stands for.
    pub times: u64,
    /// The last of those, when there is more than one.
    pub last: Option<Box<Entry>>,
    shape: u64,
}

impl Entry {
    fn new(seq: u64, at: Millis, cause: Cause, event: String) -> Self {
        Self {
            seq,
            at,
            cause,
            event,
            phase: None,
            items: Vec::new(),
            times: 1,
            last: None,
            shape: 0,
        }
    }

    /// The text with every run of digits taken out: "probe-done p17 ok" and "probe-done p18
    /// ok" are the same shape.
    fn compute_shape(&mut self) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut text = |s: &str| {
            let mut digits = false;
            for c in s.chars() {
                let d = c.is_ascii_digit();
                if !(d && digits) {
                    (if d { '#' } else { c }).hash(&mut h);
                }
                digits = d;
            }
            '\n'.hash(&mut h);
        };
        text(&self.event);
        for (_, t) in &self.items {
            text(t);
        }
        (self.cause, self.phase, self.items.len()).hash(&mut h);
        self.shape = h.finish();
    }
}

#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// The row's own events.
    pub events: u64,
    pub actions: u64,
    pub cocoon: u64,
    pub statuses: u64,
    pub k8s_events: u64,
    /// Entries folded into an earlier one.
    pub folded: u64,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub owner: Owner,
    pub entries: Vec<Entry>,
    pub counts: Counts,
    /// Each phase the pod entered, in order; `None` is "left the pod table".
    pub phases: Vec<Option<&'static str>>,
    /// The last status pushed, rendered.
    pub last_status: Option<String>,
}

impl Row {
    fn new(owner: Owner) -> Self {
        Self {
            owner,
            entries: Vec::new(),
            counts: Counts::default(),
            phases: Vec::new(),
            last_status: None,
        }
    }

    fn push(&mut self, mut e: Entry) {
        e.compute_shape();
        match self.entries.last_mut() {
            Some(prev) if prev.shape == e.shape && prev.cause != Cause::Note => {
                prev.times += 1;
                prev.last = Some(Box::new(e));
                self.counts.folded += 1;
            }
            _ => self.entries.push(e),
        }
    }
}

/// A step between its event being read and the reducer having run it.
pub struct Pending {
    entries: Vec<(usize, Entry)>,
    /// Each pod the step concerned, its row and its phase before.
    touched: Vec<(PodKey, usize, Option<&'static str>)>,
    event_row: usize,
}

impl Pending {
    fn entry(&mut self, row: usize, make: impl FnOnce() -> Entry) -> &mut Entry {
        let i = match self.entries.iter().position(|(r, _)| *r == row) {
            Some(i) => i,
            None => {
                self.entries.push((row, make()));
                self.entries.len() - 1
            }
        };
        &mut self.entries[i].1
    }
}

pub struct Rows {
    pub rows: Vec<Row>,
    index: HashMap<Owner, usize>,
    owners: Owners,
    /// The step of the last event, for notes that follow it.
    last: (u64, Millis),
}

impl Default for Rows {
    fn default() -> Self {
        Self::new()
    }
}

fn phase_of(state: &State, key: &PodKey) -> Option<&'static str> {
    state.pods.get(key).map(|e| e.phase.name())
}

impl Rows {
    pub fn new() -> Self {
        let mut index = HashMap::new();
        index.insert(Owner::Node, 0);
        Self {
            rows: vec![Row::new(Owner::Node)],
            index,
            owners: Owners::default(),
            last: (0, 0),
        }
    }

    fn row(&mut self, owner: Owner) -> usize {
        if let Some(&i) = self.index.get(&owner) {
            return i;
        }
        let i = self.rows.len();
        self.rows.push(Row::new(owner.clone()));
        self.index.insert(owner, i);
        i
    }

    /// A line in the node's row that is no step: a journal header, a state mismatch.
    pub fn note(&mut self, at: Millis, text: String) {
        let seq = self.last.0;
        self.rows[0].push(Entry::new(seq, at, Cause::Note, text));
    }

    /// Sorts the step's event and its journaled actions into rows, before the reducer runs
    /// it: `before` is the state the event meets.
    pub fn step(&mut self, env: &Envelope, actions: &[Action], before: &State) -> Pending {
        self.last = (env.seq, env.at);
        let owner = self.owners.event(&env.event, before);
        let event_row = self.row(owner.clone());
        let text = render::event(&env.event);
        let mut p = Pending {
            entries: vec![(
                event_row,
                Entry::new(env.seq, env.at, Cause::Own, text.clone()),
            )],
            touched: Vec::new(),
            event_row,
        };
        if let Some(k) = owner.key() {
            p.touched.push((k.clone(), event_row, phase_of(before, k)));
        }
        self.rows[event_row].counts.events += 1;
        for a in actions {
            let o = self.owners.action(a, &owner);
            let row = self.row(o.clone());
            let kind = Kind::of(a);
            let r = &mut self.rows[row];
            r.counts.actions += 1;
            match a {
                Action::RunCocoon { .. } => r.counts.cocoon += 1,
                Action::RecordEvent { .. } => r.counts.k8s_events += 1,
                Action::PatchPod {
                    status: Some(s), ..
                } => {
                    r.counts.statuses += 1;
                    r.last_status = Some(render::status(s));
                }
                _ => {}
            }
            if let Some(k) = o.key() {
                if !p.touched.iter().any(|(_, r, _)| *r == row) {
                    p.touched.push((k.clone(), row, phase_of(before, k)));
                }
            }
            p.entry(row, || {
                Entry::new(env.seq, env.at, Cause::Other, text.clone())
            })
            .items
            .push((kind, render::action(a)));
        }
        p
    }

    /// Files the step once the reducer ran it: `after` is the state it left, `differs` that
    /// the reducer's actions are not the journaled ones.
    pub fn settle(&mut self, mut p: Pending, after: &State, differs: bool) {
        for (key, row, before) in std::mem::take(&mut p.touched) {
            let now = phase_of(after, &key);
            if now != before {
                p.entry(row, || unreachable!("a touched pod has an entry"))
                    .phase = Some((before, now));
                let phases = &mut self.rows[row].phases;
                if phases.is_empty() && before.is_some() {
                    phases.push(before);
                }
                phases.push(now);
            }
        }
        if differs {
            let row = p.event_row;
            p.entry(row, || unreachable!("the event has an entry"))
                .items
                .push((
                    Kind::Note,
                    "the reducer now produces different actions for this event (run with --verify for details)".into(),
                ));
        }
        for (row, e) in p.entries {
            self.rows[row].push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::action::{ProbeCheck, ProbeTarget};
    use reconcilers::{Config, Event};

    #[test]
    fn a_probe_loop_folds_into_one_entry_with_its_count_and_last() {
        let state = State::new(Config::default());
        let key = PodKey::new("default", "web");
        let mut rows = Rows::new();
        for seq in 1..=5u64 {
            let env = Envelope {
                seq,
                at: 1_777_600_000_000 + seq as Millis * 1000,
                event: Event::ProbeDone {
                    key: key.clone(),
                    seq,
                    ok: true,
                    detail: String::new(),
                },
            };
            let actions = [Action::RunProbe {
                key: key.clone(),
                seq: seq + 1,
                target: ProbeTarget {
                    ip: Some("10.0.0.5".into()),
                    check: ProbeCheck::Icmp,
                },
                after_ms: 1000,
                standing: false,
            }];
            let p = rows.step(&env, &actions, &state);
            rows.settle(p, &state, false);
        }
        let row = &rows.rows[1];
        assert_eq!(row.entries.len(), 1);
        let e = &row.entries[0];
        assert_eq!((e.seq, e.times), (1, 5));
        let last = e.last.as_ref().unwrap();
        assert_eq!(last.event, "probe-done default/web p5 ok");
        assert_eq!(row.counts.folded, 4);
        assert_eq!((row.counts.events, row.counts.actions), (5, 5));
    }
}
