//! S10: the watch can deliver a version of a pod from before vk's own write after that write
//! was answered. Such a copy says nothing newer than the answer did, and taking its older
//! status as the server's would send the same write again.

use reconcilers::action::Action;
use reconcilers::event::Event;
use reconcilers::keys;
use reconcilers::pod::PodKey;
use reconcilers::testkit::{pod, World};
use reconcilers::Config;

fn patches(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::PatchPod { .. }))
        .count()
}

#[test]
fn a_copy_older_than_vks_last_write_is_not_written_again() {
    let mut w = World::new(Config::default());
    let key = PodKey::new("default", "a");
    w.start(
        vec![pod("default", "a").managed().run("base:1").build()],
        vec![],
    );
    w.settle();
    let ready = w.api.pods[&key].clone();
    assert_eq!(ready.status.phase, "Running", "{ready:?}");
    let version = ready.resource_version.expect("the write versioned the pod");
    assert!(version >= 2, "creating, then ready: {version}");

    // The version the `creating` write made, delivered late.
    let mut stale = ready.clone();
    stale.resource_version = Some(version - 1);
    stale.status = Default::default();
    stale.status.phase = "Pending".into();
    stale
        .annotations
        .insert(keys::LIFECYCLE_STATE.into(), "creating".into());
    assert_eq!(
        patches(&w.feed(Event::PodApplied { pod: stale.clone() })),
        0
    );

    // Without a version to compare, the same copy is the server's word, and vk puts the
    // pod's status back.
    stale.resource_version = None;
    assert_eq!(patches(&w.feed(Event::PodApplied { pod: stale })), 1);
}
