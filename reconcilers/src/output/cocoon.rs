//! cocoon invocations as typed commands, and their exact argv (CLI-6). The
//! argv is built here so scenario tests show precisely what would run; every name in it was
//! validated by `spec`/`names` before it got here.

use serde::{Deserialize, Serialize};

use crate::cocoon_caps::Verb;
use crate::config::RestoreMode;
use crate::spec::CpuPolicy;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", content = "value", rename_all = "snake_case")]
pub enum CloneSource {
    Snapshot(String),
    FromDir(String),
}

/// Reads an i128 quantity through i64. `CocoonCmd` and `Action` are internally tagged, so
/// serde buffers them before decoding, and that buffer cannot hold an i128: reading a
/// journaled `vm run` back (replay) failed with "i128 is not supported". No CPU count or byte
/// size comes near i64::MAX.
fn opt_i128<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i128>, D::Error> {
    Option::<i64>::deserialize(d).map(|v| v.map(i128::from))
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
        #[serde(deserialize_with = "opt_i128")]
        cpu: Option<i128>,
        /// `None`: this cocoon has no cgroup CPU flags (CLI-10).
        #[serde(default)]
        cpu_policy: Option<CpuPolicy>,
        #[serde(deserialize_with = "opt_i128")]
        memory: Option<i128>,
        #[serde(deserialize_with = "opt_i128")]
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
        /// `--on-demand`, the older spelling of `--restore-mode ondemand` (CLI-10).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        on_demand: bool,
        /// `None`: this cocoon has no cgroup CPU flags (CLI-10).
        #[serde(default)]
        cpu_policy: Option<CpuPolicy>,
        /// `--nics`: a cloud-hypervisor + Windows hibernate snapshot has none, and its clone
        /// hot-adds one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nics: Option<u32>,
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
    /// A command in the guest through cocoon's agent; only its exit status is used.
    VmExec {
        id: String,
        argv: Vec<String>,
    },
    /// Hot-resizes the VM's NIC count.
    VmNet {
        id: String,
        nics: u32,
    },
    SnapshotInspect {
        name: String,
    },
    SnapshotRm {
        name: String,
    },
    /// `description` carries the owner record (T5).
    SnapshotSave {
        name: String,
        vm: String,
        description: String,
    },
    ReconcileStaleCreate {
        id: String,
    },
    /// C14: `cocoon-macos image pull IMAGE`.
    MacosImagePull {
        image: String,
    },
    /// C14: `cocoon-macos vm run`. `vnc`: the display (port − 5900); the shell appends the
    /// password, which never enters the journal.
    MacosRun {
        name: String,
        image: String,
        cpus: Option<i64>,
        memory_mib: Option<i64>,
        storage: Option<i64>,
        vnc: Option<u16>,
    },
    MacosInspect {
        name: String,
    },
    MacosList,
    /// R10: relaunches a dead guest in place.
    MacosStart {
        name: String,
        vnc: Option<u16>,
    },
    /// D2.
    MacosRm {
        name: String,
    },
}

