//! What the node's cocoon CLI can do (CLI-10). cocoon gained verbs and changed its boot flags
//! over time; the shell reads the binary's own help texts once at startup and hands the answer
//! to the core in its configuration, so the argv the core writes is one this binary accepts
//! and a call it cannot serve is never made.

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

/// The message of a call refused because this cocoon lacks its verb.
pub fn unsupported(verb: Verb) -> String {
    format!(
        "this node's cocoon has no `{}` (an older release); upgrade cocoon on the node to use it",
        verb.command()
    )
}
