//! Prometheus (Debian's package) scraping loopback targets, and a PromQL query helper.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::bins;
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::{http, wait_ready};
use crate::rundir::{write_file, RunDir};
use crate::step;

/// One scrape job: a name (the `job` label) and `host:port` targets on loopback.
#[derive(Clone, Debug)]
pub struct ScrapeJob {
    pub job: String,
    pub targets: Vec<String>,
}

impl ScrapeJob {
    pub fn new(job: &str, target: &str) -> ScrapeJob {
        ScrapeJob {
            job: job.to_string(),
            targets: vec![target.to_string()],
        }
    }
}

pub struct Prometheus {
    pub proc: Proc,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    config: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs` (and itself, as job `prometheus`) every second.
    pub async fn start(run: &RunDir, jobs: &[ScrapeJob]) -> Result<Prometheus> {
        let bin = bins::prometheus()?;
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let config = run.path().join("prometheus.yml");
        write_file(&config, &config_yaml(port, jobs))?;
        step!("starting prometheus on {url}");
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                run.subdir("prometheus-data")?.display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // Lets `set_jobs` reload the scrape config without a restart (a test adds the
            // daemon's metrics endpoint once the daemon runs).
            .arg("--web.enable-lifecycle")
            .arg("--log.level=warn");
        let mut proc = run.spawn("prometheus", cmd)?;
        let ready = format!("{url}/-/ready");
        let c = http();
        wait_ready(&mut proc, "prometheus", Duration::from_secs(60), || async {
            c.get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await?;
        step!("prometheus ready");
        Ok(Prometheus { proc, url, config })
    }

    /// Replaces the scrape jobs and reloads the config.
    pub async fn set_jobs(&self, jobs: &[ScrapeJob]) -> Result<()> {
        let port = self.url.rsplit(':').next().unwrap_or_default().parse()?;
        write_file(&self.config, &config_yaml(port, jobs))?;
        http()
            .post(format!("{}/-/reload", self.url))
            .send()
            .await?
            .error_for_status()
            .context("reloading the prometheus config")?;
        Ok(())
    }

    /// Runs an instant PromQL query and returns `data.result` (a vector of
    /// `{"metric": {...}, "value": [ts, "v"]}`).
    pub async fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let r = http()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await
            .with_context(|| format!("querying {promql}"))?;
        let v: serde_json::Value = r.json().await?;
        if v["status"] != "success" {
            bail!("query {promql} failed: {v}");
        }
        Ok(serde_json::from_value(v["data"]["result"].clone()).unwrap_or_default())
    }

    /// Runs `promql` until some sample satisfies `pred` (values arrive only after a scrape),
    /// and returns that sample's value.
    pub async fn query_until(
        &self,
        promql: &str,
        limit: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        step!("waiting for `{promql}` in prometheus");
        let deadline = Instant::now() + limit;
        let mut last = Vec::new();
        loop {
            last = match self.query(promql).await {
                Ok(r) => r,
                Err(_) => last,
            };
            if let Some(v) = last.iter().filter_map(sample_value).find(|v| pred(*v)) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("`{promql}` never matched within {limit:?}; last result: {last:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The number in an instant-vector sample.
pub fn sample_value(sample: &serde_json::Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

fn config_yaml(own_port: u16, jobs: &[ScrapeJob]) -> String {
    let mut y = String::from(
        "global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
",
    );
    let own = ScrapeJob::new("prometheus", &format!("127.0.0.1:{own_port}"));
    for j in std::iter::once(&own).chain(jobs) {
        let targets: Vec<String> = j.targets.iter().map(|t| format!("'{t}'")).collect();
        y.push_str(&format!(
            "  - job_name: '{}'\n    static_configs:\n      - targets: [{}]\n",
            j.job,
            targets.join(", ")
        ));
    }
    y
}

/// A tiny HTTP server answering every request with a fixed Prometheus text exposition, to
/// prove the scrape path without the daemon.
pub struct MetricsStub {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    body: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsStub {
    pub async fn serve(body: &str) -> Result<MetricsStub> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let body = Arc::new(Mutex::new(body.to_string()));
        let shared = body.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let body = shared.lock().unwrap_or_else(|e| e.into_inner()).clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    // One read suffices for a scrape's small GET; the body never depends on it.
                    let _ = sock.read(&mut buf).await;
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Ok(MetricsStub { addr, body, task })
    }

    pub fn set_body(&self, body: &str) {
        *self.body.lock().unwrap_or_else(|e| e.into_inner()) = body.to_string();
    }
}

impl Drop for MetricsStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_scrapes_itself_and_every_job_on_loopback() {
        let y = config_yaml(
            9090,
            &[ScrapeJob {
                job: "vk-cocoon".into(),
                targets: vec!["127.0.0.1:9091".into(), "127.0.0.1:9092".into()],
            }],
        );
        assert!(y.contains(
            "job_name: 'prometheus'\n    static_configs:\n      - targets: ['127.0.0.1:9090']"
        ));
        assert!(y.contains("- targets: ['127.0.0.1:9091', '127.0.0.1:9092']"));
        assert!(y.contains("scrape_interval: 1s"));
    }

    #[test]
    fn sample_value_reads_the_string_number() {
        let s = serde_json::json!({ "metric": {}, "value": [1700000000.1, "42"] });
        assert_eq!(sample_value(&s), Some(42.0));
        assert_eq!(sample_value(&serde_json::json!({})), None);
    }
}
