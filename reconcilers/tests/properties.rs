//! Property tests: random startup inventories and random event sequences with random faults,
//! driven through the testkit World. A reference model (`reference/`), fed the same events the
//! core is fed, judges every action the core emits and the settled world at the end; the
//! World checks "one VM operation in flight per pod" on every feed; the tests add
//! determinism, collection of gone pods, and convergence.

mod reference;

use proptest::prelude::*;
use reconcilers::action::{Action, Timer};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::config::{Config, OrphanPolicy};
use reconcilers::event::{Envelope, Event, KubeErrorKind};
use reconcilers::keys;
use reconcilers::pod::{PodKey, PodView};
use reconcilers::testkit::{op_of, pod, vm, World};
use reconcilers::{reduce, State};
use reference::Reference;

#[derive(Clone, Debug)]
enum Op {
    Add(u8, bool),
    Delete(u8),
    Remove(u8),
    Crash(u8),
    Vanish(u8),
    Fault(u8, bool),
    KubeFault(u8),
    Advance(u16),
    Relist,
    Settle,
    /// Runs the n-th waiting effect (modulo how many wait) and nothing else, so outcomes come
    /// back in another order than the core asked, as the shell's concurrent effects may.
    Step(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..6u8, any::<bool>()).prop_map(|(i, c)| Op::Add(i, c)),
        1 => (0..6u8).prop_map(Op::Delete),
        1 => (0..6u8).prop_map(Op::Remove),
        1 => (0..6u8).prop_map(Op::Crash),
        1 => (0..6u8).prop_map(Op::Vanish),
        2 => (0..7u8, any::<bool>()).prop_map(|(v, g)| Op::Fault(v, g)),
        1 => (0..6u8).prop_map(Op::KubeFault),
        2 => (1..20_000u16).prop_map(Op::Advance),
        1 => Just(Op::Relist),
        2 => Just(Op::Settle),
    ]
}

/// The same world, with effects run one at a time in a random order.
fn op_reordered() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..6u8, any::<bool>()).prop_map(|(i, c)| Op::Add(i, c)),
        1 => (0..6u8).prop_map(Op::Delete),
        1 => (0..6u8).prop_map(Op::Remove),
        1 => (0..6u8).prop_map(Op::Crash),
        1 => (0..6u8).prop_map(Op::Vanish),
        2 => (0..7u8, any::<bool>()).prop_map(|(v, g)| Op::Fault(v, g)),
        1 => (0..6u8).prop_map(Op::KubeFault),
        8 => any::<u8>().prop_map(Op::Step),
        1 => (1..20_000u16).prop_map(Op::Advance),
        1 => Just(Op::Relist),
        1 => Just(Op::Settle),
    ]
}

const VERBS: [&str; 7] = [
    "vm run",
    "vm clone",
    "vm inspect",
    "vm rm",
    "vm start",
    "image pull",
    "snapshot inspect",
];

fn key(i: u8) -> PodKey {
    PodKey::new("default", format!("p{i}"))
}

fn new_pod(i: u8, clone: bool, gen: u32) -> PodView {
    let mut b = pod("default", &format!("p{i}"))
        .managed()
        .uid(&format!("u{i}-{gen}"));
    // One pod of the six is a managed macOS guest (C14), whatever its mode says.
    if i == 5 {
        b = b.annotation(keys::OS, "macos");
    }
    if clone {
        b.clone_of("acme/agent")
    } else {
        b.run("ubuntu:24.04")
    }
    .build()
}

/// Startup inventory: pods with a VM found by id, by name, or none; orphan VMs.
#[derive(Clone, Debug)]
struct Inventory {
    policy: u8,
    pods: Vec<u8>,
    orphans: u8,
}

fn inventory() -> impl Strategy<Value = Inventory> {
    (0..3u8, prop::collection::vec(0..3u8, 0..4), 0..3u8).prop_map(|(policy, pods, orphans)| {
        Inventory {
            policy,
            pods,
            orphans,
        }
    })
}

fn world(inv: &Inventory) -> World {
    let policy = [
        OrphanPolicy::Destroy,
        OrphanPolicy::Alert,
        OrphanPolicy::Keep,
    ][inv.policy as usize];
    let mut w = World::new(Config {
        orphan_policy: policy,
        macos_vnc: true,
        ..Config::default()
    });
    w.cocoon
        .add_snapshot("acme/agent", "cloud-hypervisor", "base:1");
    let (mut pods, mut vms) = (vec![], vec![]);
    for (i, how) in inv.pods.iter().enumerate() {
        let i = i as u8 + 10;
        let id = format!("OLD{i}");
        let mut p = new_pod(i, false, 0);
        p.annotations
            .insert(keys::LIFECYCLE_STATE.into(), "ready".into());
        match how {
            0 => {
                p.annotations.insert(keys::VM_ID.into(), id.clone());
                vms.push(vm(&id, &format!("vk-p{i}")).build());
            }
            1 => {
                vms.push(vm(&id, &format!("vk-p{i}")).build());
            }
            _ => {}
        }
        pods.push(p);
    }
    for o in 0..inv.orphans {
        let id = format!("ORPH{o}");
        vms.push(vm(&id, &format!("orphan-{o}")).build());
    }
    w.start(pods, vms);
    w
}

