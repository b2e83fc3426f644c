//! Startup reconcile (B1–B8): once both the pod relist and `cocoon vm list` are
//! complete — never before — adopt by id, then by name, and apply the orphan policy.

use std::collections::BTreeSet;

use crate::action::{Action, Counter, Level};
use crate::cocoon::CocoonCmd;
use crate::config::OrphanPolicy;
use crate::keys;
use crate::pod::PodKey;
use crate::state::{CocoonOwner, Startup, State};
use crate::trust::{self, Moment};
use crate::{create, delete, intake};

pub fn try_start(s: &mut State) {
    // Both the relist and the first `cocoon vm list` must be complete (B1).
    let listed = matches!(s.startup, Startup::Waiting { inventory: Some(_) });
    if !listed || !s.relist.complete_once {
        return;
    }
    // B1: managed macOS pods need cocoon-macos's own listing first.
    if !crate::macos::inventory_ready(s) {
        return;
    }
    let vms = match std::mem::replace(&mut s.startup, Startup::Started) {
        Startup::Waiting { inventory } => inventory.unwrap_or_default(),
        Startup::Started => Vec::new(),
    };
    let macos_vms = crate::macos::take_inventory(s);
    let now = s.now;
    s.node_vms.seed(&vms, now);
    // B3: records still `creating` are settled first and never enter the adoption index.
    let (stale, vms): (Vec<_>, Vec<_>) = vms.into_iter().partition(|v| v.is_creating());
    for vm in &stale {
        crate::stale_create::begin(s, vm);
    }
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    // T3: when pods contest a VM, the oldest claims it first (then key order), so a pod made
    // later to name another's VM never wins it. T10: unmanaged pods come after every managed
    // one, so naming a managed pod's VM never takes it away.
    let mut keys: Vec<PodKey> = s.pods.keys();
    keys.sort_by_key(|k| {
        let e = &s.pods[k];
        (
            e.spec.as_ref().is_ok_and(|sp| !sp.managed),
            e.pod.creation_timestamp.unwrap_or(i64::MAX),
            k.clone(),
        )
    });
    for key in &keys {
        claim_at_startup(s, key, &vms, &macos_vms, &mut claimed);
    }
    for vm in vms.iter().filter(|v| !claimed.contains(&v.id)) {
        // T11: a VM that pods name but none may take is left alone, never an orphan.
        match named_by_a_pod(s, &vm.name) {
            true => s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "VM {} ({}) is named by pods that may not take it; leaving it alone",
                    vm.name, vm.id
                ),
            }),
            false => orphan(s, vm),
        }
    }
    s.emit(Action::RegisterNode);
    crate::sweep::arm(s);
}

/// T11: the holder records a restarted process read back from its journal. They come first,
/// before the startup claim can read them; later they would overwrite what this process
/// recorded, so they are refused then.
pub fn holders_restored(s: &mut State, holders: crate::holders::Holders, problem: Option<String>) {
    if s.started() {
        return crate::outcome::unexpected(s, "holder records restored after startup");
    }
    let count = holders.len();
    s.holders = holders;
    let (level, message) = match problem {
        None => (
            Level::Info,
            format!("{count} VM holder records read back from the journal"),
        ),
        Some(p) => (
            Level::Warn,
            format!(
                "{count} VM holder records read back; they may be incomplete ({p}): a VM without a record is handed to no pod of another namespace"
            ),
        ),
    };
    s.emit(Action::Log { level, message });
}

/// Whether a managed pod on this node that is not finished names VM `name`.
fn named_by_a_pod(s: &State, name: &str) -> bool {
    s.pods
        .first_where(|_, e| {
            !e.pod.is_terminal()
                && e.spec
                    .as_ref()
                    .is_ok_and(|sp| sp.managed && sp.vm_name == name)
        })
        .is_some()
}

