//! `/exec`, `/attach` and `/portForward` (K4): the answer to the upgrade request, then a
//! session that runs on the upgraded connection for as long as the client keeps it.
//!
//! Which transport arrives depends on the apiserver: when the Node declares
//! `ExtendWebSocketsToKubelet` it passes kubectl's WebSocket through (remotecommand `v5` for
//! exec, SPDY tunnelled in WebSocket messages for port-forward); otherwise it speaks SPDY/3.1
//! to the node itself. All of them are served here.

mod exec;
mod port_forward;
mod remotecommand;
mod spdy_dictionary;
/// Public for the load tests' own SPDY client (`tests/e2e_tenant_caps.rs`).
pub mod spdy_frame;
mod spdy_session;
mod wire;

use std::net::IpAddr;

use actix_http::header::{self, HeaderValue};
use actix_http::{RequestHead, Response, StatusCode};
use actix_web::HttpResponse;
use futures::future::LocalBoxFuture;
use serde_json::json;

use super::Ctx;
use crate::metrics::Cap;
use crate::views::VmView;
pub use port_forward::MAX_PAIRS;
use remotecommand::Streams;
pub use wire::connection;
use wire::{Inbound, Outbound};

const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";
/// Both speak the same streams and the status as JSON; `v5` adds closing stdin.
const REMOTECOMMAND: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
const PORT_FORWARD: &str = "portforward.k8s.io";
const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// The WebSocket port-forward of clients that do not tunnel SPDY (one channel pair per port).
const PORT_FORWARD_CHANNELS: &str = "v4.channel.k8s.io";

/// A refusal before the upgrade, as a Status kubectl prints.
pub fn status_body(code: StatusCode, message: impl Into<String>) -> Vec<u8> {
    let reason = match code {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    };
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16(),
    });
    serde_json::to_vec(&status).unwrap_or_default()
}

/// The session on the upgraded connection: what the client sends, and where to send to it.
pub type Relay = Box<dyn FnOnce(Inbound, Outbound) -> LocalBoxFuture<'static, ()>>;

/// What an upgrade request is answered.
pub enum Answer {
    /// Refused before the upgrade, with a Status the client prints.
    Refuse(StatusCode, String),
    /// `101 Switching Protocols` with this response, then the relay on the connection.
    Switch(Response<()>, Relay),
}

impl Answer {
    fn refuse(code: StatusCode, message: impl Into<String>) -> Answer {
        Answer::Refuse(code, message.into())
    }
}

/// The answer to an upgrade request, by path.
pub fn answer(ctx: &Ctx, head: &RequestHead) -> Answer {
    let path = head.uri.path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["exec", ns, pod, _container] => exec(ctx, head, ns, pod),
        ["attach", _, _, _] => Answer::refuse(StatusCode::BAD_REQUEST, attach_refusal()),
        ["portForward", ns, pod] => port_forward(ctx, head, ns, pod),
        _ => Answer::refuse(
            StatusCode::NOT_FOUND,
            format!("{path} does not upgrade: exec, attach and portForward do"),
        ),
    }
}

/// `/exec`, `/attach` and `/portForward` asked without an upgrade.
pub async fn not_upgraded() -> HttpResponse {
    HttpResponse::BadRequest()
        .content_type("application/json")
        .body(status_body(StatusCode::BAD_REQUEST, NO_UPGRADE))
}

/// `/attach` asked without an upgrade: refused the same way.
pub async fn attach() -> HttpResponse {
    HttpResponse::BadRequest()
        .content_type("application/json")
        .body(status_body(StatusCode::BAD_REQUEST, attach_refusal()))
}

const NO_UPGRADE: &str = "this endpoint needs an upgrade to SPDY/3.1 or WebSocket";

enum Transport {
    /// A WebSocket with the subprotocol chosen and the `Sec-WebSocket-Accept` answer.
    WebSocket {
        protocol: &'static str,
        accept: String,
    },
    Spdy {
        protocol: &'static str,
    },
}

impl Transport {
    fn name(&self) -> &'static str {
        match self {
            Transport::WebSocket { .. } => "websocket",
            Transport::Spdy { .. } => "spdy",
        }
    }

    fn protocol(&self) -> &'static str {
        match self {
            Transport::WebSocket { protocol, .. } | Transport::Spdy { protocol } => protocol,
        }
    }
}

