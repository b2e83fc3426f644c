//! The pod watch (P1): kube-runtime's watcher on `spec.nodeName=<node>` with its backoff. Its
//! relist bracket (Init / InitApply / InitDone) is passed through, so the core can tell "the
//! list is complete" from "still listing".

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use reconcilers::Event;

use super::pod_view::pod_view;
use super::EventTx;

pub async fn run(client: Client, node: String, tx: EventTx) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(watcher::Event::Init) => Event::PodRelistBegin,
            Ok(watcher::Event::InitApply(p)) => Event::PodRelistItem { pod: pod_view(&p) },
            Ok(watcher::Event::InitDone) => Event::PodRelistEnd,
            Ok(watcher::Event::Apply(p)) => Event::PodApplied { pod: pod_view(&p) },
            Ok(watcher::Event::Delete(p)) => Event::PodDeleted { pod: pod_view(&p) },
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying with backoff");
                continue;
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}
