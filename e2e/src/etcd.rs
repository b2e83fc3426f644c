//! etcd on loopback, the apiserver's only storage.

use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::bins;
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::{http, wait_ready};
use crate::rundir::RunDir;
use crate::step;

pub struct Etcd {
    pub proc: Proc,
    /// `http://127.0.0.1:<port>`, for `--etcd-servers`.
    pub url: String,
}

impl Etcd {
    pub async fn start(run: &RunDir) -> Result<Etcd> {
        let bin = bins::built("etcd")?;
        let data = run.subdir("etcd")?;
        let client = format!("http://127.0.0.1:{}", free_port()?);
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        step!("starting etcd on {client}");
        let mut cmd = Command::new(bin);
        cmd.arg("--name=testbed")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=testbed={peer}"))
            // Throwaway data: fsync only slows every test write on a shared CI disk.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        let mut proc = run.spawn("etcd", cmd)?;
        let health = format!("{client}/health");
        let c = http();
        wait_ready(&mut proc, "etcd", Duration::from_secs(60), || async {
            match c.get(&health).send().await {
                Ok(r) => r.text().await.is_ok_and(|t| t.contains("\"true\"")),
                Err(_) => false,
            }
        })
        .await?;
        step!("etcd ready");
        Ok(Etcd { proc, url: client })
    }
}
