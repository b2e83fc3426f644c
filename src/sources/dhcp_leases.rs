//! The cocoon-net lease file (LEASE-2, LEASE-4). Watched with notify (the writer renames a
//! complete new file over the path) plus a slow poll as a safety net; every content change is
//! one `DhcpLeasesChanged` event carrying only the difference from the table sent before (the first
//! after start carries the whole table). A torn or garbage file is logged and the last good
//! table kept.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use reconcilers::event::DhcpLease;
use reconcilers::small_str::SmallStr;
use reconcilers::Event;
use serde::Deserialize;

use super::EventTx;

const POLL: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct Row {
    #[serde(default)]
    mac: String,
    #[serde(default)]
    ip: String,
    #[serde(default)]
    expiry: String,
}

/// Parses the file; `Err` only for a document that is not a lease array at all.
pub fn parse(text: &str) -> Result<Vec<DhcpLease>, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Option<Vec<serde_json::Value>> =
        serde_json::from_str(t).map_err(|e| format!("lease file is not a JSON array: {e}"))?;
    let mut out = Vec::new();
    for v in rows.unwrap_or_default() {
        // Per-row leniency: one damaged row never hides the others.
        let Ok(row) = serde_json::from_value::<Row>(v) else {
            continue;
        };
        let Some(mac) = normalise_mac(&row.mac) else {
            continue;
        };
        if row.ip.parse::<std::net::Ipv4Addr>().is_err() {
            continue;
        }
        let Some(expiry) = reconcilers::time::parse_rfc3339(&row.expiry) else {
            continue;
        };
        out.push(DhcpLease {
            mac: mac.into(),
            ip: row.ip.into(),
            expiry,
        });
    }
    Ok(out)
}

/// Accepts `:`/`-` separators and either case; returns lowercase colon form.
pub fn normalise_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.trim().split([':', '-']).collect();
    if parts.len() != 6
        || !parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
    {
        return None;
    }
    Some(parts.join(":").to_ascii_lowercase())
}

/// The event for a freshly read `table`, given the table sent last (`None` before the first):
/// the first is the whole table as upserts, even when empty, so the core knows the file was
/// read; later ones only new or changed rows and vanished MACs, and none when nothing changed.
/// Duplicate MACs are resolved (latest expiry wins) before diffing.
fn next_event(
    last: &mut Option<BTreeMap<SmallStr, DhcpLease>>,
    table: Vec<DhcpLease>,
) -> Option<Event> {
    let (upsert, remove) = match last {
        None => (reconcilers::dhcp::normalize(table), Vec::new()),
        Some(sent) => reconcilers::dhcp::diff(sent, table),
    };
    let first = last.is_none();
    if !first && upsert.is_empty() && remove.is_empty() {
        return None;
    }
    let sent = last.get_or_insert_with(BTreeMap::new);
    for mac in &remove {
        sent.remove(mac);
    }
    for l in &upsert {
        sent.insert(l.mac.clone(), l.clone());
    }
    Some(Event::DhcpLeasesChanged { upsert, remove })
}

fn fingerprint(path: &Path) -> Option<(i64, i64, u64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.mtime(), m.mtime_nsec(), m.size(), m.ino()))
}

pub async fn run(path: PathBuf, tx: EventTx) {
    let (wake_tx, mut wake_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let watcher = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
        let _ = wake_tx.send(());
    });
    let _watcher = match watcher {
        Ok(mut w) => match w.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(w),
            Err(e) => {
                tracing::info!(dir = %dir.display(), error = %e, "cannot watch the lease directory yet; polling");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "no file watcher; polling the lease file");
            None
        }
    };
    let mut last_fp = None;
    let mut last: Option<BTreeMap<SmallStr, DhcpLease>> = None;
    loop {
        let fp = fingerprint(&path);
        if fp != last_fp || last.is_none() {
            last_fp = fp;
            let table = match fp {
                None => Ok(Vec::new()),
                Some(_) => match tokio::fs::read_to_string(&path).await {
                    Ok(text) => parse(&text),
                    Err(e) => Err(e.to_string()),
                },
            };
            match table {
                Ok(table) => {
                    if let Some(event) = next_event(&mut last, table) {
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    // Retry on the next change or poll: the writer may be mid-update.
                    last_fp = None;
                    tracing::warn!(path = %path.display(), error = %e, "lease file unreadable; keeping the last good table");
                }
            }
        }
        tokio::select! {
            _ = wake_rx.recv() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerates_null_bad_rows_and_case() {
        assert!(parse("null").unwrap().is_empty());
        assert!(parse("").unwrap().is_empty());
        let t = r#"[{"mac":"02:5E:11:3A:9C:01","ip":"172.22.0.17","expiry":"2026-05-02T09:12:05+08:00"},
                   {"mac":"zz","ip":"1.2.3.4","expiry":"2026-05-02T09:12:05Z"},
                   {"mac":"02:00:00:00:00:02","ip":"1.2.3.4","expiry":"yesterday"}, 7]"#;
        let l = parse(t).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].mac, "02:5e:11:3a:9c:01");
        assert!(parse("[{\"mac\": \"02:").is_err());
    }

    fn lease(mac: &str, ip: &str, expiry: i64) -> DhcpLease {
        DhcpLease {
            mac: mac.into(),
            ip: ip.into(),
            expiry,
        }
    }

    fn diff(e: Option<Event>) -> Option<(Vec<DhcpLease>, Vec<SmallStr>)> {
        match e? {
            Event::DhcpLeasesChanged { upsert, remove } => Some((upsert, remove)),
            other => panic!("not a lease event: {other:?}"),
        }
    }

    #[test]
    fn sends_the_whole_table_first_then_only_differences() {
        let a = || lease("02:00:00:00:00:0a", "10.0.0.1", 100);
        let b = || lease("02:00:00:00:00:0b", "10.0.0.2", 100);
        let c = || lease("02:00:00:00:00:0c", "10.0.0.3", 100);
        let mut last = None;
        // The first event after start is sent even for an empty file.
        assert_eq!(diff(next_event(&mut last, vec![])), Some((vec![], vec![])));
        assert_eq!(diff(next_event(&mut last, vec![])), None);
        // Duplicate MACs: the latest expiry wins; unsorted input is sorted.
        let stale = lease("02:00:00:00:00:0a", "10.0.0.9", 50);
        assert_eq!(
            diff(next_event(&mut last, vec![b(), stale, a()])),
            Some((vec![a(), b()], vec![]))
        );
        assert_eq!(diff(next_event(&mut last, vec![a(), b()])), None);
        // b renewed, a gone, c new.
        let b2 = lease("02:00:00:00:00:0b", "10.0.0.2", 200);
        assert_eq!(
            diff(next_event(&mut last, vec![c(), b2.clone()])),
            Some((vec![b2.clone(), c()], vec!["02:00:00:00:00:0a".into()]))
        );
        assert_eq!(diff(next_event(&mut last, vec![b2, c()])), None);
        // A restart (no table sent yet) sends the whole table again.
        let mut fresh = None;
        assert_eq!(
            diff(next_event(&mut fresh, vec![c(), a()])),
            Some((vec![a(), c()], vec![]))
        );
    }
}
