//! What kube-scheduler and kube-controller-manager share: a client certificate of their own
//! (the user the bootstrap RBAC binds), a kubeconfig for it, a serving certificate of the
//! testbed CA on a free loopback port, and a wait on `/healthz`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::apiserver::ApiServer;
use crate::certs::{CertPair, Pki};
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::wait_ready;
use crate::rundir::RunDir;
use crate::step;

pub struct Component {
    name: &'static str,
    port: u16,
    kubeconfig: PathBuf,
    serving: CertPair,
    /// An admin kubeconfig that points at the component's own port, for the health check:
    /// it verifies the serving certificate against the testbed CA.
    health: PathBuf,
}

impl Component {
    pub fn prepare(
        run: &RunDir,
        pki: &Pki,
        api: &ApiServer,
        name: &'static str,
        user: &str,
    ) -> Result<Component> {
        let port = free_port()?;
        let client = pki.issue_client(&format!("{name}-client"), user, &[])?;
        let kubeconfig = run.path().join(format!("{name}.kubeconfig"));
        crate::kubeconfig::write_for(&kubeconfig, &api.url, pki, &client)?;
        let serving = pki.issue_serving(name, &["127.0.0.1", "localhost"])?;
        let health = run.path().join(format!("{name}-health.kubeconfig"));
        crate::kubeconfig::write(&health, &format!("https://127.0.0.1:{port}"), pki)?;
        Ok(Component {
            name,
            port,
            kubeconfig,
            serving,
            health,
        })
    }

    pub fn common_args(&self, cmd: &mut Command) {
        let kc = self.kubeconfig.display().to_string();
        cmd.arg(format!("--kubeconfig={kc}"))
            // Delegated authentication and authorization of its own HTTPS endpoints ask the
            // apiserver as the same user; /healthz is always allowed.
            .arg(format!("--authentication-kubeconfig={kc}"))
            .arg(format!("--authorization-kubeconfig={kc}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.port))
            .arg(format!("--tls-cert-file={}", self.serving.cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                self.serving.key.display()
            ))
            .arg("--profiling=false")
            .arg("--v=1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy");
    }
}

/// Spawns the component and waits until its `/healthz` answers `ok`.
pub async fn spawn_healthy(run: &RunDir, c: Component, cmd: Command) -> Result<(Proc, u16)> {
    step!("starting {} on 127.0.0.1:{}", c.name, c.port);
    let mut proc = run.spawn(c.name, cmd)?;
    let client = crate::kube::client(&c.health).await?;
    wait_ready(&mut proc, c.name, Duration::from_secs(120), || {
        let client = client.clone();
        async move {
            crate::kube::get_text(&client, "/healthz")
                .await
                .is_ok_and(|t| t.trim() == "ok")
        }
    })
    .await?;
    step!("{} healthy", c.name);
    Ok((proc, c.port))
}
