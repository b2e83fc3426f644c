//! Tenants kept apart on one node, end to end with the simulator. (1) T10: team-b's unmanaged
//! pod that names team-a's running VM by id and address is refused with a clear reason, exec
//! through it reaches no VM, and team-a's pod stays Ready on its VM; an unmanaged pod on a VM
//! made by hand on the host, with that VM's own id and address, goes Ready and exec reaches
//! that VM. (2) A guest that prints without end into a `vm exec` the daemon runs (the
//! post-clone fix-up) costs the daemon a bounded amount of memory and no descriptors: the call
//! is cut at its cap, counted, and retried; a Ready pod stays Ready throughout.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, create_pod, is_ready, pod_ip, pod_manifest, until, wait_ready, DaemonOptions,
};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::Api;
use serde_json::json;

const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";

/// An unmanaged pod: no `managed`, its VM named by id and address.
fn unmanaged(ns: &str, name: &str, vm_name: &str, id: &str, ip: &str) -> Result<Pod> {
    pod_manifest(
        ns,
        name,
        NODE,
        json!({"vm.cocoonstack.io/name": vm_name, "vm.cocoonstack.io/id": id,
            "vm.cocoonstack.io/ip": ip, "cocoonset.cocoonstack.io/mode": "static"}),
    )
}

/// The daemon's Warning for `pod` (not the scheduler's).
async fn warning_of(events: &Api<Event>, pod: &str) -> Result<String> {
    daemon::warning(events, pod, None, LIMIT).await
}

/// What the cluster shows of its pods and events, for a failure's message.
async fn cluster(tb: &Testbed) -> String {
    let mut out = String::new();
    for args in [
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A"][..],
    ] {
        out += &tb.kubectl(args).await.unwrap_or_else(|e| e.to_string());
    }
    out
}

/// Every `vm exec` the simulator ran in VM `id`, as its NDJSON log holds them.
fn exec_log(sim: &CocoonSim, id: &str) -> String {
    std::fs::read_to_string(sim.root.join("vms").join(id).join("exec.log")).unwrap_or_default()
}

