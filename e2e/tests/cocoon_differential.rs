//! The simulator in tier S (`COCOON_SIM_TIER=S`) against the real cocoon CLI of that tier
//! (built from shared/vendor by `make deps`): answers on an empty root, the newer verbs (the
//! `vm` help on stdout and exit 0, so an exit status alone would read as success) and the
//! newer flags (unknown flags) the older CLI lacks, and the older flags it has. Exit code,
//! final `Error:` line and stdout (by shape when JSON) must match; help texts are compared by
//! what they are, the `vm` help, since the simulator's is clap's layout and the real one
//! cobra's.

mod differential_common;
use reconcilers::cocoon_caps::{help_has_flag, help_verbs};

use std::path::Path;

use differential_common::{Answer, Differences, Pair};

#[test]
fn empty_root_answers_are_identical() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let mut d = Differences::default();
    let cases: &[&[&str]] = &[
        &["vm", "list", "-o", "json"],
        &["vm", "inspect", "nope"],
        &["vm", "rm", "--force", "nope"],
        &["vm", "start", "nope"],
        &["vm", "stop", "nope"],
        &["snapshot", "inspect", "nope"],
        &["snapshot", "rm", "nope"],
        &["snapshot", "export", "nope", "-o", "-"],
        &["snapshot", "list"],
        &["image", "inspect", "nope"],
        &["image", "list"],
        &["frobnicate"],
    ];
    for args in cases {
        d.both(&pair, args);
    }
    d.assert_none();
    let real = &pair.real;
    assert_eq!(
        real.run(&["vm", "list", "-o", "json"]).text(),
        "No VMs found.\n"
    );
    assert_eq!(
        real.run(&["vm", "inspect", "nope"]).last_stderr_line,
        "Error: inspect: vm nope: VM not found"
    );
}

/// `vm VERB` for a verb the older CLI lacks: cobra finds no such child of `vm`, which has no
/// argument check and nothing to run, so it prints the `vm` help and exits 0. The same holds
/// for any word under `vm`, `snapshot` or `image`, and for none at all.
fn is_help(a: &Answer, help: &Answer) -> bool {
    a.code == 0 && !a.stdout.is_empty() && a.stdout == help.stdout
}

#[test]
fn newer_verbs_print_the_vm_help_and_exit_zero() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let (_, real_help) = pair.both(&["vm", "--help"]);
    assert!(
        real_help.text().starts_with("Manage virtual machines")
            && real_help.text().contains("Available Commands:"),
        "the real vm help: {real_help:?}"
    );
    let mut d = Differences::default();
    let help_cases: &[&[&str]] = &[
        &["vm", "exec", "some-vm", "--", "true"],
        &["vm", "exec", "some-vm", "--", "sh", "-c", "exit 3"],
        &["vm", "logs", "some-vm"],
        &["vm", "net", "some-vm"],
        &["vm", "reconcile-stale-create", "some-vm"],
        &["vm", "reconcile-stale-create", "-h"],
        &["vm", "frobnicate"],
        &["vm"],
        &["snapshot", "frobnicate"],
        &["snapshot"],
        &["image", "frobnicate"],
    ];
    for args in help_cases {
        let (sim_help, real_help) = pair.both(&[args[0], "--help"]);
        let (s, r) = pair.both(args);
        let what = args.join(" ");
        assert!(is_help(&r, &real_help), "real {what}: {r:?}");
        if !is_help(&s, &sim_help) {
            d.note(format!("simulator {what}: not the {} help: {s:?}", args[0]));
        }
    }
    // Before cobra gives up on the verb it parses the flags, and `vm` knows none of these.
    let flag_cases: &[&[&str]] = &[
        &["vm", "exec", "-i", "some-vm", "--", "cat"],
        &["vm", "exec", "-e", "A=1", "some-vm", "--", "env"],
        &["vm", "logs", "--tail", "5", "some-vm"],
        &["vm", "net", "--nics", "0", "some-vm"],
        &["vm", "reconcile-stale-create", "some-vm", "-o", "json"],
        &["vm", "reconcile-stale-create", "--output=json", "some-vm"],
    ];
    for args in flag_cases {
        let (_, r) = d.both(&pair, args);
        assert_eq!(r.code, 1, "real {}: {r:?}", args.join(" "));
    }
    d.assert_none();
}

