//! `COCOON_SIM_TIER=S`: the simulator answers as the reference cocoon release does (checked
//! against the real binary by e2e/tests/cocoon_differential.rs); here without the real one.

mod common;

use common::*;

fn tier(t: &str) -> Sim {
    Sim::with_env(&[("COCOON_SIM_TIER", t), ("COCOON_SIM_ZERO_BOOT", "1")])
}

#[test]
fn newer_verbs_print_the_vm_help_and_exit_zero() {
    let sim = tier("S");
    let help = sim.run(&["vm", "--help"]).ok();
    assert!(help.stdout.contains("Commands:"), "{}", help.stdout);
    for args in [
        &["vm", "exec", "some-vm", "--", "false"][..],
        &["vm", "logs", "some-vm"],
        &["vm", "net", "some-vm"],
        &["vm", "reconcile-stale-create", "some-vm"],
        &[
            "--root-dir",
            sim.root.to_str().unwrap(),
            "vm",
            "exec",
            "x",
            "--",
            "true",
        ],
    ] {
        let r = sim.run(args).ok();
        assert_eq!(r.stdout, help.stdout, "{args:?} prints the vm help");
    }
    for parent in ["vm", "snapshot", "image"] {
        let help = sim.run(&[parent, "--help"]).ok();
        for args in [&[parent, "frobnicate"][..], &[parent]] {
            let r = sim.run(args).ok();
            assert_eq!(r.stdout, help.stdout, "{args:?} prints the {parent} help");
        }
    }
    let root = sim.run(&["frobnicate"]);
    assert_eq!(root.code, 1);
    assert_eq!(
        root.stderr,
        "Error: unknown command \"frobnicate\" for \"cocoon\"\nRun 'cocoon --help' for usage.\n"
    );
    // cobra parses flags before it gives up on the verb, and `vm` has none of these.
    sim.run(&["vm", "exec", "-i", "x", "--", "cat"])
        .err("unknown shorthand flag: 'i' in -i");
    sim.run(&["vm", "logs", "--tail", "5", "x"])
        .err("unknown flag: --tail");
    sim.run(&["vm", "reconcile-stale-create", "x", "-o", "json"])
        .err("unknown shorthand flag: 'o' in -o");
}

#[test]
fn newer_flags_are_unknown_the_first_one_reported() {
    let sim = tier("S");
    for (args, flag) in [
        (
            &["vm", "clone", "--restore-mode", "copy", "s"][..],
            "--restore-mode",
        ),
        (
            &["vm", "clone", "--name", "c", "--from-dir=/x"],
            "--from-dir",
        ),
        (
            &["vm", "clone", "--cpu-period-us", "1", "--bogus", "s"],
            "--cpu-period-us",
        ),
        (&["vm", "run", "--cpu-weight", "1", "img"], "--cpu-weight"),
        (
            &["vm", "run", "--cpu-quota-us", "1", "img"],
            "--cpu-quota-us",
        ),
    ] {
        sim.run(args).err(&format!("unknown flag: {flag}"));
    }
    sim.run(&["vm", "clone", "--bogus", "--restore-mode", "copy", "s"])
        .err("unknown flag: --bogus");
    sim.run(&[
        "vm",
        "clone",
        "--on-demand",
        "--cpu",
        "1",
        "--nics",
        "1",
        "s",
    ])
    .err("inspect snapshot s: snapshot not found");
}

#[test]
fn records_carry_only_the_reference_fields() {
    let newer = [
        "vsock_socket",
        "net_backend",
        "netns_path",
        "transition_generation",
        "last_transition_reason",
        "last_transition_at",
    ];
    for (t, present) in [("S", false), ("N", true)] {
        let sim = tier(t);
        sim.pull(IMAGE);
        let vm = sim.run_vm("r1", &["--cpu", "1"]);
        let inspected = sim.inspect("r1");
        for key in [
            "transition_generation",
            "last_transition_reason",
            "vsock_socket",
        ] {
            assert_eq!(vm.get(key).is_some(), present, "tier {t}: run prints {key}");
        }
        for key in newer {
            if !present {
                assert!(
                    inspected.get(key).is_none(),
                    "tier {t}: inspect prints {key}"
                );
            }
        }
    }
}

#[test]
fn the_newer_tier_keeps_its_verbs_and_a_bad_tier_is_refused() {
    let sim = tier("N");
    sim.run(&["vm", "exec", "nope", "--", "true"])
        .err("exec: vm nope: VM not found");
    sim.run(&["vm", "clone", "--restore-mode", "copy", "nope"])
        .err("inspect snapshot nope: snapshot not found");
    tier("R")
        .run(&["vm", "list"])
        .err("COCOON_SIM_TIER=\"R\": want S or N");
}
