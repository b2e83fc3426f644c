//! Publishing a pod: what the server lacks of the derived status and annotations goes out as
//! one write, one at a time per pod. While a write is in flight nothing else is sent; its
//! outcome touches the pod, and whatever still differs then goes next, so a burst of changes
//! costs one or two writes instead of one each (spec/behavior.md S9/S10, L1–L3).

use crate::action::Action;
use crate::pod::PodKey;
use crate::state::{OpOwner, Publish};
use crate::status::first_probe_pending;
use crate::{annotations, delete, status};

pub(crate) fn sync(p: &mut Publish, key: &PodKey) {
    let e = &*p.entry;
    if !p.started
        || e.gone
        || e.deleted_by_us
        || e.superseded
        || e.kube_backoff
        || e.write_op.is_some()
        || e.delete_op.is_some()
        || first_probe_pending(e)
        // D5–D8: a deleting pod's status waits for its VM's removal, so a quick removal goes
        // straight to Succeeded instead of through a not-ready write; a failed one is
        // published when it comes back.
        || (e.deleting && e.busy.is_some())
    {
        return;
    }
    let status = status::wanted(p.config, e);
    if status.is_none() {
        // The server holds the final status: a deleted pod's object can go (D8).
        delete::finalize(p, key);
        if p.entry.delete_op.is_some() {
            return;
        }
    }
    // A deleting pod's object is about to go: its annotations are not worth a write.
    let annotations = match p.entry.deleting {
        true => Default::default(),
        false => annotations::diff(p.entry),
    };
    if status.is_none() && annotations.is_empty() {
        return;
    }
    let op = p.fx.new_op(OpOwner::Write {
        key: key.clone(),
        status: status.clone(),
        annotations: annotations.clone(),
    });
    p.entry.write_op = Some(op);
    p.fx.emit(Action::PatchPod {
        op,
        key: key.clone(),
        uid: p.entry.pod.uid.clone(),
        status,
        annotations,
    });
}