fn apply_op(w: &mut World, gens: &mut [u32; 6], op: &Op) {
    match *op {
        Op::Add(i, clone) => {
            if !w.api.pods.contains_key(&key(i)) {
                gens[i as usize] += 1;
                w.apply(new_pod(i, clone, gens[i as usize]));
            }
        }
        Op::Delete(i) => {
            w.delete_pod(&key(i));
        }
        Op::Remove(i) => {
            w.remove_pod(&key(i));
        }
        Op::Crash(i) | Op::Vanish(i) => {
            let id = w
                .cocoon
                .vms
                .values()
                .find(|v| v.name == format!("vk-p{i}"))
                .map(|v| v.id.clone());
            if let Some(id) = id {
                if matches!(op, Op::Crash(_)) {
                    w.crash(&id);
                } else {
                    w.vanish(&id);
                }
            }
        }
        Op::Fault(v, garbage) => {
            let verb = VERBS[v as usize];
            if garbage {
                w.cocoon.garbage_next(verb)
            } else {
                w.cocoon.fail_next(verb, "Error: injected: i/o timeout")
            }
        }
        Op::KubeFault(i) => w.api.fail_next(&key(i), KubeErrorKind::Other),
        Op::Advance(ms) => w.run_for(ms as u64),
        Op::Relist => w.relist(),
        Op::Settle => w.settle(),
        Op::Step(n) => {
            let waiting: Vec<u64> = w.pending().filter_map(op_of).collect();
            if !waiting.is_empty() {
                w.exec_op(waiting[n as usize % waiting.len()]);
            }
        }
    }
}

fn converged(w: &World) -> Result<(), String> {
    for (k, p) in &w.api.pods {
        let ready = p
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let failed = p.status.reason.as_deref() == Some("ProviderFailed")
            || p.annotation(keys::LIFECYCLE_STATE) == Some("failed")
            || p.status.phase == "Failed";
        let evict_kept = w.counters.contains_key("pod_evict_failure");
        if p.deletion_timestamp.is_some() {
            return Err(format!("{k} still terminating"));
        }
        if !(ready || failed || evict_kept) {
            return Err(format!(
                "{k} neither Ready nor failed: {:?} lifecycle={:?}",
                p.status.phase,
                p.annotation(keys::LIFECYCLE_STATE)
            ));
        }
    }
    for (k, e) in w.state.pods.sorted() {
        match w.api.pods.get(k) {
            Some(p) if p.uid == e.pod.uid => {}
            _ => return Err(format!("{k}: state kept after the pod is gone")),
        }
    }
    Ok(())
}

/// Two fresh States give the journaled actions; so does a State restored from a JSON
/// snapshot taken halfway (what a rotated journal file's header holds), so no hash order or
/// insertion history inside the State can reach an action.
fn replay_identical(w: &World) -> Result<(), String> {
    let mut a = State::new(w.state.config.clone());
    let mut b = State::new(w.state.config.clone());
    let mut restored: Option<State> = None;
    for (i, (env, logged)) in w.log.iter().enumerate() {
        if i == w.log.len() / 2 {
            let snapshot = serde_json::to_string(&a).unwrap();
            restored = Some(serde_json::from_str(&snapshot).unwrap());
        }
        let x = serde_json::to_string(&reduce(&mut a, env.clone())).unwrap();
        let y = serde_json::to_string(&reduce(&mut b, env.clone())).unwrap();
        let z = serde_json::to_string(logged).unwrap();
        if x != y || x != z {
            return Err(format!("seq {}: actions differ on replay", env.seq));
        }
        if let Some(c) = restored.as_mut() {
            if serde_json::to_string(&reduce(c, env.clone())).unwrap() != z {
                return Err(format!(
                    "seq {}: a restored snapshot acts differently",
                    env.seq
                ));
            }
        }
    }
    Ok(())
}

/// `cases` runs, with the seeds of failures found once kept in
/// reconcilers/proptest-regressions/ and replayed first on every run (cargo runs tests from
/// the crate directory).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/properties.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn random_runs_keep_the_invariants(inv in inventory(), ops in prop::collection::vec(op(), 1..40)) {
        keeps_the_invariants(&inv, &ops)?;
    }
}

proptest! {
    // Fewer cases than the first property, so the whole file runs about as long as that
    // property did alone.
    #![proptest_config(config(48))]

    #[test]
    fn reordered_outcomes_keep_the_invariants(inv in inventory(), ops in prop::collection::vec(op_reordered(), 1..40)) {
        keeps_the_invariants(&inv, &ops)?;
    }
}

