//! Routing a Kubernetes write's outcome back to the pod that asked for it.

use crate::action::{Action, Level, OpId, Timer};
use crate::event::{KubeError, KubeErrorKind, KubeOk};
use crate::pod::PodKey;
use crate::state::{OpOwner, State};
use crate::vmevents;

const RETRY_FIRST_MS: u64 = 500;
const RETRY_MAX_MS: u64 = 15_000;

pub fn done(s: &mut State, op: OpId, result: Result<KubeOk, KubeError>) {
    let Some(owner) = s.ops.remove(&op) else {
        return;
    };
    match *owner {
        OpOwner::Write {
            key,
            status,
            annotations,
        } => {
            let Some(e) = s.pods.get_mut(&key) else {
                return;
            };
            if e.write_op != Some(op) {
                return;
            }
            e.write_op = None;
            s.touched.insert(&key);
            match result {
                Ok(ok) => {
                    e.kube_failures = 0;
                    // The echo is the server's whole status; without one it holds what was
                    // pushed.
                    match (ok, &status) {
                        (KubeOk::Status { status: held }, _) => e.pod.status = held,
                        (KubeOk::Done, Some(pushed)) => e.pod.status = pushed.clone(),
                        (KubeOk::Done, None) => {}
                    }
                    if let Some(pushed) = status {
                        // The server changed what we pushed: pushing it again would loop.
                        e.echo_mismatch = (pushed != e.pod.status).then_some(pushed);
                    }
                    for (k, v) in annotations {
                        match v {
                            Some(v) => e.pod.annotations.insert(k, v),
                            None => e.pod.annotations.remove(&k),
                        };
                    }
                }
                Err(err) => {
                    let what = match status {
                        Some(_) => "status",
                        None => "annotation patch",
                    };
                    failed(s, &key, what, err)
                }
            }
        }
        OpOwner::Delete { key } => {
            let Some(e) = s.pods.get_mut(&key) else {
                return;
            };
            e.delete_op = None;
            s.touched.insert(&key);
            match result {
                Ok(_)
                | Err(KubeError {
                    kind: KubeErrorKind::NotFound | KubeErrorKind::Conflict,
                    ..
                }) => {
                    e.deleted_by_us = true;
                    e.gone = true;
                    let uid = e.pod.uid.clone();
                    s.tombstones.insert(uid, key.clone());
                }
                Err(err) => failed(s, &key, "pod delete", err),
            }
        }
        OpOwner::Evict {
            key,
            reason,
            message,
        } => {
            let ok = matches!(
                result,
                Ok(_)
                    | Err(KubeError {
                        kind: KubeErrorKind::NotFound,
                        ..
                    })
            );
            s.touched.insert(&key);
            vmevents::evicted(s, &key, reason, message, ok);
        }
        OpOwner::Vm { .. }
        | OpOwner::StaleCreate { .. }
        | OpOwner::Sweep
        | OpOwner::LeaseRelease { .. }
        | OpOwner::Detached { .. } => {}
    }
}

/// 404/409/422 mean the incarnation was superseded: drop the write. Anything else is retried
/// with backoff; the declarative sync re-derives what to write when the timer fires.
fn failed(s: &mut State, key: &PodKey, what: &str, err: KubeError) {
    let Some(e) = s.pods.get_mut(key) else { return };
    // A 422 on a status write is our own bug (an invalid status), not a superseded pod: it is
    // logged loudly and retried, so a fixed derivation heals it.
    let superseded = match err.kind {
        KubeErrorKind::NotFound | KubeErrorKind::Conflict => true,
        KubeErrorKind::Invalid => what != "status",
        KubeErrorKind::Other => false,
    };
    match superseded {
        true => {
            e.superseded = true;
            s.emit(Action::Log {
                level: Level::Info,
                message: format!("pod {key}: {what} dropped, pod superseded: {}", err.message),
            });
        }
        false => {
            e.kube_failures += 1;
            e.kube_backoff = true;
            let after_ms = (RETRY_FIRST_MS << (e.kube_failures - 1).min(8)).min(RETRY_MAX_MS);
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
    }
}