impl CocoonCmd {
    /// The name of the VM this command makes, if it makes one (T11).
    pub fn makes_vm(&self) -> Option<&str> {
        match self {
            CocoonCmd::VmRun { name, .. }
            | CocoonCmd::VmClone { name, .. }
            | CocoonCmd::MacosRun { name, .. } => Some(name),
            CocoonCmd::ImagePull { .. }
            | CocoonCmd::VmInspect { .. }
            | CocoonCmd::VmList
            | CocoonCmd::VmRm { .. }
            | CocoonCmd::VmStart { .. }
            | CocoonCmd::VmExec { .. }
            | CocoonCmd::VmNet { .. }
            | CocoonCmd::SnapshotInspect { .. }
            | CocoonCmd::SnapshotRm { .. }
            | CocoonCmd::SnapshotSave { .. }
            | CocoonCmd::ReconcileStaleCreate { .. }
            | CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosInspect { .. }
            | CocoonCmd::MacosList
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. } => None,
        }
    }

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
                push("--");
                push(image);
            }
            CocoonCmd::VmRun { .. } | CocoonCmd::VmClone { .. } => boot_argv(self, &mut push),
            CocoonCmd::VmInspect { vm } => words(&mut push, &["vm", "inspect", "--", vm]),
            CocoonCmd::VmList => words(&mut push, &["vm", "list", "-o", "json"]),
            CocoonCmd::VmRm { id } => words(&mut push, &["vm", "rm", "--force", "--", id]),
            CocoonCmd::VmStart { id } => words(&mut push, &["vm", "start", "--", id]),
            // The one verb whose REF comes before `--`: cocoon splits REF from the guest's
            // argv at the dash. REF is a VM id the core took from cocoon itself.
            CocoonCmd::VmExec { id, argv } => {
                for s in ["vm", "exec", id, "--"] {
                    push(s);
                }
                for s in argv {
                    push(s);
                }
            }
            CocoonCmd::VmNet { id, nics } => words(
                &mut push,
                &["vm", "net", "--nics", &nics.to_string(), "--", id],
            ),
            CocoonCmd::SnapshotInspect { name } => {
                words(&mut push, &["snapshot", "inspect", "--", name])
            }
            CocoonCmd::SnapshotRm { name } => words(&mut push, &["snapshot", "rm", "--", name]),
            CocoonCmd::SnapshotSave {
                name,
                vm,
                description,
            } => words(
                &mut push,
                &[
                    "snapshot",
                    "save",
                    "--name",
                    name,
                    "--description",
                    description,
                    "--",
                    vm,
                ],
            ),
            CocoonCmd::ReconcileStaleCreate { id } => words(
                &mut push,
                &["vm", "reconcile-stale-create", "-o", "json", "--", id],
            ),
            CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosRun { .. }
            | CocoonCmd::MacosInspect { .. }
            | CocoonCmd::MacosList
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. } => return crate::macos_cmd::argv(self),
        }
        a
    }

    /// The verb of an older cocoon's missing set this command needs, if any (CLI-10).
    pub fn needs(&self) -> Option<Verb> {
        match self {
            CocoonCmd::VmExec { .. } => Some(Verb::Exec),
            CocoonCmd::VmNet { .. } => Some(Verb::Net),
            CocoonCmd::ReconcileStaleCreate { .. } => Some(Verb::ReconcileStaleCreate),
            CocoonCmd::VmClone {
                source: CloneSource::FromDir(_),
                ..
            } => Some(Verb::CloneFromDir),
            CocoonCmd::VmClone {
                source: CloneSource::Snapshot(_),
                ..
            }
            | CocoonCmd::ImagePull { .. }
            | CocoonCmd::VmRun { .. }
            | CocoonCmd::VmInspect { .. }
            | CocoonCmd::VmList
            | CocoonCmd::VmRm { .. }
            | CocoonCmd::VmStart { .. }
            | CocoonCmd::SnapshotInspect { .. }
            | CocoonCmd::SnapshotRm { .. }
            | CocoonCmd::SnapshotSave { .. }
            | CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosRun { .. }
            | CocoonCmd::MacosInspect { .. }
            | CocoonCmd::MacosList
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. } => None,
        }
    }

    /// Which binary runs the command.
    pub fn binary(&self) -> Binary {
        match self {
            CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosRun { .. }
            | CocoonCmd::MacosInspect { .. }
            | CocoonCmd::MacosList
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. } => Binary::CocoonMacos,
            CocoonCmd::ImagePull { .. }
            | CocoonCmd::VmRun { .. }
            | CocoonCmd::VmClone { .. }
            | CocoonCmd::VmInspect { .. }
            | CocoonCmd::VmList
            | CocoonCmd::VmRm { .. }
            | CocoonCmd::VmStart { .. }
            | CocoonCmd::VmExec { .. }
            | CocoonCmd::VmNet { .. }
            | CocoonCmd::SnapshotInspect { .. }
            | CocoonCmd::SnapshotRm { .. }
            | CocoonCmd::SnapshotSave { .. }
            | CocoonCmd::ReconcileStaleCreate { .. } => Binary::Cocoon,
        }
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
            CocoonCmd::MacosInspect { .. } => Output::MacosVm,
            CocoonCmd::MacosList => Output::MacosVms,
            CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosRun { .. }
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. }
            | CocoonCmd::ImagePull { .. }
            | CocoonCmd::VmRm { .. }
            | CocoonCmd::VmStart { .. }
            | CocoonCmd::VmExec { .. }
            | CocoonCmd::VmNet { .. }
            | CocoonCmd::SnapshotRm { .. }
            | CocoonCmd::SnapshotSave { .. } => Output::Nothing,
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
    /// cocoon-macos's own record shape (`vm inspect`).
    MacosVm,
    /// A JSON array of cocoon-macos records (`vm list`).
    MacosVms,
}

