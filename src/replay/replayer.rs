//! Feeding journaled events through the same reducer. A header that starts a process, or
//! resumes journaling after steps that were not journaled, resets the state to its own; a
//! rotated file must start from exactly the state replay arrived at, which checks the whole
//! state, not only the actions, at every rotation.

use reconcilers::{reduce, Action, Envelope, State};

use super::json_diff;
use crate::journal::{Header, Start};

#[derive(Default)]
pub struct Replayer {
    state: Option<State>,
}

impl Replayer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the header's starting state. `Err` names where a rotation header's state differs
    /// from the replayed one; the header's state is taken anyway, to stay with the journal.
    pub fn begin(&mut self, header: &Header) -> Result<(), Vec<String>> {
        let differs = match (&self.state, header.start) {
            (Some(replayed), Start::Rotate) if *replayed != header.state => {
                Some(state_differences(replayed, &header.state))
            }
            _ => None,
        };
        self.state = Some(header.state.clone());
        match differs {
            Some(d) => Err(d),
            None => Ok(()),
        }
    }

    /// The actions the reducer produces for `envelope` now.
    pub fn step(&mut self, envelope: Envelope) -> Vec<Action> {
        let state = self
            .state
            .as_mut()
            .expect("the reader yields a file header before any step");
        reduce(state, envelope)
    }

    pub fn state(&self) -> Option<&State> {
        self.state.as_ref()
    }
}

fn state_differences(replayed: &State, journaled: &State) -> Vec<String> {
    let as_json = |s: &State| serde_json::to_value(s).unwrap_or(serde_json::Value::Null);
    let d = json_diff::differences(&as_json(replayed), &as_json(journaled), 12);
    if d.is_empty() {
        // Only fields serde skips differ; say so rather than print nothing.
        vec!["(the states differ in fields the snapshot does not hold)".into()]
    } else {
        d
    }
}
