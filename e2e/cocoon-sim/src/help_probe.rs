//! The daemon's help-text rule (`reconcilers::cocoon_caps`) applied to the real reference
//! release's help (captured under tests/fixtures/) and to the simulator's own help in both
//! tiers, so the simulator cannot drift into a help layout the daemon misreads.

use crate::tier::{self, Tier, NEWER_CLONE_FLAGS, NEWER_RUN_FLAGS, NEWER_VM_VERBS};
use reconcilers::cocoon_caps::{help_has_flag as has_flag, help_verbs as verbs};

const REAL_VM: &str = include_str!("../tests/fixtures/real-s-vm-help.txt");
const REAL_RUN: &str = include_str!("../tests/fixtures/real-s-vm-run-help.txt");
const REAL_CLONE: &str = include_str!("../tests/fixtures/real-s-vm-clone-help.txt");

/// The flags only the reference release has: the daemon passes them to an older host.
const OLDER_CLONE_FLAGS: [&str; 5] = ["on-demand", "cpu", "memory", "storage", "nics"];
const OLDER_RUN_FLAGS: [&str; 2] = ["nics", "dns"];

/// What `cocoon vm [run|clone] --help` prints in a tier, as clap renders it.
fn sim_help(tier: Tier, path: &[&str]) -> String {
    let mut argv = vec!["cocoon"];
    argv.extend_from_slice(path);
    argv.push("--help");
    let err = tier::command(tier)
        .try_get_matches_from(argv)
        .expect_err("--help ends the parse");
    assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
    err.to_string()
}

fn flag(name: &str) -> String {
    format!("--{name}")
}

#[test]
fn the_rule_reads_only_section_lines_and_whole_flag_tokens() {
    let help = "Run it, see exec below\n\nAvailable Commands:\n  run   Create\n  clone Copy (unlike exec)\n\nFlags:\n      --cpu-weight int   weight\n  logs is not a verb here\n";
    assert_eq!(verbs(help), ["run", "clone"]);
    assert!(has_flag(help, "--cpu-weight"));
    assert!(!has_flag(help, "--cpu"), "--cpu is only part of a token");
    assert!(!has_flag("      --cpu-weighted", "--cpu-weight"));
    assert!(has_flag("  -o, --output string", "--output"));
    assert!(has_flag("      --cpu <CPU>", "--cpu"));
}

#[test]
fn real_reference_help_has_only_the_older_verbs_and_flags() {
    let real_verbs = verbs(REAL_VM);
    for v in ["run", "clone", "start", "inspect", "list", "rm", "status"] {
        assert!(real_verbs.iter().any(|r| r == v), "{v} in {real_verbs:?}");
    }
    for v in NEWER_VM_VERBS {
        assert!(!real_verbs.iter().any(|r| r == v), "{v} in {real_verbs:?}");
    }
    for f in NEWER_RUN_FLAGS {
        assert!(!has_flag(REAL_RUN, &flag(f)), "{f} in the real run help");
    }
    for f in OLDER_RUN_FLAGS {
        assert!(
            has_flag(REAL_RUN, &flag(f)),
            "{f} missing from the real run help"
        );
    }
    for f in NEWER_CLONE_FLAGS {
        assert!(
            !has_flag(REAL_CLONE, &flag(f)),
            "{f} in the real clone help"
        );
    }
    for f in OLDER_CLONE_FLAGS {
        assert!(
            has_flag(REAL_CLONE, &flag(f)),
            "{f} missing from the real clone help"
        );
    }
}

#[test]
fn simulator_help_names_each_tiers_verbs_and_flags() {
    for (tier, newer) in [(Tier::N, true), (Tier::S, false)] {
        let vm = verbs(&sim_help(tier, &["vm"]));
        for v in ["run", "clone", "start", "inspect", "list", "rm", "status"] {
            assert!(vm.iter().any(|r| r == v), "{tier:?}: {v} in {vm:?}");
        }
        for v in NEWER_VM_VERBS {
            assert_eq!(vm.iter().any(|r| r == v), newer, "{tier:?}: {v} in {vm:?}");
        }
        let run = sim_help(tier, &["vm", "run"]);
        for f in NEWER_RUN_FLAGS {
            assert_eq!(has_flag(&run, &flag(f)), newer, "{tier:?}: run {f}");
        }
        let clone = sim_help(tier, &["vm", "clone"]);
        for f in NEWER_CLONE_FLAGS {
            assert_eq!(has_flag(&clone, &flag(f)), newer, "{tier:?}: clone {f}");
        }
    }
    let run = sim_help(Tier::S, &["vm", "run"]);
    for f in OLDER_RUN_FLAGS {
        assert!(has_flag(&run, &flag(f)), "S: run {f}");
    }
    let clone = sim_help(Tier::S, &["vm", "clone"]);
    for f in OLDER_CLONE_FLAGS {
        assert!(has_flag(&clone, &flag(f)), "S: clone {f}");
    }
}

/// Every verb and flag the daemon probes reads the same from the simulator's tier S as
/// from the real reference release.
#[test]
fn simulator_tier_s_reads_like_the_real_reference_help() {
    let (sim_vm, real_vm) = (verbs(&sim_help(Tier::S, &["vm"])), verbs(REAL_VM));
    for v in NEWER_VM_VERBS
        .iter()
        .chain(&["run", "clone", "start", "status"])
    {
        assert_eq!(
            sim_vm.iter().any(|x| x == v),
            real_vm.iter().any(|x| x == v),
            "vm {v}"
        );
    }
    let pairs = [
        (sim_help(Tier::S, &["vm", "run"]), REAL_RUN, "run"),
        (sim_help(Tier::S, &["vm", "clone"]), REAL_CLONE, "clone"),
    ];
    for (sim, real, verb) in &pairs {
        let probed = NEWER_CLONE_FLAGS
            .iter()
            .chain(&OLDER_CLONE_FLAGS)
            .chain(&OLDER_RUN_FLAGS);
        for f in probed {
            assert_eq!(
                has_flag(sim, &flag(f)),
                has_flag(real, &flag(f)),
                "vm {verb} --{f}"
            );
        }
    }
}
