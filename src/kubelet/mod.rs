//! The kubelet API on `VK_NODE_IP:VK_KUBELET_PORT` (K1–K6), HTTPS, on a thread of its own
//! (actix's server is not `Send`). Every request, to any path, passes the guard first (K9); the
//! apiserver reaches it with `kubectl logs`, `exec` and `port-forward`.

pub mod auth;
pub mod log_query;
mod log_time;
mod logs;
mod routes;
mod stream;
pub mod tls;
mod upgrade_head;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_web::dev::AppConfig;
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};

use crate::cocoon::CocoonCli;
use crate::stats::Sampler;
use crate::views::Views;

pub struct Ctx {
    pub views: Views,
    pub cocoon: CocoonCli,
    pub sampler: Arc<Sampler>,
    pub node: String,
    /// Process start (RFC 3339), reported as the node's start time.
    pub started: String,
    /// K3: log streams running at once; one more is answered 503.
    pub log_streams: Arc<tokio::sync::Semaphore>,
    /// K4: exec and port-forward sessions running at once; one more is answered 503.
    pub streams: Arc<tokio::sync::Semaphore>,
}

/// Each log stream holds a `cocoon` process and a connection; past this many, callers wait
/// for one to end rather than the host filling with followers.
pub const MAX_LOG_STREAMS: usize = 128;

pub fn log_streams() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_LOG_STREAMS))
}

/// Each exec holds a `cocoon vm exec` and each port-forward its connections to the guest;
/// bounded like the log streams, for the same reason.
pub const MAX_STREAMS: usize = 32;

pub fn streams() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS))
}

type Conn = upgrade_head::Retagged<TlsStream<TcpStream>>;

/// Keeps the verified client certificate of a TLS connection for the guard.
fn remember_client_certificate(conn: &Conn, ext: &mut actix_web::dev::Extensions) {
    let (_, session) = conn.get_ref().get_ref();
    if let Some(cert) = session.peer_certificates().and_then(|c| c.first()) {
        ext.insert(auth::PeerCert(cert.to_vec()));
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
            // actix-web's HttpServer, assembled by hand so every connection passes through
            // `upgrade_head` between TLS and HTTP (K4 over SPDY needs it).
            let app = move || {
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
                        web::route().to(stream::exec),
                    )
                    .route(
                        "/attach/{ns}/{pod}/{container}",
                        web::route().to(stream::attach),
                    )
                    .route(
                        "/portForward/{ns}/{pod}",
                        web::route().to(stream::port_forward),
                    )
                    .route("/stats/summary", web::get().to(routes::stats_summary))
                    .route("/stats/summary/", web::get().to(routes::stats_summary))
                    .route("/metrics/resource", web::get().to(routes::metrics_resource))
                    .route(
                        "/metrics/resource/",
                        web::get().to(routes::metrics_resource),
                    )
                    .default_service(web::to(routes::not_found))
            };
            let mut tls = tls;
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            let server = actix_server::Server::build()
                .workers(2)
                .disable_signals()
                .listen("kubelet-api", listener, move || {
                    let http = actix_http::HttpService::build()
                        .client_request_timeout(std::time::Duration::from_secs(30))
                        .on_connect_ext(remember_client_certificate)
                        .finish(map_config(app().into_factory(), |_| AppConfig::default()))
                        .map_err(|e| tracing::debug!(error = %e, "kubelet API connection"));
                    let mut acceptor = Acceptor::new(tls.clone());
                    acceptor.set_handshake_timeout(std::time::Duration::from_secs(10));
                    acceptor
                        .map_init_err(|_| ())
                        .map_err(|e| tracing::debug!(error = ?e, "kubelet API TLS handshake"))
                        .and_then(fn_service(|io: TlsStream<TcpStream>| async move {
                            let peer = io.get_ref().0.peer_addr().ok();
                            Ok::<_, ()>((
                                upgrade_head::Retagged::new(io),
                                actix_http::Protocol::Http1,
                                peer,
                            ))
                        }))
                        .and_then(http)
                });
            let run = async move {
                match server {
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
