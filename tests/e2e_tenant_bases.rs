//! Public bases and snapshots without an owner record, end to end (T15): namespace `team-b`
//! (the attacker) and `team-a`, two nodes sharing one registry, with the simulator.
//!
//! - The takeover: `agent-base:v1` is a base the platform published with cocoon's own tools
//!   (no owner record) and the node lists as public (`VK_PUBLIC_SNAPSHOTS`). team-b asks for a
//!   VM named `agent-base`, whose delete-time save and push would replace the base every
//!   tenant clones, and is refused before any cocoon call; the tag is untouched, and pods of
//!   both namespaces on both nodes still clone it.
//! - The upgrade path: `legacy:latest` and the local `legacy-local` were made before records
//!   existed and nobody listed them, so they are nobody's: team-a's clone is refused, naming
//!   what lifts it. The operator records team-a as the owner with `vk-cocoon snapshots own`
//!   (registry and `--local`); team-a's pods then clone both, team-b's are refused, and a
//!   second `own` leaves the record as it is.
//! - The re-created namespace (T16): team-a's pod is deleted (its state saved and pushed,
//!   recorded with team-a's UID), then team-a itself is deleted and made again under the same
//!   name. A pod of the new team-a is refused the earlier one's snapshot, local and pushed.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{self, annotation, create_pod, pod_manifest, until, wait_ready, DaemonOptions};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::json;
use vk_cocoon::cocoon::CocoonCli;
use vk_cocoon::registry::cocoon_pipe::push_from_cocoon;
use vk_cocoon::registry::{PushKnobs, Registry};

#[path = "support/tenant.rs"]
mod tenant;
use tenant::{delete_and_wait, tag};

const LIMIT: Duration = Duration::from_secs(45);
const PREFIX: &str = "cocoon";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";

/// A managed pod of `ns` on `node`; `vm` its VM name, cloning `clone` when given.
fn pod(ns: &str, name: &str, node: &str, vm: &str, clone: Option<&str>) -> Result<Pod> {
    let (mode, image) = match clone {
        Some(snapshot) => ("clone", snapshot),
        None => ("run", IMAGE),
    };
    pod_manifest(
        ns,
        name,
        node,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": vm,
            "cocoonset.cocoonstack.io/mode": mode,
            "cocoonset.cocoonstack.io/image": image,
        }),
    )
}

/// Saves a VM made on `sim` with cocoon's own tools as the record-less snapshot `local`, and
/// pushes it as `name:tag` without an owner, as a platform publishes a base.
async fn publish(
    sim: &CocoonSim,
    reg: &Registry,
    local: &str,
    (name, tag): (&str, &str),
) -> Result<()> {
    let maker = format!("maker-{name}");
    sim.run(&["vm", "run", "--name", &maker, IMAGE])?;
    sim.run(&["snapshot", "save", "--name", local, &maker])?;
    sim.run(&["vm", "rm", "--force", &maker])?;
    let cli = CocoonCli {
        env: sim.env(),
        ..CocoonCli::new(sim.bin.display().to_string())
    };
    push_from_cocoon(
        reg,
        &cli,
        local,
        name,
        tag,
        Some(IMAGE),
        None,
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("publishing {name}:{tag}: {e}"))?;
    Ok(())
}

