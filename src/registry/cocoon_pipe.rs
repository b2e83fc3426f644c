//! The registry transfers wired to cocoon: `snapshot export <name> -o -` streamed into a push
//! (CLI-6.19), a pull streamed into `snapshot import --name <local>` (CLI-6.18, archive as in
//! CLI-9). argv goes to cocoon without a shell, the child gets its own process group, and the
//! group is killed whenever the transfer is dropped or fails, so a cancelled wake or hibernate
//! leaves no cocoon process behind.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use reconcilers::vm::{CocoonError, CocoonErrorKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;

use super::pull::{valid_snapshot_name, PullOutcome};
use super::{PushKnobs, PushOutcome, Registry, RegistryError};
use crate::cocoon::{kill_group, CocoonCli};

/// cocoon's stderr is log lines plus the final error; this much is kept for the message.
const STDERR_KEEP: usize = 64 << 10;
/// A snapshot held by a running save or reader is retried for this long (CLI-3).
const BUSY_RETRY_FOR: Duration = Duration::from_secs(30);
const BUSY_RETRY_EVERY: Duration = Duration::from_millis(500);

/// Kills the child's process group on drop unless the child has been seen to exit.
struct GroupGuard {
    pid: Option<u32>,
    exited: Arc<AtomicBool>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            if !self.exited.load(Ordering::SeqCst) {
                kill_group(pid);
            }
        }
    }
}

impl GroupGuard {
    fn kill_now(&mut self) {
        if let Some(pid) = self.pid.take() {
            if !self.exited.load(Ordering::SeqCst) {
                kill_group(pid);
            }
        }
    }
}

/// Pipes of 1 MiB instead of 64 KiB: a snapshot crosses them in 16 times fewer wake-ups.
/// Best effort; the kernel's `pipe-max-size` may refuse it.
fn widen_pipe(fd: &impl std::os::fd::AsRawFd) {
    // SAFETY: fcntl on a descriptor we own; failure only leaves the default size.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

fn command(cli: &CocoonCli, argv: &[&str]) -> Command {
    let mut c = Command::new(&cli.bin);
    c.args(argv).kill_on_drop(true).process_group(0);
    for (k, v) in &cli.env {
        c.env(k, v);
    }
    c
}

fn spawn_error(cli: &CocoonCli, e: io::Error) -> RegistryError {
    RegistryError::Cocoon(CocoonError::new(
        CocoonErrorKind::Transient,
        format!("cannot start {}: {e} (check VK_COCOON_BIN)", cli.bin),
    ))
}

/// Waits for the child in the background, collecting its stderr; reports exit 0 as `Ok`, any
/// other end as the classified cocoon error. Until it exits, its group is among those
/// shutdown kills (N18).
fn watch(
    cli: &CocoonCli,
    mut child: Child,
    stderr: Option<ChildStderr>,
    argv: String,
    exited: Arc<AtomicBool>,
) -> oneshot::Receiver<Result<(), CocoonError>> {
    let tracked = child.id().map(|pid| cli.groups.track(pid));
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut text = Vec::new();
        if let Some(mut e) = stderr {
            let mut buf = [0u8; 8192];
            loop {
                match e.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if text.len() < STDERR_KEEP {
                            text.extend_from_slice(&buf[..n]);
                        }
                    }
                }
            }
        }
        let status = child.wait().await;
        exited.store(true, Ordering::SeqCst);
        if let Some(t) = tracked {
            t.exited();
        }
        let res = match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => {
                let text = String::from_utf8_lossy(&text);
                let mut e = CocoonError::classify(&text);
                if e.message.trim().is_empty() {
                    e.message = format!("cocoon {argv} exited with {s}");
                }
                Err(e)
            }
            Err(e) => Err(CocoonError::new(
                CocoonErrorKind::Transient,
                format!("cocoon {argv}: {e}"),
            )),
        };
        let _ = tx.send(res);
    });
    rx
}

/// cocoon's export stdout, which reports the exporter's failure at EOF: a tar cut short by a
/// dying exporter, or one that looks complete from a process that then fails, both end in an
/// error instead of a clean end of stream.
struct ExportStream {
    stdout: ChildStdout,
    status: oneshot::Receiver<Result<(), CocoonError>>,
    outcome: Option<Result<(), CocoonError>>,
    guard: GroupGuard,
}

impl AsyncRead for ExportStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.stdout).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {}
            other => return other,
        }
        if this.outcome.is_none() {
            match Pin::new(&mut this.status).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    this.outcome = Some(r.unwrap_or_else(|_| {
                        Err(CocoonError::new(
                            CocoonErrorKind::Transient,
                            "the export watcher went away",
                        ))
                    }))
                }
            }
        }
        match this.outcome.as_ref().expect("set above") {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io::Error::other(format!(
                "cocoon snapshot export failed: {}",
                e.message
            )))),
        }
    }
}