fn offered(req: &RequestHead, name: &str) -> Vec<String> {
    req.headers()
        .get_all(name)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The transport and protocol for this request, ours (`spdy` or `ws`, by transport) chosen in
/// our order of preference.
fn negotiate(
    req: &RequestHead,
    spdy_ours: &[&'static str],
    ws_ours: &[&'static str],
) -> Result<Transport, String> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let pick = |ours: &[&'static str], theirs: &[String]| {
        ours.iter().copied().find(|p| theirs.iter().any(|t| t == p))
    };
    if upgrade == "websocket" {
        let accept = wire::ws_accept(req)?;
        let theirs = offered(req, "Sec-WebSocket-Protocol");
        let ours = ws_ours;
        let protocol = pick(ours, &theirs).ok_or_else(|| {
            format!(
                "none of the WebSocket subprotocols {theirs:?} is served here; vk-cocoon speaks {ours:?}"
            )
        })?;
        return Ok(Transport::WebSocket { protocol, accept });
    }
    if upgrade.starts_with("spdy/3.1") {
        let theirs = offered(req, PROTOCOL_HEADER);
        let ours = spdy_ours;
        let protocol = pick(ours, &theirs).ok_or_else(|| {
            format!(
                "none of the stream protocols {theirs:?} is served here; vk-cocoon speaks {ours:?}"
            )
        })?;
        return Ok(Transport::Spdy { protocol });
    }
    Err(NO_UPGRADE.into())
}

/// The 101 answer for the transport chosen.
fn switching(transport: &Transport) -> Response<()> {
    let mut resp = Response::build(StatusCode::SWITCHING_PROTOCOLS);
    match transport {
        Transport::WebSocket { protocol, accept } => {
            resp.upgrade("websocket");
            if let Ok(v) = HeaderValue::from_str(accept) {
                resp.insert_header((header::SEC_WEBSOCKET_ACCEPT, v));
            }
            resp.insert_header((header::SEC_WEBSOCKET_PROTOCOL, *protocol));
        }
        Transport::Spdy { protocol } => {
            resp.upgrade("SPDY/3.1");
            resp.insert_header((PROTOCOL_HEADER, *protocol));
        }
    }
    resp.finish().drop_body()
}

fn boolean(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE")
}

#[derive(Debug, Default, PartialEq)]
pub struct ExecQuery {
    pub command: Vec<String>,
    pub streams: Streams,
}

/// The exec query as the apiserver writes it; the refusals a kubelet gives.
pub fn exec_query(query: &str) -> Result<ExecQuery, String> {
    let mut q = ExecQuery::default();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "command" => q.command.push(v.into_owned()),
            "input" | "stdin" => q.streams.stdin = boolean(&v),
            "output" | "stdout" => q.streams.stdout = boolean(&v),
            "error" | "stderr" => q.streams.stderr = boolean(&v),
            "tty" => q.streams.tty = boolean(&v),
            _ => {}
        }
    }
    let s = q.streams;
    if s.tty && s.stderr {
        return Err("tty and stderr cannot both be true".into());
    }
    if !s.stdin && !s.stdout && !s.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    if q.command.is_empty() {
        return Err("you must specify a command".into());
    }
    Ok(q)
}

/// A refusal before the upgrade: the status and what [`refuse`] tells the client.
type Refusal = (StatusCode, String);

/// The pod's live VM, or the refusal that says why there is none.
fn vm_of(ctx: &Ctx, ns: &str, pod: &str) -> Result<VmView, Refusal> {
    let key = format!("{ns}/{pod}");
    if !ctx.views.pods.contains_key(&key) {
        return Err((
            StatusCode::NOT_FOUND,
            format!("pod {key} is not on this node"),
        ));
    }
    match ctx.views.vms.get(&key).map(|v| v.value().clone()) {
        Some(vm) => Ok(vm),
        None => Err((
            StatusCode::NOT_FOUND,
            format!("vk-cocoon: pod {key} has no live VM"),
        )),
    }
}

fn permit(ctx: &Ctx, ns: &str) -> Result<super::sessions::SessionPermit, Refusal> {
    ctx.streams
        .try_acquire(ns)
        .map_err(|why| (StatusCode::SERVICE_UNAVAILABLE, why))
}

