//! Invariants the world checks on every feed, so any test that drives it — a scenario, a
//! property run, a benchmark's generator — also proves them. Breaches are collected in
//! `World::violations`, not panicked on, so a property test can shrink the failing run.

use std::collections::BTreeMap;

use crate::action::Action;
use crate::cocoon::CocoonCmd;
use crate::pod::PodKey;
use crate::state::{CocoonOwner, PodEntry};

use super::World;

/// A pod still wants its VM unless it is being deleted, is gone, is terminal or is being
/// evicted.
pub fn wants_vm(e: &PodEntry) -> bool {
    e.phase.wants_vm()
}

/// Never a `vm rm` of a VM whose pod still wants it.
pub fn check_actions(w: &mut World, actions: &[Action]) {
    for a in actions {
        let Action::RunCocoon {
            cmd: CocoonCmd::VmRm { id },
            key,
            ..
        } = a
        else {
            continue;
        };
        for (k, e) in w.state.pods.sorted() {
            let holds = e.vm().is_some_and(|v| &v.record.id == id);
            let asked = key.as_ref() == Some(k);
            if (holds || asked) && wants_vm(e) {
                w.violations.push(format!(
                    "seq {}: vm rm {id} while pod {k} still wants its VM",
                    w.seq
                ));
            }
        }
    }
}

/// At most one VM operation in flight per pod.
pub fn check_in_flight(w: &mut World) {
    let mut per_pod: BTreeMap<&PodKey, u32> = BTreeMap::new();
    for a in &w.pending {
        let Action::RunCocoon { op, .. } = a else {
            continue;
        };
        if let Some(CocoonOwner::Pod { key }) = w.state.cocoon_owner(*op) {
            *per_pod.entry(key).or_default() += 1;
        }
    }
    let bad: Vec<String> = per_pod
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, n)| format!("seq {}: {n} VM operations in flight for {k}", w.seq))
        .collect();
    w.violations.extend(bad);
}
