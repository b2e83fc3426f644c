//! Stateful VMs end to end: the real daemon, the testbed's registry (nothing pre-seeded on the
//! host) and the simulator with snapshots that carry bytes. A clone-mode pod whose base is
//! only in the registry is pulled and runs (C8.3); deleting pods pushes `<vm>:latest` by
//! policy (D4); a pod hibernates into `<vm>:hibernate` and wakes under the same VM name with
//! a file written in its guest intact (U3, U5, U6). The journal is replayed with --verify.

use e2e::daemon;
use e2e::daemon::{annotate, lifecycle_is};

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, phase, pod_manifest, until, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use vk_cocoon::cocoon::CocoonCli;
use vk_cocoon::registry::cocoon_pipe::push_from_cocoon;
use vk_cocoon::registry::{PushKnobs, Registry};

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(90);
const PREFIX: &str = "cocoon";

fn cli(tb: &Testbed, exec_host: bool) -> CocoonCli {
    let sim = tb.sim.as_ref().expect("simulator");
    let mut env = sim.env();
    env.push((
        e2e::procs::MARKER.to_string(),
        tb.run_dir().display().to_string(),
    ));
    if exec_host {
        env.push(("COCOON_SIM_EXEC".into(), "host".into()));
    }
    CocoonCli {
        env,
        ..CocoonCli::new(sim.bin.display().to_string())
    }
}

fn registry(tb: &Testbed) -> Result<Registry> {
    let addr = &tb.registry.as_ref().context("registry")?.addr;
    let spool = tb.run_dir().join("test-spool");
    std::fs::create_dir_all(&spool)?;
    Ok(Registry::from_config(&format!("{addr}/{PREFIX}"))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(spool))
}

fn managed(extra: serde_json::Value) -> serde_json::Value {
    let mut a = json!({"cocoonset.cocoonstack.io/managed": "true"});
    a.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    a
}

