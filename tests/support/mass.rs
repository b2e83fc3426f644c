//! Pods created, and later deleted, all at once, timed through one watch of theirs: when this
//! process received each pod's creation, its binding to a node, its Ready, its deletion and
//! its removal. Every time is wall ms since the epoch (`e2e::null_node::wall_ms`), the clock
//! the daemon's journal and the null node use too, so their steps line up with these.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use e2e::daemon::{self, is_ready};
use e2e::null_node::wall_ms;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;

/// Calls in flight at once, for creates and deletes alike.
const IN_FLIGHT: usize = 32;
/// Longest wait for all pods Ready, or all gone.
const LIMIT: Duration = Duration::from_secs(600);

/// What the watch saw of one pod, wall ms.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub added: Option<f64>,
    pub bound: Option<f64>,
    pub ready: Option<f64>,
    pub deleting: Option<f64>,
    pub gone: Option<f64>,
}

/// A watch of the pods with one label, by name.
pub struct PodWatch {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Returns once the watch is established, so nothing created after it is missed.
    pub async fn start(api: Api<Pod>, selector: &str) -> Result<PodWatch> {
        let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cfg = watcher::Config::default().labels(selector);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut stream = watcher(api, cfg).boxed();
                let mut tx = Some(tx);
                while let Some(ev) = stream.next().await {
                    let now = wall_ms();
                    let (pod, gone) = match ev {
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = tx.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                        Ok(watcher::Event::Delete(p)) => (p, true),
                        _ => continue,
                    };
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let mut all = seen.lock().unwrap();
                    let s = all.entry(name).or_default();
                    s.added.get_or_insert(now);
                    if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                        s.bound.get_or_insert(now);
                    }
                    if is_ready(&pod) {
                        s.ready.get_or_insert(now);
                    }
                    if pod.metadata.deletion_timestamp.is_some() {
                        s.deleting.get_or_insert(now);
                    }
                    if gone {
                        s.gone.get_or_insert(now);
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), rx).await??;
        Ok(PodWatch { seen, task })
    }

    pub fn seen(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until `at` of every pod in `names` is set, and returns the latest of them.
    pub async fn all(
        &self,
        what: &str,
        names: &[String],
        limit: Duration,
        at: fn(&Seen) -> Option<f64>,
    ) -> Result<f64> {
        daemon::until(what, limit, || async {
            let seen = self.seen.lock().unwrap();
            let times: Option<Vec<f64>> = names.iter().map(|n| seen.get(n).and_then(at)).collect();
            Ok(times.map(|t| t.into_iter().fold(f64::MIN, f64::max)))
        })
        .await
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each call's send and return times, wall ms, by pod name.
#[derive(Default)]
pub struct Calls {
    pub first: f64,
    pub sent: BTreeMap<String, f64>,
    pub returned: BTreeMap<String, f64>,
    /// When the last call returned.
    pub done: f64,
}

async fn timed<F, Fut>(names: Vec<String>, call: F) -> Result<Calls>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let first = wall_ms();
    let results: Vec<Result<(String, f64, f64)>> = futures::stream::iter(names)
        .map(|name| {
            let fut = call(name.clone());
            async move {
                let sent = wall_ms();
                fut.await?;
                Ok((name, sent, wall_ms()))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut calls = Calls {
        first,
        ..Default::default()
    };
    for r in results {
        let (name, sent, returned) = r?;
        calls.sent.insert(name.clone(), sent);
        calls.returned.insert(name, returned);
    }
    calls.done = wall_ms();
    Ok(calls)
}

/// Creates every pod, 32 calls in flight.
pub async fn create(api: &Api<Pod>, pods: Vec<Pod>) -> Result<Calls> {
    let by_name: BTreeMap<String, Pod> = pods
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect();
    let names = by_name.keys().cloned().collect();
    let by_name = &by_name;
    timed(names, |name| async move {
        api.create(&PostParams::default(), &by_name[&name]).await?;
        Ok(())
    })
    .await
}

/// Deletes every pod in `names` with its own grace period, 32 calls in flight.
pub async fn delete(api: &Api<Pod>, names: &[String]) -> Result<Calls> {
    timed(names.to_vec(), |name| async move {
        api.delete(&name, &DeleteParams::default()).await?;
        Ok(())
    })
    .await
}

/// One run's mass create and delete as its watch saw them, wall ms.
pub struct Mass {
    pub created: Calls,
    /// When the last pod was seen Ready.
    pub all_ready: f64,
    pub deleted: Calls,
    /// When the last deleted pod was seen gone.
    pub all_gone: f64,
    pub seen: BTreeMap<String, Seen>,
}

impl Mass {
    /// Pods Ready per second, from the first create call to the last Ready seen.
    pub fn ready_rate(&self) -> f64 {
        self.created.sent.len() as f64 / ((self.all_ready - self.created.first) / 1000.0)
    }

    pub fn ready_after_s(&self) -> f64 {
        (self.all_ready - self.created.first) / 1000.0
    }

    /// Pods gone per second, from the first delete call to the last pod seen gone.
    pub fn gone_rate(&self) -> f64 {
        self.deleted.sent.len() as f64 / ((self.all_gone - self.deleted.first) / 1000.0)
    }

    pub fn gone_after_s(&self) -> f64 {
        (self.all_gone - self.deleted.first) / 1000.0
    }
}

/// Creates `pods` at once and returns the calls and when the last of them was seen Ready.
pub async fn create_until_ready(
    api: &Api<Pod>,
    watch: &PodWatch,
    pods: Vec<Pod>,
) -> Result<(Calls, f64)> {
    let names: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    let calls = create(api, pods).await?;
    let what = format!("{} pods Ready", names.len());
    let last = watch.all(&what, &names, LIMIT, |s| s.ready).await?;
    Ok((calls, last))
}

/// Deletes `names` at once and returns the calls and when the last of them was seen gone.
pub async fn delete_until_gone(
    api: &Api<Pod>,
    watch: &PodWatch,
    names: &[String],
) -> Result<(Calls, f64)> {
    let calls = delete(api, names).await?;
    let what = format!("{} pods gone", names.len());
    let last = watch.all(&what, names, LIMIT, |s| s.gone).await?;
    Ok((calls, last))
}

/// Sorted `to - from`, ms, over the pods that have both.
pub fn spans<T>(
    items: &[T],
    from: impl Fn(&T) -> Option<f64>,
    to: impl Fn(&T) -> Option<f64>,
) -> Vec<f64> {
    let mut v: Vec<f64> = items
        .iter()
        .filter_map(|p| Some(to(p)? - from(p)?))
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// `p50 / p99` of sorted ms, or `-` when there are none.
pub fn p50_p99(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    format!(
        "{:.0} / {:.0}",
        daemon::percentile(v, 0.5),
        daemon::percentile(v, 0.99)
    )
}
