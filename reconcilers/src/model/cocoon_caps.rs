//! What the node's cocoon CLI can do (CLI-10). cocoon gained verbs and changed its boot flags
//! over time; the shell runs the binary's help once at startup, this module reads it
//! (`CocoonCaps::from_help`), and the answer reaches the core in its configuration, so the argv
//! the core writes is one this binary accepts and a call it cannot serve is never made. The
//! simulator's tests and the differential suite read help with the same two functions.

use serde::{Deserialize, Serialize};

/// A verb (or verb form) that an older cocoon lacks. An older binary answers an unknown
/// subcommand with its parent's help and exit 0, so a call it lacks must not be made at all:
/// its "success" would be read as done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verb {
    /// `vm exec`: the post-clone fix-up, a Windows guest's `ipconfig`, `kubectl exec`.
    Exec,
    /// `vm logs`: `kubectl logs`.
    Logs,
    /// `vm net`: the NIC drop of a Windows hibernation.
    Net,
    /// `vm reconcile-stale-create`: placeholders a killed create left behind (B3).
    ReconcileStaleCreate,
    /// `vm clone --from-dir`: clones of a snapshot directory (T4, staged wakes).
    CloneFromDir,
}

impl Verb {
    pub const ALL: [Verb; 5] = [
        Verb::Exec,
        Verb::Logs,
        Verb::Net,
        Verb::ReconcileStaleCreate,
        Verb::CloneFromDir,
    ];

    /// How an operator would type it.
    pub fn command(self) -> &'static str {
        match self {
            Verb::Exec => "cocoon vm exec",
            Verb::Logs => "cocoon vm logs",
            Verb::Net => "cocoon vm net",
            Verb::ReconcileStaleCreate => "cocoon vm reconcile-stale-create",
            Verb::CloneFromDir => "cocoon vm clone --from-dir",
        }
    }
}

/// The capabilities found, each `true` on a current cocoon (the default, so a journal written
/// before they were recorded replays as it ran).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CocoonCaps {
    pub exec: bool,
    pub logs: bool,
    pub net: bool,
    pub reconcile_stale_create: bool,
    pub clone_from_dir: bool,
    /// `vm clone --restore-mode`; without it the older `--on-demand` switch.
    pub restore_mode: bool,
    /// `--cpu-weight`, `--cpu-quota-us`, `--cpu-period-us` on `vm run` and `vm clone`.
    pub cpu_knobs: bool,
}

impl Default for CocoonCaps {
    fn default() -> Self {
        Self::CURRENT
    }
}

impl CocoonCaps {
    /// Everything the core may ask of cocoon.
    pub const CURRENT: CocoonCaps = CocoonCaps {
        exec: true,
        logs: true,
        net: true,
        reconcile_stale_create: true,
        clone_from_dir: true,
        restore_mode: true,
        cpu_knobs: true,
    };

    /// The reference release: none of the newer verbs, the older boot flags.
    pub const REFERENCE: CocoonCaps = CocoonCaps {
        exec: false,
        logs: false,
        net: false,
        reconcile_stale_create: false,
        clone_from_dir: false,
        restore_mode: false,
        cpu_knobs: false,
    };

    pub fn is_current(&self) -> bool {
        *self == Self::CURRENT
    }

    pub fn has(&self, verb: Verb) -> bool {
        match verb {
            Verb::Exec => self.exec,
            Verb::Logs => self.logs,
            Verb::Net => self.net,
            Verb::ReconcileStaleCreate => self.reconcile_stale_create,
            Verb::CloneFromDir => self.clone_from_dir,
        }
    }

    /// The verbs this cocoon lacks, in a fixed order.
    pub fn missing(&self) -> Vec<Verb> {
        Verb::ALL.into_iter().filter(|v| !self.has(*v)).collect()
    }

    /// The same, and the boot flags it lacks, for a person: `-` when nothing is missing.
    pub fn describe_missing(&self) -> String {
        let mut parts: Vec<&str> = self.missing().into_iter().map(Verb::command).collect();
        if !self.restore_mode {
            parts.push("vm clone --restore-mode (uses --on-demand)");
        }
        if !self.cpu_knobs {
            parts.push("--cpu-weight/--cpu-quota-us/--cpu-period-us");
        }
        match parts.is_empty() {
            true => "-".into(),
            false => parts.join(", "),
        }
    }
}

