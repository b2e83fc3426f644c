//! The kubelet API on `VK_NODE_IP:VK_KUBELET_PORT` (K1–K6), HTTPS, on a thread of its own
//! (actix's server is not `Send`). Every request, to any path, passes the guard first (K9); the
//! apiserver reaches it with `kubectl logs`, `exec` and `port-forward`.

pub mod auth;
mod first_head;
pub mod handshakes;
pub mod log_query;
mod log_time;
mod logs;
mod pod_object;
mod routes;
pub mod sessions;
pub mod stream;
pub mod tls;
mod upgrade;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix_codec::Framed;
use actix_http::{h1, Request};
use actix_service::{
    fn_factory, fn_service, map_config, IntoServiceFactory, Service, ServiceFactory,
    ServiceFactoryExt,
};
use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::dev::AppConfig;
use actix_web::rt::net::TcpStream;
use actix_web::{web, App};

use crate::cocoon::CocoonCli;
use crate::metrics::Metrics;
use crate::stats::Sampler;
use crate::views::Views;

pub struct Ctx {
    pub views: Views,
    pub cocoon: CocoonCli,
    pub sampler: Arc<Sampler>,
    pub node: String,
    /// Process start (RFC 3339), reported as the node's start time.
    pub started: String,
    /// K3, K13: log streams running at once, on the node and per namespace; one more is
    /// answered 503.
    pub log_streams: Arc<sessions::Sessions>,
    /// K4, K13: exec and port-forward sessions running at once, on the node and per
    /// namespace; one more is answered 503.
    pub streams: Arc<sessions::Sessions>,
    /// K4: an exec session in which nothing moves either way this long ends.
    pub exec_idle: Duration,
    /// The daemon's metrics: served on `/metrics` (K8), and where the caps count (M7).
    pub metrics: Metrics,
}

/// Each log stream holds a `cocoon` process and a connection; past this many, callers wait
/// for one to end rather than the host filling with followers.
pub const MAX_LOG_STREAMS: usize = 128;

/// K13: one namespace's share of the log streams.
pub const NAMESPACE_LOG_STREAMS: usize = 32;

pub fn log_streams(count: crate::caps::CapCount) -> Arc<sessions::Sessions> {
    sessions::Sessions::new("log streams", MAX_LOG_STREAMS, NAMESPACE_LOG_STREAMS, count)
}

/// Each exec holds a `cocoon vm exec` and each port-forward its connections to the guest;
/// bounded like the log streams, for the same reason.
pub const MAX_STREAMS: usize = 32;

/// K13: one namespace's share of the exec and port-forward sessions.
pub const NAMESPACE_STREAMS: usize = 8;

pub fn streams(count: crate::caps::CapCount) -> Arc<sessions::Sessions> {
    sessions::Sessions::new(
        "exec and port-forward sessions",
        MAX_STREAMS,
        NAMESPACE_STREAMS,
        count,
    )
}

type Tls = TlsStream<TcpStream>;
type Conn = first_head::Replay<Tls>;

/// How long a client has to send a whole request head after its first (the first is bounded
/// by K10).
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

fn client_certificate(tls: &Tls) -> Option<auth::PeerCert> {
    let (_, session) = tls.get_ref();
    let cert = session.peer_certificates().and_then(|c| c.first())?;
    Some(auth::PeerCert(cert.to_vec()))
}

/// Keeps the verified client certificate of a TLS connection for the guard.
fn remember_client_certificate(conn: &Conn, ext: &mut actix_web::dev::Extensions) {
    if let Some(cert) = client_certificate(conn.get_ref()) {
        ext.insert(cert);
    }
}

/// The routes of every request that does not take its connection over; each passes the
/// guard first (K9), unknown paths included.
fn app(
    ctx: web::Data<Ctx>,
    guard: web::Data<auth::Guard>,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .app_data(ctx)
        .app_data(guard)
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
            web::route().to(stream::not_upgraded),
        )
        .route(
            "/attach/{ns}/{pod}/{container}",
            web::route().to(stream::attach),
        )
        .route(
            "/portForward/{ns}/{pod}",
            web::route().to(stream::not_upgraded),
        )
        .route("/stats/summary", web::get().to(routes::stats_summary))
        .route("/stats/summary/", web::get().to(routes::stats_summary))
        .route("/metrics", web::get().to(routes::metrics))
        .route("/metrics/resource", web::get().to(routes::metrics_resource))
        .route(
            "/metrics/resource/",
            web::get().to(routes::metrics_resource),
        )
        .default_service(web::to(routes::not_found))
}

