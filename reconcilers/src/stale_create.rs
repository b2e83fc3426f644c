//! B3: VM records still `creating` when vk starts. Such a record may belong to a create whose
//! caller died with the old process, or to one still running, so it is neither adopted nor an
//! orphan: it goes through `vm reconcile-stale-create`. `collected` or `not-found` frees the
//! name. `busy` or a transient error starts a bounded watcher that inspects between tries: a
//! create that committed (`running`) is indexed for the pod that wants its name, a record that
//! ended otherwise gets the orphan policy, one still `creating` is asked again. A cocoon
//! without the verb leaves the record alone.

use crate::action::{Action, Counter, Level, Timer};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::state::{OpOwner, State};
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};

/// Tries of the verb (or of an inspect between them) before the record is left alone.
pub const MAX_TRIES: u32 = 8;
const FIRST_WAIT_MS: u64 = 1000;
const MAX_WAIT_MS: u64 = 30_000;

/// Which call of the watcher an outcome answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Reconcile,
    Inspect,
}

pub(crate) fn begin(s: &mut State, vm: &VmRecord) {
    ask(s, &vm.id, &vm.name, 1);
}

fn ask(s: &mut State, id: &str, name: &str, attempt: u32) {
    call(s, id, name, attempt, Call::Reconcile);
}

fn call(s: &mut State, id: &str, name: &str, attempt: u32, what: Call) {
    let op = s.new_op(OpOwner::StaleCreate {
        id: id.to_string(),
        name: name.to_string(),
        attempt,
        call: what,
    });
    let cmd = match what {
        Call::Reconcile => CocoonCmd::ReconcileStaleCreate { id: id.to_string() },
        Call::Inspect => CocoonCmd::VmInspect { vm: id.to_string() },
    };
    s.emit(Action::Cocoon { op, key: None, cmd });
}

fn count(s: &mut State, outcome: &str) {
    s.emit(Action::Count {
        counter: Counter::StaleCreateReconcile {
            outcome: outcome.to_string(),
        },
    });
}

fn log(s: &mut State, level: Level, message: String) {
    s.emit(Action::Log { level, message });
}

pub(crate) fn done(
    s: &mut State,
    id: &str,
    name: &str,
    attempt: u32,
    what: Call,
    result: Result<CocoonOk, CocoonError>,
) {
    match what {
        Call::Reconcile => answered(s, id, name, attempt, result),
        Call::Inspect => inspected(s, id, name, attempt, result),
    }
}

fn answered(
    s: &mut State,
    id: &str,
    name: &str,
    attempt: u32,
    result: Result<CocoonOk, CocoonError>,
) {
    match result {
        Ok(CocoonOk::StaleCreate { outcome }) => {
            count(s, &outcome);
            match outcome.as_str() {
                "collected" | "not-found" => log(
                    s,
                    Level::Info,
                    format!("stale-create {id} ({name}): {outcome}, the name is free"),
                ),
                "not-creating" => call(s, id, name, attempt, Call::Inspect),
                _ => later(s, id, name, attempt, &outcome),
            }
        }
        Ok(other) => {
            count(s, "error");
            later(
                s,
                id,
                name,
                attempt,
                &format!("an unexpected answer ({other:?})"),
            );
        }
        Err(e) if e.kind == CocoonErrorKind::VmNotFound => {
            count(s, "not-found");
            log(
                s,
                Level::Info,
                format!("stale-create {id} ({name}): not found, the name is free"),
            );
        }
        Err(e) if e.kind == CocoonErrorKind::Unsupported => {
            count(s, "error");
            log(
                s,
                Level::Warn,
                format!(
                    "stale-create {id} ({name}) failed: {}; this cocoon lacks the verb, the record is left alone",
                    e.message
                ),
            );
        }
        Err(e) => {
            count(s, "error");
            later(s, id, name, attempt, &format!("failing ({})", e.message));
        }
    }
}

fn inspected(
    s: &mut State,
    id: &str,
    name: &str,
    attempt: u32,
    result: Result<CocoonOk, CocoonError>,
) {
    match result {
        Ok(CocoonOk::Vm { vm }) if vm.state == "creating" => ask(s, id, name, attempt),
        Ok(CocoonOk::Vm { vm }) if vm.is_running() && wanted(s, &vm.name) => {
            log(
                s,
                Level::Info,
                format!("stale-create {id} ({name}): the create committed; its pod adopts the VM"),
            );
            s.unclaimed.insert(vm.name.clone(), vm);
            // The pod may be between create attempts: its next one adopts.
        }
        Ok(CocoonOk::Vm { vm }) => crate::startup::orphan(s, &vm),
        Err(e) if e.kind == CocoonErrorKind::VmNotFound => log(
            s,
            Level::Info,
            format!("stale-create {id} ({name}): the record is gone, the name is free"),
        ),
        Ok(_) | Err(_) => later(s, id, name, attempt, "not inspectable"),
    }
}

/// A pod on this node wants a VM of this name (any order of the walk gives the same answer).
fn wanted(s: &State, name: &str) -> bool {
    s.pods.sorted().into_iter().any(|(_, e)| {
        !e.gone
            && e.spec
                .as_ref()
                .is_ok_and(|sp| sp.managed && sp.vm_name == name)
    })
}

fn later(s: &mut State, id: &str, name: &str, attempt: u32, why: &str) {
    if attempt >= MAX_TRIES {
        log(
            s,
            Level::Warn,
            format!("stale-create {id} ({name}): still {why} after {attempt} tries; the record is left alone"),
        );
        return;
    }
    let after_ms = (FIRST_WAIT_MS << (attempt - 1).min(16)).min(MAX_WAIT_MS);
    log(
        s,
        Level::Info,
        format!("stale-create {id} ({name}): {why}; looking again in {after_ms} ms"),
    );
    s.emit(Action::ArmTimer {
        timer: Timer::StaleCreate {
            id: id.to_string(),
            name: name.to_string(),
            attempt: attempt + 1,
        },
        after_ms,
    });
}

/// The watcher's timer: inspect first, then (still `creating`) ask again.
pub(crate) fn fired(s: &mut State, id: &str, name: &str, attempt: u32) {
    call(s, id, name, attempt, Call::Inspect);
}