/// B4–B11 for one pod: its VM found by id, then by name (T3: `claimed` holds the VMs older
/// pods took), resumed or handed to its delete; or, without one, taken in as new.
fn claim_at_startup(
    s: &mut State,
    key: &PodKey,
    vms: &[crate::vm::VmRecord],
    macos_vms: &[crate::vm::VmRecord],
    claimed: &mut BTreeSet<String>,
) {
    let e = &s.pods[key];
    if e.pod.is_terminal() {
        intake::intake(s, key);
        return;
    }
    let deleting = e.pod.deletion_timestamp.is_some();
    let Ok(spec) = e.spec.clone() else {
        intake::intake(s, key);
        return;
    };
    if !spec.managed {
        // C5: vk does not run this VM, but it is someone's: never an orphan (B8), also
        // while its pod is being deleted (D1).
        for vm in vms
            .iter()
            .filter(|v| spec.static_id.as_deref() == Some(v.id.as_str()) || v.name == spec.vm_name)
        {
            claimed.insert(vm.id.clone());
        }
        intake::intake(s, key);
        return;
    }
    // B1: split off to cocoon-macos (C14); never matched against cocoon's list.
    if spec.os == crate::spec::Os::Macos {
        crate::macos::startup_pod(s, key, macos_vms);
        return;
    }
    let id = e
        .pod
        .annotation(keys::VM_ID)
        .map(str::to_string)
        .filter(|i| !i.is_empty());
    // T11: the VM carrying the pod's VM name is its only candidate (an `id` annotation is
    // the pod's to write, so it claims nothing), and the holder records decide.
    let candidate = vms
        .iter()
        .find(|v| v.name == spec.vm_name && !claimed.contains(&v.id));
    let found = match candidate.map(|vm| (vm, trust::may_take(s, key, vm, Moment::Startup))) {
        Some((vm, Ok(()))) => Some(vm),
        Some((vm, Err(why))) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("pod {key}: VM {} is not resumed for it: {why}", vm.id),
            });
            None
        }
        None => None,
    };
    if found.is_some_and(|vm| id.as_deref() != Some(vm.id.as_str())) {
        s.emit(Action::Count {
            counter: Counter::ReconcileAdoptByName,
        });
    }
    if let Some(vm) = found {
        claimed.insert(vm.id.clone());
        if deleting {
            // B11: the delete goes on with the VM, its snapshot first (D4).
            delete::resume(s, key, vm.clone());
        } else {
            create::resume(s, key, vm.clone());
            resume_hibernate(s, key);
        }
    } else if deleting {
        intake::intake(s, key);
    } else {
        if let (Some(id), None) = (id, candidate) {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "pod {key}: VM {id} is not in the runtime list; it will be recreated"
                ),
            });
        }
        intake::intake(s, key);
    }
}

/// B9: a pod still asked to hibernate that has its VM re-runs the hibernate.
fn resume_hibernate(s: &mut State, key: &PodKey) {
    if !crate::hibernate::wanted(s, key) {
        return;
    }
    let Some(uid) = s.pod(key).map(|e| e.pod.uid.clone()) else {
        return;
    };
    s.emit(Action::Count {
        counter: Counter::StartupResume {
            op: crate::labels::ResumeOp::Hibernate,
        },
    });
    s.emit(Action::RecordEvent {
        source: crate::action::EventSource::Vk,
        key: key.clone(),
        uid,
        kind: crate::action::EventType::Normal,
        reason: "ResumedAfterRestart".into(),
        message: "reconcile: resuming the hibernate".into(),
    });
    crate::hibernate::begin(s, key, 0);
}

/// A VM no pod claims (B8). A `creating` placeholder goes through stale-create (B3) instead:
/// it may belong to a create that is still running.
pub(crate) fn orphan(s: &mut State, vm: &crate::vm::VmRecord) {
    if vm.is_creating() {
        crate::stale_create::begin(s, vm);
        return;
    }
    // D10: kept after an eviction its tenant did not ask for, for the namespace's next pod.
    if s.holders.get(&vm.name).is_some_and(|h| h.kept) {
        s.emit(Action::Log {
            level: Level::Info,
            message: format!(
                "VM {} ({}) was kept after its pod's eviction: leaving it for the pod that replaces it",
                vm.name, vm.id
            ),
        });
        s.unclaimed.insert(vm.name.clone(), vm.clone());
        return;
    }
    match s.config.orphan_policy {
        OrphanPolicy::Destroy => {
            s.emit(Action::Log {
                level: Level::Info,
                message: format!(
                    "orphan VM {} ({}) has no pod: removing it (VK_ORPHAN_POLICY=destroy)",
                    vm.name, vm.id
                ),
            });
            let owner = CocoonOwner::Detached {
                what: format!("remove orphan VM {}", vm.id),
                release: crate::dhcp::release_mac(vm),
            };
            s.run_cocoon(owner, None, CocoonCmd::VmRm { id: vm.id.clone() });
        }
        OrphanPolicy::Alert => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "orphan VM {} ({}) has no pod: leaving it (VK_ORPHAN_POLICY=alert)",
                    vm.name, vm.id
                ),
            });
            s.emit(Action::Count {
                counter: Counter::OrphanVm,
            });
            s.unclaimed.insert(vm.name.clone(), vm.clone());
        }
        OrphanPolicy::Keep => {
            s.unclaimed.insert(vm.name.clone(), vm.clone());
        }
    }
}
