//! Prometheus scrapes a loopback target and answers PromQL through the harness.

use std::time::Duration;

use e2e::prometheus::{MetricsStub, ScrapeJob};
use e2e::{Testbed, TestbedOptions};

const BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_and_query() {
    let stub = MetricsStub::serve("# TYPE vk_smoke_value gauge\nvk_smoke_value 42\n")
        .await
        .unwrap();
    let tb = Testbed::start(
        TestbedOptions::default().with_prometheus(vec![ScrapeJob::new("stub", &stub.addr)]),
    )
    .await
    .expect("testbed starts");
    let prom = tb.prometheus.as_ref().unwrap();

    let up = prom
        .query_until(r#"up{job="stub"}"#, BOUND, |v| v == 1.0)
        .await
        .unwrap();
    assert_eq!(up, 1.0);
    let v = prom
        .query_until("vk_smoke_value", BOUND, |v| v == 42.0)
        .await
        .unwrap();
    assert_eq!(v, 42.0);

    // A reload swaps the targets: a job that nothing serves reports up == 0.
    stub.set_body("vk_smoke_value 7\n");
    prom.set_jobs(&[
        ScrapeJob::new("stub", &stub.addr),
        ScrapeJob::new(
            "nobody",
            &format!("127.0.0.1:{}", e2e::ports::free_port().unwrap()),
        ),
    ])
    .await
    .unwrap();
    prom.query_until(r#"up{job="nobody"}"#, BOUND, |v| v == 0.0)
        .await
        .unwrap();
    prom.query_until("vk_smoke_value", BOUND, |v| v == 7.0)
        .await
        .unwrap();
}