/// `vk-cocoon snapshots own <args>` with the node's environment; its exit and output.
fn own(
    sim: &CocoonSim,
    registry: &str,
    staging: &std::path::Path,
    args: &[&str],
) -> Result<(bool, String)> {
    let out = Command::new(daemon::vk_cocoon_bin()?)
        .args(["snapshots", "own"])
        .args(args)
        .envs(sim.env())
        .env("VK_COCOON_BIN", &sim.bin)
        .env("VK_STAGING_DIR", staging)
        .env("OCI_REGISTRY", registry)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// The Warning `reason` on pod `name` of `ns` contains `says`, and the pod holds no VM.
async fn refused(
    tb: &Testbed,
    ns: &str,
    name: &str,
    reason: &str,
    says: &str,
    logs: &daemon::Daemon,
) -> Result<()> {
    let events: Api<Event> = Api::namespaced(tb.client()?, ns);
    let why = daemon::warning(&events, name, Some(reason), LIMIT)
        .await
        .with_context(|| logs.proc.log_tail(60))?;
    ensure!(why.contains(says), "{ns}/{name}: {why}");
    let pods: Api<Pod> = Api::namespaced(tb.client()?, ns);
    let p = pods.get(name).await?;
    ensure!(
        annotation(&p, "vm.cocoonstack.io/id").is_none(),
        "{name} was given a VM"
    );
    Ok(())
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_bases_serve_everyone_and_unrecorded_snapshots_wait_for_an_owner() -> Result<()> {
    let mut tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    tb.add_host("sim-b")?;
    for ns in ["team-a", "team-b"] {
        tb.ensure_namespace(ns).await?;
    }
    let registry = format!(
        "{}/{PREFIX}",
        tb.registry.as_ref().context("registry")?.addr
    );
    let node_opts = |node: &str, ip: &str, host: Option<&str>| DaemonOptions {
        node: node.into(),
        env: vec![("OCI_REGISTRY".into(), registry.clone())],
        host: host.map(str::to_string),
        node_ip: Some(ip.into()),
        ..DaemonOptions::default()
    };
    let run = tb.run_dir();
    // Published before the daemons start: a VM no pod names is an orphan to them.
    let sim = tb.host(None)?;
    let spool = run.join("test-spool");
    std::fs::create_dir_all(&spool)?;
    let reg = Registry::from_config(&registry)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(&spool);
    sim.run(&["image", "pull", IMAGE])?;
    publish(sim, &reg, "agent-base:v1", ("agent-base", "v1")).await?;
    publish(sim, &reg, "legacy", ("legacy", "latest")).await?;
    let sim_maker = "maker-local";
    sim.run(&["vm", "run", "--name", sim_maker, IMAGE])?;
    sim.run(&["snapshot", "save", "--name", "legacy-local", sim_maker])?;
    sim.run(&["vm", "rm", "--force", sim_maker])?;
    let (base_digest, _) = tag(&reg, "agent-base", "v1").await?;
    let da = daemon::start(
        &tb,
        &node_opts("node-a", "127.0.0.2", None),
        &run.join("journal-a").join("events.journal"),
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let db = daemon::start(
        &tb,
        &node_opts("node-b", "127.0.0.3", Some("sim-b")),
        &run.join("journal-b").join("events.journal"),
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    let b: Api<Pod> = Api::namespaced(tb.client()?, "team-b");

    e2e::step!("team-b asks for a VM named after the public base");
    create_pod(&b, &pod("team-b", "squat", "node-a", "agent-base", None)?).await?;
    refused(
        &tb,
        "team-b",
        "squat",
        "CreateBringUpFailed",
        "public base",
        &da,
    )
    .await?;

    e2e::step!("both namespaces clone the base on both nodes");
    create_pod(
        &a,
        &pod(
            "team-a",
            "on-b",
            "node-b",
            "vk-a-on-b",
            Some("agent-base:v1"),
        )?,
    )
    .await?;
    create_pod(
        &b,
        &pod(
            "team-b",
            "on-a",
            "node-a",
            "vk-b-on-a",
            Some("agent-base:v1"),
        )?,
    )
    .await?;
    wait_ready(&a, "on-b", LIMIT)
        .await
        .with_context(|| db.proc.log_tail(60))?;
    wait_ready(&b, "on-a", LIMIT)
        .await
        .with_context(|| da.proc.log_tail(60))?;
    delete_and_wait(&b, "squat", LIMIT, None).await?;
    let (after, owner) = tag(&reg, "agent-base", "v1").await?;
    ensure!(
        after == base_digest && owner.is_none(),
        "the base changed: {after} {owner:?}"
    );

    e2e::step!("snapshots nobody listed and nobody owns are nobody's");
    create_pod(
        &a,
        &pod("team-a", "old", "node-b", "vk-a-old", Some("legacy:latest"))?,
    )
    .await?;
    refused(
        &tb,
        "team-a",
        "old",
        "CreateBringUpFailed",
        "vk-cocoon snapshots own",
        &db,
    )
    .await?;
    create_pod(
        &a,
        &pod(
            "team-a",
            "old-local",
            "node-a",
            "vk-a-old-local",
            Some("legacy-local"),
        )?,
    )
    .await?;
    refused(
        &tb,
        "team-a",
        "old-local",
        "CreateBringUpFailed",
        "no owner record",
        &da,
    )
    .await?;

    e2e::step!("the operator records team-a as their owner");
    let (ok, text) = own(
        sim,
        &registry,
        &spool,
        &["legacy:latest", "--owner", "team-a/old"],
    )?;
    ensure!(ok, "snapshots own legacy:latest: {text}");
    let (_, owner) = tag(&reg, "legacy", "latest").await?;
    ensure!(owner.as_deref() == Some("team-a/old"), "owner {owner:?}");
    let args = ["--local", "legacy-local", "--owner", "team-a/old-local"];
    let (ok, text) = own(sim, &registry, &spool, &args)?;
    ensure!(ok, "snapshots own --local legacy-local: {text}");
    let described = sim.run(&["snapshot", "inspect", "--", "legacy-local"])?;
    ensure!(
        described.contains("vk-cocoon owner=team-a/old-local"),
        "{described}"
    );
    let (ok, text) = own(
        sim,
        &registry,
        &spool,
        &["legacy:latest", "--owner", "team-b/x"],
    )?;
    ensure!(
        !ok && text.contains("never rewritten"),
        "a second own: {text}"
    );

    e2e::step!("team-a's pods clone them now; team-b's are refused");
    for name in ["old", "old-local"] {
        delete_and_wait(&a, name, LIMIT, None).await?;
    }
    create_pod(
        &a,
        &pod("team-a", "old", "node-b", "vk-a-old", Some("legacy:latest"))?,
    )
    .await?;
    create_pod(
        &a,
        &pod(
            "team-a",
            "old-local",
            "node-a",
            "vk-a-old-local",
            Some("legacy-local"),
        )?,
    )
    .await?;
    wait_ready(&a, "old", LIMIT)
        .await
        .with_context(|| db.proc.log_tail(60))?;
    wait_ready(&a, "old-local", LIMIT)
        .await
        .with_context(|| da.proc.log_tail(60))?;
    create_pod(
        &b,
        &pod(
            "team-b",
            "thief",
            "node-b",
            "vk-b-thief",
            Some("legacy:latest"),
        )?,
    )
    .await?;
    refused(
        &tb,
        "team-b",
        "thief",
        "CreateBringUpFailed",
        "another namespace",
        &db,
    )
    .await?;
    Ok(())
}

/// T16: a namespace deleted and made again under the same name is another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_made_again_does_not_inherit_the_earlier_ones_snapshots() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    tb.ensure_namespace("team-a").await?;
    let registry = format!(
        "{}/{PREFIX}",
        tb.registry.as_ref().context("registry")?.addr
    );
    let opts = DaemonOptions {
        env: vec![("OCI_REGISTRY".into(), registry.clone())],
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let node = opts.node.clone();
    let reg = Registry::from_config(&registry).map_err(|e| anyhow::anyhow!("{e}"))?;
    let namespaces: Api<Namespace> = Api::all(tb.client()?);
    let first_uid = namespaces
        .get("team-a")
        .await?
        .metadata
        .uid
        .context("uid")?;

    e2e::step!("team-a's pod runs and is deleted: its state is saved and pushed");
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    create_pod(&a, &pod("team-a", "victim", &node, "vk-victim", None)?).await?;
    wait_ready(&a, "victim", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    delete_and_wait(&a, "victim", LIMIT, None).await?;
    let (_, owner) = tag(&reg, "vk-victim", "latest").await?;
    ensure!(
        owner == Some(format!("team-a/victim@{first_uid}")),
        "owner {owner:?}"
    );

    e2e::step!("team-a is deleted and made again under the same name");
    namespaces
        .delete("team-a", &DeleteParams::default())
        .await?;
    until("team-a gone", LIMIT, || async {
        Ok(namespaces.get_opt("team-a").await?.is_none().then_some(()))
    })
    .await?;
    tb.ensure_namespace("team-a").await?;
    let second_uid = namespaces
        .get("team-a")
        .await?
        .metadata
        .uid
        .context("uid")?;
    ensure!(second_uid != first_uid, "the namespace kept its UID");

    e2e::step!("the new team-a's pods are refused the earlier one's snapshots");
    let a: Api<Pod> = Api::namespaced(tb.client()?, "team-a");
    create_pod(
        &a,
        &pod("team-a", "heir", &node, "vk-heir", Some("vk-victim"))?,
    )
    .await?;
    refused(
        &tb,
        "team-a",
        "heir",
        "CreateBringUpFailed",
        "earlier namespace",
        &d,
    )
    .await?;
    let (_, owner) = tag(&reg, "vk-victim", "latest").await?;
    ensure!(
        owner == Some(format!("team-a/victim@{first_uid}")),
        "owner {owner:?}"
    );
    Ok(())
}
