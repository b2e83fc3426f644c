//! A command in the guest for `kubectl exec` (K4): `cocoon vm exec` with the caller's streams
//! relayed, whatever carries them. cocoon gives the guest command no terminal, so a `-t`
//! session runs without one: resize messages are read and dropped.

use std::process::Stdio;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::cocoon::CocoonCli;

/// What the command produced, in the order the caller should see it; `Status` is last.
#[derive(Debug, PartialEq)]
pub enum Out {
    Stdout(Bytes),
    Stderr(Bytes),
    Status(Value),
}

const CHUNK: usize = 32 * 1024;
/// Kept of the child's stderr to tell cocoon's own failure from the guest's.
const STDERR_TAIL: usize = 4096;

/// `cocoon vm exec [-i] <vm id> -- <command…>`. The VM id comes from cocoon's own record and
/// sits before the `--`; the caller's words all come after it, so none can be read as a
/// cocoon flag, and no shell ever sees them.
pub fn argv(vm_id: &str, stdin: bool, command: &[String]) -> Vec<String> {
    let mut argv = vec!["vm".to_string(), "exec".into()];
    if stdin {
        argv.push("-i".into());
    }
    argv.push(vm_id.to_string());
    argv.push("--".into());
    argv.extend(command.iter().cloned());
    argv
}

pub fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
}

/// The status a kubelet reports for a command that exited non-zero; kubectl exits with `code`.
pub fn exit_code(code: i32) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
}

/// A failure that is not the command's: kubectl prints `message` and exits 1.
pub fn failure(message: impl Into<String>) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": "InternalError", "code": 500})
}

/// A Windows guest has no `vm exec`; the caller is told where to go instead.
pub async fn windows_notice(ip: String, out: mpsc::Sender<Out>) {
    let _ = out
        .send(Out::Stdout(Bytes::from(format!(
            "vk-cocoon: Windows guest: use RDP to {ip}\n"
        ))))
        .await;
    let _ = out.send(Out::Status(success())).await;
}

/// A command this node cannot run at all (CLI-10): kubectl prints `message` and exits 1.
pub async fn refuse(message: String, out: mpsc::Sender<Out>) {
    let _ = out.send(Out::Status(failure(message))).await;
}

/// cocoon's own failure (bad VM, no agent) rather than the guest command's: exit 1 with an
/// `Error: exec:` line, as cocoon-cli documents it.
fn cocoon_failure(code: i32, stderr_tail: &[u8]) -> Option<String> {
    if code != 1 {
        return None;
    }
    String::from_utf8_lossy(stderr_tail)
        .lines()
        .rev()
        .find(|l| l.starts_with("Error: exec:"))
        .map(|l| l.trim_start_matches("Error: ").to_string())
}

