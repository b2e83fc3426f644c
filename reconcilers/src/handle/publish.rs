//! Publishing a pod: what the server lacks of the derived status and annotations goes out as
//! one write, one at a time per pod. While a write is out nothing else is sent; its outcome
//! touches the pod, and whatever still differs then goes next, so a burst of changes costs
//! one or two writes instead of one each (S9, S10, L1–L3). The node has a fixed number of
//! writes out at once; pods beyond that wait in line, and a pod's changes while it waits
//! become one write, so a mass create costs about one write per pod instead of two.

use std::collections::{BTreeMap, BTreeSet};

use crate::action::{Action, Level, OpId, Timer};
use crate::event::{KubeError, KubeErrorKind, KubeOk};
use crate::pod::PodKey;
use crate::state::{writes_out, KubeOwner, Publish, State};
use crate::status::{first_probe_pending, PodStatus};
use crate::writer::{WriteState, RETRY};
use crate::{annotations, delete, status};

pub(crate) fn sync(p: &mut Publish, key: &PodKey) {
    let e = &*p.entry;
    let waiting = match e.writer.state {
        WriteState::Idle => None,
        WriteState::Waiting(turn) => Some(turn),
        WriteState::Out(_) | WriteState::Backoff | WriteState::Superseded => return,
    };
    if !p.started || e.phase.holds_writes() || first_probe_pending(e) {
        return leave_line(p, waiting);
    }
    let status = status::wanted(p.config, e);
    if status.is_none() {
        // The server holds the final status: a deleted pod's object can go (D8).
        delete::finalize(p, key);
        if !p.entry.writer.can_write() || p.entry.phase.holds_writes() {
            return leave_line(p, waiting);
        }
    }
    // A deleting pod's object is about to go: its annotations are not worth a write.
    let annotations = match p.entry.phase.deleting() {
        true => Default::default(),
        false => annotations::diff(p.entry),
    };
    if status.is_none() && annotations.is_empty() {
        return leave_line(p, waiting);
    }
    // S9: the node's writes out are capped; beyond that the pod waits its turn, and what it
    // writes is derived again when the turn comes.
    let free = (p.config.write_slots as usize).saturating_sub(p.fx.writes_out());
    if !p.turns.within(waiting, free) {
        if waiting.is_none() {
            let turn = p.turns.join(key);
            p.entry.writer.state = WriteState::Waiting(turn);
        }
        return;
    }
    if let Some(turn) = waiting {
        p.turns.leave(turn);
    }
    let op = p.fx.kube_op(KubeOwner::Write {
        key: key.clone(),
        status: status.clone(),
        annotations: annotations.clone(),
    });
    p.entry.writer.state = WriteState::Out(op);
    p.fx.emit(Action::PatchPod {
        op,
        key: key.clone(),
        uid: p.entry.pod.uid.clone(),
        status,
        annotations,
    });
}

/// A waiting pod with nothing it may write now gives up its turn; it queues again, last, once
/// it has something.
fn leave_line(p: &mut Publish, waiting: Option<u64>) {
    if let Some(turn) = waiting {
        p.turns.leave(turn);
        p.entry.writer.state = WriteState::Idle;
    }
}

/// Touches the first pods in line, as many as there are write slots free, so they are
/// published before the event is done; turns whose pod no longer waits at them are dropped.
/// `handed`: the pods this event has handed a slot already, so a pass always ends. Returns
/// whether it touched any.
pub(crate) fn hand_on(s: &mut State, handed: &mut BTreeSet<PodKey>) -> bool {
    let free = (s.config.write_slots as usize).saturating_sub(writes_out(&s.kube_ops));
    if free == 0 || s.write_turns.is_empty() {
        return false;
    }
    let (mut stale, mut next, mut touched) = (Vec::new(), 0, false);
    for (turn, key) in s.write_turns.iter() {
        if next == free {
            break;
        }
        let waits = s.pods.get(key).map(|e| e.writer.state);
        if waits != Some(WriteState::Waiting(turn)) {
            stale.push(turn);
            continue;
        }
        next += 1;
        if handed.insert(key.clone()) {
            s.touched.insert(key);
            touched = true;
        }
    }
    for turn in stale {
        s.write_turns.leave(turn);
    }
    touched
}