fn sim_run(c: &CocoonCli, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(&c.bin)
        .envs(c.env.iter().cloned())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_clone_delete_policy_hibernate_and_wake() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    let sim_cli = cli(&tb, false);
    let reg = registry(&tb)?;
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();

    // A clone base that exists only in the registry: made on the side, pushed, removed here.
    sim_run(
        &sim_cli,
        &["image", "pull", "ghcr.io/cocoonstack/ubuntu:24.04"],
    )?;
    sim_run(
        &sim_cli,
        &[
            "vm",
            "run",
            "--name",
            "base-maker",
            "ghcr.io/cocoonstack/ubuntu:24.04",
        ],
    )?;
    sim_run(
        &sim_cli,
        &["snapshot", "save", "--name", "agent-base:v1", "base-maker"],
    )?;
    push_from_cocoon(
        &reg,
        &sim_cli,
        "agent-base:v1",
        "agent-base",
        "v1",
        Some("ghcr.io/cocoonstack/ubuntu:24.04"),
        None,
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("seeding the registry: {e}"))?;
    sim_run(&sim_cli, &["snapshot", "rm", "agent-base:v1"])?;
    sim_run(&sim_cli, &["vm", "rm", "--force", "base-maker"])?;

    let journal = tb.run_dir().join("journal").join("events.journal");
    let opts = DaemonOptions {
        env: vec![
            ("OCI_REGISTRY".into(), format!("{addr}/{PREFIX}")),
            ("COCOON_SIM_EXEC".into(), "host".into()),
        ],
        ..DaemonOptions::default()
    };
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);

    // C8.3: the clone base is pulled from the registry.
    let clone = pod_manifest(
        NS,
        "clone-r",
        NODE,
        managed(json!({"vm.cocoonstack.io/name": "vk-default-clone-r",
            "cocoonset.cocoonstack.io/image": "agent-base:v1"})),
    )?;
    // D4: the default policy pushes at delete, `never` does not.
    let keep = pod_manifest(
        NS,
        "run-keep",
        NODE,
        managed(json!({"vm.cocoonstack.io/name": "vk-default-run-keep",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"})),
    )?;
    let never = pod_manifest(
        NS,
        "run-never",
        NODE,
        managed(json!({"vm.cocoonstack.io/name": "vk-default-run-never",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/snapshot-policy": "never",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"})),
    )?;
    let sleeper = pod_manifest(
        NS,
        "sleeper",
        NODE,
        managed(json!({"vm.cocoonstack.io/name": "vk-default-sleeper",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/snapshot-policy": "never",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"})),
    )?;
    for p in [&clone, &keep, &never, &sleeper] {
        create_pod(&pods, p).await?;
    }
    for name in ["clone-r", "run-keep", "run-never", "sleeper"] {
        wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
    }

    for name in ["run-keep", "run-never"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    until("deleted pods gone", LIMIT, || async {
        let a = pods.get_opt("run-keep").await?;
        let b = pods.get_opt("run-never").await?;
        Ok((a.is_none() && b.is_none()).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let latest = reg
        .inspect("vk-default-run-keep", "latest")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("vk-default-run-keep:latest was not pushed")?;
    ensure!(
        latest.base_image.as_deref() == Some("ghcr.io/cocoonstack/ubuntu:24.04"),
        "base image annotation: {:?}",
        latest.base_image
    );
    ensure!(
        latest.from_node.as_deref() == Some(NODE),
        "from-node: {:?}",
        latest.from_node
    );
    ensure!(
        reg.inspect("vk-default-run-never", "latest")
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .is_none(),
        "policy never pushed a snapshot"
    );

    // U3: a marker in the guest, then hibernate.
    let host = cli(&tb, true);
    let before = pods.get("sleeper").await?;
    let id = annotation(&before, "vm.cocoonstack.io/id").context("id")?;
    sim_run(
        &host,
        &[
            "vm",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo hello-hibernate > marker",
        ],
    )?;
    annotate(
        &pods,
        "sleeper",
        "vm.cocoonstack.io/hibernate",
        Some("true"),
    )
    .await?;
    let hibernated = lifecycle_is(&pods, "sleeper", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(80))?;
    ensure!(phase(&hibernated) == "Pending", "hibernated pod phase");
    ensure!(
        annotation(&hibernated, "vm.cocoonstack.io/id").is_none(),
        "id annotation left on a hibernated pod"
    );
    let ids = tb.sim.as_ref().unwrap().vm_ids();
    ensure!(!ids.contains(&id), "the hibernated VM {id} still exists");
    let tag = reg
        .inspect("vk-default-sleeper", "hibernate")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("no vk-default-sleeper:hibernate")?;
    ensure!(!tag.snapshot_id.is_empty());

    // U5: wake under the same VM name, the marker intact.
    annotate(&pods, "sleeper", "vm.cocoonstack.io/hibernate", None).await?;
    let woken = wait_ready(&pods, "sleeper", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(80))?;
    let new_id = annotation(&woken, "vm.cocoonstack.io/id").context("id after wake")?;
    let inspect: serde_json::Value =
        serde_json::from_str(&sim_run(&sim_cli, &["vm", "inspect", &new_id])?)?;
    ensure!(
        inspect["config"]["name"] == "vk-default-sleeper",
        "woken VM name: {}",
        inspect["config"]["name"]
    );
    let marker = sim_run(&host, &["vm", "exec", &new_id, "--", "cat", "marker"])?;
    ensure!(
        marker.trim() == "hello-hibernate",
        "marker after wake: {marker:?}"
    );
    ensure!(
        annotation(&woken, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("ready"),
        "lifecycle after wake"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}

fn vm_named(tb: &Testbed, c: &CocoonCli, name: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for id in tb.sim.as_ref().context("sim")?.vm_ids() {
        let v: serde_json::Value = serde_json::from_str(&sim_run(c, &["vm", "inspect", &id])?)?;
        if v["config"]["name"] == name {
            found.push(id);
        }
    }
    Ok(found)
}

/// D4 and U4 under failure, and B9 across kill -9: a failed delete-time save keeps the VM and
/// the pod until a retry saves and pushes it; a failed hibernate push rolls back to a running
/// pod that hibernates on retry; a daemon killed in the middle of a hibernate, and again in
/// the middle of the wake, finishes each after its restart with exactly one VM of the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_roll_back_and_killed_daemons_finish() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    let sim_cli = cli(&tb, false);
    let reg = registry(&tb)?;
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();
    let opts = DaemonOptions {
        env: vec![("OCI_REGISTRY".into(), format!("{addr}/{PREFIX}"))],
        ..DaemonOptions::default()
    };
    // One journal across the restarts, as a host keeps it: each process reads back from it
    // which pod holds each VM (T11).
    let journal = tb.run_dir().join("journal").join("events.journal");
    let mut d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let run_pod = |name: &str| {
        pod_manifest(
            NS,
            name,
            NODE,
            managed(
                json!({"vm.cocoonstack.io/name": format!("vk-default-{name}"),
                "cocoonset.cocoonstack.io/mode": "run",
                "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"}),
            ),
        )
    };
    for name in ["held", "rollback", "killed"] {
        create_pod(&pods, &run_pod(name)?).await?;
    }
    for name in ["held", "rollback", "killed"] {
        wait_ready(&pods, name, LIMIT)
            .await
            .with_context(|| d.proc.log_tail(60))?;
    }

    // D4: the save fails once; the pod stays, saying why, and its VM is kept.
    sim_run(
        &sim_cli,
        &[
            "sim",
            "fault",
            "fail",
            "snapshot save",
            "--message",
            "save snapshot: pause vm: timeout",
        ],
    )?;
    pods.delete("held", &DeleteParams::default()).await?;
    until("a held delete says why", LIMIT, || async {
        let Some(p) = pods.get_opt("held").await? else {
            return Ok(None);
        };
        let msg = p
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default();
        Ok(msg.contains("delete held").then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        vm_named(&tb, &sim_cli, "vk-default-held")?.len() == 1,
        "the VM of a held delete is gone"
    );
    until(
        "the held pod goes once its retry saved it",
        LIMIT,
        || async { Ok(pods.get_opt("held").await?.is_none().then_some(())) },
    )
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(reg
        .inspect("vk-default-held", "latest")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .is_some());

    // U4: the push fails (its export does); the pod runs on, then hibernates on retry.
    sim_run(
        &sim_cli,
        &[
            "sim",
            "fault",
            "fail",
            "snapshot export",
            "--message",
            "export: disk read error",
        ],
    )?;
    annotate(
        &pods,
        "rollback",
        "vm.cocoonstack.io/hibernate",
        Some("true"),
    )
    .await?;
    let failed = lifecycle_is(&pods, "rollback", "failed")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        annotation(&failed, "vm.cocoonstack.io/id").is_some(),
        "a rolled-back hibernate lost its id"
    );
    ensure!(vm_named(&tb, &sim_cli, "vk-default-rollback")?.len() == 1);
    lifecycle_is(&pods, "rollback", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(60))?;

    // B9: kill -9 while the hibernate's save is under way; the restart finishes it.
    sim_run(
        &sim_cli,
        &["sim", "fault", "delay", "snapshot save", "3000"],
    )?;
    annotate(&pods, "killed", "vm.cocoonstack.io/hibernate", Some("true")).await?;
    lifecycle_is(&pods, "killed", "hibernating").await?;
    d.proc.signal(libc::SIGKILL);
    d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    lifecycle_is(&pods, "killed", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(80))?;
    ensure!(vm_named(&tb, &sim_cli, "vk-default-killed")?.is_empty());
    ensure!(reg
        .inspect("vk-default-killed", "hibernate")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .is_some());

    // ... and while the wake's clone is under way.
    sim_run(&sim_cli, &["sim", "fault", "delay", "vm clone", "3000"])?;
    annotate(&pods, "killed", "vm.cocoonstack.io/hibernate", None).await?;
    lifecycle_is(&pods, "killed", "creating").await?;
    // The kill lands once the simulator holds the clone's `creating` record, inside its delay.
    until("the wake's clone under way", LIMIT, || async {
        for id in vm_named(&tb, &sim_cli, "vk-default-killed")? {
            let v: serde_json::Value =
                serde_json::from_str(&sim_run(&sim_cli, &["vm", "inspect", &id])?)?;
            if v["state"] == "creating" {
                return Ok(Some(()));
            }
        }
        Ok(None)
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    d.proc.signal(libc::SIGKILL);
    d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    wait_ready(&pods, "killed", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(80))?;
    let vms = vm_named(&tb, &sim_cli, "vk-default-killed")?;
    ensure!(
        vms.len() == 1,
        "VMs named vk-default-killed after the wake: {vms:?}"
    );

    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
