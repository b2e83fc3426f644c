//! A distribution v3 registry on loopback, with deletes enabled.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::bins;
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::{http, wait_ready};
use crate::rundir::{write_file, RunDir};
use crate::step;

pub struct Registry {
    pub proc: Proc,
    /// `127.0.0.1:<port>`, the registry part of an image reference.
    pub addr: String,
}

impl Registry {
    pub async fn start(run: &RunDir) -> Result<Registry> {
        let bin = bins::built("registry")?;
        let storage = run.subdir("registry-storage")?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let config = run.path().join("registry.yml");
        write_file(
            &config,
            &format!(
                "version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {}
  # Hibernation snapshots are deleted by tag; without this the registry answers 405.
  delete:
    enabled: true
http:
  addr: {addr}
",
                storage.display()
            ),
        )?;
        step!("starting registry on {addr}");
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg(&config)
            // distribution v3 exports OpenTelemetry traces by default; the testbed reaches
            // nothing but loopback.
            .env("OTEL_TRACES_EXPORTER", "none")
            .env("OTEL_SDK_DISABLED", "true");
        let mut proc = run.spawn("registry", cmd)?;
        let base = format!("http://{addr}/v2/");
        let c = http();
        wait_ready(&mut proc, "registry", Duration::from_secs(60), || async {
            c.get(&base)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await?;
        step!("registry ready");
        Ok(Registry { proc, addr })
    }

    /// `127.0.0.1:<port>/<repo>:<tag>`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.addr)
    }

    /// An oci-client that talks plain HTTP, as a loopback registry does.
    pub fn oci_client(&self) -> oci_client::Client {
        crate::ready::crypto();
        oci_client::Client::new(oci_client::client::ClientConfig {
            protocol: oci_client::client::ClientProtocol::Http,
            ..Default::default()
        })
    }

    /// DELETE /v2/<repo>/manifests/<tag>; returns the HTTP status (202 when deleted).
    pub async fn delete_tag(&self, repo: &str, tag: &str) -> Result<u16> {
        let url = format!("http://{}/v2/{repo}/manifests/{tag}", self.addr);
        let r = http()
            .delete(&url)
            .send()
            .await
            .with_context(|| format!("DELETE {url}"))?;
        Ok(r.status().as_u16())
    }

    /// Tags of a repository (empty when it has none or does not exist).
    pub async fn tags(&self, repo: &str) -> Result<Vec<String>> {
        let url = format!("http://{}/v2/{repo}/tags/list", self.addr);
        let r = http().get(&url).send().await?;
        if r.status().as_u16() == 404 {
            return Ok(Vec::new());
        }
        let v: serde_json::Value = r.error_for_status()?.json().await?;
        Ok(serde_json::from_value(v["tags"].clone()).unwrap_or_default())
    }
}
