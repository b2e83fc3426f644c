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
