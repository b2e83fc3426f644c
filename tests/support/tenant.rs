//! What the tenant suites (`tests/e2e_tenant_*.rs`) do to the node alike: run cocoon on the
//! host as an operator would, read the local snapshots and a tag's owner record, and delete a
//! pod and wait for it to go.

// Each suite uses the helpers it needs.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{until, Daemon};
use e2e::sim::CocoonSim;
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
