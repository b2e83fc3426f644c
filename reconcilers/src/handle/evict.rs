//! The Evicting phase (W6): delete the API pod (UID-bound, two tries); only once that worked
//! is the VM forgotten and the pod reported Failed. A failed eviction keeps all state, so a
//! later event retries. No Event and no lifecycle write.

use crate::action::{Action, Counter, Level, OpId, Timer};
use crate::backoff::Backoff;
use crate::event::{KubeError, KubeErrorKind, KubeOk};
use crate::phase::{End, EvictReason, Evicting, Gone, Object, ObjectDelete, Phase, Terminal};
use crate::pod::PodKey;
use crate::state::{KubeOwner, State};
use crate::{delete, outcome, tracking};

/// W6: two tries, 200 ms then 400 ms apart.
const RETRY: Backoff = Backoff::doubling(200, 400);
const TRIES: u32 = 2;

/// Starts the eviction of a Running pod.
pub fn begin(s: &mut State, key: &PodKey, reason: EvictReason, message: &str) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let running = match &mut e.phase {
        Phase::Running(r) => {
            // The verdict is in: a hint that waited for it has nothing left to say.
            r.task = None;
            r.clone()
        }
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => return,
    };
    e.phase = Phase::Evicting(Evicting {
        running,
        reason,
        message: message.to_string(),
        tries: 0,
        delete: None,
        cancel: None,
    });
    send(s, key);
}

fn send(s: &mut State, key: &PodKey) {
    let op = s.kube_op(KubeOwner::Evict { key: key.clone() });
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Evicting(ev) = &mut e.phase else {
        return crate::outcome::unexpected(s, &format!("pod {key}: send found it not Evicting"));
    };
    ev.tries += 1;
    ev.delete = Some(op);
    let uid = e.pod.uid.clone();
    s.emit(Action::DeletePod {
        op,
        key: key.clone(),
        uid,
        grace_seconds: None,
    });
}

pub(crate) fn done(s: &mut State, key: &PodKey, op: OpId, result: Result<KubeOk, KubeError>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let ev = match &mut e.phase {
        Phase::Evicting(ev) if ev.delete == Some(op) => ev,
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {
            let what = format!("pod {key}: an eviction outcome in phase {}", e.phase.name());
            return outcome::unexpected(s, &what);
        }
    };
    s.touched.insert(key);
    ev.delete = None;
    let ok = matches!(
        result,
        Ok(_)
            | Err(KubeError {
                kind: KubeErrorKind::NotFound,
                ..
            })
    );
    let ev = ev.clone();
    let uid = e.pod.uid.clone();
    if ok {
        let end = End::Evicted {
            reason: ev.reason,
            message: ev.message,
        };
        e.phase = match ev.cancel {
            None => Phase::Terminal(Terminal {
                end,
                object: ObjectDelete::NotAsked,
            }),
            Some(Object::Present) => Phase::Terminal(Terminal {
                end,
                object: ObjectDelete::Asked,
            }),
            Some(Object::Gone) => Phase::Gone(Gone { delete: None }),
        };
        tracking::forget(s, key, &ev.running.vm);
        return;
    }
    if let Some(object) = ev.cancel {
        // The pod is being deleted anyway: the normal delete removes the VM and the object.
        return delete::with_vm(s, key, ev.running.vm, object);
    }
    if ev.tries < TRIES {
        // The retry timer sends the delete again.
        s.emit(Action::ArmTimer {
            timer: Timer::EvictRetry {
                key: key.clone(),
                uid,
            },
            after_ms: RETRY.after(ev.tries),
        });
        return;
    }
    e.phase = Phase::Running(ev.running);
    s.emit(Action::Count {
        counter: Counter::PodEvictFailure,
    });
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!(
            "pod {key}: eviction ({}) failed; keeping all state",
            ev.reason.as_str()
        ),
    });
}

/// The evict-retry timer.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    match &e.phase {
        Phase::Evicting(ev) if ev.delete.is_none() => send(s, key),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Evicting(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => {}
    }
}
