//! Events in their own lane (F4), against the real API server in a brownout for Events only:
//! an admission webhook holds every Event create for 8 s. Forty pods whose annotations are
//! invalid each get a Warning Event and a status write; the status writes all land within a
//! few seconds, while the Events trickle in (or are dropped) behind them.

use e2e::daemon;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use base64::Engine;
use e2e::daemon::{create_pod, pod_manifest, until, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const PODS: usize = 40;
const HOLD: Duration = Duration::from_secs(8);

/// An HTTPS admission webhook on loopback that allows every request after `HOLD`; answers the
/// port and the PEM of its self-signed certificate (the caBundle).
fn slow_webhook(dir: &std::path::Path) -> Result<(u16, String)> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?.self_signed(&key)?;
    let (cert_path, key_path) = (dir.join("webhook.crt"), dir.join("webhook.key"));
    std::fs::write(&cert_path, cert.pem())?;
    std::fs::write(&key_path, key.serialize_pem())?;
    let tls = vk_cocoon::kubelet::tls::server_config(
        &cert_path,
        &key_path,
        None,
        "webhook",
        "127.0.0.1",
    )?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let server = HttpServer::new(|| {
            App::new().route(
                "/hold",
                web::post().to(|review: web::Json<serde_json::Value>| async move {
                    actix_web::rt::time::sleep(HOLD).await;
                    let uid = review["request"]["uid"].clone();
                    HttpResponse::Ok().json(json!({
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {"uid": uid, "allowed": true},
                    }))
                }),
            )
        })
        .workers(2)
        .disable_signals()
        .listen_rustls_0_23(listener, tls)
        .expect("webhook listener");
        let _ = actix_web::rt::System::new().block_on(server.run());
    });
    Ok((port, cert.pem()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_do_not_wait_for_events_the_api_server_holds() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let client = tb.client()?;
    let (port, ca) = slow_webhook(tb.run_dir())?;
    let ar = ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: "ValidatingWebhookConfiguration".into(),
        plural: "validatingwebhookconfigurations".into(),
    };
    let hooks: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let hook: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "hold-events"},
        "webhooks": [{
            "name": "hold-events.e2e.local",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/hold"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
            },
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["events"]}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))?;
    hooks.create(&PostParams::default(), &hook).await?;
    // The brownout is on once an Event of our own takes the hold.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    until(
        "the webhook holds Events",
        Duration::from_secs(60),
        || async {
            let probe: Event = serde_json::from_value(json!({
                "metadata": {"generateName": "probe."},
                "involvedObject": {"kind": "Pod", "name": "probe", "namespace": NS},
                "reason": "Probe", "message": "is the webhook on?", "type": "Normal",
            }))?;
            let t = Instant::now();
            events.create(&PostParams::default(), &probe).await?;
            Ok((t.elapsed() >= HOLD - Duration::from_secs(1)).then_some(()))
        },
    )
    .await?;

    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    until("the node is up", Duration::from_secs(60), || async {
        Ok(daemon::metric(metrics_port, "cocoon_vk_event_queue_depth")
            .await
            .ok())
    })
    .await?;
    // Each pod's backend is invalid: a Warning Event and a ProviderFailed status write each.
    let start = Instant::now();
    for i in 0..PODS {
        let p = pod_manifest(
            NS,
            &format!("bad-{i}"),
            NODE,
            json!({"cocoonset.cocoonstack.io/managed": "true",
                "cocoonset.cocoonstack.io/mode": "run",
                "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04",
                "vm.cocoonstack.io/backend": "qemu"}),
        )?;
        create_pod(&pods, &p).await?;
    }
    until("every status written", Duration::from_secs(60), || async {
        let written = pods
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("ProviderFailed")
            })
            .count();
        Ok((written == PODS).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let took = start.elapsed();
    // 40 Events at 8 s each would hold every shared write slot for 8 s and more.
    ensure!(
        took < HOLD,
        "the status writes took {took:?}: they waited behind the held Events"
    );
    let warnings = events
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("CreateBringUpFailed"))
        .count();
    ensure!(
        warnings < PODS,
        "all {warnings} Events were already recorded: the webhook did not hold them"
    );
    eprintln!("{PODS} status writes in {took:?}; {warnings} of {PODS} Events recorded by then");
    drop(d);
    Ok(())
}
