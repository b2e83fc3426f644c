//! What the tenant suites (`tests/e2e_tenant_*.rs`) do to the node alike: run cocoon on the
//! host as an operator would, read the local snapshots and a tag's owner record, and delete a
//! pod and wait for it to go.

// Each suite uses the helpers it needs.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{self, until, Daemon, DaemonOptions};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use vk_cocoon::registry::Registry;

/// `cocoon <args>` on the testbed's host, guests' commands run on the host (`vm exec`).
pub fn sim_run(sim: &CocoonSim, args: &[&str]) -> Result<String> {
    let out = sim
        .command()
        .env("COCOON_SIM_EXEC", "host")
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "cocoon {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node's local snapshots as (name, description), from `snapshot list -o json`.
pub fn snapshots(sim: &CocoonSim) -> Result<Vec<(String, String)>> {
    let out = sim.run(&["snapshot", "list", "-o", "json"])?;
    // An empty store answers "No snapshots found." rather than JSON.
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    let field = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    (field("name"), field("description"))
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The digest and owner annotation of `name:tag`, which must exist.
pub async fn tag(reg: &Registry, name: &str, tag: &str) -> Result<(String, Option<String>)> {
    let r = reg
        .inspect(name, tag)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("{name}:{tag} is absent"))?;
    let owner = r
        .manifest
        .annotations
        .get(vk_cocoon::registry::media::ANN_OWNER)
        .cloned();
    Ok((r.digest, owner))
}

/// Deletes pod `name` and waits up to `limit` for it to be gone, with the daemon's log on
/// failure when `d` is given.
pub async fn delete_and_wait(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    d: Option<&Daemon>,
) -> Result<()> {
    pods.delete(name, &DeleteParams::default()).await?;
    until(&format!("{name} deleted"), limit, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.map(|d| d.proc.log_tail(60)).unwrap_or_default())
}

/// One node with a registry (repositories under `prefix`) and the namespaces `team-a` and
/// `team-b`; guests' commands run on the host.
pub struct Node {
    pub tb: Testbed,
    pub d: Daemon,
    pub journal: std::path::PathBuf,
    pub metrics_port: u16,
    pub reg: Registry,
    pub a: Api<Pod>,
    pub b: Api<Pod>,
}

pub async fn one_node(prefix: &str) -> Result<Node> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();
    let opts = DaemonOptions {
        env: vec![
            ("OCI_REGISTRY".into(), format!("{addr}/{prefix}")),
            ("COCOON_SIM_EXEC".into(), "host".into()),
        ],
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");
    let reg =
        Registry::from_config(&format!("{addr}/{prefix}")).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Node {
        tb,
        d,
        journal,
        metrics_port,
        reg,
        a,
        b,
    })
}
