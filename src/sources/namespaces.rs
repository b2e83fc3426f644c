//! T16: the UID of every namespace, for the owner records of VMs and snapshots. Names are
//! reused when a namespace is deleted and made again; UIDs never are, so the core tells the
//! two apart by UID wherever it knows one.
//!
//! The first list is sent before the pod watch starts, so the startup claim already decides
//! with every namespace's UID; the watch then reports namespaces made later. Only metadata
//! is read. A deleted namespace sends nothing: its UID stays known, and its records stay
//! another tenant's when the name comes back.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use reconcilers::Event;

use super::EventTx;

/// What has been sent, so the watch's relists repeat nothing.
#[derive(Default)]
pub struct Seen(HashMap<String, String>);

impl Seen {
    /// The event for `name` (UID `uid`), unless the core already has that UID.
    fn change(&mut self, name: Option<&str>, uid: Option<&str>) -> Option<Event> {
        let (name, uid) = (name?, uid?);
        if self.0.get(name).map(String::as_str) == Some(uid) {
            return None;
        }
        self.0.insert(name.to_string(), uid.to_string());
        Some(Event::Namespace {
            name: name.to_string(),
            uid: uid.to_string(),
        })
    }
}

/// Lists every namespace once and sends their UIDs. A node that cannot read namespaces
/// (an older ClusterRole) says so and goes on: records then match by name alone.
pub async fn first_list(client: &Client, tx: &EventTx, seen: &mut Seen) {
    let api: Api<Namespace> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default()).await {
        Ok(list) => {
            for ns in &list.items {
                let m = &ns.metadata;
                if let Some(e) = seen.change(m.name.as_deref(), m.uid.as_deref()) {
                    let _ = tx.send(e).await;
                }
            }
        }
        Err(e) => tracing::warn!(
            error = %e,
            "cannot list namespaces: owner records match by namespace name only, so a namespace \
             deleted and made again under the same name inherits the earlier one's VMs and \
             snapshots; grant the daemon list and watch on namespaces (packaging/daemonset.yaml)"
        ),
    }
}

pub async fn run(client: Client, tx: EventTx, mut seen: Seen) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(item) = stream.next().await {
        let ns = match item {
            Ok(watcher::Event::InitApply(ns) | watcher::Event::Apply(ns)) => ns,
            Ok(watcher::Event::Init | watcher::Event::InitDone | watcher::Event::Delete(_)) => {
                continue
            }
            Err(e) => {
                tracing::warn!(error = %e, "namespace watch failed; retrying with backoff");
                continue;
            }
        };
        let m = &ns.metadata;
        if let Some(e) = seen.change(m.name.as_deref(), m.uid.as_deref()) {
            if tx.send(e).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_new_uid_is_sent() {
        let mut seen = Seen::default();
        assert!(seen.change(Some("a"), Some("u1")).is_some());
        assert!(seen.change(Some("a"), Some("u1")).is_none());
        // Made again under the same name.
        assert_eq!(
            seen.change(Some("a"), Some("u2")),
            Some(Event::Namespace {
                name: "a".into(),
                uid: "u2".into()
            })
        );
        assert!(seen.change(None, Some("u3")).is_none());
        assert!(seen.change(Some("b"), None).is_none());
    }
}
