//! The cocoon CLI client: argv straight from the core (never a shell), a timeout per verb
//! (F5), the child in its own process group so a timeout or shutdown kills everything it
//! started.

use std::process::Stdio;

use reconcilers::cocoon::{Binary, CloneSource, CocoonCmd, Output};
use reconcilers::cocoon_caps::{unsupported, CocoonCaps, Verb};
use reconcilers::event::CocoonOk;
use reconcilers::vm::{CocoonError, CocoonErrorKind};
use tokio::process::Command;

pub mod capped;
pub mod json;
pub mod macos;
pub mod process_groups;
pub mod tier;
pub mod timeouts;

pub use process_groups::kill_group;
use process_groups::ProcessGroups;
pub use timeouts::Timeouts;

#[derive(Clone, Debug)]
pub struct CocoonCli {
    pub bin: String,
    pub timeouts: Timeouts,
    /// Extra environment for the child (the e2e simulator's root, for instance).
    pub env: Vec<(String, String)>,
    /// The children still running, shared by every clone: shutdown kills them (N18).
    pub groups: ProcessGroups,
    /// `VK_COCOON_MACOS_BIN`: runs the cocoon-macos commands (C14).
    pub macos_bin: String,
    /// `COCOON_MACOS_VNC_PASSWORD`, added to a cocoon-macos argv that asks for a display.
    pub macos_vnc_password: Option<String>,
    /// Counts calls whose output passed what is kept of it (`capped`).
    pub caps: capped::CapCount,
    /// CLI-10: what this cocoon supports (`tier::detect`); a call it lacks is never made.
    pub verbs: CocoonCaps,
}

impl CocoonCli {
    pub fn new(bin: impl Into<String>) -> Self {
        Self {
            bin: bin.into(),
            timeouts: Timeouts::default(),
            env: Vec::new(),
            groups: ProcessGroups::default(),
            macos_bin: "cocoon-macos".into(),
            macos_vnc_password: None,
            caps: capped::CapCount::default(),
            verbs: CocoonCaps::CURRENT,
        }
    }

    /// CLI-10: the refusal of a verb this cocoon lacks, if it lacks it.
    pub fn lacks(&self, verb: Verb) -> Option<CocoonError> {
        (!self.verbs.has(verb))
            .then(|| CocoonError::new(CocoonErrorKind::Unsupported, unsupported(verb)))
    }

    pub async fn call(&self, cmd: &CocoonCmd) -> Result<CocoonOk, CocoonError> {
        self.call_in(cmd, "").await
    }

    /// [`CocoonCli::call`] for a pod of `namespace` (empty: the node's own call): a macOS
    /// guest's display gets the guest's own password (C14).
    pub async fn call_in(&self, cmd: &CocoonCmd, namespace: &str) -> Result<CocoonOk, CocoonError> {
        if let Some(refused) = cmd.needs().and_then(|v| self.lacks(v)) {
            return Err(refused);
        }
        if let CocoonCmd::VmClone {
            source: CloneSource::FromDir(dir),
            ..
        } = cmd
        {
            resolves_to_itself(dir).await?;
        }
        if cmd.binary() == Binary::CocoonMacos {
            // A projection, not a decision: only these two ask for a display.
            let guest = match cmd {
                CocoonCmd::MacosRun { name, .. } | CocoonCmd::MacosStart { name, .. } => Some(name),
                _ => None,
            };
            let password = self
                .macos_vnc_password
                .as_deref()
                .zip(guest)
                .map(|(node, guest)| macos::guest_password(node, namespace, guest));
            let argv = macos::argv(cmd, password.as_deref());
            return self
                .macos_call(cmd, &argv)
                .await
                .map_err(|e| macos::redact(e, password.as_deref()));
        }
        let argv = cmd.argv();
        let text = self.run(&argv).await?;
        match cmd.output() {
            Output::Nothing => Ok(CocoonOk::Done),
            Output::Vm => {
                let vm = json::vm(&text)?;
                if vm.id.is_empty() {
                    return Err(CocoonError::new(
                        CocoonErrorKind::BadOutput,
                        "cocoon returned a VM record without an id",
                    ));
                }
                Ok(CocoonOk::Vm { vm })
            }
            Output::Vms => Ok(CocoonOk::Vms {
                vms: json::vms(&text)?,
            }),
            Output::Snapshot => Ok(CocoonOk::Snapshot {
                snapshot: json::snapshot(&text)?,
            }),
            Output::StaleCreate => json::stale_create(&text),
            Output::MacosVm | Output::MacosVms => Err(CocoonError::new(
                CocoonErrorKind::BadOutput,
                "a cocoon-macos output from cocoon",
            )),
        }
    }

