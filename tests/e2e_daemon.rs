//! The daemon end to end (issue #5): the real binary against a real kube-apiserver + etcd and
//! the cocoon simulator with real guests. Every daemon run's journal is replayed with --verify.

#[path = "e2e/daemon.rs"]
mod daemon;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use daemon::{
    annotation, create_pod, is_ready, phase, pod_ip, pod_manifest, until, wait_ready, DaemonOptions,
};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

fn vm_ids(tb: &Testbed) -> Vec<String> {
    let mut ids = tb.sim.as_ref().map(|s| s.vm_ids()).unwrap_or_default();
    ids.sort();
    ids
}

async fn wait_node(tb: &Testbed) -> Result<()> {
    let nodes: Api<Node> = Api::all(tb.client()?);
    until("node registered", LIMIT, || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_probe_delete_restart_vanish() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "acme/agent:v1",
        "--image",
        "acme/base:1",
    ])?;
    let journal1 = tb.run_dir().join("journal-1").join("events.jsonl");
    let opts = DaemonOptions::default();
    let mut d = daemon::start(
        &tb,
        &opts,
        &journal1,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    wait_node(&tb).await.with_context(|| d.proc.log_tail(40))?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let managed = |extra: serde_json::Value| {
        let mut a = json!({"cocoonset.cocoonstack.io/managed": "true"});
        a.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        a
    };
    let run_pod = pod_manifest(
        NS,
        "run-a",
        NODE,
        managed(json!({
        "vm.cocoonstack.io/name": "vk-default-run-a", "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"})),
    )?;
    let clone_pod = pod_manifest(
        NS,
        "clone-a",
        NODE,
        managed(json!({
        "vm.cocoonstack.io/name": "vk-default-clone-a", "cocoonset.cocoonstack.io/image": "acme/agent:v1"})),
    )?;
    let probe_pod = pod_manifest(
        NS,
        "probe-a",
        NODE,
        managed(json!({
        "vm.cocoonstack.io/name": "vk-default-probe-a", "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04", "vm.cocoonstack.io/probe-port": "9099"})),
    )?;
    let bad_pod = pod_manifest(
        NS,
        "bad-a",
        NODE,
        managed(json!({
        "vm.cocoonstack.io/name": "vk-default-bad-a", "cocoonset.cocoonstack.io/mode": "run",
        "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04", "vm.cocoonstack.io/probe-port": "http"})),
    )?;
    for p in [&run_pod, &clone_pod, &probe_pod, &bad_pod] {
        create_pod(&pods, p).await?;
    }

    // 1: run and clone reach Running + Ready with the IP of their lease.
    for name in ["run-a", "clone-a"] {
        let p = wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
        ensure!(phase(&p) == "Running", "{name} phase {}", phase(&p));
        let ip = pod_ip(&p).context("podIP")?;
        ensure!(
            annotation(&p, "vm.cocoonstack.io/ip").as_deref() == Some(ip.as_str()),
            "ip annotation differs from podIP"
        );
        ensure!(annotation(&p, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("ready"));
        let leases = std::fs::read_to_string(&sim.leases)?;
        ensure!(
            leases.contains(&format!("\"{ip}\"")),
            "podIP {ip} of {name} is not in the lease file"
        );
    }

    // 8: the malformed pod is failed with a message naming the key; the others run.
    let bad = until("bad-a rejected", LIMIT, || async {
        let p = pods.get("bad-a").await?;
        let s = p.status.clone().unwrap_or_default();
        Ok((s.reason.as_deref() == Some("ProviderFailed")).then_some(s))
    })
    .await?;
    ensure!(
        bad.message
            .unwrap_or_default()
            .contains("vm.cocoonstack.io/probe-port"),
        "message must name the key"
    );

    // 2: the probe-port pod stays not Ready until its guest opens the port.
    let probe = until("probe-a has a VM", LIMIT, || async {
        let p = pods.get("probe-a").await?;
        Ok(annotation(&p, "vm.cocoonstack.io/id")
            .filter(|_| pod_ip(&p).is_some())
            .map(|id| (id, p)))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        !is_ready(&pods.get("probe-a").await?),
        "probe-a must not be Ready before port 9099 opens"
    );
    sim.run(&["sim", "fault", "open-port", &probe.0, "9099"])?;
    wait_ready(&pods, "probe-a", LIMIT).await?;

    // 4: kill -9 and restart: the same VMs are adopted, none created, pods stay Ready.
    let before = vm_ids(&tb);
    d.proc.signal(libc::SIGKILL);
    let journal2 = tb.run_dir().join("journal-2").join("events.jsonl");
    d = daemon::start(
        &tb,
        &opts,
        &journal2,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(5) {
        for name in ["run-a", "clone-a", "probe-a"] {
            ensure!(
                is_ready(&pods.get(name).await?),
                "{name} lost Ready across the restart"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        vm_ids(&tb) == before,
        "restart changed the VM set: {before:?} -> {:?}",
        vm_ids(&tb)
    );

    // 3: delete removes the VM and the pod object.
    let run_id =
        annotation(&pods.get("run-a").await?, "vm.cocoonstack.io/id").context("run-a id")?;
    pods.delete("run-a", &DeleteParams::default()).await?;
    until("run-a gone", LIMIT, || async {
        Ok(pods.get_opt("run-a").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        !vm_ids(&tb).contains(&run_id),
        "run-a's VM {run_id} survived its pod"
    );

    // 6: a VM that vanishes turns its pod Failed / VMGone (latency is measured, not asserted).
    let clone_id =
        annotation(&pods.get("clone-a").await?, "vm.cocoonstack.io/id").context("clone-a id")?;
    let t0 = Instant::now();
    sim.run(&["sim", "fault", "vanish", &clone_id])?;
    until("clone-a Failed/VMGone or removed", LIMIT, || async {
        let Some(p) = pods.get_opt("clone-a").await? else {
            return Ok(Some(()));
        };
        let gone = phase(&p) == "Failed"
            && p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .and_then(|t| t.reason.as_deref())
                            == Some("VMGone")
                    })
                });
        Ok(gone.then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    eprintln!(
        "measure: VM vanished -> pod Failed/VMGone in {:?}",
        t0.elapsed()
    );

    d.proc.stop();
    daemon::replay_verify(&journal1)?;
    daemon::replay_verify(&journal2)?;
    Ok(())
}