/// The CLI a command belongs to: `VK_COCOON_BIN` or `VK_COCOON_MACOS_BIN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Cocoon,
    CocoonMacos,
}

impl Binary {
    pub fn as_str(self) -> &'static str {
        match self {
            Binary::Cocoon => "cocoon",
            Binary::CocoonMacos => "cocoon-macos",
        }
    }
}

/// The argv of the two commands that boot a VM (`vm run`, `vm clone`); `argv` writes every
/// other command's itself.
fn boot_argv(cmd: &CocoonCmd, push: &mut impl FnMut(&str)) {
    match cmd {
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
            cpu_flags(push, cpu_policy);
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
            push("--");
            push(image);
        }
        CocoonCmd::VmClone {
            name,
            source,
            network,
            no_direct_io,
            pull,
            restore_mode,
            on_demand,
            cpu_policy,
            nics,
        } => {
            for s in ["vm", "clone", "--output", "json", "--name", name] {
                push(s);
            }
            if let Some(n) = nics {
                push("--nics");
                push(&n.to_string());
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
            if *on_demand {
                push("--on-demand");
            }
            cpu_flags(push, cpu_policy);
            match source {
                CloneSource::Snapshot(s) => {
                    push("--");
                    push(s);
                }
                CloneSource::FromDir(d) => {
                    push("--from-dir");
                    push(d);
                }
            }
        }
        CocoonCmd::ImagePull { .. }
        | CocoonCmd::VmInspect { .. }
        | CocoonCmd::VmList
        | CocoonCmd::VmRm { .. }
        | CocoonCmd::VmStart { .. }
        | CocoonCmd::VmExec { .. }
        | CocoonCmd::VmNet { .. }
        | CocoonCmd::SnapshotInspect { .. }
        | CocoonCmd::SnapshotRm { .. }
        | CocoonCmd::SnapshotSave { .. }
        | CocoonCmd::ReconcileStaleCreate { .. }
        | CocoonCmd::MacosImagePull { .. }
        | CocoonCmd::MacosRun { .. }
        | CocoonCmd::MacosInspect { .. }
        | CocoonCmd::MacosList
        | CocoonCmd::MacosStart { .. }
        | CocoonCmd::MacosRm { .. } => {}
    }
}

fn words(push: &mut impl FnMut(&str), words: &[&str]) {
    for w in words {
        push(w);
    }
}

fn cpu_flags(push: &mut impl FnMut(&str), p: &Option<CpuPolicy>) {
    let Some(p) = p else { return };
    push("--cpu-weight");
    push(&p.weight.to_string());
    if let (Some(q), Some(per)) = (p.quota_us, p.period_us) {
        push("--cpu-quota-us");
        push(&q.to_string());
        push("--cpu-period-us");
        push(&per.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_run_action_reads_back_from_json() {
        let cmd = CocoonCmd::VmRun {
            name: "vk-a".into(),
            image: "ubuntu:24.04".into(),
            cpu: Some(2),
            cpu_policy: Some(CpuPolicy {
                weight: 39,
                quota_us: None,
                period_us: None,
            }),
            memory: Some(4 << 30),
            storage: None,
            network: None,
            windows: false,
            fc: false,
            no_direct_io: false,
        };
        let action = crate::Action::RunCocoon {
            op: 1,
            key: None,
            cmd,
        };
        let text = serde_json::to_string(&action).unwrap();
        let back: crate::Action = serde_json::from_str(&text).unwrap();
        assert_eq!(back, action);
    }
}
