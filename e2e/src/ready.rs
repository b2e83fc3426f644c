//! Bounded waiting for a component to answer.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::procs::Proc;

/// Polls `check` until it returns true. Gives up when the process exits (with the tail of its
/// log, which is where the reason is) or after `limit`, a bound generous enough for a loaded
/// 2-core CI machine: it catches hangs, it does not measure speed.
pub async fn wait_ready<F, Fut>(
    proc: &mut Proc,
    what: &str,
    limit: Duration,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return Ok(());
        }
        if !proc.running() {
            bail!(
                "{what} exited before it was ready; last lines of {}:\n{}",
                proc.log_path().display(),
                proc.log_tail(30)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{what} not ready after {limit:?}; last lines of {}:\n{}",
                proc.log_path().display(),
                proc.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain-HTTP client for loopback components: no proxy from the environment (a CI proxy must
/// never see testbed traffic) and short timeouts so a wedged component fails the poll fast.
pub fn http() -> reqwest::Client {
    crypto();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("building an HTTP client without TLS cannot fail")
}

/// Installs ring as rustls' process-wide provider. reqwest (under oci-client) is built without
/// a provider of its own so the tree carries one crypto library, and it panics when it finds
/// none installed; kube-rs picks ring explicitly either way.
pub fn crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only means some other code installed a provider first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