    async fn macos_call(&self, cmd: &CocoonCmd, argv: &[String]) -> Result<CocoonOk, CocoonError> {
        let text = self.run_bin(&self.macos_bin, argv).await?;
        match cmd.output() {
            Output::MacosVm => Ok(CocoonOk::Vm {
                vm: macos::vm(&text)?,
            }),
            Output::MacosVms => Ok(CocoonOk::Vms {
                vms: macos::vms(&text)?,
            }),
            Output::Nothing => Ok(CocoonOk::Done),
            Output::Vm | Output::Vms | Output::Snapshot | Output::StaleCreate => {
                Err(CocoonError::new(
                    CocoonErrorKind::BadOutput,
                    "a cocoon output from cocoon-macos",
                ))
            }
        }
    }

    /// Runs `bin argv…`; stdout on exit 0, else the classified error from stderr+stdout.
    pub async fn run(&self, argv: &[String]) -> Result<String, CocoonError> {
        self.run_bin(&self.bin, argv).await
    }

    async fn run_bin(&self, bin: &str, argv: &[String]) -> Result<String, CocoonError> {
        let mut command = Command::new(bin);
        command
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command.process_group(0);
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let mut child = command.spawn().map_err(|e| {
            CocoonError::new(
                CocoonErrorKind::Transient,
                format!("cannot start {bin}: {e} (check VK_COCOON_BIN / VK_COCOON_MACOS_BIN)"),
            )
        })?;
        let tracked = child.id().map(|pid| self.groups.track(pid));
        let limit = self.timeouts.for_argv(argv);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async {
            let kept =
                capped::read(stdout, stderr, capped::MAX_STDOUT, capped::STDERR_KEEP).await?;
            match kept.stdout_over {
                true => Ok::<_, std::io::Error>((None, kept)),
                false => Ok((Some(child.wait().await?), kept)),
            }
        };
        let (status, kept) = match tokio::time::timeout(limit, run).await {
            Ok(Ok((Some(status), kept))) => {
                if let Some(t) = tracked {
                    t.exited();
                }
                (status, kept)
            }
            Ok(Ok((None, _))) => {
                if let Some(t) = tracked {
                    t.kill();
                }
                self.caps.refused(crate::caps::Cap::GuestOutput);
                return Err(CocoonError::new(
                    CocoonErrorKind::BadOutput,
                    format!(
                        "cocoon {}: its output passed {} MiB and it was stopped",
                        argv.join(" "),
                        capped::MAX_STDOUT >> 20
                    ),
                ));
            }
            Ok(Err(e)) => {
                if let Some(t) = tracked {
                    t.kill();
                }
                return Err(CocoonError::new(
                    CocoonErrorKind::Transient,
                    format!("cocoon {}: {e}", argv.join(" ")),
                ));
            }
            Err(_) => {
                if let Some(t) = tracked {
                    t.kill();
                }
                return Err(CocoonError::new(
                    CocoonErrorKind::Timeout,
                    format!("cocoon {} did not finish within {limit:?}", argv.join(" "),),
                ));
            }
        };
        if kept.capped() {
            self.caps.refused(crate::caps::Cap::GuestOutput);
        }
        let stdout = String::from_utf8_lossy(&kept.stdout).into_owned();
        if status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&kept.stderr);
        Err(CocoonError::classify(&format!("{stderr}\n{stdout}")))
    }
}