/// The simulator's address for VM `id`.
fn sim_ip(sim: &CocoonSim, id: &str) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(&sim.run(&["sim", "info", id])?)?;
    let ip = v["ip"].as_str().unwrap_or_default().to_string();
    ensure!(!ip.is_empty(), "VM {id} has no address yet: {v}");
    Ok(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmanaged_pod_gets_only_a_vm_the_node_proves_is_its_own() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let (d, _) = daemon::start_default(&tb)?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");
    let sim = tb.sim.as_ref().context("sim")?;

    create_pod(&a, &daemon::run_pod("team-a", "victim", NODE)?).await?;
    let victim = wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let victim_id = annotation(&victim, "vm.cocoonstack.io/id").context("victim id")?;
    let victim_ip = pod_ip(&victim).context("victim ip")?;

    // team-b claims team-a's VM by its id and address.
    create_pod(
        &b,
        &unmanaged("team-b", "thief", "loot", &victim_id, &victim_ip)?,
    )
    .await?;
    let events: Api<Event> = Api::namespaced(tb.client()?, "team-b");
    let why = match warning_of(&events, "thief").await {
        Ok(why) => why,
        Err(e) => {
            let seen = cluster(&tb).await;
            return Err(e.context(format!("{seen}\n{}", d.proc.log_tail(40))));
        }
    };
    ensure!(
        why.contains("unmanaged pod refused")
            && why.contains("belongs to a pod of another namespace"),
        "thief's Warning: {why}"
    );
    let thief = until("the thief's lifecycle message", LIMIT, || async {
        let p = b.get("thief").await?;
        Ok(annotation(&p, LIFECYCLE_MESSAGE)
            .filter(|m| m.contains("belongs to a pod of another namespace"))
            .map(|_| p))
    })
    .await?;
    ensure!(
        annotation(&thief, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("failed"),
        "the thief's lifecycle is not failed"
    );
    ensure!(!is_ready(&thief), "the thief is Ready");
    let before = exec_log(sim, &victim_id);
    let exec = tb
        .kubectl(&[
            "exec",
            "-n",
            "team-b",
            "thief",
            "--",
            "echo",
            "through-the-thief",
        ])
        .await;
    ensure!(exec.is_err(), "exec through the thief ran: {exec:?}");
    ensure!(
        !exec_log(sim, &victim_id).contains("through-the-thief")
            && exec_log(sim, &victim_id) == before,
        "exec through the thief reached the victim's VM"
    );

    // A VM made by hand on the host, claimed with its own id and address.
    sim.run(&["image", "pull", IMAGE])?;
    let made: serde_json::Value = serde_json::from_str(
        &sim.run(&["vm", "run", "--output", "json", "--name", "toolbox", IMAGE])?,
    )?;
    let tool_id = made["id"].as_str().context("toolbox id")?.to_string();
    let tool_ip = until("the toolbox's address", LIMIT, || async {
        Ok(sim_ip(sim, &tool_id).ok())
    })
    .await?;
    create_pod(
        &b,
        &unmanaged("team-b", "tool", "toolbox", &tool_id, &tool_ip)?,
    )
    .await?;
    let tool = wait_ready(&b, "tool", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        pod_ip(&tool).as_deref() == Some(tool_ip.as_str()),
        "tool's IP"
    );
    let said = until("exec through the toolbox pod", LIMIT, || async {
        Ok(tb
            .kubectl(&[
                "exec",
                "-n",
                "team-b",
                "tool",
                "--",
                "echo",
                "into-the-toolbox",
            ])
            .await
            .ok())
    })
    .await?;
    ensure!(said.contains("into-the-toolbox"), "exec said {said:?}");
    ensure!(
        exec_log(sim, &tool_id).contains("into-the-toolbox"),
        "exec through the toolbox pod did not reach the toolbox VM"
    );

    // The victim is untouched: Ready on the same VM, which runs.
    let still = a.get("victim").await?;
    ensure!(is_ready(&still), "the victim is no longer Ready");
    ensure!(
        annotation(&still, "vm.cocoonstack.io/id").as_deref() == Some(victim_id.as_str()),
        "the victim lost its VM"
    );
    ensure!(sim.vm_ids().contains(&victim_id), "the victim's VM is gone");
    ensure!(
        !exec_log(sim, &victim_id).contains("through-the-thief"),
        "something reached the victim's VM"
    );
    drop(d);
    Ok(())
}

/// The daemon's resident set (bytes) and open descriptors.
fn footprint(pid: u32) -> Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmRSS")?
        .parse()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((kib * 1024, fds))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_never_stops_printing_costs_the_daemon_a_bounded_amount() -> Result<()> {
    const FC_SNAPSHOT: &str = "guest/fc:v1";
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        FC_SNAPSHOT,
        "--hypervisor",
        "firecracker",
        "--image",
        "acme/base:1",
    ])?;
    // The first two fix-up attempts fail, which leaves time to make the third one flood.
    sim.run(&[
        "sim",
        "fault",
        "fixup",
        "*",
        "--times",
        "2",
        "--message",
        "guest agent not up yet (e2e)",
    ])?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let opts = DaemonOptions {
        env: vec![("COCOON_SIM_GUEST_FIXUP".into(), "1".into())],
        ..DaemonOptions::default()
    };
    let metrics_port = e2e::ports::free_port()?;
    let d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, "default");

    create_pod(&pods, &daemon::run_pod("default", "steady", NODE)?).await?;
    wait_ready(&pods, "steady", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let pid = d.proc.pid();
    let (rss0, fds0) = footprint(pid)?;
    // Watched from now on: a moment of NotReady would be seen.
    let steady_dropped = daemon::watch_for(pods.clone(), "steady", |p| !is_ready(p));

    let chatty = pod_manifest(
        "default",
        "chatty",
        NODE,
        json!({"cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-chatty",
            "cocoonset.cocoonstack.io/image": FC_SNAPSHOT,
            "vm.cocoonstack.io/backend": "firecracker"}),
    )?;
    create_pod(&pods, &chatty).await?;
    let id = until("chatty has a VM", LIMIT, || async {
        Ok(annotation(
            &pods.get("chatty").await?,
            "vm.cocoonstack.io/id",
        ))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    sim.run(&[
        "sim",
        "fault",
        "exec",
        &id,
        "--flood",
        "--stdout",
        "the guest will not stop talking",
    ])?;

    // Sampled until the flooded call was cut and the pod came up after it.
    let peak = std::sync::Mutex::new((rss0, fds0));
    let sample = || -> Result<()> {
        let (rss, fds) = footprint(pid)?;
        let mut p = peak.lock().unwrap();
        *p = (p.0.max(rss), p.1.max(fds));
        Ok(())
    };
    let cut = until(
        "the flood cut at its cap and chatty Ready",
        LIMIT * 2,
        || async {
            sample()?;
            let cut = daemon::metric_series(metrics_port, "cocoon_vk_cap_refusals_total")
                .await?
                .into_iter()
                .any(|(labels, v)| labels.contains("guest_output") && v >= 1.0);
            let ready = is_ready(&pods.get("chatty").await?);
            Ok((cut && ready).then_some(()))
        },
    )
    .await;
    if let Err(e) = cut {
        let seen = cluster(&tb).await;
        return Err(e.context(format!("{seen}\n{}", d.proc.log_tail(60))));
    }
    sample()?;
    let fds = footprint(pid)?.1;
    let peak = *peak.lock().unwrap();
    e2e::step!(
        "daemon rss {} -> peak {} MiB, fds {fds0} -> peak {}",
        rss0 >> 20,
        peak.0 >> 20,
        peak.1
    );
    // The call keeps at most 16 MiB of stdout; anything near a flood's worth would be far more.
    ensure!(
        peak.0 < rss0 + (96 << 20),
        "the daemon grew from {} to {} MiB",
        rss0 >> 20,
        peak.0 >> 20
    );
    ensure!(
        fds <= fds0 + 16,
        "the daemon holds {fds} descriptors, {fds0} before the flood"
    );
    let log = std::fs::read_to_string(sim.root.join("vms").join(&id).join("exec.log"))?;
    ensure!(log.lines().count() >= 3, "fix-up attempts: {log}");
    ensure!(
        is_ready(&pods.get("steady").await?),
        "steady is not Ready after the flood"
    );
    ensure!(
        steady_dropped
            .wait("steady NotReady", Duration::from_millis(200))
            .await
            .is_err(),
        "steady went NotReady during the flood"
    );
    drop(d);
    Ok(())
}