#[test]
fn newer_flags_are_unknown_and_older_ones_accepted() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let mut d = Differences::default();
    let cases: &[&[&str]] = &[
        &["vm", "clone", "--restore-mode", "ondemand", "snap"],
        &["vm", "clone", "--restore-mode=copy", "snap"],
        &["vm", "clone", "--name", "c", "--cpu-weight", "1", "snap"],
        &["vm", "clone", "--cpu-quota-us", "5000", "snap"],
        &["vm", "clone", "--cpu-period-us", "10000", "snap"],
        &["vm", "clone", "--from-dir", "/nonexistent"],
        &["vm", "clone", "--bogus", "--restore-mode", "copy", "snap"],
        &["vm", "run", "--cpu-weight", "1", "img"],
        &["vm", "run", "--cpu-quota-us", "5000", "img"],
        &["vm", "run", "--cpu-period-us", "10000", "img"],
        // The older flags parse; the missing snapshot or image is what fails.
        &["vm", "clone", "--on-demand", "--name", "c", "snap"],
        &[
            "vm",
            "clone",
            "-o",
            "json",
            "--cpu",
            "4",
            "--memory",
            "2G",
            "--storage",
            "20G",
            "--nics",
            "2",
            "--dns",
            "1.1.1.1",
            "snap",
        ],
        &[
            "vm", "run", "--nics", "0", "--dns", "1.1.1.1", "--name", "r", "img",
        ],
        &["vm", "clone", "snap", "extra"],
        &["vm", "clone"],
    ];
    for args in cases {
        d.both(&pair, args);
    }
    d.assert_none();
    let (_, real) = pair.both(&["vm", "clone", "--restore-mode", "ondemand", "snap"]);
    assert_eq!(real.code, 1);
    assert_eq!(real.last_stderr_line, "Error: unknown flag: --restore-mode");
    let (_, real) = pair.both(&["vm", "clone", "--on-demand", "--name", "c", "snap"]);
    assert_eq!(
        real.last_stderr_line, "Error: inspect snapshot snap: snapshot not found",
        "the older clone flag is accepted and the missing snapshot is what fails"
    );
}

/// The three help texts the daemon reads to learn a host's tier: read by the same rule, the
/// simulator in tier S and the live real CLI name the same probed verbs and flags, and the
/// real texts are still the ones captured for the simulator's unit tests (a rebuilt real CLI
/// that prints other help must be captured again).
#[test]
fn help_texts_name_the_same_verbs_and_flags() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("cocoon-sim/tests/fixtures");
    let probed_verbs = [
        "run",
        "clone",
        "start",
        "status",
        "exec",
        "logs",
        "net",
        "reconcile-stale-create",
    ];
    let probed_flags = [
        "restore-mode",
        "cpu-weight",
        "cpu-quota-us",
        "cpu-period-us",
        "from-dir",
        "on-demand",
        "cpu",
        "memory",
        "storage",
        "nics",
        "dns",
        "pull",
        "name",
        "output",
    ];
    let mut d = Differences::default();
    for (path, fixture) in [
        (&["vm", "--help"][..], "real-s-vm-help.txt"),
        (&["vm", "run", "--help"], "real-s-vm-run-help.txt"),
        (&["vm", "clone", "--help"], "real-s-vm-clone-help.txt"),
    ] {
        let (s, r) = pair.both(path);
        let (s, r) = (s.ok("simulator help").text(), r.ok("real help").text());
        let captured = std::fs::read_to_string(fixtures.join(fixture)).expect("the fixture");
        assert_eq!(
            r,
            captured,
            "cocoon {} is the captured {fixture}",
            path.join(" ")
        );
        let (sv, rv) = (help_verbs(&s), help_verbs(&r));
        for v in probed_verbs {
            let (a, b) = (sv.iter().any(|x| x == v), rv.iter().any(|x| x == v));
            if a != b {
                d.note(format!(
                    "{}: verb {v}: simulator {a}, real {b}",
                    path.join(" ")
                ));
            }
        }
        for f in probed_flags {
            let flag = format!("--{f}");
            let (a, b) = (help_has_flag(&s, &flag), help_has_flag(&r, &flag));
            if a != b {
                d.note(format!(
                    "{}: {flag}: simulator {a}, real {b}",
                    path.join(" ")
                ));
            }
        }
    }
    d.assert_none();
}