/// Copies one output of the child to `out` (when `wanted`), keeping its tail in `keep`;
/// false when the caller has gone.
async fn pump(
    mut r: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    wanted: bool,
    wrap: fn(Bytes) -> Out,
    mut keep: Option<&mut Vec<u8>>,
    out: mpsc::Sender<Out>,
) -> bool {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return true,
            Ok(n) => {
                if let Some(k) = keep.as_deref_mut() {
                    k.extend_from_slice(&buf[..n]);
                    if k.len() > STDERR_TAIL {
                        k.drain(..k.len() - STDERR_TAIL);
                    }
                }
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                if wanted && out.send(wrap(chunk)).await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// Runs `cocoon <argv>` and relays: `stdin` (None: the caller opened no stdin; the channel
/// ending: the caller closed it) to the child, its output to `out`, then the exit as a status.
/// The child leads its own process group; when this future is dropped (the caller went away)
/// the group is killed.
pub async fn run(
    cli: &CocoonCli,
    argv: Vec<String>,
    stdin: Option<mpsc::Receiver<Bytes>>,
    want_stdout: bool,
    want_stderr: bool,
    out: mpsc::Sender<Out>,
) {
    let mut command = Command::new(&cli.bin);
    command
        .args(&argv)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    for (k, v) in &cli.env {
        command.env(k, v);
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("cannot start {}: {e} (check VK_COCOON_BIN)", cli.bin);
            let _ = out.send(Out::Status(failure(msg))).await;
            return;
        }
    };
    let tracked = child.id().map(|pid| cli.groups.track(pid));
    let feed = {
        let child_in = child.stdin.take();
        async move {
            let (Some(mut w), Some(mut rx)) = (child_in, stdin) else {
                return;
            };
            while let Some(b) = rx.recv().await {
                if w.write_all(&b).await.is_err() {
                    break;
                }
            }
            // Dropping the pipe is the command's end of input.
        }
    };
    let stdout: Box<dyn tokio::io::AsyncRead + Unpin + Send> =
        Box::new(child.stdout.take().expect("stdout is piped"));
    let stderr: Box<dyn tokio::io::AsyncRead + Unpin + Send> =
        Box::new(child.stderr.take().expect("stderr is piped"));
    let mut tail = Vec::new();
    let relayed = {
        let a = pump(stdout, want_stdout, Out::Stdout, None, out.clone());
        let b = pump(
            stderr,
            want_stderr,
            Out::Stderr,
            Some(&mut tail),
            out.clone(),
        );
        let outputs = async { futures::join!(a, b) };
        tokio::pin!(outputs);
        tokio::pin!(feed);
        // Input may stay open after the command has finished (kubectl keeps stdin until the
        // stream ends), so only the outputs decide when the relay is over.
        let mut fed = false;
        loop {
            tokio::select! {
                r = &mut outputs => break r.0 && r.1,
                _ = &mut feed, if !fed => fed = true,
            }
        }
    };
    if !relayed {
        return; // The caller is gone; dropping `child` and `tracked` kills the group.
    }
    let status = child.wait().await;
    if let Some(t) = tracked {
        t.exited();
    }
    let st = match status {
        Ok(s) => match s.code() {
            Some(0) => success(),
            Some(code) => match cocoon_failure(code, &tail) {
                Some(msg) => failure(format!("vk-cocoon: cocoon vm exec failed: {msg}")),
                None => exit_code(code),
            },
            None => failure(format!("vk-cocoon: cocoon vm exec ended by {s}")),
        },
        Err(e) => failure(format!("vk-cocoon: cocoon vm exec: {e}")),
    };
    let _ = out.send(Out::Status(st)).await;
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_vm_id_precedes_the_dash_and_every_word_of_the_caller_follows_it() {
        let cmd = vec!["--help".to_string(), "-i".into(), "a b; rm -rf /".into()];
        assert_eq!(
            argv("VMID", true, &cmd),
            [
                "vm",
                "exec",
                "-i",
                "VMID",
                "--",
                "--help",
                "-i",
                "a b; rm -rf /"
            ]
        );
        assert_eq!(
            argv("VMID", false, &["true".to_string()]),
            ["vm", "exec", "VMID", "--", "true"]
        );
    }

    #[test]
    fn a_non_zero_exit_is_reported_as_kubectl_reads_it() {
        let s = exit_code(3);
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(success()["status"], "Success");
    }

    #[test]
    fn cocoons_own_failure_is_told_from_the_guests() {
        assert_eq!(
            cocoon_failure(1, b"log line\nError: exec: vm X: VM not found\n").as_deref(),
            Some("exec: vm X: VM not found")
        );
        assert_eq!(cocoon_failure(1, b"grep found nothing\n"), None);
        assert_eq!(cocoon_failure(2, b"Error: exec: x\n"), None);
    }

    fn stand_in(dir: &std::path::Path, script: &str) -> CocoonCli {
        let bin = dir.join("cocoon");
        std::fs::write(&bin, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        CocoonCli::new(bin.display().to_string())
    }

    async fn collect(mut rx: mpsc::Receiver<Out>) -> Vec<Out> {
        let mut v = Vec::new();
        while let Some(o) = rx.recv().await {
            v.push(o);
        }
        v
    }

    #[tokio::test]
    async fn stdin_is_relayed_and_the_exit_code_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "cat; echo oops >&2; exit 3");
        let (in_tx, in_rx) = mpsc::channel(1);
        in_tx.try_send(Bytes::from_static(b"hello\n")).unwrap();
        drop(in_tx);
        let (tx, rx) = mpsc::channel(8);
        run(&cli, vec![], Some(in_rx), true, true, tx).await;
        let got = collect(rx).await;
        assert!(got.contains(&Out::Stdout(Bytes::from_static(b"hello\n"))));
        assert!(got.contains(&Out::Stderr(Bytes::from_static(b"oops\n"))));
        assert_eq!(got.last(), Some(&Out::Status(exit_code(3))));
    }

    #[tokio::test]
    async fn a_windows_guest_is_pointed_to_rdp() {
        let (tx, rx) = mpsc::channel(8);
        windows_notice("10.0.0.7".into(), tx).await;
        assert_eq!(
            collect(rx).await,
            vec![
                Out::Stdout(Bytes::from_static(
                    b"vk-cocoon: Windows guest: use RDP to 10.0.0.7\n"
                )),
                Out::Status(success())
            ]
        );
    }

    #[tokio::test]
    async fn a_cocoon_failure_is_an_error_not_an_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(
            dir.path(),
            "echo 'Error: exec: vm X: VM not found' >&2; exit 1",
        );
        let (tx, rx) = mpsc::channel(8);
        run(&cli, vec![], None, true, false, tx).await;
        let got = collect(rx).await;
        let Some(Out::Status(s)) = got.last() else {
            panic!("{got:?}")
        };
        assert_eq!(s["reason"], "InternalError");
        assert!(s["message"].as_str().unwrap().contains("VM not found"));
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_kills_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "echo started; exec sleep 300");
        let (tx, mut rx) = mpsc::channel(8);
        let groups = cli.groups.clone();
        let task = tokio::spawn(async move { run(&cli, vec![], None, true, true, tx).await });
        assert_eq!(
            rx.recv().await,
            Some(Out::Stdout(Bytes::from_static(b"started\n")))
        );
        assert_eq!(groups.live(), 1);
        task.abort();
        let _ = task.await;
        assert_eq!(groups.live(), 0);
    }
}
