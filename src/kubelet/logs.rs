//! A `cocoon vm logs` child's output as an HTTP body (K3): chunks go out as they are read, so
//! nothing is held whole and a follower sees each line when cocoon writes it. The child leads a
//! process group of its own; when the body is dropped (the caller went away, or `limitBytes`
//! was reached) the group is killed, so no `cocoon vm logs -f` outlives its reader.

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use reconcilers::vm::{CocoonError, CocoonErrorKind};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdout, Command};

use crate::cocoon::process_groups::Tracked;
use crate::cocoon::CocoonCli;

use super::log_time::{LineFilter, Nanos as LogNanos};

const CHUNK: usize = 64 * 1024;
/// Kept of the child's stderr, for the error a failed start answers with.
const STDERR_KEEP: usize = 16 * 1024;
/// How long the first output (or the child's exit) is awaited before answering 200: a
/// follower of a quiet log gets its headers now and its lines when they come.
const FIRST_OUTPUT: Duration = Duration::from_secs(2);

struct Running {
    child: Child,
    stdout: ChildStdout,
    tracked: Option<Tracked>,
    left: Option<u64>,
    first: Option<Bytes>,
    buf: Vec<u8>,
    /// Dates, filters and stamps lines when the caller asked for `since` or `timestamps`.
    filter: Option<LineFilter>,
    _permit: super::sessions::SessionPermit,
}

impl Running {
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.left == Some(0) {
            return None;
        }
        let mut chunk = loop {
            let raw = match self.first.take() {
                Some(b) => Some(b),
                None => match self.stdout.read(&mut self.buf).await {
                    Ok(0) | Err(_) => None,
                    Ok(n) => Some(Bytes::copy_from_slice(&self.buf[..n])),
                },
            };
            let Some(raw) = raw else {
                let mut rest = Vec::new();
                if let Some(f) = self.filter.as_mut() {
                    f.finish(now_nanos(), &mut rest);
                }
                let _ = self.child.wait().await;
                if let Some(t) = self.tracked.take() {
                    t.exited();
                }
                if rest.is_empty() {
                    return None;
                }
                break Bytes::from(rest);
            };
            let Some(f) = self.filter.as_mut() else {
                break raw;
            };
            let mut out = Vec::new();
            f.push(&raw, now_nanos(), &mut out);
            if !out.is_empty() {
                break Bytes::from(out);
            }
        };
        if let Some(left) = self.left {
            if chunk.len() as u64 > left {
                chunk.truncate(left as usize);
            }
            self.left = Some(left - chunk.len() as u64);
        }
        Some(chunk)
    }
}

fn now_nanos() -> LogNanos {
    k8s_openapi::jiff::Timestamp::now().as_nanosecond()
}

/// Starts `cocoon <argv>` and answers with its stdout as a stream, or with the classified
/// error when it fails before writing anything.
pub async fn stream(
    cli: &CocoonCli,
    argv: &[String],
    limit_bytes: Option<u64>,
    filter: Option<LineFilter>,
    permit: super::sessions::SessionPermit,
) -> Result<impl Stream<Item = Result<Bytes, std::io::Error>> + 'static, CocoonError> {
    let mut command = Command::new(&cli.bin);
    command
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    for (k, v) in &cli.env {
        command.env(k, v);
    }
    let mut child = command.spawn().map_err(|e| {
        CocoonError::new(
            CocoonErrorKind::Transient,
            format!("cannot start {}: {e} (check VK_COCOON_BIN)", cli.bin),
        )
    })?;
    let tracked = child.id().map(|pid| cli.groups.track(pid));
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().map(|mut e| {
        tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = e.read(&mut buf).await {
                if kept.len() < STDERR_KEEP {
                    kept.extend_from_slice(&buf[..n]);
                }
            }
            kept
        })
    });
    let mut buf = vec![0u8; CHUNK];
    let first = match tokio::time::timeout(FIRST_OUTPUT, stdout.read(&mut buf)).await {
        Ok(Ok(0)) => {
            // Nothing written: either an empty log or a failure, which the exit tells apart.
            let status = child.wait().await;
            if let Some(t) = tracked {
                t.exited();
            }
            let err = match stderr {
                Some(h) => h.await.unwrap_or_default(),
                None => Vec::new(),
            };
            return match status {
                Ok(s) if s.success() => {
                    Ok(futures::future::Either::Left(futures::stream::empty::<
                        Result<Bytes, std::io::Error>,
                    >()))
                }
                Ok(s) => {
                    let mut e = CocoonError::classify(&String::from_utf8_lossy(&err));
                    if e.message.trim().is_empty() {
                        e.message = format!("cocoon {} exited with {s}", argv.join(" "));
                    }
                    Err(e)
                }
                Err(e) => Err(CocoonError::new(
                    CocoonErrorKind::Transient,
                    format!("cocoon {}: {e}", argv.join(" ")),
                )),
            };
        }
        Ok(Ok(n)) => Some(Bytes::copy_from_slice(&buf[..n])),
        Ok(Err(e)) => {
            return Err(CocoonError::new(
                CocoonErrorKind::Transient,
                format!("cocoon {}: {e}", argv.join(" ")),
            ))
        }
        Err(_) => None,
    };
    let running = Running {
        child,
        stdout,
        tracked,
        left: limit_bytes,
        first,
        buf,
        filter,
        _permit: permit,
    };
    Ok(futures::future::Either::Right(futures::stream::unfold(
        running,
        |mut r| async move { r.next_chunk().await.map(|c| (Ok(c), r)) },
    )))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use futures::StreamExt;

    use super::*;

    fn stand_in(dir: &std::path::Path, script: &str) -> CocoonCli {
        let bin = dir.join("cocoon");
        std::fs::write(&bin, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        CocoonCli::new(bin.display().to_string())
    }

    fn permit() -> crate::kubelet::sessions::SessionPermit {
        crate::kubelet::log_streams(Default::default())
            .try_acquire("ns")
            .unwrap()
    }

    async fn collect(s: impl Stream<Item = Result<Bytes, std::io::Error>>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut s = std::pin::pin!(s);
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn output_is_streamed_and_cut_at_the_byte_limit() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "printf 'one\\ntwo\\nthree\\n'");
        let s = stream(&cli, &[], None, None, permit()).await.unwrap();
        assert_eq!(collect(s).await, b"one\ntwo\nthree\n");
        let s = stream(&cli, &[], Some(6), None, permit()).await.unwrap();
        assert_eq!(collect(s).await, b"one\ntw");
    }

    #[tokio::test]
    async fn a_failure_before_any_output_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cli = stand_in(dir.path(), "echo 'Error: vm x: VM not found' >&2; exit 1");
        let err = match stream(&cli, &[], None, None, permit()).await {
            Err(e) => e,
            Ok(_) => panic!("a failed cocoon must not stream"),
        };
        assert!(err.message.contains("not found"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_dropped_body_kills_the_follower() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let cli = stand_in(
            dir.path(),
            &format!(
                "echo $$ > {}; echo first; exec sleep 300",
                pid_file.display()
            ),
        );
        let s = stream(&cli, &[], None, None, permit()).await.unwrap();
        let mut s = Box::pin(s);
        assert_eq!(&s.next().await.unwrap().unwrap()[..], b"first\n");
        assert_eq!(cli.groups.live(), 1);
        drop(s);
        assert_eq!(cli.groups.live(), 0);
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut gone = false;
        for _ in 0..200 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty()
                || stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, r)| r.starts_with('Z'))
            {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(gone, "the follower outlived its reader");
    }
}
