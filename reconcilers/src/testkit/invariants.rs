//! Invariants the world checks on every feed, so any test that drives it — a scenario, a
//! property run, a benchmark's generator — also proves them. Breaches are collected in
//! `World::violations`, not panicked on, so a property test can shrink the failing run.
//!
//! The judgement comes from what the core was told (the log, the fake API and cocoon), never
//! from the core's own state, so a check cannot agree with the core by construction. The
//! property test's reference model (`tests/reference/`) holds the fuller rules.

use std::collections::BTreeMap;

use crate::action::{Action, OpId};
use crate::cocoon::CocoonCmd;
use crate::event::{CocoonOk, Event, VmEventKind};
use crate::keys;
use crate::pod::{PodKey, PodView};

use super::World;

/// Each pod incarnation the core was told of, by UID: its newest view, or `None` once it is
/// gone (deleted, replaced by a new UID under its name, or left out of a complete relist).
fn told(w: &World) -> BTreeMap<&str, Option<&PodView>> {
    let mut seen: BTreeMap<&str, Option<&PodView>> = BTreeMap::new();
    let mut current: BTreeMap<PodKey, &str> = BTreeMap::new();
    let mut relisted: Option<Vec<PodKey>> = None;
    for (env, _) in &w.log {
        match &env.event {
            Event::PodApplied { pod } | Event::PodRelistItem { pod } => {
                if let Some(r) = relisted.as_mut() {
                    r.push(pod.key());
                }
                if let Some(old) = current.insert(pod.key(), &pod.uid) {
                    if old != pod.uid {
                        seen.insert(old, None);
                    }
                }
                let view = seen.entry(&pod.uid).or_insert(Some(pod));
                if view.is_some() {
                    *view = Some(pod);
                }
            }
            Event::PodDeleted { pod } => {
                seen.insert(&pod.uid, None);
                current.remove(&pod.key());
            }
            Event::PodRelistBegin => relisted = Some(Vec::new()),
            Event::PodRelistEnd => {
                let listed = relisted.take().unwrap_or_default();
                current.retain(|k, uid| {
                    let keep = listed.contains(k);
                    if !keep {
                        seen.insert(uid, None);
                    }
                    keep
                });
            }
            _ => {}
        }
    }
    seen
}

/// A pod still wants its VM while it is managed, present, not deleting, not finished and not
/// asked to hibernate (P2, D5, U3).
pub fn wants_vm(p: &PodView) -> bool {
    p.flag(keys::MANAGED)
        && p.deletion_timestamp.is_none()
        && !p.is_terminal()
        && !p.flag(keys::HIBERNATE)
}

/// The VM was reported stopped or gone (W4, W6), or cocoon does not run it.
fn reported_down(w: &World, id: &str) -> bool {
    if !w.cocoon.vms.get(id).is_some_and(|v| v.is_running()) {
        return true;
    }
    let mut calls: BTreeMap<OpId, &CocoonCmd> = BTreeMap::new();
    for (env, actions) in &w.log {
        for a in actions {
            if let Action::RunCocoon { op, cmd, .. } = a {
                calls.insert(*op, cmd);
            }
        }
        let down = match &env.event {
            Event::VmStream { kind, vm } => {
                vm.id == id && (*kind == VmEventKind::Deleted || !vm.is_running())
            }
            Event::CocoonDone { op, result } => match (calls.get(op), result) {
                (Some(CocoonCmd::VmInspect { vm }), Ok(CocoonOk::Vm { vm: rec })) => {
                    vm == id && !rec.is_running()
                }
                (Some(CocoonCmd::VmInspect { vm: x } | CocoonCmd::VmStart { id: x }), Err(_)) => {
                    x == id
                }
                _ => false,
            },
            _ => false,
        };
        if down {
            return true;
        }
    }
    false
}

/// Never a `vm rm` of a running VM whose pod still wants it, for the pod the API names as
/// the VM's holder (`vm.cocoonstack.io/id`). The API and the fake cocoon answer first; only
/// a removal they do not explain is held against everything the core was told, since a
/// scenario may feed the core what the fake world never saw.
pub fn check_actions(w: &mut World, actions: &[Action]) {
    let mut bad = Vec::new();
    for (key, id) in actions.iter().filter_map(|a| match a {
        Action::RunCocoon {
            key,
            cmd: CocoonCmd::VmRm { id },
            ..
        } => Some((key, id)),
        _ => None,
    }) {
        let holders: Vec<&PodView> = match key {
            Some(k) => w.api.pods.get(k).into_iter().collect(),
            None => w.api.pods.values().collect(),
        };
        for p in holders {
            let suspect = p.annotation(keys::VM_ID) == Some(id.as_str())
                && wants_vm(p)
                && w.cocoon.vms.get(id).is_some_and(|v| v.is_running());
            let told = suspect.then(|| told(w));
            let still = told
                .as_ref()
                .and_then(|t| t.get(p.uid.as_str()).copied().flatten())
                .is_some_and(wants_vm);
            if still && !reported_down(w, id) {
                bad.push(format!(
                    "seq {}: vm rm {id} while pod {} still wants its VM",
                    w.seq,
                    p.key()
                ));
            }
        }
    }
    w.violations.extend(bad);
}

/// Whether a command creates, starts, resizes or removes a VM.
fn changes_vm(cmd: &CocoonCmd) -> bool {
    match cmd {
        CocoonCmd::VmRun { .. }
        | CocoonCmd::VmClone { .. }
        | CocoonCmd::VmRm { .. }
        | CocoonCmd::VmStart { .. }
        | CocoonCmd::VmNet { .. }
        | CocoonCmd::MacosRun { .. }
        | CocoonCmd::MacosStart { .. }
        | CocoonCmd::MacosRm { .. } => true,
        CocoonCmd::ImagePull { .. }
        | CocoonCmd::VmInspect { .. }
        | CocoonCmd::VmList
        | CocoonCmd::VmExec { .. }
        | CocoonCmd::SnapshotInspect { .. }
        | CocoonCmd::SnapshotRm { .. }
        | CocoonCmd::SnapshotSave { .. }
        | CocoonCmd::ReconcileStaleCreate { .. }
        | CocoonCmd::MacosImagePull { .. }
        | CocoonCmd::MacosInspect { .. }
        | CocoonCmd::MacosList => false,
    }
}

/// At most one VM-changing command in flight per pod (INV-3).
pub fn check_in_flight(w: &mut World) {
    let mut per_pod: BTreeMap<&PodKey, u32> = BTreeMap::new();
    for a in &w.pending {
        if let Action::RunCocoon {
            key: Some(key),
            cmd,
            ..
        } = a
        {
            if changes_vm(cmd) {
                *per_pod.entry(key).or_default() += 1;
            }
        }
    }
    let bad: Vec<String> = per_pod
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, n)| format!("seq {}: {n} VM operations in flight for {k}", w.seq))
        .collect();
    w.violations.extend(bad);
}
