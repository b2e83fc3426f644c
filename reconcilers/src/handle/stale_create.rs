//! B3: VM records still `creating` when vk starts. Such a record may belong to a create whose
//! caller died with the old process, or to one still running, so it is neither adopted nor an
//! orphan: it goes through `vm reconcile-stale-create`. `collected` or `not-found` frees the
//! name. `busy` or a transient error starts a bounded watcher that inspects between tries: a
//! create that committed (`running`) is indexed for the pod that wants its name, a record that
//! ended otherwise gets the orphan policy, one still `creating` is asked again. A cocoon
//! without the verb leaves the record alone.

use crate::action::{Action, Counter, Level, Timer};
use crate::backoff::Backoff;
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, StaleOutcome};
use crate::labels::StaleCreateOutcome;
use crate::state::{CocoonOwner, State};
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};

/// Tries of the verb (or of an inspect between them) before the record is left alone.
pub const MAX_TRIES: u32 = 8;
/// Between tries: 1 s doubling to 30 s.
const RETRY: Backoff = Backoff::doubling(1000, 30_000);

/// Which call of the watcher an outcome answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Reconcile,
    Inspect,
}

/// One record under watch, and which try this is.
#[derive(Clone, Copy)]
struct Watch<'a> {
    id: &'a str,
    name: &'a str,
    attempt: u32,
}

impl Watch<'_> {
    fn call(self, s: &mut State, what: Call) {
        let owner = CocoonOwner::StaleCreate {
            id: self.id.to_string(),
            name: self.name.to_string(),
            attempt: self.attempt,
            call: what,
        };
        let id = self.id.to_string();
        let cmd = match what {
            Call::Reconcile => CocoonCmd::ReconcileStaleCreate { id },
            Call::Inspect => CocoonCmd::VmInspect { vm: id },
        };
        s.run_cocoon(owner, None, cmd);
    }

    /// Logs `stale-create <id> (<name>)` followed by `text`.
    fn say(self, s: &mut State, level: Level, text: &str) {
        let (id, name) = (self.id, self.name);
        s.emit(Action::Log {
            level,
            message: format!("stale-create {id} ({name}){text}"),
        });
    }

    /// Another try later, or none once the bound is reached.
    fn later(self, s: &mut State, why: &str) {
        if self.attempt >= MAX_TRIES {
            let tries = self.attempt;
            let text = format!(": still {why} after {tries} tries; the record is left alone");
            self.say(s, Level::Warn, &text);
            return;
        }
        let after_ms = RETRY.after(self.attempt);
        self.say(
            s,
            Level::Info,
            &format!(": {why}; looking again in {after_ms} ms"),
        );
        s.emit(Action::ArmTimer {
            timer: Timer::StaleCreate {
                id: self.id.to_string(),
                name: self.name.to_string(),
                attempt: self.attempt + 1,
            },
            after_ms,
        });
    }
}

pub(crate) fn begin(s: &mut State, vm: &VmRecord) {
    let w = Watch {
        id: &vm.id,
        name: &vm.name,
        attempt: 1,
    };
    w.call(s, Call::Reconcile);
}

/// The watcher's timer: inspect first, then (still `creating`) ask again.
pub(crate) fn fired(s: &mut State, id: &str, name: &str, attempt: u32) {
    Watch { id, name, attempt }.call(s, Call::Inspect);
}

fn count(s: &mut State, outcome: StaleCreateOutcome) {
    s.emit(Action::Count {
        counter: Counter::StaleCreateReconcile { outcome },
    });
}

pub(crate) fn done(
    s: &mut State,
    id: &str,
    name: &str,
    attempt: u32,
    what: Call,
    result: Result<CocoonOk, CocoonError>,
) {
    let w = Watch { id, name, attempt };
    match what {
        Call::Reconcile => answered(s, w, result),
        Call::Inspect => inspected(s, w, result),
    }
}

fn answered(s: &mut State, w: Watch, result: Result<CocoonOk, CocoonError>) {
    match result {
        Ok(CocoonOk::StaleCreate { outcome }) => {
            let said = outcome.as_str();
            count(s, outcome.into());
            match outcome {
                StaleOutcome::Collected | StaleOutcome::NotFound => {
                    w.say(s, Level::Info, &format!(": {said}, the name is free"))
                }
                StaleOutcome::NotCreating => w.call(s, Call::Inspect),
                StaleOutcome::Busy => w.later(s, said),
            }
        }
        Ok(other) => {
            count(s, StaleCreateOutcome::Error);
            w.later(s, &format!("an unexpected answer ({other:?})"));
        }
        Err(e) if e.kind == CocoonErrorKind::VmNotFound => {
            count(s, StaleCreateOutcome::NotFound);
            w.say(s, Level::Info, ": not found, the name is free");
        }
        Err(e) if e.kind == CocoonErrorKind::Unsupported => {
            count(s, StaleCreateOutcome::Error);
            let text = format!(
                " failed: {}; this cocoon lacks the verb, the record is left alone",
                e.message
            );
            w.say(s, Level::Warn, &text);
        }
        Err(e) => {
            count(s, StaleCreateOutcome::Error);
            w.later(s, &format!("failing ({})", e.message));
        }
    }
}

fn inspected(s: &mut State, w: Watch, result: Result<CocoonOk, CocoonError>) {
    match result {
        Ok(CocoonOk::Vm { vm }) if vm.is_creating() => w.call(s, Call::Reconcile),
        Ok(CocoonOk::Vm { vm }) if vm.is_running() && wanted(s, &vm.name) => {
            w.say(
                s,
                Level::Info,
                ": the create committed; its pod adopts the VM",
            );
            // The pod may be between create attempts: its next one adopts.
            s.unclaimed.insert(vm.name.clone(), vm);
        }
        Ok(CocoonOk::Vm { vm }) => crate::startup::orphan(s, &vm),
        Err(e) if e.kind == CocoonErrorKind::VmNotFound => {
            w.say(s, Level::Info, ": the record is gone, the name is free")
        }
        Ok(_) | Err(_) => w.later(s, "not inspectable"),
    }
}

/// A pod on this node wants a VM of this name (any order of the walk gives the same answer).
fn wanted(s: &State, name: &str) -> bool {
    s.pods.sorted().into_iter().any(|(_, e)| {
        !e.phase.object_gone()
            && e.spec
                .as_ref()
                .is_ok_and(|sp| sp.managed && sp.vm_name == name)
    })
}
