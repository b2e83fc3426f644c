//! The kubelet API on `VK_NODE_IP:VK_KUBELET_PORT` (K1–K6), HTTPS, on a thread of its own
//! (actix's server is not `Send`). Every request, to any path, passes the guard first (K9); the
//! apiserver reaches it with `kubectl logs`.

pub mod auth;
pub mod log_query;
mod log_time;
mod logs;
mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpServer};

use crate::effects::cocoon::CocoonCli;
use crate::runtime::views::Views;
use crate::stats::Sampler;

pub struct Ctx {
    pub views: Views,
    pub cocoon: CocoonCli,
    pub sampler: Arc<Sampler>,
    pub node: String,
    /// Process start (RFC 3339), reported as the node's start time.
    pub started: String,
    /// K3: log streams running at once; one more is answered 503.
    pub log_streams: Arc<tokio::sync::Semaphore>,
}

/// Each log stream holds a `cocoon` process and a connection; past this many, callers wait
/// for one to end rather than the host filling with followers.
pub const MAX_LOG_STREAMS: usize = 128;

pub fn log_streams() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_LOG_STREAMS))
}

/// Keeps the verified client certificate of a TLS connection for the guard.
fn remember_client_certificate(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    if let Some(tls) = conn.downcast_ref::<Tls>() {
        let (_, session) = tls.get_ref();
        if let Some(cert) = session.peer_certificates().and_then(|c| c.first()) {
            ext.insert(auth::PeerCert(cert.to_vec()));
        }
    }
}

/// Binds first, so a port that cannot be had stops the start (K1) with the variable named.
pub fn spawn(
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    guard: auth::Guard,
    ctx: Ctx,
) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        anyhow::anyhow!("VK_KUBELET_PORT: cannot listen on {addr} for the kubelet API: {e}")
    })?;
    let data = web::Data::new(ctx);
    let guard = web::Data::new(guard);
    let spawned = std::thread::Builder::new()
        .name("kubelet-api".into())
        .spawn(move || {
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(data.clone())
                    .app_data(guard.clone())
                    .wrap(actix_web::middleware::from_fn(auth::middleware))
                    .route("/pods", web::get().to(routes::pods))
                    .route("/runningpods/", web::get().to(routes::running_pods))
                    .route("/runningpods", web::get().to(routes::running_pods))
                    .route(
                        "/containerLogs/{ns}/{pod}/{container}",
                        web::get().to(routes::container_logs),
                    )
                    .route(
                        "/exec/{ns}/{pod}/{container}",
                        web::route().to(routes::not_implemented),
                    )
                    .route(
                        "/attach/{ns}/{pod}/{container}",
                        web::route().to(routes::not_implemented),
                    )
                    .route(
                        "/portForward/{ns}/{pod}",
                        web::route().to(routes::not_implemented),
                    )
                    .route("/stats/summary", web::get().to(routes::stats_summary))
                    .route("/stats/summary/", web::get().to(routes::stats_summary))
                    .route("/metrics/resource", web::get().to(routes::metrics_resource))
                    .route(
                        "/metrics/resource/",
                        web::get().to(routes::metrics_resource),
                    )
                    .default_service(web::to(routes::not_found))
            })
            .on_connect(remember_client_certificate)
            .workers(2)
            .disable_signals()
            .client_request_timeout(std::time::Duration::from_secs(30));
            let run = async move {
                match server.listen_rustls_0_23(listener, tls) {
                    Ok(s) => s.run().await,
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = actix_web::rt::System::new().block_on(run) {
                tracing::error!(%addr, error = %e, "kubelet API listener failed");
            }
        });
    spawned.map_err(|e| anyhow::anyhow!("cannot start the kubelet API thread: {e}"))?;
    Ok(())
}
