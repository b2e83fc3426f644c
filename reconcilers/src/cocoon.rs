//! cocoon invocations as typed commands, and their exact argv (spec/cocoon-cli.md §6). The
//! argv is built here so scenario tests show precisely what would run; every name in it was
//! validated by `spec`/`names` before it got here.

use serde::{Deserialize, Serialize};

use crate::config::RestoreMode;
use crate::spec::CpuPolicy;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", content = "value", rename_all = "snake_case")]
pub enum CloneSource {
    Snapshot(String),
    FromDir(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verb", rename_all = "snake_case")]
pub enum CocoonCmd {
    ImagePull {
        image: String,
        force: bool,
    },
    VmRun {
        name: String,
        image: String,
        cpu: Option<i128>,
        cpu_policy: CpuPolicy,
        memory: Option<i128>,
        storage: Option<i128>,
        network: Option<String>,
        windows: bool,
        fc: bool,
        no_direct_io: bool,
    },
    VmClone {
        name: String,
        source: CloneSource,
        network: Option<String>,
        no_direct_io: bool,
        pull: bool,
        restore_mode: Option<RestoreMode>,
        cpu_policy: CpuPolicy,
    },
    VmInspect {
        vm: String,
    },
    VmList,
    VmRm {
        id: String,
    },
    VmStart {
        id: String,
    },
    SnapshotInspect {
        name: String,
    },
    SnapshotRm {
        name: String,
    },
    SnapshotSave {
        name: String,
        vm: String,
    },
    ReconcileStaleCreate {
        id: String,
    },
}

impl CocoonCmd {
    /// The argv after the binary.
    pub fn argv(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |s: &str| a.push(s.to_string());
        match self {
            CocoonCmd::ImagePull { image, force } => {
                push("image");
                push("pull");
                if *force {
                    push("--force");
                }
                push(image);
            }
            CocoonCmd::VmRun {
                name,
                image,
                cpu,
                cpu_policy,
                memory,
                storage,
                network,
                windows,
                fc,
                no_direct_io,
            } => {
                for s in ["vm", "run", "--output", "json", "--name", name] {
                    push(s);
                }
                if let Some(c) = cpu {
                    push("--cpu");
                    push(&c.to_string());
                }
                cpu_flags(&mut push, cpu_policy);
                if let Some(m) = memory {
                    push("--memory");
                    push(&m.to_string());
                }
                if let Some(s) = storage {
                    push("--storage");
                    push(&s.to_string());
                }
                if let Some(n) = network {
                    push("--network");
                    push(n);
                }
                if *windows {
                    push("--windows");
                }
                if *fc {
                    push("--fc");
                }
                if *no_direct_io {
                    push("--no-direct-io");
                }
                push(image);
            }
            CocoonCmd::VmClone {
                name,
                source,
                network,
                no_direct_io,
                pull,
                restore_mode,
                cpu_policy,
            } => {
                for s in ["vm", "clone", "--output", "json", "--name", name] {
                    push(s);
                }
                if let Some(n) = network {
                    push("--network");
                    push(n);
                }
                if *no_direct_io {
                    push("--no-direct-io");
                }
                if *pull {
                    push("--pull");
                }
                if let Some(m) = restore_mode {
                    push("--restore-mode");
                    push(m.as_str());
                }
                cpu_flags(&mut push, cpu_policy);
                match source {
                    CloneSource::Snapshot(s) => push(s),
                    CloneSource::FromDir(d) => {
                        push("--from-dir");
                        push(d);
                    }
                }
            }
            CocoonCmd::VmInspect { vm } => {
                for s in ["vm", "inspect", vm] {
                    push(s);
                }
            }
            CocoonCmd::VmList => {
                for s in ["vm", "list", "-o", "json"] {
                    push(s);
                }
            }
            CocoonCmd::VmRm { id } => {
                for s in ["vm", "rm", "--force", id] {
                    push(s);
                }
            }
            CocoonCmd::VmStart { id } => {
                for s in ["vm", "start", id] {
                    push(s);
                }
            }
            CocoonCmd::SnapshotInspect { name } => {
                for s in ["snapshot", "inspect", name] {
                    push(s);
                }
            }
            CocoonCmd::SnapshotRm { name } => {
                for s in ["snapshot", "rm", name] {
                    push(s);
                }
            }
            CocoonCmd::SnapshotSave { name, vm } => {
                for s in ["snapshot", "save", "--name", name, vm] {
                    push(s);
                }
            }
            CocoonCmd::ReconcileStaleCreate { id } => {
                for s in ["vm", "reconcile-stale-create", id, "-o", "json"] {
                    push(s);
                }
            }
        }
        a
    }

    /// What the shell should decode from stdout on success.
    pub fn output(&self) -> Output {
        match self {
            CocoonCmd::VmRun { .. } | CocoonCmd::VmClone { .. } | CocoonCmd::VmInspect { .. } => {
                Output::Vm
            }
            CocoonCmd::VmList => Output::Vms,
            CocoonCmd::SnapshotInspect { .. } => Output::Snapshot,
            CocoonCmd::ReconcileStaleCreate { .. } => Output::StaleCreate,
            _ => Output::Nothing,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Nothing,
    Vm,
    Vms,
    Snapshot,
    StaleCreate,
}

fn cpu_flags(push: &mut impl FnMut(&str), p: &CpuPolicy) {
    push("--cpu-weight");
    push(&p.weight.to_string());
    if let (Some(q), Some(per)) = (p.quota_us, p.period_us) {
        push("--cpu-quota-us");
        push(&q.to_string());
        push("--cpu-period-us");
        push(&per.to_string());
    }
}
