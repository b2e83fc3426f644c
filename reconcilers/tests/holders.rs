//! T11 end to end in the fake world: after a restart every VM goes back to exactly the pod that
//! held it, whatever names, ages and namespaces the pods have, and what one namespace deletes
//! touches nothing of another's.

use std::collections::BTreeMap;

use proptest::prelude::*;
use reconcilers::config::Config;
use reconcilers::pod::PodKey;
use reconcilers::testkit::{pod, World};

const NAMESPACES: [&str; 4] = ["team-a", "team-b", "team-c", "team-d"];

/// VM id → the UID of the pod that holds it.
fn held(w: &World) -> BTreeMap<String, String> {
    w.state
        .vm_ids
        .iter()
        .map(|(id, key)| (id.clone(), w.state.pods[key].pod.uid.clone()))
        .collect()
}

fn vm_ids(w: &World) -> Vec<String> {
    w.cocoon.vms.keys().cloned().collect()
}

/// Pods of four namespaces, taken in one at a time in `order`; pod `i` names VM `names[i]`,
/// so pods of different namespaces contest names, and was made at `created[i]`.
fn run_pods(names: &[u8], created: &[u16], order: &[usize]) -> World {
    let mut w = World::new(Config {
        orphan_policy: reconcilers::config::OrphanPolicy::Destroy,
        ..Config::default()
    });
    w.start(vec![], vec![]);
    for &i in order {
        let ns = NAMESPACES[i % NAMESPACES.len()];
        let p = pod(ns, &format!("p{i}"))
            .managed()
            .run("ubuntu:24.04")
            .vm_name(&format!("vm-{}", names[i]))
            .created(1_777_000_000_000 + i64::from(created[i]) * 1000)
            .build();
        w.apply(p);
        w.settle();
    }
    w
}

fn restart(w: World) -> World {
    let mut w = w.restarted();
    w.start(vec![], vec![]);
    w.feed_lease_table();
    w.settle();
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_restart_hands_every_vm_back_to_its_holder(
        pods in (4usize..24).prop_flat_map(|n| (
            proptest::collection::vec(0u8..6, n),
            proptest::collection::vec(0u16..600, n),
            Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
        ))
    ) {
        let (names, created, order) = pods;
        let w = run_pods(&names, &created, &order);
        prop_assert!(w.violations.is_empty(), "{:?}", w.violations);
        let before = held(&w);
        let vms = vm_ids(&w);
        let w = restart(w);
        prop_assert!(w.violations.is_empty(), "{:?}", w.violations);
        prop_assert_eq!(held(&w), before, "a VM changed hands across the restart");
        prop_assert_eq!(vm_ids(&w), vms, "a VM was removed or made by the restart");
    }
}

#[test]
fn two_hundred_pods_of_four_namespaces_get_their_own_vms_back() {
    // Every name is wanted by one pod of each namespace: the first comer holds it and the
    // others, which claim to be older, are refused.
    let n = 200;
    let names: Vec<u8> = (0..n).map(|i| (i / NAMESPACES.len()) as u8).collect();
    // The later a pod is taken in, the older it claims to be.
    let created: Vec<u16> = (0..n).map(|i| (n - i) as u16).collect();
    // Name k goes first to the pod of namespace k mod 4, so each namespace holds a quarter.
    let order: Vec<usize> = (0..n / 4)
        .flat_map(|k| (0..4).map(move |j| 4 * k + (k + j) % 4))
        .collect();
    let w = run_pods(&names, &created, &order);
    let before = held(&w);
    assert_eq!(before.len(), n / NAMESPACES.len());
    let vms = vm_ids(&w);
    let mut w = restart(w);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(held(&w), before);
    assert_eq!(vm_ids(&w), vms);

    // Deleting every pod of one namespace removes its VMs and no other's.
    let namespace_of = |w: &World, id: &str| w.state.vm_ids[id].namespace().to_string();
    let others: BTreeMap<String, String> = before
        .iter()
        .filter(|(id, _)| namespace_of(&w, id) != "team-b")
        .map(|(id, uid)| (id.clone(), uid.clone()))
        .collect();
    assert!(others.len() < before.len(), "team-b holds none of the VMs");
    let snapshots: Vec<String> = w.cocoon.snapshots.keys().cloned().collect();
    let doomed: Vec<PodKey> = w
        .api
        .pods
        .keys()
        .filter(|k| k.namespace() == "team-b")
        .cloned()
        .collect();
    for k in &doomed {
        w.delete_pod(k);
    }
    w.settle();
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(held(&w), others, "another namespace's VM changed hands");
    let left: Vec<String> = vm_ids(&w);
    assert_eq!(left, others.keys().cloned().collect::<Vec<_>>());
    for name in &snapshots {
        assert!(
            w.cocoon.snapshots.contains_key(name),
            "snapshot {name} went"
        );
    }
}