/// The comparison itself: a shape that ignored what it must compare would let every
/// differential test pass.
#[test]
fn the_shape_comparison_sees_what_differs() {
    use differential_common::shape;
    use serde_json::json;
    let vm = json!({"id": "AAAA", "state": "running", "pid": 41, "config": {"cpu": 2, "name": "a"},
                    "snapshot_ids": {"X": {}}, "created_at": "2026-01-01T00:00:00Z"});
    let same = json!({"id": "BBBB", "state": "running", "pid": 97, "config": {"cpu": 2, "name": "a"},
                      "snapshot_ids": {"Y": {}}, "created_at": "2027-02-02T00:00:00Z"});
    assert_eq!(
        shape(&vm),
        shape(&same),
        "ids, pids, times and id-keyed sets are not compared"
    );
    let differs = [
        json!({"id": "AAAA", "state": "stopped (stale)", "pid": 41, "config": {"cpu": 2, "name": "a"},
               "snapshot_ids": {"X": {}}, "created_at": "2026-01-01T00:00:00Z"}),
        json!({"id": "AAAA", "state": "running", "pid": 0, "config": {"cpu": 2, "name": "a"},
               "snapshot_ids": {"X": {}}, "created_at": "2026-01-01T00:00:00Z"}),
        json!({"id": "AAAA", "state": "running", "pid": 41, "config": {"cpu": 4, "name": "a"},
               "snapshot_ids": {"X": {}}, "created_at": "2026-01-01T00:00:00Z"}),
        json!({"id": "AAAA", "state": "running", "pid": 41, "config": {"cpu": 2, "name": "a"},
               "snapshot_ids": {}, "created_at": "2026-01-01T00:00:00Z"}),
        json!({"id": "AAAA", "state": "running", "pid": 41, "config": {"cpu": 2, "name": "a"},
               "snapshot_ids": {"X": {}}}),
        json!({"id": 7, "state": "running", "pid": 41, "config": {"cpu": 2, "name": "a"},
               "snapshot_ids": {"X": {}}, "created_at": "2026-01-01T00:00:00Z"}),
    ];
    for d in differs {
        assert_ne!(shape(&vm), shape(&d), "{d} reads like {vm}");
    }
}

#[test]
fn the_error_line_mask_hides_only_ids_and_the_root() {
    use differential_common::masked;
    let dir = Path::new("/tmp/x1");
    assert_eq!(
        masked(
            "Error: vm name \"c1\" already exists (id: Q3ZK7M2XW4JH5N6P7R3S6T2UVA)",
            dir
        ),
        "Error: vm name \"c1\" already exists (id: <ID>)"
    );
    assert_eq!(
        masked("Error: open /tmp/x1/root/a: gone", dir),
        "Error: open <dir>/root/a: gone"
    );
    assert_eq!(
        masked(
            "Error: inspect: vm Q3ZK7M2XW4JH5N6P7R8S9T2UV1: VM not found",
            dir
        ),
        "Error: inspect: vm Q3ZK7M2XW4JH5N6P7R8S9T2UV1: VM not found",
        "1 is not in cocoon's id alphabet"
    );
}