impl ExportStream {
    /// The exporter's own verdict, waiting a moment for it: a push that failed because the
    /// stream broke reports why cocoon stopped rather than the broken tar.
    async fn verdict(&mut self, wait: Duration) -> Option<Result<(), CocoonError>> {
        if let Some(o) = &self.outcome {
            return Some(o.clone());
        }
        match tokio::time::timeout(wait, &mut self.status).await {
            Ok(Ok(r)) => Some(r),
            _ => None,
        }
    }
}

/// Pushes the local cocoon snapshot `snapshot_name` as `name:tag`.
#[allow(clippy::too_many_arguments)]
pub async fn push_from_cocoon(
    reg: &Registry,
    cli: &CocoonCli,
    snapshot_name: &str,
    name: &str,
    tag: &str,
    base_image: Option<&str>,
    from_node: Option<&str>,
    knobs: &PushKnobs,
) -> Result<PushOutcome, RegistryError> {
    let meta = PushMeta {
        base_image,
        from_node,
        owner: None,
    };
    push_owned_from_cocoon(reg, cli, snapshot_name, name, tag, meta, knobs).await
}

/// What a push records in the manifest besides the snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub struct PushMeta<'a> {
    pub base_image: Option<&'a str>,
    pub from_node: Option<&'a str>,
    /// The owner record `<namespace>/<pod>` (T5). With one, the push first refuses to replace
    /// a tag another namespace owns (T7).
    pub owner: Option<&'a str>,
}

/// [`push_from_cocoon`] with the owner record: the tag's current owner is checked before
/// cocoon's export starts, and the new manifest carries `meta.owner`.
pub async fn push_owned_from_cocoon(
    reg: &Registry,
    cli: &CocoonCli,
    snapshot_name: &str,
    name: &str,
    tag: &str,
    meta: PushMeta<'_>,
    knobs: &PushKnobs,
) -> Result<PushOutcome, RegistryError> {
    let PushMeta {
        base_image,
        from_node,
        owner,
    } = meta;
    if let Some(owner) = owner {
        let current = reg.current_owner(name, tag).await?;
        super::owner::check_push(current.as_ref().map(|c| &c.record), owner, name, tag)?;
    }
    if !valid_snapshot_name(snapshot_name) {
        return Err(RegistryError::Refused(format!(
            "{snapshot_name:?} is not a cocoon snapshot name"
        )));
    }
    let argv = ["snapshot", "export", "-o", "-", "--", snapshot_name];
    let mut child = command(cli, &argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_error(cli, e))?;
    let exited = Arc::new(AtomicBool::new(false));
    let guard = GroupGuard {
        pid: child.id(),
        exited: exited.clone(),
    };
    let stdout = child.stdout.take().expect("stdout is piped");
    widen_pipe(&stdout);
    let stderr = child.stderr.take();
    let status = watch(cli, child, stderr, argv.join(" "), exited);
    let mut export = ExportStream {
        stdout,
        status,
        outcome: None,
        guard,
    };
    let res = reg
        .push_snapshot_owned(name, tag, &mut export, base_image, from_node, owner, knobs)
        .await;
    match res {
        Ok(o) => Ok(o),
        Err(e) => {
            let verdict = export.verdict(Duration::from_secs(2)).await;
            export.guard.kill_now();
            match verdict {
                Some(Err(ce)) => Err(RegistryError::Cocoon(ce)),
                _ => Err(e),
            }
        }
    }
}

/// Replaces the local snapshot `local_name` with the registry's `name:tag`: removes any local
/// snapshot of that name (not-found is fine), then streams the pull into `snapshot import`.
/// On any error the importer is killed before its input is closed, so it never sees a
/// complete archive built from bad data.
pub async fn pull_into_cocoon(
    reg: &Registry,
    cli: &CocoonCli,
    name: &str,
    tag: &str,
    local_name: &str,
) -> Result<PullOutcome, RegistryError> {
    import(reg, cli, name, tag, local_name, None).await
}

/// [`pull_into_cocoon`] for a pod of `tenant` (T7, T16): the tag's owner record is read first
/// and must allow that namespace; the pull is then pinned to the digest checked, and the
/// local snapshot's description carries the manifest's record (none for a public base).
pub async fn pull_owned_into_cocoon(
    reg: &Registry,
    cli: &CocoonCli,
    (name, tag): (&str, &str),
    local_name: &str,
    tenant: reconcilers::owner::Tenant<'_>,
) -> Result<PullOutcome, RegistryError> {
    if !valid_snapshot_name(local_name) {
        return Err(RegistryError::Refused(format!(
            "{local_name:?} is not a cocoon snapshot name"
        )));
    }
    let Some(current) = reg.current_owner(name, tag).await? else {
        return Err(RegistryError::Absent(format!("{name}:{tag}")));
    };
    super::owner::check_pull(&current.record, tenant, name, tag)?;
    local_replaceable(cli, reg.bases(), local_name, (tenant, &current.record)).await?;
    let description = match &current.record {
        reconcilers::owner::Record::Owned(o) => o.description(),
        reconcilers::owner::Record::Public
        | reconcilers::owner::Record::Legacy
        | reconcilers::owner::Record::Unrecorded
        | reconcilers::owner::Record::Unreadable(_) => String::new(),
    };
    import(
        reg,
        cli,
        name,
        &current.digest,
        local_name,
        Some(description.as_str()),
    )
    .await
}

