//! Journaling a run that was reduced elsewhere (the testkit's `World::log`): the sample
//! journal, benchmarks and tests write real journals this way, through the same writer the
//! daemon uses, rotation included.

use anyhow::{bail, Result};

use reconcilers::time::Millis;
use reconcilers::{reduce, Action, Config, Envelope, State};

use super::writer::{Journal, JournalSettings};

/// Writes `steps` as a fresh journal whose first state is `State::new(config)`. Each step is
/// reduced again to know the state a rotated file starts from, and must give the logged
/// actions, so an export can never hold a run the reducer would not reproduce.
pub fn write_run(
    settings: &JournalSettings,
    config: &Config,
    created_at: Millis,
    steps: &[(Envelope, Vec<Action>)],
) -> Result<()> {
    let mut state = State::new(config.clone());
    let mut journal = Journal::open_at(settings, config, &state, created_at)?;
    for (envelope, actions) in steps {
        let again = reduce(&mut state, envelope.clone());
        if again != *actions {
            bail!(
                "seq {}: the reducer does not reproduce the logged actions; the run is not deterministic",
                envelope.seq
            );
        }
        journal.record(envelope, actions)?;
        journal.rotate_if_needed(&state)?;
    }
    Ok(())
}
