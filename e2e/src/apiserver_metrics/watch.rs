//! A pod watch as a node's daemon opens it, counting what it receives: no apiserver metric
//! gives events or bytes per watcher.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use serde_json::Value;

/// What one counted watch has received so far.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Events by type (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`).
    pub events: BTreeMap<String, u64>,
    /// Bytes of the response bodies, as the client reads them (one JSON event a line).
    pub bytes: u64,
    /// Watch requests opened (the first, then one per reconnect).
    pub opened: u64,
    /// Pods present now, by `namespace/name`, with whether each is Ready.
    pub pods: BTreeMap<String, bool>,
    /// Nodes named by the pods this watch delivered (one, for a node's own selector).
    pub nodes: BTreeSet<String>,
}

impl Tally {
    /// Events of objects (bookmarks and errors aside).
    pub fn object_events(&self) -> u64 {
        ["ADDED", "MODIFIED", "DELETED"]
            .iter()
            .map(|t| self.events.get(*t).copied().unwrap_or(0))
            .sum()
    }

    pub fn ready(&self) -> usize {
        self.pods.values().filter(|r| **r).count()
    }

    /// The growth since `before`: counters subtracted, the pods and nodes as they are now.
    pub fn since(&self, before: &Tally) -> Tally {
        let mut events = self.events.clone();
        for (t, n) in &before.events {
            *events.entry(t.clone()).or_insert(0) -= n;
        }
        Tally {
            events,
            bytes: self.bytes - before.bytes,
            opened: self.opened - before.opened,
            pods: self.pods.clone(),
            nodes: self.nodes.clone(),
        }
    }
}

/// A pod watch counting what it receives, stopped on drop.
pub struct CountedWatch {
    tally: Arc<Mutex<Tally>>,
    task: tokio::task::JoinHandle<()>,
}

impl CountedWatch {
    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for CountedWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches pods across namespaces with `field_selector` (empty: every pod) from now on, as
/// kube-rs's watcher does for the daemon: a list for the resource version, then watches with
/// bookmarks from there, reopened when the server ends one.
pub fn count_pods(client: Client, field_selector: &str) -> CountedWatch {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let selector = field_selector.to_string();
    let t = tally.clone();
    let task = tokio::spawn(async move {
        let mut rv = None;
        loop {
            if let Err(e) = watch_once(&client, &selector, &mut rv, &t).await {
                crate::step!("counted pod watch ({selector}): {e:#}; reopening");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    CountedWatch { tally, task }
}

async fn watch_once(
    client: &Client,
    selector: &str,
    rv: &mut Option<String>,
    tally: &Mutex<Tally>,
) -> Result<()> {
    let fs = url_encode(selector);
    let version = match rv.clone() {
        Some(v) => v,
        None => {
            let path = format!("/api/v1/pods?fieldSelector={fs}&limit=500");
            let list: Value = serde_json::from_str(&crate::kube::get_text(client, &path).await?)?;
            let v = list["metadata"]["resourceVersion"].as_str().unwrap_or("");
            v.to_string()
        }
    };
    *rv = Some(version.clone());
    let path = format!(
        "/api/v1/pods?fieldSelector={fs}&watch=true&allowWatchBookmarks=true\
         &timeoutSeconds=3600&resourceVersion={version}"
    );
    let req = http::Request::get(path).body(Vec::new())?;
    let body = client.request_stream(req).await?;
    let mut lines = std::pin::pin!(body.lines());
    tally.lock().unwrap_or_else(|e| e.into_inner()).opened += 1;
    while let Some(line) = lines.next().await {
        let line = line?;
        let ev: Value = serde_json::from_str(&line)?;
        let ty = ev["type"].as_str().unwrap_or("").to_string();
        if ty == "ERROR" {
            // An expired resource version: start over with a list.
            *rv = None;
        }
        let obj = &ev["object"];
        if let Some(v) = obj["metadata"]["resourceVersion"].as_str() {
            if ty != "ERROR" {
                *rv = Some(v.to_string());
            }
        }
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        // The line as read plus its newline: what the client received of this event.
        t.bytes += line.len() as u64 + 1;
        *t.events.entry(ty.clone()).or_insert(0) += 1;
        if matches!(ty.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
            note_pod(&mut t, &ty, obj);
        }
    }
    Ok(())
}

fn note_pod(t: &mut Tally, ty: &str, pod: &Value) {
    let meta = &pod["metadata"];
    let key = format!(
        "{}/{}",
        meta["namespace"].as_str().unwrap_or(""),
        meta["name"].as_str().unwrap_or("")
    );
    if let Some(node) = pod["spec"]["nodeName"].as_str() {
        t.nodes.insert(node.to_string());
    }
    if ty == "DELETED" {
        t.pods.remove(&key);
        return;
    }
    let ready = pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    t.pods.insert(key, ready);
}

/// Percent-encodes a query value (field selectors hold `=`, `!` and `,`).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_field_selectors() {
        assert_eq!(url_encode("spec.nodeName=n-1"), "spec.nodeName%3Dn-1");
    }
}
