//! kube-scheduler on loopback: pods reach a node as users' pods do, by its labels, taints and
//! allocatable, never by a `spec.nodeName` the test wrote.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::apiserver::ApiServer;
use crate::bins;
use crate::certs::Pki;
use crate::component::{self, Component};
use crate::procs::Proc;
use crate::rundir::{write_file, RunDir};

/// The user the bootstrap RBAC (`system:kube-scheduler`) is bound to.
pub const USER: &str = "system:kube-scheduler";

/// What kube-scheduler's own defaults give its API client (KubeSchedulerConfiguration v1
/// `clientConnection`): every binding is one request through this token bucket, so a mass
/// create binds at most `qps` pods a second once the burst is spent.
pub const DEFAULT_CLIENT: ClientConnection = ClientConnection {
    qps: 50.0,
    burst: 100,
};

/// The client rate limit kube-scheduler talks to the apiserver with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientConnection {
    pub qps: f32,
    pub burst: u32,
}

impl std::fmt::Display for ClientConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "qps {} burst {}", self.qps, self.burst)
    }
}

pub struct Scheduler {
    pub proc: Proc,
    /// Its secure port on 127.0.0.1 (`/healthz`, `/metrics`).
    pub port: u16,
    /// The rate limit it was started with.
    pub client: ClientConnection,
    /// An admin kubeconfig for its own port (`/metrics`).
    admin: PathBuf,
}

impl Scheduler {
    /// `client: None` starts it as a stock cluster has it, from flags alone ([`DEFAULT_CLIENT`]).
    pub async fn start(
        run: &RunDir,
        pki: &Pki,
        api: &ApiServer,
        client: Option<ClientConnection>,
    ) -> Result<Scheduler> {
        let c = Component::prepare(run, pki, api, "kube-scheduler", USER)?;
        let mut cmd = Command::new(bins::built("kube-scheduler")?);
        c.common_args(&mut cmd);
        // One scheduler per testbed: a leader election would only delay its start by a lease.
        // The flag is honoured with `--config` too.
        cmd.arg("--leader-elect=false");
        if let Some(limit) = client {
            // The deprecated `--kube-api-qps`/`--kube-api-burst` are the other way; a config
            // file is the supported one. With it kube-scheduler ignores `--kubeconfig` and
            // `--profiling`, so the file repeats them.
            let path = run.path().join("kube-scheduler.config.yaml");
            write_file(&path, &config_file(run, limit))?;
            cmd.arg(format!("--config={}", path.display()));
        }
        let (proc, port) = component::spawn_healthy(run, c, cmd).await?;
        Ok(Scheduler {
            proc,
            port,
            client: client.unwrap_or(DEFAULT_CLIENT),
            // The health check's kubeconfig `Component::prepare` wrote for this component.
            admin: run.path().join("kube-scheduler-health.kubeconfig"),
        })
    }

    /// How long its API requests waited on its client's rate limiter so far, in seconds, and
    /// how many requests: client-go's `rest_client_rate_limiter_duration_seconds`, summed over
    /// verbs (bindings and events alike).
    pub async fn rate_limiter_wait(&self) -> Result<(f64, f64)> {
        let client = crate::kube::client(&self.admin).await?;
        let text = crate::kube::get_text(&client, "/metrics").await?;
        let total = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.split(['{', ' ']).next() == Some(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Ok((
            total("rest_client_rate_limiter_duration_seconds_sum"),
            total("rest_client_rate_limiter_duration_seconds_count"),
        ))
    }
}

fn config_file(run: &RunDir, limit: ClientConnection) -> String {
    // The kubeconfig `Component::prepare` wrote for this component.
    let kubeconfig = run.path().join("kube-scheduler.kubeconfig");
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
  qps: {qps}
  burst: {burst}
leaderElection:
  leaderElect: false
enableProfiling: false
",
        kubeconfig = kubeconfig.display(),
        qps = limit.qps,
        burst = limit.burst,
    )
}
