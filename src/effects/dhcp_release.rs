//! D6: `DELETE /v1/leases/<mac>` on cocoon-net's control socket (LEASE-7):
//! HTTP/1.1 over a Unix socket, 5 s for the whole exchange. 204 means released or no lease
//! (idempotent); anything else is reported back as an error text.

use std::path::Path;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

const TIMEOUT: Duration = Duration::from_secs(5);

pub async fn release(socket: &Path, mac: &str) -> Result<(), String> {
    match tokio::time::timeout(TIMEOUT, call(socket, mac)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer from {} within {}s",
            socket.display(),
            TIMEOUT.as_secs()
        )),
    }
}

/// The MAC as a path segment: the canonical lowercase form; its `:` needs no escaping.
fn path(mac: &str) -> Result<String, String> {
    let mac = mac.to_ascii_lowercase();
    let ok = mac.len() == 17
        && mac
            .split(':')
            .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()));
    match ok {
        true => Ok(format!("/v1/leases/{mac}")),
        false => Err(format!("not a MAC address: {mac:?}")),
    }
}

async fn call(socket: &Path, mac: &str) -> Result<(), String> {
    let uri = path(mac)?;
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::DELETE)
        .uri(uri)
        .header(hyper::header::HOST, "cocoon-net")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let res = sender.send_request(req).await.map_err(|e| e.to_string());
    driver.abort();
    match res?.status() {
        StatusCode::NO_CONTENT => Ok(()),
        other => Err(format!("cocoon-net answered {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_carries_the_canonical_mac_and_nothing_else() {
        assert_eq!(
            path("02:5E:11:3A:9C:01").unwrap(),
            "/v1/leases/02:5e:11:3a:9c:01"
        );
        assert!(path("02:5e:11:3a:9c").is_err());
        assert!(path("../../etc/passwd").is_err());
        assert!(path("02:5e:11:3a:9c:0g").is_err());
    }
}
