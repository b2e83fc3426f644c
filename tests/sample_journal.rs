//! The sample journal in packaging/sample/demo.journal is made here, from the demo run of the
//! fake world, by the daemon's own journal writer. The test fails when the committed file is
//! not what the current code writes; `UPDATE_SAMPLE=1 cargo test --test sample_journal`
//! rewrites it.

mod support;

use reconcilers::pod::PodKey;
use reconcilers::render;
use reconcilers::Action;
use vk_cocoon::journal::frame;

use support::scenarios;

fn rendered_for(w: &reconcilers::testkit::World, key: &str) -> Vec<String> {
    w.log
        .iter()
        .flat_map(|(_, actions)| actions.iter())
        .map(render::action)
        .filter(|line| line.contains(key))
        .collect()
}

#[test]
fn the_demo_run_creates_three_pods_evicts_one_and_deletes_one() {
    let w = scenarios::demo();
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(w.fatal, None);
    // Only the api pod is left, running and ready.
    let left: Vec<&PodKey> = w.api.pods.keys().collect();
    assert_eq!(left, [&PodKey::new("default", "api")]);
    let api = render::status(&w.api.pods[&PodKey::new("default", "api")].status);
    assert!(api.starts_with("phase=Running ready=true"), "{api}");
    // Each pod became ready.
    for key in ["default/web", "default/worker", "default/api"] {
        assert!(
            rendered_for(&w, key)
                .iter()
                .any(|l| l.contains("phase=Running ready=true")),
            "{key} never became ready"
        );
    }
    // The clone pod's VM vanished: it was failed and deleted (evicted).
    let worker = rendered_for(&w, "default/worker");
    assert!(worker
        .iter()
        .any(|l| l.contains("phase=Failed") && l.contains("VMGone")));
    assert!(worker.iter().any(|l| l.starts_with("delete-pod")));
    // The run pod was deleted: its VM removed, a terminal status, the object deleted.
    let web = rendered_for(&w, "default/web");
    assert!(w.log.iter().flat_map(|(_, a)| a).any(|a| matches!(a,
        Action::RunCocoon { key: Some(k), cmd, .. }
            if k.name() == "web" && cmd.argv().join(" ") == "vm rm --force -- V001")));
    assert!(web.iter().any(|l| l.contains("phase=Succeeded")));
    assert_eq!(
        w.counters.get("pod_lifecycle{op=create,result=ok,reason=}"),
        Some(&3)
    );
    assert_eq!(
        w.counters.get("pod_lifecycle{op=delete,result=ok,reason=}"),
        Some(&1)
    );
}

#[test]
fn the_committed_sample_journal_is_what_the_writer_produces() {
    let w = scenarios::demo();
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("demo.journal");
    support::journal_world(&w, &fresh, u64::MAX, 1);
    let produced = std::fs::read(&fresh).unwrap();
    let committed_path = support::sample_path();
    if std::env::var_os("UPDATE_SAMPLE").is_some() {
        std::fs::create_dir_all(committed_path.parent().unwrap()).unwrap();
        std::fs::write(&committed_path, &produced).unwrap();
        return;
    }
    let committed = std::fs::read(&committed_path).unwrap_or_default();
    if committed != produced {
        let text = |b: &[u8]| frame::lines_of_file(b).unwrap_or_else(|(lines, _)| lines);
        let (committed, produced) = (text(&committed), text(&produced));
        let first = committed
            .split(|&c| c == b'\n')
            .zip(produced.split(|&c| c == b'\n'))
            .position(|(a, b)| a != b)
            .map_or("(lengths differ)".to_string(), |i| {
                format!("line {}", i + 1)
            });
        panic!(
            "{} is out of date (first difference: {first}); regenerate it with \
             UPDATE_SAMPLE=1 cargo test --test sample_journal, and review the diff",
            committed_path.display()
        );
    }
}

/// What the benches read of a journal: every step of every rotated file in the journal's
/// directory, in order, with its actions, and no header.
#[test]
fn the_steps_of_a_rotated_journal_are_read_from_its_directory() {
    let w = scenarios::demo();
    let dir = tempfile::tempdir().unwrap();
    // Small files: the run rotates across several.
    support::journal_world(&w, &dir.path().join("events.journal"), 2048, 64);
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(files > 1, "the run should rotate, wrote {files} file(s)");
    let steps: Vec<_> = vk_cocoon::journal::Reader::open_dir(dir.path())
        .unwrap()
        .steps()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(steps.len(), w.log.len());
    for (step, (envelope, actions)) in steps.iter().zip(w.log.iter()) {
        assert_eq!(step.envelope.seq, envelope.seq);
        assert_eq!(&step.actions, actions);
    }
    let missing = vk_cocoon::journal::Reader::open_dir(&dir.path().join("nope"));
    assert!(
        missing.is_err(),
        "a directory that is not there is an error"
    );
}
