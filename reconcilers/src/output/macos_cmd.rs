//! The argv of the cocoon-macos commands (C14, R10, D2). cocoon-macos is a cobra CLI like
//! cocoon: flags first, then `--`, then the positional arguments, so a name can never be read
//! as a flag. The VNC password is not here: the shell appends `--vnc-password` after
//! `--vnc D` (it never enters the journal).

use crate::cocoon::CocoonCmd;

/// The argv after the binary of a cocoon-macos command (empty for any other command).
pub(crate) fn argv(cmd: &CocoonCmd) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |s: &str| a.push(s.to_string());
    match cmd {
        CocoonCmd::MacosImagePull { image } => {
            for s in ["image", "pull", "--", image] {
                push(s);
            }
        }
        CocoonCmd::MacosRun {
            name,
            image,
            cpus,
            memory_mib,
            storage,
            vnc,
        } => {
            for s in ["vm", "run", "--name", name] {
                push(s);
            }
            if let Some(c) = cpus {
                push("--cpus");
                push(&c.to_string());
            }
            if let Some(m) = memory_mib {
                push("--memory");
                push(&m.to_string());
            }
            if let Some(st) = storage {
                push("--storage");
                push(&st.to_string());
            }
            if let Some(d) = vnc {
                push("--vnc");
                push(&d.to_string());
            }
            for s in ["--net", "cni", "--", image] {
                push(s);
            }
        }
        CocoonCmd::MacosInspect { name } => {
            for s in ["vm", "inspect", "--", name] {
                push(s);
            }
        }
        CocoonCmd::MacosList => {
            for s in ["vm", "list"] {
                push(s);
            }
        }
        CocoonCmd::MacosStart { name, vnc } => {
            push("vm");
            push("start");
            if let Some(d) = vnc {
                push("--vnc");
                push(&d.to_string());
            }
            push("--");
            push(name);
        }
        CocoonCmd::MacosRm { name } => {
            for s in ["vm", "rm", "--force", "--", name] {
                push(s);
            }
        }
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
        | CocoonCmd::ReconcileStaleCreate { .. } => {}
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positionals_follow_the_dash_dash() {
        let run = CocoonCmd::MacosRun {
            name: "vk-m".into(),
            image: "sequoia:15".into(),
            cpus: Some(4),
            memory_mib: Some(8192),
            storage: None,
            vnc: Some(3),
        };
        assert_eq!(
            run.argv().join(" "),
            "vm run --name vk-m --cpus 4 --memory 8192 --vnc 3 --net cni -- sequoia:15"
        );
        let start = CocoonCmd::MacosStart {
            name: "vk-m".into(),
            vnc: None,
        };
        assert_eq!(start.argv().join(" "), "vm start -- vk-m");
        let text = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<CocoonCmd>(&text).unwrap(), run);
    }
}