/// T8, T15: a pull replaces the local snapshot of its name, so that snapshot must be one a pod
/// of `namespace` may remove: absent, or its own namespace's; or, when what comes in is a
/// public base, the node's older copy of that base. Anything else is refused (`Foreign`), and
/// nothing is removed or imported.
async fn local_replaceable(
    cli: &CocoonCli,
    bases: reconcilers::owner::Bases<'_>,
    local_name: &str,
    (tenant, incoming): (reconcilers::owner::Tenant<'_>, &reconcilers::owner::Record),
) -> Result<(), RegistryError> {
    use reconcilers::owner::Record;
    let cmd = reconcilers::cocoon::CocoonCmd::SnapshotInspect {
        name: local_name.to_string(),
    };
    match cli.call(&cmd).await {
        Ok(reconcilers::event::CocoonOk::Snapshot { snapshot }) => {
            match Record::from_description(&snapshot.description, local_name, bases) {
                Record::Public if *incoming == Record::Public => Ok(()),
                here => here
                    .replaceable_by(tenant, &format!("local snapshot {local_name}"))
                    .map_err(|why| RegistryError::Foreign(format!("{why}; it is not replaced"))),
            }
        }
        Err(e) if e.kind == CocoonErrorKind::SnapshotNotFound => Ok(()),
        Err(e) => Err(RegistryError::Cocoon(e)),
        Ok(other) => Err(RegistryError::Local(format!(
            "snapshot inspect {local_name} answered {other:?}"
        ))),
    }
}

/// Removes the local `local_name`, then streams `name:tag` into `snapshot import`;
/// `description` (T5) is what the imported snapshot's description becomes, when given.
async fn import(
    reg: &Registry,
    cli: &CocoonCli,
    name: &str,
    tag: &str,
    local_name: &str,
    description: Option<&str>,
) -> Result<PullOutcome, RegistryError> {
    if !valid_snapshot_name(local_name) {
        return Err(RegistryError::Refused(format!(
            "{local_name:?} is not a cocoon snapshot name"
        )));
    }
    remove_snapshot(cli, local_name).await?;
    let mut argv = vec!["snapshot", "import", "--name", local_name];
    if let Some(d) = description.filter(|d| !d.is_empty()) {
        argv.extend(["--description", d]);
    }
    let mut imp = Importer::spawn(cli, &argv)?;
    let res = reg
        .pull_snapshot_described(name, tag, &mut imp.stdin, local_name, description)
        .await;
    let limit = cli.timeouts.for_argv(&["snapshot", "import"]);
    imp.finish(res, limit).await
}

/// Streams the cloud image `name:tag` (its disk layers, in title order) into
/// `cocoon image import <image_name>` (CLI-6.3), with the same kill-before-close rule.
pub async fn pull_cloud_image_into_cocoon(
    reg: &Registry,
    cli: &CocoonCli,
    name: &str,
    tag: &str,
    image_name: &str,
) -> Result<u64, RegistryError> {
    if image_name.is_empty()
        || image_name.starts_with('-')
        || image_name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(RegistryError::Refused(format!(
            "{image_name:?} is not an image name cocoon can import as"
        )));
    }
    let mut imp = Importer::spawn(cli, &["image", "import", "--", image_name])?;
    let res = reg.pull_cloud_image(name, tag, &mut imp.stdin).await;
    let limit = cli.timeouts.for_argv(&["image", "import"]);
    imp.finish(res, limit).await
}

/// A cocoon process reading an archive or image on its stdin.
struct Importer {
    stdin: ChildStdin,
    status: oneshot::Receiver<Result<(), CocoonError>>,
    guard: GroupGuard,
    what: String,
}

impl Importer {
    fn spawn(cli: &CocoonCli, argv: &[&str]) -> Result<Importer, RegistryError> {
        let mut child = command(cli, argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_error(cli, e))?;
        let exited = Arc::new(AtomicBool::new(false));
        let guard = GroupGuard {
            pid: child.id(),
            exited: exited.clone(),
        };
        let stdin = child.stdin.take().expect("stdin is piped");
        widen_pipe(&stdin);
        let stderr = child.stderr.take();
        let what = argv.join(" ");
        let status = watch(cli, child, stderr, what.clone(), exited);
        Ok(Importer {
            stdin,
            status,
            guard,
            what,
        })
    }

