//! K11 against a stand-in apiserver: what random bearer tokens can make the guard ask of it.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use super::*;

/// Vouches for tokens that start with `good`, allows every access, and counts the
/// TokenReviews it was asked; with `hold` it answers none of them.
async fn answer(
    req: Request<Incoming>,
    reviews: Arc<watch::Sender<usize>>,
    hold: bool,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = if path.ends_with("/tokenreviews") {
        reviews.send_modify(|n| *n += 1);
        if hold {
            std::future::pending::<()>().await;
        }
        let good = doc["spec"]["token"]
            .as_str()
            .is_some_and(|t| t.starts_with("good"));
        serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {},
            "status": {"authenticated": good, "user": {"username": "alice", "groups": ["g"]}},
        })
    } else {
        serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {},
            "status": {"allowed": true},
        })
    };
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text.to_string())))
        .unwrap())
}

/// The client, and how many TokenReviews the apiserver was asked so far.
async fn apiserver(hold: bool) -> (kube::Client, watch::Receiver<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reviews, seen) = watch::channel(0);
    let reviews = Arc::new(reviews);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let reviews = reviews.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| answer(r, reviews.clone(), hold));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), seen)
}

fn throttled(m: &Metrics) -> u64 {
    m.cap_refusals.with_label_values(&["token_reviews"]).get()
}

/// A guard whose review budget never refills: what a flood gets is exactly the burst.
fn guard(client: kube::Client, m: &Metrics) -> Guard {
    let g = Guard::new(client, "node-a".into(), false, false, m.clone());
    *lock(&g.0.review_rate) = Bucket::new(0, REVIEW_BURST, Instant::now());
    g
}

#[tokio::test]
async fn random_tokens_cost_the_apiserver_the_burst_and_known_callers_nothing() {
    let (client, reviews) = apiserver(false).await;
    let m = Metrics::new();
    let g = guard(client, &m);
    let attrs = attributes(&Method::GET, "/pods");
    assert_eq!(
        g.check(None, Some("Bearer good-1"), attrs).await,
        Verdict::Allow
    );
    // A bad token asked again is answered from its cache.
    for _ in 0..3 {
        assert!(matches!(
            g.check(None, Some("Bearer bad-0"), attrs).await,
            Verdict::Unauthenticated(_)
        ));
    }
    assert_eq!(*reviews.borrow(), 2);
    let (mut refused, mut throttled_seen) = (0, 0);
    for i in 0..2000 {
        match g
            .check(None, Some(&format!("Bearer random-{i}")), attrs)
            .await
        {
            Verdict::Unauthenticated(_) => refused += 1,
            Verdict::Throttled(why) => {
                assert!(why.contains("new bearer tokens a second"), "{why}");
                throttled_seen += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    let budget = REVIEW_BURST as usize - 2;
    assert_eq!((refused, throttled_seen), (budget, 2000 - budget));
    assert_eq!(*reviews.borrow(), REVIEW_BURST as usize);
    assert_eq!(throttled(&m), (2000 - budget) as u64);
    // The caller known before the flood is still served, without a review.
    assert_eq!(
        g.check(None, Some("Bearer good-1"), attrs).await,
        Verdict::Allow
    );
    assert_eq!(*reviews.borrow(), REVIEW_BURST as usize);
    // A caller new to the node, while the budget is spent, is told to retry; the apiserver
    // is not asked.
    let refusal = g.check(None, Some("Bearer good-2"), attrs).await;
    assert!(matches!(refusal, Verdict::Throttled(_)), "{refusal:?}");
    assert_eq!(
        refusal.refusal().map(|(c, _)| c),
        Some(StatusCode::TOO_MANY_REQUESTS)
    );
    // The known caller's answer expires: a token vouched for lately is reviewed again
    // though the budget is spent.
    let key: [u8; 32] = Sha256::digest(b"good-1").into();
    lock(&g.0.tokens).remove(&key);
    assert_eq!(
        g.check(None, Some("Bearer good-1"), attrs).await,
        Verdict::Allow
    );
    assert_eq!(*reviews.borrow(), REVIEW_BURST as usize + 1);
}

#[tokio::test]
async fn no_more_reviews_than_the_cap_wait_at_once() {
    let (client, mut reviews) = apiserver(true).await;
    let m = Metrics::new();
    let g = Guard::new(client, "node-a".into(), false, false, m.clone());
    let attrs = attributes(&Method::GET, "/pods");
    let mut waiting = Vec::new();
    for i in 0..REVIEWS_AT_ONCE {
        let g = g.clone();
        waiting.push(tokio::spawn(async move {
            g.check(None, Some(&format!("Bearer slow-{i}")), attrs)
                .await
        }));
    }
    reviews
        .wait_for(|n| *n == REVIEWS_AT_ONCE)
        .await
        .expect("the apiserver is asked");
    match g.check(None, Some("Bearer one-more"), attrs).await {
        Verdict::Throttled(why) => assert!(why.contains("being checked"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(*reviews.borrow(), REVIEWS_AT_ONCE);
    assert_eq!(throttled(&m), 1);
    for w in waiting {
        w.abort();
    }
}

#[test]
fn the_review_budget_refills_at_its_rate_up_to_its_burst() {
    let t0 = Instant::now();
    let mut b = Bucket::new(REVIEWS_PER_SECOND, REVIEW_BURST, t0);
    let taken = (0..100).filter(|_| b.take(t0)).count();
    assert_eq!(taken, REVIEW_BURST as usize);
    let t1 = t0 + Duration::from_secs(1);
    let taken = (0..100).filter(|_| b.take(t1)).count();
    assert_eq!(taken, REVIEWS_PER_SECOND as usize);
    // A long quiet refills the burst, never more.
    let t2 = t1 + Duration::from_secs(3600);
    let taken = (0..100).filter(|_| b.take(t2)).count();
    assert_eq!(taken, REVIEW_BURST as usize);
}