/// T4: the core checked that a `--from-dir` path lies under its root as written; here the
/// filesystem must agree, so a symlink inside the root cannot lead a clone elsewhere.
async fn resolves_to_itself(dir: &str) -> Result<(), CocoonError> {
    let real = tokio::fs::canonicalize(dir).await.map_err(|e| {
        CocoonError::new(
            CocoonErrorKind::InvalidArgs,
            format!("--from-dir {dir}: {e}"),
        )
    })?;
    match real == std::path::Path::new(dir) {
        true => Ok(()),
        false => Err(CocoonError::new(
            CocoonErrorKind::InvalidArgs,
            format!(
                "--from-dir {dir} resolves to {} (a symbolic link): refused",
                real.display()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `cocoon` that runs `script`, its calls counted on `metrics`.
    fn stand_in(
        dir: &std::path::Path,
        script: &str,
        metrics: &crate::metrics::Metrics,
    ) -> CocoonCli {
        let bin = dir.join("cocoon");
        std::fs::write(&bin, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        CocoonCli {
            caps: metrics.cap_count(),
            ..CocoonCli::new(bin.display().to_string())
        }
    }

    fn guest_output_refusals(m: &crate::metrics::Metrics) -> u64 {
        m.cap_refusals
            .with_label_values(&[crate::caps::Cap::GuestOutput.as_str()])
            .get()
    }

    #[tokio::test]
    async fn a_guest_that_prints_without_end_is_stopped_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = crate::metrics::Metrics::new();
        let cli = stand_in(dir.path(), "exec yes guest-output", &metrics);
        let argv: Vec<String> = ["vm", "exec", "x", "--", "true"].map(String::from).into();
        let err = cli.run(&argv).await.unwrap_err();
        assert_eq!(err.kind, CocoonErrorKind::BadOutput, "{err:?}");
        assert!(err.message.contains("16 MiB"), "{}", err.message);
        assert_eq!(guest_output_refusals(&metrics), 1);
        assert_eq!(cli.groups.live(), 0, "the writer's group was killed");
    }

    #[tokio::test]
    async fn a_long_stderr_keeps_its_last_lines_for_the_classification() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = crate::metrics::Metrics::new();
        let script =
            "head -c 1000000 /dev/zero | tr '\\0' x >&2\necho 'Error: vm not found' >&2\nexit 1";
        let cli = stand_in(dir.path(), script, &metrics);
        let argv: Vec<String> = ["vm", "inspect", "x"].map(String::from).into();
        let err = cli.run(&argv).await.unwrap_err();
        assert_eq!(
            err.kind,
            CocoonErrorKind::VmNotFound,
            "{}",
            &err.message[err.message.len().saturating_sub(200)..]
        );
        assert_eq!(guest_output_refusals(&metrics), 1);
    }

    /// CLI-10: an older cocoon would answer the verb with its help and exit 0; the call is
    /// refused before anything runs (the binary here does not even exist).
    #[tokio::test]
    async fn a_verb_this_cocoon_lacks_is_refused_without_running_it() {
        let cli = CocoonCli {
            verbs: CocoonCaps::REFERENCE,
            ..CocoonCli::new("/nonexistent/cocoon")
        };
        let exec = CocoonCmd::VmExec {
            id: "v".into(),
            argv: vec!["true".into()],
        };
        let err = cli.call(&exec).await.unwrap_err();
        assert_eq!(err.kind, CocoonErrorKind::Unsupported, "{err:?}");
        assert!(err.message.contains("`cocoon vm exec`"), "{}", err.message);
        let stale = CocoonCmd::ReconcileStaleCreate { id: "v".into() };
        let err = cli.call(&stale).await.unwrap_err();
        assert!(
            err.message.contains("reconcile-stale-create"),
            "{}",
            err.message
        );
        // A verb it has is run (and fails here only because the binary is missing).
        let err = cli.call(&CocoonCmd::VmList).await.unwrap_err();
        assert_eq!(err.kind, CocoonErrorKind::Transient, "{err:?}");
    }

    #[tokio::test]
    async fn a_from_dir_through_a_symlink_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let real = root.join("snap");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        assert!(resolves_to_itself(real.to_str().unwrap()).await.is_ok());
        let err = resolves_to_itself(root.join("link").to_str().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind, CocoonErrorKind::InvalidArgs);
        assert!(err.message.contains("symbolic link"), "{}", err.message);
        let err = resolves_to_itself(root.join("absent").to_str().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind, CocoonErrorKind::InvalidArgs);
    }
}
