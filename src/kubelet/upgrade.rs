//! The upgrade service of the kubelet API (K4): a request that takes its connection over
//! (exec, attach and port-forward, over WebSocket or SPDY/3.1) arrives here with the
//! connection itself, as actix-http's upgrade extension point hands it over. It passes the
//! same guard as every other request (K9), is answered, and on `101` its session runs on the
//! connection until either side ends it.

use actix_codec::{AsyncRead, AsyncWrite, Framed};
use actix_http::body::BodySize;
use actix_http::h1::{Codec, Message};
use actix_http::header::{self, HeaderValue};
use actix_http::{ConnectionType, Request, Response, StatusCode};
use bytes::Bytes;
use futures::SinkExt;

use super::auth::{self, Guard, PeerCert};
use super::stream::{self, Answer};
use super::Ctx;

/// Serves one upgrade request; `cert` is the connection's verified client certificate.
pub async fn serve<T>(
    ctx: &Ctx,
    guard: &Guard,
    cert: Option<PeerCert>,
    req: Request,
    framed: Framed<T, Codec>,
) where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let head = req.head();
    let authorization = head
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let attrs = auth::attributes(&head.method, head.uri.path());
    let verdict = guard.check(cert.as_ref(), authorization, attrs).await;
    if let Some((code, text)) = verdict.refusal() {
        tracing::debug!(path = %head.uri.path(), ?verdict, "kubelet API upgrade refused");
        let body = Bytes::copy_from_slice(text.as_bytes());
        return respond(framed, code, auth::PLAIN, body).await;
    }
    match stream::answer(ctx, head) {
        Answer::Refuse(code, message) => {
            let body = Bytes::from(stream::status_body(code, message));
            respond(framed, code, "application/json", body).await;
        }
        Answer::Switch(response, relay) => {
            let mut framed = framed;
            if framed
                .send(Message::Item((response, BodySize::None)))
                .await
                .is_err()
            {
                return;
            }
            let (inbound, out, writer) = stream::connection(framed.into_parts());
            futures::join!(relay(inbound, out), writer);
        }
    }
}

/// A whole answer, after which the connection is closed.
async fn respond<T>(mut framed: Framed<T, Codec>, code: StatusCode, kind: &'static str, body: Bytes)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut res = Response::new(code).drop_body();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    res.head_mut().set_connection_type(ConnectionType::Close);
    let size = BodySize::Sized(body.len() as u64);
    if framed.send(Message::Item((res, size))).await.is_ok() {
        let _ = framed.send(Message::Chunk(Some(body))).await;
    }
    let _ = framed.close().await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::first_head::{self, First};
    use super::*;
    use crate::views::Views;

    fn ctx() -> Ctx {
        let views = Views::default();
        Ctx {
            sampler: Arc::new(crate::stats::Sampler::new(views.clone(), "x.slice", "/x")),
            views,
            cocoon: crate::cocoon::CocoonCli::new("cocoon"),
            node: "node-a".into(),
            started: "2026-12-01T19:00:00Z".into(),
            log_streams: super::super::log_streams(Default::default()),
            streams: super::super::streams(Default::default()),
            exec_idle: std::time::Duration::from_secs(30),
            metrics: crate::metrics::Metrics::new(),
        }
    }

    /// A guard whose apiserver never answers; `open` serves callers without credentials.
    fn guard(open: bool) -> Guard {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        Guard::new(
            kube::Client::try_from(config).unwrap(),
            "node-a".into(),
            true,
            open,
            crate::metrics::Metrics::new(),
        )
    }

    /// A client certificate, and a guard that lets its user make every upgrade (a POST).
    fn trusted() -> (Guard, PeerCert) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = PeerCert(p.self_signed(&key).unwrap().der().to_vec());
        let user = auth::user_of_certificate(&cert.0).unwrap();
        let g = guard(false);
        let post = actix_http::Method::POST;
        g.remember_allowed(user, auth::attributes(&post, "/exec/default/p/c"));
        (g, cert)
    }

    /// The whole answer to a SPDY upgrade of `target` from a caller without credentials.
    async fn answer(guard: &Guard, target: &str) -> String {
        answer_to(guard, None, target).await
    }

    /// The whole answer to a SPDY upgrade of `target` from a caller presenting `cert`.
    async fn answer_to(guard: &Guard, cert: Option<PeerCert>, target: &str) -> String {
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let head = format!(
            "POST {target} HTTP/1.1\r\nHost: n\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
             X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
        );
        client.write_all(head.as_bytes()).await.unwrap();
        let config = actix_http::ServiceConfig::default();
        let First::Spdy(req, framed) = first_head::read(server, &config).await else {
            panic!("not a SPDY upgrade");
        };
        serve(&ctx(), guard, cert, req, framed).await;
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        String::from_utf8(got).unwrap()
    }

    #[actix_web::test]
    async fn an_upgrade_passes_the_guard_before_anything_else() {
        let got = answer(&guard(false), "/exec/default/p/c?command=ls&stdout=1").await;
        assert!(got.starts_with("HTTP/1.1 401"), "{got}");
        assert!(got.contains("connection: close"), "{got}");
        assert!(got.ends_with("\r\n\r\nUnauthorized"), "{got}");
        // The open mode serves reads only: an exec without credentials is refused, saying so.
        let got = answer(&guard(true), "/exec/default/p/c?command=ls&stdout=1").await;
        assert!(got.starts_with("HTTP/1.1 401"), "{got}");
        assert!(got.contains("exec, attach, port-forward"), "{got}");
    }

    #[actix_web::test]
    async fn a_refused_upgrade_is_a_status_the_client_prints() {
        let (g, cert) = trusted();
        let got = answer_to(
            &g,
            Some(cert.clone()),
            "/exec/default/p/c?command=ls&stdout=1",
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 404"), "{got}");
        assert!(got.contains("content-type: application/json"), "{got}");
        assert!(
            got.contains(r#""message":"pod default/p is not on this node""#),
            "{got}"
        );
        let got = answer_to(&g, Some(cert.clone()), "/pods").await;
        assert!(got.starts_with("HTTP/1.1 404"), "{got}");
        let got = answer_to(&g, Some(cert), "/attach/default/p/c?stdout=1").await;
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(got.contains("attach is not supported"), "{got}");
    }
}
