//! kube-scheduler on loopback: pods reach a node as users' pods do, by its labels, taints and
//! allocatable, never by a `spec.nodeName` the test wrote.

use std::process::Command;

use anyhow::Result;

use crate::apiserver::ApiServer;
use crate::bins;
use crate::certs::Pki;
use crate::component::{self, Component};
use crate::procs::Proc;
use crate::rundir::RunDir;

/// The user the bootstrap RBAC (`system:kube-scheduler`) is bound to.
pub const USER: &str = "system:kube-scheduler";

pub struct Scheduler {
    pub proc: Proc,
    /// Its secure port on 127.0.0.1 (`/healthz`, `/metrics`).
    pub port: u16,
}

impl Scheduler {
    pub async fn start(run: &RunDir, pki: &Pki, api: &ApiServer) -> Result<Scheduler> {
        let c = Component::prepare(run, pki, api, "kube-scheduler", USER)?;
        let mut cmd = Command::new(bins::built("kube-scheduler")?);
        c.common_args(&mut cmd);
        // One scheduler per testbed: a leader election would only delay its start by a lease.
        cmd.arg("--leader-elect=false");
        let (proc, port) = component::spawn_healthy(run, c, cmd).await?;
        Ok(Scheduler { proc, port })
    }
}
