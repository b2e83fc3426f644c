//! Trust between pods (T1–T3): a pod may only touch its own VM and snapshots. A VM name is
//! held by the pod that holds its VM, is bringing one up, or keeps its hibernated state; any
//! other pod naming it is refused before it can adopt, remove or snapshot anything of it. A
//! fork copies another VM, so its source must be a VM a pod of the same namespace runs here.

use crate::phase::{Phase, Purpose};
use crate::pod::PodKey;
use crate::state::State;

/// Whether a pod in this phase holds its VM name (and so the VM, `<vm>` and `fork-<vm>`).
fn holds_name(phase: &Phase) -> bool {
    match phase {
        Phase::Creating(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_) => true,
        // A failed wake still owns the hibernated state it is trying to bring back.
        Phase::Failed(f) => f.purpose != Purpose::Fresh,
        Phase::Waiting | Phase::Terminal(_) | Phase::Gone(_) => false,
    }
}

/// T1: another pod that holds VM name `name`, if any (the smallest key when several do).
pub(crate) fn name_holder(s: &State, key: &PodKey, name: &str) -> Option<PodKey> {
    if let Some(k) = s.vm_names.get(name).filter(|k| *k != key) {
        return Some(k.clone());
    }
    s.pods
        .first_where(|k, e| {
            k != key
                && e.spec
                    .as_ref()
                    .is_ok_and(|sp| sp.managed && sp.vm_name == name)
                && holds_name(&e.phase)
        })
        .cloned()
}

/// T1: the refusal when `name` is another pod's.
pub(crate) fn name_taken(s: &State, key: &PodKey, name: &str) -> Option<String> {
    let other = name_holder(s, key, name)?;
    Some(format!(
        "VM name {name:?} belongs to pod {other}; give this pod another vm.cocoonstack.io/name"
    ))
}

/// T5: `fork-` names the fork snapshots (`fork-<vm>`, C9), so a managed pod's VM may not take
/// it: its saves would land on, and its removals reach, another VM's fork snapshot.
pub(crate) fn fork_prefix(name: &str) -> Option<String> {
    name.starts_with(crate::names::FORK_PREFIX).then(|| {
        format!(
            "VM name {name:?} starts with {:?}, which is kept for fork snapshots; give this pod another vm.cocoonstack.io/name",
            crate::names::FORK_PREFIX
        )
    })
}

/// T4: `clone-from-dir` reads a host directory into a guest, so only one under the node's
/// configured root; the shell then checks that the path resolves to itself (no symlinks).
pub(crate) fn from_dir_refused(s: &State, dir: &str) -> Option<String> {
    let Some(root) = s.config.clone_from_dir_root.as_deref() else {
        return Some(format!(
            "clone-from-dir {dir}: refused on this node (VK_CLONE_FROM_DIR_ROOT is not set)"
        ));
    };
    let path = std::path::Path::new(dir);
    match path != std::path::Path::new(root) && path.starts_with(root) {
        true => None,
        false => Some(format!(
            "clone-from-dir {dir}: not under {root}, the node's VK_CLONE_FROM_DIR_ROOT"
        )),
    }
}

/// T2: a fork's source must be a VM that a pod of this pod's namespace runs on this node.
pub(crate) fn fork_refused(s: &State, key: &PodKey, source: &str) -> Option<String> {
    match s.vm_names.get(source) {
        Some(holder) if holder.namespace() == key.namespace() => None,
        Some(_) => Some(format!(
            "fork-from {source:?}: that VM belongs to a pod of another namespace"
        )),
        None => Some(format!(
            "fork-from {source:?}: no pod of namespace {} runs that VM on this node",
            key.namespace()
        )),
    }
}
