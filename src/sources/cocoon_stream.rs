//! cocoon's VM event stream (W1, W2): `cocoon vm status --event --format json` for the life of
//! the process. A failed start backs off 1 s → 60 s (reset by a good start); a clean end of
//! stream reconnects after a fixed 2 s. The child runs in its own process group, killed on
//! every reconnect, when this task is dropped and at shutdown, so no stream process is ever
//! orphaned.

use std::process::Stdio;
use std::time::Duration;

use reconcilers::Event;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::EventTx;
use crate::effects::cocoon::CocoonCli;
use crate::effects::cocoon_json;

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
const CLEAN_RECONNECT: Duration = Duration::from_secs(2);
/// Longest line accepted (cocoon N caps lines at 1 MiB too).
const MAX_LINE: usize = 1 << 20;

pub async fn run(cli: CocoonCli, tx: EventTx) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let mut cmd = Command::new(&cli.bin);
        cmd.args(["vm", "status", "--event", "--format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .process_group(0);
        for (k, v) in &cli.env {
            cmd.env(k, v);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, bin = %cli.bin, ?backoff, "cannot start the cocoon event stream");
                let _ = tx
                    .send(Event::VmStreamClosed {
                        clean: false,
                        error: Some(e.to_string()),
                    })
                    .await;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        // Killed when dropped, including on task abort: the stream never ends on its own.
        let _guard = child.id().map(|pid| cli.groups.track(pid));
        backoff = BACKOFF_FIRST;
        if tx.send(Event::VmStreamConnected).await.is_err() {
            return;
        }
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut error = None;
        loop {
            match lines.next_line().await {
                Ok(Some(line)) if line.trim().is_empty() => continue,
                Ok(Some(line)) if line.len() > MAX_LINE => {
                    error = Some(format!(
                        "event line of {} bytes exceeds the 1 MiB cap",
                        line.len()
                    ));
                    break;
                }
                Ok(Some(line)) => match cocoon_json::stream_line(&line) {
                    Ok((kind, vm)) if vm.id.is_empty() && vm.name.is_empty() => {
                        tracing::debug!(?kind, "event without id or name skipped");
                    }
                    Ok((kind, vm)) => {
                        if tx.send(Event::VmStream { kind, vm }).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let clean = match &error {
            None => tokio::time::timeout(CLEAN_RECONNECT, child.wait())
                .await
                .ok()
                .and_then(Result::ok)
                .is_some_and(|s| s.success()),
            Some(_) => false,
        };
        drop(_guard);
        let _ = child.wait().await;
        if let Some(e) = &error {
            tracing::warn!(error = %e, "cocoon event stream broke; reconnecting");
        }
        if tx
            .send(Event::VmStreamClosed {
                clean,
                error: error.clone(),
            })
            .await
            .is_err()
        {
            return;
        }
        if clean {
            tokio::time::sleep(CLEAN_RECONNECT).await;
        } else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}