/// One worker's connection service: TLS and the first request head, within K10's bounds
/// ([`opening`]; a SPDY upgrade goes to [`upgrade::serve`] from there), then actix-http, whose
/// upgrade extension point takes WebSocket upgrades to the same place.
fn connections(
    tls: Arc<rustls::ServerConfig>,
    handshakes: handshakes::Handshakes,
    ctx: web::Data<Ctx>,
    guard: web::Data<auth::Guard>,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = (), InitError = ()> {
    let upgrades = {
        let (ctx, guard) = (ctx.clone(), guard.clone());
        fn_service(move |(req, framed): (Request, Framed<Conn, h1::Codec>)| {
            let (ctx, guard) = (ctx.clone(), guard.clone());
            async move {
                let cert = req.conn_data::<auth::PeerCert>().cloned();
                upgrade::serve(&ctx, &guard, cert, req, framed).await;
                Ok::<_, actix_http::Error>(())
            }
        })
    };
    let (app_ctx, app_guard) = (ctx.clone(), guard.clone());
    let http = actix_http::HttpService::build()
        .client_request_timeout(HEAD_TIMEOUT)
        .on_connect_ext(remember_client_certificate)
        .upgrade(upgrades)
        .finish(map_config(app(app_ctx, app_guard).into_factory(), |_| {
            AppConfig::default()
        }));
    let served = fn_factory(move || {
        let http = http.new_service(());
        let (ctx, guard) = (ctx.clone(), guard.clone());
        async move {
            let http = Rc::new(http.await.map_err(|_| ())?);
            Ok::<_, ()>(fn_service(move |opened: Opened| {
                let http = http.clone();
                let (ctx, guard) = (ctx.clone(), guard.clone());
                async move {
                    match opened.first {
                        first_head::First::Spdy(req, framed) => {
                            upgrade::serve(&ctx, &guard, opened.cert, req, framed).await;
                        }
                        first_head::First::Plain(conn) => {
                            let call = (conn, actix_http::Protocol::Http1, opened.peer);
                            if let Err(e) = http.call(call).await {
                                tracing::debug!(error = %e, "kubelet API connection");
                            }
                        }
                    }
                    Ok::<_, ()>(())
                }
            }))
        }
    });
    opening(tls, handshakes).and_then(served)
}

/// A connection through its TLS handshake and its first request head.
struct Opened {
    peer: Option<SocketAddr>,
    cert: Option<auth::PeerCert>,
    first: first_head::First<Tls>,
}

/// K10: the TLS handshake and the first request head, within the bounds of `handshakes`: a
/// connection holds its place until it has asked for something, so one that handshakes and
/// then says nothing is bounded like one that never handshakes.
fn opening(
    tls: Arc<rustls::ServerConfig>,
    handshakes: handshakes::Handshakes,
) -> impl ServiceFactory<TcpStream, Config = (), Response = Opened, Error = (), InitError = ()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    fn_factory(move || {
        let (acceptor, handshakes) = (acceptor.clone(), handshakes.clone());
        async move {
            let config = actix_http::ServiceConfig::default();
            Ok::<_, ()>(fn_service(move |tcp: TcpStream| {
                let (acceptor, handshakes) = (acceptor.clone(), handshakes.clone());
                let config = config.clone();
                async move {
                    let ip = tcp
                        .peer_addr()
                        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
                    let open = async {
                        let tls = Tls::from(acceptor.accept(tcp).await?);
                        let peer = tls.get_ref().0.peer_addr().ok();
                        let cert = client_certificate(&tls);
                        let first = first_head::read(tls, &config).await;
                        std::io::Result::Ok(Opened { peer, cert, first })
                    };
                    match handshakes.run(ip, open).await {
                        Ok(Ok(opened)) => Ok(opened),
                        Ok(Err(e)) => {
                            tracing::debug!(%ip, error = %e, "kubelet API TLS handshake failed");
                            Err(())
                        }
                        Err(cut) => {
                            tracing::debug!(%ip, ?cut, "kubelet API connection cut before its first request");
                            Err(())
                        }
                    }
                }
            }))
        }
    })
}

/// K13: established connections one worker serves at once (two workers). Past it the
/// listener stops accepting until one ends, so the daemon's sockets and tasks stay bounded
/// however many connections callers keep open; far above what the apiserver, metrics-server
/// and Prometheus hold.
pub const CONNECTIONS_PER_WORKER: usize = 512;

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
    let handshakes = handshakes::Handshakes::new(ctx.metrics.clone());
    let data = web::Data::new(ctx);
    let guard = web::Data::new(guard);
    let mut tls = tls;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = Arc::new(tls);
    let spawned = std::thread::Builder::new()
        .name("kubelet-api".into())
        .spawn(move || {
            let server = actix_server::Server::build()
                .workers(2)
                .max_concurrent_connections(CONNECTIONS_PER_WORKER)
                .disable_signals()
                .listen("kubelet-api", listener, move || {
                    connections(tls.clone(), handshakes.clone(), data.clone(), guard.clone())
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

#[cfg(test)]
mod tests {
    use actix_web::test;

    use super::*;

    fn ctx() -> Ctx {
        let views = crate::views::Views::default();
        Ctx {
            sampler: Arc::new(Sampler::new(views.clone(), "x.slice", "/x")),
            views,
            cocoon: CocoonCli::new("cocoon"),
            node: "node-a".into(),
            started: "2026-12-01T19:00:00Z".into(),
            log_streams: log_streams(Default::default()),
            streams: streams(Default::default()),
            exec_idle: Duration::from_secs(30),
            metrics: Metrics::new(),
        }
    }

    fn guard(open: bool) -> auth::Guard {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        auth::Guard::new(client, "node-a".into(), true, open, Metrics::new())
    }

    /// K8: the daemon's own metrics on the kubelet port, behind the guard like every path.
    #[actix_web::test]
    async fn the_daemons_metrics_are_served_behind_the_guard() {
        for (open, want) in [(true, 200), (false, 401)] {
            let app =
                test::init_service(app(web::Data::new(ctx()), web::Data::new(guard(open)))).await;
            let req = test::TestRequest::get().uri("/metrics").to_request();
            let resp = test::call_service(&app, req).await;
            assert_eq!(resp.status().as_u16(), want, "open: {open}");
            if open {
                let body = test::read_body(resp).await;
                let text = String::from_utf8_lossy(&body);
                assert!(
                    text.contains(r#"cocoon_vk_cap_refusals_total{cap="tls_handshake"} 0"#),
                    "{text}"
                );
            }
        }
    }
}
