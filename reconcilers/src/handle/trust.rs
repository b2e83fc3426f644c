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
        "VM name {name:?} belongs to {}; give this pod another vm.cocoonstack.io/name",
        holder_words(key, &other)
    ))
}

/// How a refusal names the pod that holds what `key` asked for: a pod of the same namespace
/// by name, any other only as "a pod of another namespace" (a refusal must not tell a tenant
/// what another namespace runs).
pub(crate) fn holder_words(key: &PodKey, holder: &PodKey) -> String {
    match holder.namespace() == key.namespace() {
        true => format!("pod {holder}"),
        false => "a pod of another namespace".to_string(),
    }
}

/// T5: `fork-` names the fork snapshots (`fork-<vm>`, C9) and `kept-` the copies of deleted
/// VMs (D9), so a managed pod's VM may not take either: its saves would land on, and its
/// removals reach, another VM's snapshot.
pub(crate) fn fork_prefix(name: &str) -> Option<String> {
    let (prefix, what) = [
        (crate::names::FORK_PREFIX, "fork snapshots"),
        (
            crate::names::KEPT_PREFIX,
            "the snapshots the daemon keeps of deleted VMs",
        ),
    ]
    .into_iter()
    .find(|(p, _)| name.starts_with(p))?;
    Some(format!(
        "VM name {name:?} starts with {prefix:?}, which is kept for {what}; give this pod another vm.cocoonstack.io/name"
    ))
}

/// T15: a VM, its local snapshot and its registry repository share the name, so a VM named
/// after a public base would save and push over the base every tenant clones from.
fn public_base(s: &State, vm_name: &str) -> Option<String> {
    s.config.bases().lists(vm_name).then(|| {
        format!(
            "VM name {vm_name:?} is a public base's, which no pod's VM may take; give this pod another vm.cocoonstack.io/name"
        )
    })
}

/// T5, T12, T14, T15: a VM name of the daemon's own or of a public base, an image URL the
/// node does not fetch from, or a network the pod's namespace may not join; refused for good
/// whatever path the pod takes.
pub(crate) fn spec_refused(s: &State, key: &PodKey, spec: &crate::spec::VmSpec) -> Option<String> {
    fork_prefix(&spec.vm_name)
        .or_else(|| public_base(s, &spec.vm_name))
        .or_else(|| image_url_refused(s, &spec.image))
        .or_else(|| {
            spec.network
                .as_deref()
                .and_then(|n| network_refused(s, key, n))
        })
}

/// T12: an `http(s)://` image makes the host fetch that URL from the node's network, so only
/// from a host the node's configuration lists; `Some` says why not.
pub(crate) fn image_url_refused(s: &State, image: &str) -> Option<String> {
    let rest = image
        .strip_prefix("https://")
        .or_else(|| image.strip_prefix("http://"))?;
    let allowed = s.config.image_url_hosts.as_ref()?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        // The URL is not repeated: it would put the credentials in an Event.
        return Some(
            "image: a URL with credentials in it is refused; the node fetches images with its own"
                .to_string(),
        );
    }
    let authority = authority.to_ascii_lowercase();
    // `host:port`, `[v6]:port`, or a bare host.
    let host = match authority.rsplit_once(':') {
        Some((h, port))
            if !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!h.contains(':') || h.ends_with(']')) =>
        {
            h
        }
        _ => authority.as_str(),
    };
    let listed = allowed.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        a == "*" || a == authority || (!a.contains(':') && a == host)
    });
    match listed {
        true => None,
        false if allowed.is_empty() => Some(format!(
            "image {image:?}: this node fetches no image by URL (VK_IMAGE_URL_HOSTS is empty and OCI_REGISTRY is unset)"
        )),
        false => Some(format!(
            "image {image:?}: host {authority:?} is not one this node fetches images from (VK_IMAGE_URL_HOSTS: {})",
            allowed.join(",")
        )),
    }
}

/// T14: a named network is joined only when the node's configuration lists it for the pod's
/// namespace (or for every namespace); `Some` says why not, naming only the pod's own list.
pub(crate) fn network_refused(s: &State, key: &PodKey, network: &str) -> Option<String> {
    let lists = s.config.networks.as_ref()?;
    let mine = lists.get(key.namespace());
    let all = lists.get("*");
    let listed = mine.into_iter().chain(all).flatten().any(|n| n == network);
    if listed {
        return None;
    }
    let allowed: Vec<&str> = mine
        .into_iter()
        .chain(all)
        .flatten()
        .map(String::as_str)
        .collect();
    Some(match allowed.is_empty() {
        true => format!(
            "network {network:?}: pods of namespace {} join only the node's default network here (VK_NETWORKS)",
            key.namespace()
        ),
        false => format!(
            "network {network:?} is not one pods of namespace {} may join here (VK_NETWORKS lists {} for it)",
            key.namespace(),
            allowed.join(",")
        ),
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

/// When a VM is handed to a pod that names it: at the startup claim, or later (an orphan
/// kept under `alert`/`keep`, a create that committed while the process was down, the VM
/// found after "name already exists").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moment {
    Startup,
    Later,
}

/// T11: whether pod `key` may take VM `vm`, which carries its VM name, on the word of the
/// holder records; `Err` says why not, naming nothing of another namespace.
pub(crate) fn may_take(
    s: &State,
    key: &PodKey,
    vm: &crate::vm::VmRecord,
    moment: Moment,
) -> Result<(), String> {
    use crate::holders::{grant, Grant};
    let Some(uid) = s.pod(key).map(|e| e.pod.uid.as_str()) else {
        return Err(format!("pod {key} is not known"));
    };
    let record = s.holders.of_vm(&vm.name, &vm.id);
    let name = &vm.name;
    match grant(record, (key, uid), s.tenant(key)) {
        Grant::Holder => Ok(()),
        // A successor in the holder's namespace, once the holder itself is gone.
        Grant::Namespace => match record.and_then(|h| live_pod(s, &h.uid)) {
            Some(other) if &other != key => Err(format!(
                "VM name {name:?} is held for pod {other}; give this pod another vm.cocoonstack.io/name"
            )),
            Some(_) | None => Ok(()),
        },
        Grant::Refused => Err(format!(
            "VM name {name:?} is held on this node for a pod of another namespace; give this pod another vm.cocoonstack.io/name"
        )),
        // Made before holders were recorded (or the journal was lost): at the startup claim a
        // VM only pods of one namespace name goes to them; anything else waits for an operator.
        Grant::Unrecorded => match moment {
            Moment::Startup if namers_in_one_namespace(s, key, name) => Ok(()),
            Moment::Startup => Err(format!(
                "VM {name:?} has no holder record and pods of more than one namespace name it; it is left alone until an operator removes the pods that are not its own"
            )),
            Moment::Later => Err(format!(
                "VM {name:?} on this node has no holder record, so it is not handed to any pod; an operator removes it (cocoon vm rm) for this pod to make its own"
            )),
        },
    }
}

/// The pod with UID `uid`, if the node still has it.
fn live_pod(s: &State, uid: &str) -> Option<PodKey> {
    s.pods
        .first_where(|_, e| e.pod.uid == uid && !e.phase.object_gone())
        .cloned()
}

/// Whether every managed pod on the node that names VM `name` is in `key`'s namespace.
fn namers_in_one_namespace(s: &State, key: &PodKey, name: &str) -> bool {
    s.pods
        .first_where(|k, e| {
            k.namespace() != key.namespace()
                && !e.pod.is_terminal()
                && e.spec
                    .as_ref()
                    .is_ok_and(|sp| sp.managed && sp.vm_name == name)
        })
        .is_none()
}
