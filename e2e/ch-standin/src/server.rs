//! The API socket: HTTP/1.1 over a unix socket (hyper), one request at a time into the VMM,
//! as cloud-hypervisor's single API thread. A request that ends the process (vmm.shutdown,
//! a power-off) is answered first: its connection finishes writing, then the process exits.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Notify};

use crate::vmm::{After, Vmm};

/// Binds `path`, clearing a stale socket that no process answers on (a live one is an error:
/// another VMM owns it).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{} is in use by another process", path.display()),
        ));
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

/// Serves until a request asks the process to exit; returns then.
pub async fn serve(listener: UnixListener, vmm: Arc<Mutex<Vmm>>) {
    let (exit_tx, mut exit_rx) = mpsc::channel::<()>(1);
    loop {
        tokio::select! {
            _ = exit_rx.recv() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                tokio::spawn(connection(stream, vmm.clone(), exit_tx.clone()));
            }
        }
    }
}

async fn connection(
    stream: tokio::net::UnixStream,
    vmm: Arc<Mutex<Vmm>>,
    exit_tx: mpsc::Sender<()>,
) {
    let exit_now = Arc::new(Notify::new());
    let exit_flag = Arc::new(AtomicBool::new(false));
    let flag = (exit_now.clone(), exit_flag.clone());
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let vmm = vmm.clone();
        let flag = flag.clone();
        async move {
            let method = req.method().as_str().to_string();
            let path = req.uri().path().to_string();
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let reply = {
                let mut vmm = vmm.lock().unwrap_or_else(|e| e.into_inner());
                crate::api::handle(&mut vmm, &method, &path, &body)
            };
            eprintln!("api: {method} {path} -> {}", reply.status);
            if reply.after == After::Exit {
                flag.1.store(true, Ordering::SeqCst);
                flag.0.notify_one();
            }
            Ok::<_, Infallible>(response(reply))
        }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let asked_exit = tokio::select! {
        _ = conn.as_mut() => false,
        _ = exit_now.notified() => true,
    };
    // The client may have closed first, ending the connection before the notification won.
    if asked_exit || exit_flag.load(Ordering::SeqCst) {
        conn.as_mut().graceful_shutdown();
        let _ = conn.await;
        let _ = exit_tx.send(()).await;
    }
}

fn response(reply: crate::api::Reply) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(reply.status)
        .header("Server", "Cloud Hypervisor API")
        .header("Content-Type", "application/json");
    if reply.after == After::Exit {
        b = b.header("Connection", "close");
    }
    b.body(Full::new(Bytes::from(reply.body.unwrap_or_default())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}
