//! The packaged RBAC is all the daemon needs: `packaging/daemonset.yaml` is applied to the
//! testbed, and vk-cocoon runs with its ServiceAccount's token instead of the testbed's admin
//! certificate. It registers the node, renews the Lease, takes a pod from create to Ready
//! (status and annotations in one `pods/status` patch) and deletes it, with nothing forbidden.

#[path = "e2e/daemon.rs"]
mod daemon;

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use daemon::{annotation, create_pod, pod_manifest, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::config::Kubeconfig;
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

/// The testbed's kubeconfig with its client certificate swapped for a bearer token.
fn token_kubeconfig(admin: &Path, token: &str, out: &Path) -> Result<()> {
    let mut kc = Kubeconfig::read_from(admin)?;
    for user in &mut kc.auth_infos {
        let auth = user.auth_info.as_mut().context("user without auth")?;
        auth.client_certificate = None;
        auth.client_certificate_data = None;
        auth.client_key = None;
        auth.client_key_data = None;
        auth.token = Some(token.to_string().into());
    }
    // JSON is YAML: kubeconfig readers take it as it is.
    std::fs::write(out, serde_json::to_vec_pretty(&kc)?)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packaged_rbac_is_enough() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let admin = tb.client()?;
    e2e::kube::ensure_namespace(&admin, "cocoon-system").await?;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/daemonset.yaml");
    tb.kubectl(&["apply", "-f", &manifest.display().to_string()])
        .await?;
    let token = tb
        .kubectl(&[
            "create",
            "token",
            "vk-cocoon",
            "-n",
            "cocoon-system",
            "--duration=1h",
        ])
        .await?;
    let kubeconfig = tb.run_dir().join("vk-cocoon-sa.kubeconfig");
    token_kubeconfig(tb.kubeconfig()?, token.trim(), &kubeconfig)?;

    let journal = tb.run_dir().join("journal-rbac").join("events.jsonl");
    let opts = DaemonOptions {
        env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        ..DaemonOptions::default()
    };
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let nodes: Api<Node> = Api::all(admin.clone());
    daemon::until("node registered", LIMIT, || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod = pod_manifest(
        NS,
        "rbac-a",
        NODE,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-rbac-a",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"
        }),
    )?;
    create_pod(&pods, &pod).await?;
    let ready = wait_ready(&pods, "rbac-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        annotation(&ready, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("ready"),
        "lifecycle annotation written through pods/status"
    );
    ensure!(annotation(&ready, "vm.cocoonstack.io/id").is_some());

    pods.delete("rbac-a", &DeleteParams::default()).await?;
    daemon::until("pod rbac-a gone", LIMIT, || async {
        Ok(pods.get_opt("rbac-a").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let log = std::fs::read_to_string(d.proc.log_path())?;
    ensure!(
        !log.to_lowercase().contains("forbidden"),
        "the daemon was refused something: {}",
        log.lines()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
