//! F4 against an apiserver that takes no Events: status writes still go through at once.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use reconcilers::action::EventType;
use reconcilers::pod::PodKey;
use reconcilers::{Action, Event};
use tokio::sync::watch;

use super::event_lane::{CAPACITY, CONCURRENCY};
use super::probes::{Pinger, Probes};
use super::Executor;
use crate::cocoon::CocoonCli;
use crate::metrics::Metrics;

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default","uid":"u"},"status":{"phase":"Running"}}"#;

/// Answers a pod status patch at once; holds every Event create without an answer, and
/// counts the held ones in `held`.
async fn answer(
    req: Request<Incoming>,
    held: Arc<watch::Sender<usize>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() == Method::POST && req.uri().path().ends_with("/events") {
        held.send_modify(|n| *n += 1);
        std::future::pending::<()>().await;
    }
    if req.method() == Method::PATCH
        && req.uri().path() == "/api/v1/namespaces/default/pods/p/status"
    {
        return Ok(Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(POD.as_bytes())))
            .unwrap());
    }
    Ok(Response::builder()
        .status(404)
        .body(Full::new(Bytes::new()))
        .unwrap())
}

/// The client, and how many Event creates the apiserver holds so far.
async fn slow_apiserver() -> (kube::Client, watch::Receiver<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (held, seen) = watch::channel(0);
    let held = Arc::new(held);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let held = held.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, held.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), seen)
}

#[tokio::test]
async fn events_withheld_by_the_apiserver_never_delay_a_status_write() {
    let (client, mut held) = slow_apiserver().await;
    let (tx, mut rx) = crate::sources::event_queue();
    let metrics = Metrics::new();
    let probes = Probes::new(Pinger::Degraded, tx.clone(), metrics.clone());
    let mut exec = Executor::new(
        CocoonCli::new("/nonexistent/cocoon"),
        client,
        tx,
        probes,
        metrics.clone(),
        "node-a".into(),
        None,
    );
    let key = PodKey::new("default", "p");
    // More Events than the status writes' 32 slots and the Events lane together.
    let events = 2 * CAPACITY + 32;
    for i in 0..events {
        exec.execute(Action::RecordEvent {
            key: key.clone(),
            uid: "u".into(),
            kind: EventType::Warning,
            reason: format!("Reason{i}"),
            message: "m".into(),
            source: reconcilers::action::EventSource::Vk,
        });
    }
    // The Events the lane lets through reach the apiserver, and stay there, first.
    tokio::time::timeout(
        Duration::from_secs(10),
        held.wait_for(|n| *n >= CONCURRENCY),
    )
    .await
    .expect("the Events lane sent no Events")
    .unwrap();
    exec.execute(Action::PatchPod {
        op: 7,
        key,
        uid: "u".into(),
        status: None,
        annotations: BTreeMap::new(),
    });
    let done = tokio::time::timeout(Duration::from_secs(3), rx.recv())
        .await
        .expect("the status write was held back by the Events")
        .unwrap();
    assert!(
        matches!(
            done,
            Event::KubeDone {
                op: 7,
                result: Ok(_)
            }
        ),
        "{done:?}"
    );
    let full = metrics
        .events_dropped
        .with_label_values(&["lane_full"])
        .get();
    assert_eq!(full, (events - CAPACITY) as u64);
}