/// Drives the core and the reference model with `ops` after a startup from `inv`, checking
/// the model's rules after every op, then lets the world settle and checks it.
fn keeps_the_invariants(inv: &Inventory, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = world(inv);
    let mut model = Reference::new(w.state.config.orphan_policy);
    model.catch_up(&w);
    let listed = inv.orphans as usize + inv.pods.iter().filter(|h| **h < 2).count();
    prop_assert_eq!(model.inventory.len(), listed);
    let mut gens = [0u32; 6];
    for op in ops {
        apply_op(&mut w, &mut gens, op);
        model.catch_up(&w);
        prop_assert!(
            model.violations.is_empty(),
            "after {:?}: {:?}",
            op,
            model.violations
        );
    }
    // Faults stop; the world gets time to converge (delete retries back off to 60 s).
    w.cocoon.faults.clear();
    w.api.faults.clear();
    w.run_for(15 * 60 * 1000);
    model.catch_up(&w);
    prop_assert!(
        model.violations.is_empty(),
        "settling: {:?}",
        model.violations
    );
    prop_assert!(w.violations.is_empty(), "{:?}", w.violations);
    // Faults, reorders and restarts are all outcomes the core expects: none is unexpected.
    let unexpected: Vec<&String> = w
        .log
        .iter()
        .flat_map(|(_, acts)| acts)
        .filter_map(|a| match a {
            reconcilers::Action::Log { message, .. }
                if message.starts_with("unexpected outcome") =>
            {
                Some(message)
            }
            _ => None,
        })
        .collect();
    prop_assert!(unexpected.is_empty(), "{:?}", unexpected);
    prop_assert!(converged(&w).is_ok(), "{:?}", converged(&w));
    prop_assert!(model.settled(&w).is_ok(), "{:?}", model.settled(&w));
    prop_assert!(replay_identical(&w).is_ok(), "{:?}", replay_identical(&w));
    Ok(())
}

/// A running world with pod p0 Ready on its VM, and the model caught up with it.
fn running_p0() -> (World, Reference, String) {
    let mut w = world(&Inventory {
        policy: 1,
        pods: vec![],
        orphans: 1,
    });
    w.apply(new_pod(0, false, 1));
    w.run_for(2_000);
    let mut model = Reference::new(w.state.config.orphan_policy);
    model.catch_up(&w);
    assert!(model.violations.is_empty(), "{:?}", model.violations);
    let id = w
        .cocoon
        .vms
        .values()
        .find(|v| v.name == "vk-p0")
        .expect("p0's VM")
        .id
        .clone();
    (w, model, id)
}

/// The core answering a timer with `actions`, as a core with a defect would.
fn emit(w: &mut World, actions: Vec<Action>) {
    let seq = w.log.last().map_or(1, |(e, _)| e.seq + 1);
    let env = Envelope {
        seq,
        at: w.now,
        event: Event::TimerFired {
            timer: Timer::Sweep,
        },
    };
    w.log.push((env, actions));
}

fn rm(op: u64, key: Option<PodKey>, id: &str) -> Action {
    Action::RunCocoon {
        op,
        key,
        cmd: CocoonCmd::VmRm { id: id.into() },
    }
}

/// The model named a violation containing `what`.
fn assert_refused(model: &Reference, what: &str) {
    let all = model.violations.join("\n");
    assert!(
        all.contains(what),
        "no violation naming {what:?} in:\n{all}"
    );
}

#[test]
fn the_model_refuses_removing_a_vm_its_pod_is_entitled_to() {
    let (mut w, mut model, id) = running_p0();
    emit(&mut w, vec![rm(9_000, Some(key(0)), &id)]);
    model.catch_up(&w);
    assert_refused(&model, "still entitled");
}

#[test]
fn the_model_refuses_removing_an_orphan_it_keeps() {
    let (mut w, mut model, _) = running_p0();
    emit(&mut w, vec![rm(9_000, None, "ORPH0")]);
    model.catch_up(&w);
    assert_refused(&model, "orphan under Alert");
}

#[test]
fn the_model_refuses_a_vm_for_a_deleting_pod_and_two_operations_at_once() {
    let (mut w, mut model, id) = running_p0();
    w.delete_pod(&key(0));
    model.catch_up(&w);
    let run = Action::RunCocoon {
        op: 9_001,
        key: Some(key(0)),
        cmd: CocoonCmd::VmStart { id: id.clone() },
    };
    let mut create = w
        .log
        .iter()
        .flat_map(|(_, a)| a)
        .find(|a| {
            matches!(
                a,
                Action::RunCocoon {
                    cmd: CocoonCmd::VmRun { .. },
                    ..
                }
            )
        })
        .expect("p0 was run")
        .clone();
    if let Action::RunCocoon { op, .. } = &mut create {
        *op = 9_002;
    }
    emit(&mut w, vec![run, create]);
    model.catch_up(&w);
    assert_refused(&model, "which is deleting");
    assert_refused(&model, "VM operations in flight");
}

#[test]
fn the_settled_check_finds_a_leaked_vm() {
    let (mut w, mut model, id) = running_p0();
    w.remove_pod(&key(0));
    // The core forgets the pod and leaves its VM behind.
    let keep = w.cocoon.vms[&id].clone();
    w.run_for(60_000);
    w.cocoon.add_vm(keep);
    model.catch_up(&w);
    let verdict = model.settled(&w);
    assert!(verdict.is_err(), "a leaked VM passed");
}