    /// After the stream was written (`res`): on success close the input and wait for exit 0;
    /// on failure kill the importer first, so it never reads an end of input.
    async fn finish<T>(
        mut self,
        res: Result<T, RegistryError>,
        timeout: Duration,
    ) -> Result<T, RegistryError> {
        let value = match res {
            Ok(v) => v,
            Err(RegistryError::Local(m)) => {
                // The stream broke: most likely the importer stopped reading, and its own
                // error says why.
                let verdict = tokio::time::timeout(Duration::from_secs(2), &mut self.status).await;
                self.guard.kill_now();
                return Err(match verdict {
                    Ok(Ok(Err(ce))) => RegistryError::Cocoon(ce),
                    _ => RegistryError::Local(m),
                });
            }
            Err(e) => {
                self.guard.kill_now();
                return Err(e);
            }
        };
        if let Err(e) = self.stdin.shutdown().await {
            self.guard.kill_now();
            return Err(RegistryError::Local(format!(
                "closing the input of cocoon {}: {e}",
                self.what
            )));
        }
        drop(self.stdin);
        let verdict = match tokio::time::timeout(timeout, &mut self.status).await {
            Ok(Ok(v)) => v,
            Ok(Err(_)) => Err(CocoonError::new(
                CocoonErrorKind::Transient,
                format!("the watcher of cocoon {} went away", self.what),
            )),
            Err(_) => {
                self.guard.kill_now();
                Err(CocoonError::new(
                    CocoonErrorKind::Timeout,
                    format!("cocoon {} did not finish within {timeout:?}", self.what),
                ))
            }
        };
        verdict.map_err(RegistryError::Cocoon)?;
        Ok(value)
    }
}

/// `snapshot rm -- <name>`; a snapshot that is not there is already removed, a busy one is
/// retried.
pub async fn remove_snapshot(cli: &CocoonCli, name: &str) -> Result<(), RegistryError> {
    let argv: Vec<String> = ["snapshot", "rm", "--", name]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let deadline = tokio::time::Instant::now() + BUSY_RETRY_FOR;
    loop {
        match cli.run(&argv).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind == CocoonErrorKind::SnapshotNotFound => return Ok(()),
            Err(e)
                if e.kind == CocoonErrorKind::SnapshotBusy
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(BUSY_RETRY_EVERY).await;
            }
            Err(e) => return Err(RegistryError::Cocoon(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A `cocoon` that answers `snapshot inspect -- <name>` from a table: `theirs` is team-a's,
    /// `mine` team-b's, `base` has no record, anything else is not found.
    fn cocoon(dir: &std::path::Path) -> CocoonCli {
        let bin = dir.join("cocoon");
        let script = r#"#!/bin/sh
case "$4" in
  theirs) echo '{"id":"S1","name":"theirs","description":"vk-cocoon owner=team-a/victim"}' ;;
  mine) echo '{"id":"S2","name":"mine","description":"vk-cocoon owner=team-b/p"}' ;;
  base) echo '{"id":"S3","name":"base","description":""}' ;;
  *) echo "Error: inspect: snapshot not found" >&2; exit 1 ;;
esac
"#;
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        CocoonCli::new(bin.display().to_string())
    }

    #[tokio::test]
    async fn a_pull_replaces_only_a_local_snapshot_its_namespace_may_remove() {
        use reconcilers::owner::{Bases, Record, Tenant};
        let team_b = Tenant {
            namespace: "team-b",
            uid: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let cli = cocoon(dir.path());
        let listed = vec!["base".to_string()];
        let (bases, none) = (Bases::Listed(&listed), Bases::Listed(&[]));
        let owned = Record::from_annotation(Some("team-b/p"), "x", none);
        for name in ["mine", "absent"] {
            let ok = local_replaceable(&cli, bases, name, (team_b, &owned)).await;
            assert!(ok.is_ok(), "{name}");
        }
        // The node's copy of a public base is refreshed by a pull of that base, never
        // replaced by a pod's own snapshot; a record-less one nobody listed stays too.
        let public = local_replaceable(&cli, bases, "base", (team_b, &Record::Public)).await;
        assert!(public.is_ok());
        for (bases, incoming) in [(bases, &owned), (none, &Record::Public), (none, &owned)] {
            let refused = local_replaceable(&cli, bases, "base", (team_b, incoming)).await;
            assert!(
                matches!(refused, Err(RegistryError::Foreign(_))),
                "{incoming:?}"
            );
        }
        match local_replaceable(&cli, bases, "theirs", (team_b, &owned)).await {
            Err(RegistryError::Foreign(m)) => {
                assert!(
                    m.contains("another namespace") && !m.contains("team-a"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