/// The subcommands a help text lists: the first word of each indented line in a section
/// headed by a line ending in `Commands:` (cobra's `Available Commands:` and its groups, clap's
/// `Commands:`); a section ends at the first blank or unindented line.
pub fn help_verbs(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_section = false;
    for line in help.lines() {
        if line.trim_end().ends_with("Commands:") {
            in_section = true;
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if !in_section || !indented || line.trim().is_empty() {
            in_section = false;
            continue;
        }
        if let Some(word) = line.split_whitespace().next() {
            out.push(word.to_string());
        }
    }
    out
}

/// Whether a help text names `flag` (written with its dashes, `--cpu-weight`) as a whole
/// token, tokens being runs of ASCII letters, digits and `-`: `--cpu` is not found inside
/// `--cpu-weight`.
pub fn help_has_flag(help: &str, flag: &str) -> bool {
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .any(|tok| tok == flag)
}

impl CocoonCaps {
    /// What `vm --help`, `vm run --help` and `vm clone --help` show; `None` when they do not
    /// look like cocoon's (no `run` or `clone` subcommand), so a wrapper that prints something
    /// else is not taken for a cocoon that can do nothing.
    pub fn from_help(vm: &str, run: &str, clone: &str) -> Option<CocoonCaps> {
        let verbs = help_verbs(vm);
        let has = |v: &str| verbs.iter().any(|s| s == v);
        if !has("run") || !has("clone") {
            return None;
        }
        Some(CocoonCaps {
            exec: has("exec"),
            logs: has("logs"),
            net: has("net"),
            reconcile_stale_create: has("reconcile-stale-create"),
            clone_from_dir: help_has_flag(clone, "--from-dir"),
            restore_mode: help_has_flag(clone, "--restore-mode"),
            cpu_knobs: help_has_flag(run, "--cpu-weight") && help_has_flag(clone, "--cpu-weight"),
        })
    }
}

/// The message of a call refused because this cocoon lacks its verb.
pub fn unsupported(verb: Verb) -> String {
    format!(
        "this node's cocoon has no `{}` (an older release); upgrade cocoon on the node to use it",
        verb.command()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference release's own help, as the binary `make deps` builds prints it (the
    /// differential suite checks the live binary still does).
    const REAL_VM: &str = include_str!("../../../e2e/cocoon-sim/tests/fixtures/real-s-vm-help.txt");
    const REAL_RUN: &str =
        include_str!("../../../e2e/cocoon-sim/tests/fixtures/real-s-vm-run-help.txt");
    const REAL_CLONE: &str =
        include_str!("../../../e2e/cocoon-sim/tests/fixtures/real-s-vm-clone-help.txt");

    /// clap's layout, as the simulator prints it in the current tier.
    const CLAP_VM: &str = "VM commands\n\nUsage: cocoon vm <COMMAND>\n\nCommands:\n  run     Boot\n  \
        clone   Clone\n  exec    Run in the guest\n  logs    Log\n  net     NICs\n  \
        reconcile-stale-create  Placeholders\n  help    Print this message\n\nOptions:\n  -h, --help  Print help\n";

    #[test]
    fn verbs_are_read_from_the_sections_of_cobra_and_clap() {
        let real = help_verbs(REAL_VM);
        assert!(real.iter().any(|v| v == "run") && real.iter().any(|v| v == "clone"));
        assert!(
            !real.iter().any(|v| v == "exec" || v.starts_with('-')),
            "{real:?}"
        );
        let clap = help_verbs(CLAP_VM);
        for v in [
            "run",
            "clone",
            "exec",
            "logs",
            "net",
            "reconcile-stale-create",
        ] {
            assert!(clap.iter().any(|c| c == v), "{v} in {clap:?}");
        }
        let prose = "Run it, see exec below\n\nAvailable Commands:\n  run   Create\n\nFlags:\n  logs is not a verb here\n";
        assert_eq!(help_verbs(prose), ["run"]);
    }

    #[test]
    fn a_flag_is_found_whole() {
        let help = "      --cpu int          boot CPUs\n      --cpu-weight int   weight\n";
        assert!(help_has_flag(help, "--cpu"));
        assert!(help_has_flag(help, "--cpu-weight"));
        assert!(!help_has_flag(help, "--cpu-quota-us"));
        assert!(!help_has_flag("      --cpu-weight int\n", "--cpu"));
        assert!(help_has_flag("  --restore-mode <MODE>", "--restore-mode"));
    }

    #[test]
    fn the_reference_release_lacks_the_newer_verbs_and_flags() {
        assert_eq!(
            CocoonCaps::from_help(REAL_VM, REAL_RUN, REAL_CLONE),
            Some(CocoonCaps::REFERENCE)
        );
    }

    #[test]
    fn a_current_cocoon_has_everything() {
        let run = "  --cpu-weight <W>\n  --cpu-quota-us <Q>\n";
        let clone = "  --restore-mode <M>\n  --from-dir <DIR>\n  --cpu-weight <W>\n";
        assert_eq!(
            CocoonCaps::from_help(CLAP_VM, run, clone),
            Some(CocoonCaps::CURRENT)
        );
    }

    #[test]
    fn help_that_is_not_cocoons_is_not_read_as_a_cocoon_without_verbs() {
        assert_eq!(
            CocoonCaps::from_help("usage: wrapper [args]\n", "", ""),
            None
        );
    }
}
