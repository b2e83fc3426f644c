//! cocoon's VM event stream (W1, W2): `cocoon vm status --event --format json` for the life of
//! the process. A failed start backs off 1 s → 60 s (reset by a good start); a clean end of
//! stream reconnects after a fixed 2 s. The child runs in its own process group, killed on
//! every reconnect, when this task is dropped and at shutdown, so no stream process is ever
//! orphaned.

use std::process::Stdio;
use std::time::Duration;

use reconcilers::Event;
use tokio::io::BufReader;
use tokio::process::Command;

use super::bounded_lines::{BoundedLines, Line};
use super::EventTx;
use crate::backoff::Backoff;
use crate::cocoon::json as cocoon_json;
use crate::cocoon::CocoonCli;

const START_RETRY: Backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));
const CLEAN_RECONNECT: Duration = Duration::from_secs(2);
/// Longest line accepted (cocoon N caps lines at 1 MiB too); a longer one is never held whole.
const MAX_LINE: usize = 1 << 20;

pub async fn run(cli: CocoonCli, tx: EventTx) {
    let mut backoff = START_RETRY;
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
                let backoff = backoff.failed();
                tracing::warn!(error = %e, bin = %cli.bin, ?backoff, "cannot start the cocoon event stream");
                let _ = tx
                    .send(Event::VmStreamClosed {
                        clean: false,
                        error: Some(e.to_string()),
                    })
                    .await;
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        // Killed when dropped, including on task abort: the stream never ends on its own.
        let _guard = child.id().map(|pid| cli.groups.track(pid));
        backoff.reset();
        if tx.send(Event::VmStreamConnected).await.is_err() {
            return;
        }
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut lines = BoundedLines::new(stdout, MAX_LINE);
        let mut error = None;
        loop {
            match lines.next_line().await {
                Ok(Line::Text(line)) if line.trim().is_empty() => continue,
                Ok(Line::TooLong(len)) => {
                    cli.caps.refused(crate::caps::Cap::GuestOutput);
                    error = Some(format!("event line of {len} bytes exceeds the 1 MiB cap"));
                    break;
                }
                Ok(Line::Text(line)) => match cocoon_json::stream_line(&line) {
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
                Ok(Line::End) => break,
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
            tokio::time::sleep(backoff.failed()).await;
        }
    }
}
