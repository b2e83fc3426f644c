//! A registry stand-in for unit tests: fixed answers per path over plain HTTP/1.1 on
//! loopback, so the reader's fail-closed rules can be exercised without the testbed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Default)]
pub struct FakeRegistry {
    routes: Arc<Mutex<HashMap<String, Answer>>>,
    pub addr: String,
}

pub fn digest_of(b: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(b))
}

impl FakeRegistry {
    pub async fn start() -> FakeRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let reg = FakeRegistry {
            routes: Arc::default(),
            addr,
        };
        reg.set("/v2/", 200, "application/json", b"{}".to_vec());
        let routes = reg.routes.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let routes = routes.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let n = match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_string();
                            buf.drain(..end + 4);
                            let mut parts = head.split_whitespace();
                            let method = parts.next().unwrap_or("").to_string();
                            let path = parts.next().unwrap_or("").to_string();
                            let path = path.split('?').next().unwrap_or("").to_string();
                            let answer = {
                                let r = routes.lock().unwrap();
                                r.get(&format!("{method} {path}"))
                                    .or_else(|| r.get(&path))
                                    .cloned()
                            };
                            let a = answer.unwrap_or(Answer {
                                status: 404,
                                content_type: "application/json".into(),
                                body: br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#
                                    .to_vec(),
                                headers: Vec::new(),
                            });
                            let extra: String = a
                                .headers
                                .iter()
                                .map(|(k, v)| format!("{k}: {v}\r\n"))
                                .collect();
                            let mut resp = format!(
                                "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\n{extra}\r\n",
                                a.status,
                                a.content_type,
                                a.body.len()
                            )
                            .into_bytes();
                            if method != "HEAD" {
                                resp.extend_from_slice(&a.body);
                            }
                            if sock.write_all(&resp).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        reg
    }

    /// `route` is a path, or `METHOD path` for an answer to that method only.
    pub fn set(&self, route: &str, status: u16, content_type: &str, body: Vec<u8>) {
        self.set_with_headers(route, status, content_type, body, Vec::new());
    }

    pub fn set_with_headers(
        &self,
        route: &str,
        status: u16,
        content_type: &str,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
    ) {
        self.routes.lock().unwrap().insert(
            route.to_string(),
            Answer {
                status,
                content_type: content_type.to_string(),
                body,
                headers,
            },
        );
    }

    /// Serves `body` as the blob `digest` of `repo` (which need not be its real digest).
    pub fn blob(&self, repo: &str, digest: &str, body: Vec<u8>) {
        self.set(
            &format!("/v2/{repo}/blobs/{digest}"),
            200,
            "application/octet-stream",
            body,
        );
    }

    pub fn manifest(&self, repo: &str, reference: &str, body: Vec<u8>) {
        self.set(
            &format!("/v2/{repo}/manifests/{reference}"),
            200,
            super::media::OCI_MANIFEST,
            body,
        );
    }
}