/// The outcome of the pod's write.
pub(crate) fn write_done(
    s: &mut State,
    key: &PodKey,
    op: OpId,
    pushed: Option<PodStatus>,
    annotations: BTreeMap<String, Option<String>>,
    result: Result<KubeOk, KubeError>,
) {
    let Some(e) = s.pods.get_mut(key) else { return };
    if e.writer.out() != Some(op) {
        let what = format!("pod {key}: the outcome of write #{op}, which is not the one out");
        return crate::outcome::unexpected(s, &what);
    }
    e.writer.state = WriteState::Idle;
    s.touched.insert(key);
    match result {
        Ok(ok) => {
            e.writer.failures = 0;
            // The echo is the server's whole status; without one it holds what was pushed.
            match (ok, &pushed) {
                (
                    KubeOk::Status {
                        status: held,
                        resource_version,
                    },
                    _,
                ) => {
                    e.pod.status = *held;
                    e.pod.resource_version = e.pod.resource_version.max(resource_version);
                }
                (KubeOk::Done, Some(pushed)) => e.pod.status = pushed.clone(),
                (KubeOk::Done, None) => {}
            }
            for (k, v) in annotations {
                match v {
                    Some(v) => e.pod.annotations.insert(k, v),
                    None => e.pod.annotations.remove(&k),
                };
            }
            if let Some(pushed) = pushed {
                crate::latency::status_pushed(s, key, &pushed);
                let Some(e) = s.pods.get_mut(key) else { return };
                // The server changed what we pushed: pushing it again would loop.
                e.writer.echo_mismatch = (pushed != e.pod.status).then_some(pushed);
            }
        }
        Err(err) => {
            let what = match pushed {
                Some(_) => Write::Status,
                None => Write::Annotations,
            };
            write_failed(s, key, what, err)
        }
    }
}

/// Which Kubernetes write of the pod failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Status,
    Annotations,
    ObjectDelete,
}

impl Write {
    fn as_str(self) -> &'static str {
        match self {
            Write::Status => "status",
            Write::Annotations => "annotation patch",
            Write::ObjectDelete => "pod delete",
        }
    }
}

/// 404/409/422 mean the incarnation was superseded: drop the write. Anything else is retried
/// with backoff; the declarative sync re-derives what to write when the timer fires.
pub(crate) fn write_failed(s: &mut State, key: &PodKey, what: Write, err: KubeError) {
    let Some(e) = s.pods.get_mut(key) else { return };
    // A 422 on a status write is our own bug (an invalid status), not a superseded pod: it is
    // logged loudly and retried, so a fixed derivation heals it.
    let superseded = match (err.kind, what) {
        (KubeErrorKind::NotFound | KubeErrorKind::Conflict, _) => true,
        (KubeErrorKind::Invalid, Write::Status) => false,
        (KubeErrorKind::Invalid, Write::Annotations | Write::ObjectDelete) => true,
        (KubeErrorKind::Other, _) => false,
    };
    let what = what.as_str();
    if superseded {
        e.writer.state = WriteState::Superseded;
        s.emit(Action::Log {
            level: Level::Info,
            message: format!("pod {key}: {what} dropped, pod superseded: {}", err.message),
        });
        return;
    }
    e.writer.failures += 1;
    e.writer.state = WriteState::Backoff;
    let after_ms = RETRY.after(e.writer.failures);
    let uid = e.pod.uid.clone();
    s.emit(Action::Log {
        level: Level::Warn,
        message: format!("pod {key}: {what} failed, retrying: {}", err.message),
    });
    s.emit(Action::ArmTimer {
        timer: Timer::KubeRetry {
            key: key.clone(),
            uid,
        },
        after_ms,
    });
}

/// The kube-retry timer re-opens the writer.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    match e.writer.state {
        WriteState::Backoff => e.writer.state = WriteState::Idle,
        WriteState::Idle | WriteState::Waiting(_) | WriteState::Out(_) | WriteState::Superseded => {
        }
    }
    s.touched.insert(key);
}