/// `/exec/{ns}/{pod}/{container}`.
fn exec(ctx: &Ctx, head: &RequestHead, ns: &str, pod: &str) -> Answer {
    let q = match exec_query(head.uri.query().unwrap_or_default()) {
        Ok(q) => q,
        Err(e) => return Answer::refuse(StatusCode::BAD_REQUEST, e),
    };
    let vm = match vm_of(ctx, ns, pod) {
        Ok(vm) => vm,
        Err((code, msg)) => return Answer::Refuse(code, msg),
    };
    let transport = match negotiate(head, &REMOTECOMMAND, &REMOTECOMMAND) {
        Ok(t) => t,
        Err(e) => return Answer::refuse(StatusCode::BAD_REQUEST, e),
    };
    let permit = match permit(ctx, ns) {
        Ok(p) => p,
        Err((code, msg)) => return Answer::Refuse(code, msg),
    };
    tracing::info!(namespace = %ns, pod = %pod, transport = transport.name(),
        protocol = transport.protocol(), "exec");
    let cli = ctx.cocoon.clone();
    let streams = q.streams;
    let idle = ctx.exec_idle;
    let worker: remotecommand::Worker<_> = Box::new(move |stdin, out| {
        let windows_ip = vm.windows.then(|| vm.ip.clone().unwrap_or_default());
        let refused = cli.lacks(reconcilers::cocoon_caps::Verb::Exec);
        let argv = exec::argv(&vm.vm_id, stdin.is_some(), &q.command);
        async move {
            match (windows_ip, refused) {
                (Some(ip), _) => exec::windows_notice(ip, out).await,
                (None, Some(refused)) => exec::refuse(refused.message, out).await,
                (None, None) => {
                    exec::run(&cli, argv, stdin, streams.stdout, streams.stderr, out).await
                }
            }
        }
    });
    let response = switching(&transport);
    let relay: Relay = match transport {
        Transport::WebSocket { protocol, .. } => {
            let close_signal = protocol == REMOTECOMMAND[0];
            Box::new(move |raw, out| {
                Box::pin(async move {
                    let inbound = wire::ws_messages(raw, out.clone());
                    remotecommand::websocket(inbound, out, streams, close_signal, idle, worker)
                        .await;
                    drop(permit);
                })
            })
        }
        Transport::Spdy { .. } => Box::new(move |raw, out| {
            Box::pin(async move {
                let session = spdy_session::Session::new(raw, out, |b| b);
                remotecommand::spdy(session, streams, idle, worker).await;
                drop(permit);
            })
        }),
    };
    Answer::Switch(response, relay)
}

/// Why `/attach` cannot be served: there is no process of the pod's to attach to.
pub fn attach_refusal() -> String {
    "vk-cocoon: attach is not supported: a pod here is a whole VM with no container \
     process whose console could be joined (cocoon offers none for Linux guests); \
     use kubectl exec instead"
        .into()
}

