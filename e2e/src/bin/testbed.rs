//! `testbed up|down|status`: the e2e testbed for humans (`make testbed-up` / `testbed-down`).
//!
//! `up` starts every component in its own session, records it in a run directory under
//! /tmp/vk-cocoon-testbed marked as detached, prints the exports and returns; `down` stops
//! what every detached run recorded and removes it.

use std::path::Path;

use anyhow::{bail, Result};
use e2e::procs::processes_of;
use e2e::prometheus::ScrapeJob;
use e2e::rundir::{base_dir, detached_runs, runs, teardown_dir};
use e2e::{Testbed, TestbedOptions};

const ENV_FILE: &str = "testbed.env";

#[tokio::main]
async fn main() -> Result<()> {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    match cmd.as_str() {
        "up" => up().await,
        "down" => down(),
        "status" => status(),
        _ => bail!("usage: testbed up|down|status"),
    }
}

async fn up() -> Result<()> {
    if let Some(run) = detached_runs(&base_dir()).first() {
        eprintln!(
            "a testbed is already up ({}); `make testbed-down` stops it",
            run.display()
        );
        print_env(run);
        return Ok(());
    }
    // The daemon's default metrics port: a daemon started by hand is scraped without any edit.
    // metrics-server too, so `kubectl top` works against a daemon started with
    // VK_CLIENT_CA_FILE=$TESTBED_CA.
    let opts = TestbedOptions::all()
        .with_prometheus(vec![ScrapeJob::new("vk-cocoon", "127.0.0.1:9091")])
        .with_metrics_server();
    let tb = Testbed::start(opts).await?;
    let mut lines: String = tb
        .summary()
        .into_iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    // The image's /usr/bin/kubectl is v1.32; the shell that evals this must find v1.37 first.
    lines.push_str(&format!(
        "export PATH={}:$PATH\n",
        e2e::bins::cache_bin_dir().display()
    ));
    std::fs::write(tb.run_dir().join(ENV_FILE), &lines)?;
    let run = tb.detach()?;
    print_env(&run);
    eprintln!(
        "# logs: {}/logs; stop with `make testbed-down`",
        run.display()
    );
    Ok(())
}

fn print_env(run: &Path) {
    print!(
        "{}",
        std::fs::read_to_string(run.join(ENV_FILE)).unwrap_or_default()
    );
}

fn down() -> Result<()> {
    let runs = detached_runs(&base_dir());
    if runs.is_empty() {
        eprintln!("no testbed is up");
    }
    for run in runs {
        teardown_dir(&run);
        eprintln!("stopped and removed {}", run.display());
    }
    Ok(())
}

fn status() -> Result<()> {
    let all = runs(&base_dir());
    if all.is_empty() {
        println!("no testbed runs under {}", base_dir().display());
    }
    let detached = detached_runs(&base_dir());
    for run in all {
        let kind = if detached.contains(&run) {
            "testbed up"
        } else {
            "test run"
        };
        println!("{} ({kind})", run.display());
        for (pid, cmd) in processes_of(&run) {
            let short: String = cmd.chars().take(120).collect();
            println!("  {pid:>7} {short}");
        }
    }
    Ok(())
}
