//! The kubelet API on `VK_KUBELET_PORT` (K1–K6), HTTPS, on a thread of its own (actix's server
//! is not `Send`). It asks no client certificate (DEC-5); the
//! apiserver reaches it with `kubectl logs`.

pub mod log_query;
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
}

pub fn spawn(addr: SocketAddr, tls: rustls::ServerConfig, ctx: Ctx) {
    let data = web::Data::new(ctx);
    let spawned = std::thread::Builder::new()
        .name("kubelet-api".into())
        .spawn(move || {
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(data.clone())
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
            .workers(2)
            .disable_signals()
            .client_request_timeout(std::time::Duration::from_secs(30));
            let run = async move {
                match server.bind_rustls_0_23(addr, tls) {
                    Ok(s) => s.run().await,
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = actix_web::rt::System::new().block_on(run) {
                tracing::error!(%addr, error = %e, "kubelet API listener failed");
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the kubelet API thread");
    }
}