/// `/portForward/{ns}/{pod}`.
fn port_forward(ctx: &Ctx, head: &RequestHead, ns: &str, pod: &str) -> Answer {
    let vm = match vm_of(ctx, ns, pod) {
        Ok(vm) => vm,
        Err((code, msg)) => return Answer::Refuse(code, msg),
    };
    // Only the pod's own address is ever dialled, whatever the client asks.
    let Some(ip) = vm.ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()) else {
        return Answer::refuse(
            StatusCode::NOT_FOUND,
            format!("vk-cocoon: pod {ns}/{pod} has no IP yet"),
        );
    };
    let ws = [PORT_FORWARD_TUNNEL, PORT_FORWARD_CHANNELS];
    let transport = match negotiate(head, &[PORT_FORWARD], &ws) {
        Ok(t) => t,
        Err(e) => return Answer::refuse(StatusCode::BAD_REQUEST, e),
    };
    let channel_ports = match (&transport, transport.protocol()) {
        (Transport::WebSocket { .. }, PORT_FORWARD_CHANNELS) => {
            match port_forward::query_ports(head.uri.query().unwrap_or_default()) {
                Ok(p) if p.len() > port_forward::MAX_PAIRS => {
                    ctx.metrics.cap_refused(Cap::PortForwardStreams);
                    return Answer::refuse(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "{} ports asked for: {}",
                            p.len(),
                            port_forward::too_many_pairs()
                        ),
                    );
                }
                Ok(p) => Some(p),
                Err(e) => return Answer::refuse(StatusCode::BAD_REQUEST, e),
            }
        }
        _ => None,
    };
    let permit = match permit(ctx, ns) {
        Ok(p) => p,
        Err((code, msg)) => return Answer::Refuse(code, msg),
    };
    tracing::info!(namespace = %ns, pod = %pod, transport = transport.name(),
        protocol = transport.protocol(), "port-forward");
    let response = switching(&transport);
    let metrics = ctx.metrics.clone();
    let relay: Relay = match (transport, channel_ports) {
        (Transport::WebSocket { .. }, Some(ports)) => Box::new(move |raw, out| {
            Box::pin(async move {
                let inbound = wire::ws_messages(raw, out.clone());
                port_forward::websocket(inbound, out, ip, ports).await;
                drop(permit);
            })
        }),
        (Transport::WebSocket { .. }, None) => Box::new(move |raw, out| {
            Box::pin(async move {
                let inbound = wire::ws_messages(raw, out.clone());
                let session = spdy_session::Session::new(inbound, out, wire::ws_binary);
                port_forward::spdy(session, ip, metrics).await;
                drop(permit);
            })
        }),
        (Transport::Spdy { .. }, _) => Box::new(move |raw, out| {
            Box::pin(async move {
                let session = spdy_session::Session::new(raw, out, |b| b);
                port_forward::spdy(session, ip, metrics).await;
                drop(permit);
            })
        }),
    };
    Answer::Switch(response, relay)
}

#[cfg(test)]
mod tests {
    use actix_web::HttpRequest;

    use super::*;

    #[test]
    fn the_exec_query_is_read_and_checked_as_a_kubelet_checks_it() {
        let q =
            exec_query("command=printf&command=%25s+%25s&command=a+b&stdin=1&stdout=true").unwrap();
        assert_eq!(q.command, ["printf", "%s %s", "a b"]);
        assert_eq!(
            q.streams,
            Streams {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: false
            }
        );
        assert!(exec_query("command=ls&tty=1&stdout=1&stderr=1")
            .unwrap_err()
            .contains("tty and stderr"));
        assert!(exec_query("command=ls")
            .unwrap_err()
            .contains("at least 1 of"));
        assert!(exec_query("stdout=1").unwrap_err().contains("command"));
    }

    #[test]
    fn attach_says_why_not() {
        assert!(attach_refusal().contains("attach is not supported"));
    }

    fn request(headers: &[(&str, &str)]) -> HttpRequest {
        let mut r = actix_web::test::TestRequest::get();
        for (k, v) in headers {
            r = r.insert_header((*k, *v));
        }
        r.to_http_request()
    }

    #[test]
    fn the_newest_protocol_both_sides_speak_is_chosen() {
        let req = request(&[
            ("Upgrade", "SPDY/3.1"),
            ("Connection", "Upgrade"),
            (
                PROTOCOL_HEADER,
                "v4.channel.k8s.io, v5.channel.k8s.io, v3.channel.k8s.io",
            ),
        ]);
        assert!(matches!(
            negotiate(req.head(), &REMOTECOMMAND, &REMOTECOMMAND),
            Ok(Transport::Spdy {
                protocol: "v5.channel.k8s.io"
            })
        ));
        let req = request(&[
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Protocol", "v4.channel.k8s.io"),
        ]);
        match negotiate(req.head(), &REMOTECOMMAND, &REMOTECOMMAND) {
            Ok(Transport::WebSocket { protocol, accept }) => {
                assert_eq!(protocol, "v4.channel.k8s.io");
                assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
            }
            _ => panic!("not a WebSocket"),
        }
        let req = request(&[
            ("Upgrade", "SPDY/3.1"),
            ("Connection", "Upgrade"),
            (PROTOCOL_HEADER, "channel.k8s.io"),
        ]);
        assert!(negotiate(req.head(), &REMOTECOMMAND, &REMOTECOMMAND).is_err());
        assert!(negotiate(request(&[]).head(), &REMOTECOMMAND, &REMOTECOMMAND).is_err());
    }
}
