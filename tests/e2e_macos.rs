//! Managed macOS pods end to end (C14, R10, D2, B1): the daemon drives the simulator's
//! cocoon-macos personality (a symlink named `cocoon-macos`). A macOS pod runs, gets its
//! `vnc-port`, turns Ready through the SSH banner probe, has its dead guest started in place by
//! the sweep (R10), survives a daemon restart without a second guest (same guest, same QEMU
//! pid), and its delete removes the guest. The VNC password reaches cocoon-macos but never the
//! journal.

use e2e::daemon;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, create_pod, is_ready, pod_manifest, until, wait_ready, DaemonOptions,
};
use e2e::sim::CocoonSim;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(90);
const PASSWORD: &str = "e2e-vnc7";

/// `cocoon-macos vm list` of the simulator's macOS state.
fn guests(sim: &CocoonSim) -> Result<Vec<Value>> {
    let text = sim.run(&["--personality", "macos", "vm", "list"])?;
    Ok(serde_json::from_str(&text)?)
}

fn journal_text(journal: &Path) -> Result<String> {
    let dir = journal.parent().context("journal dir")?;
    let mut all = String::new();
    for f in std::fs::read_dir(dir)?.flatten() {
        // The records as written: the file holds them compressed.
        let raw = std::fs::read(f.path())?;
        let lines = vk_cocoon::journal::frame::lines_of_file(&raw).unwrap_or_else(|(l, _)| l);
        all += &String::from_utf8_lossy(&lines);
    }
    Ok(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macos_pod_runs_survives_a_restart_and_deletes() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let sim = tb.sim.as_ref().context("sim")?;
    let macos_bin = tb.run_dir().join("cocoon-macos");
    std::os::unix::fs::symlink(&sim.bin, &macos_bin)?;
    let opts = DaemonOptions {
        env: vec![
            (
                "VK_COCOON_MACOS_BIN".into(),
                macos_bin.display().to_string(),
            ),
            ("COCOON_MACOS_VNC_PASSWORD".into(), PASSWORD.into()),
        ],
        ..Default::default()
    };
    let journal1 = tb.run_dir().join("journal-1").join("events.journal");
    let mut d = daemon::start(
        &tb,
        &opts,
        &journal1,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;

    // C14: pull, run with a VNC display, inspect; R10: Ready through the SSH banner.
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let pod = pod_manifest(
        NS,
        "mac-a",
        NODE,
        json!({"cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-mac-a",
            "cocoonset.cocoonstack.io/os": "macos",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/macos:sequoia"}),
    )?;
    create_pod(&pods, &pod).await?;
    let p = wait_ready(&pods, "mac-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        annotation(&p, "vm.cocoonstack.io/vnc-port").as_deref() == Some("5900"),
        "vnc-port: {:?}",
        annotation(&p, "vm.cocoonstack.io/vnc-port")
    );
    ensure!(
        annotation(&p, "vm.cocoonstack.io/id").as_deref() == Some("vk-default-mac-a"),
        "id: {:?}",
        annotation(&p, "vm.cocoonstack.io/id")
    );
    ensure!(annotation(&p, "vm.cocoonstack.io/ip").is_some(), "no ip");
    let first = guests(sim)?;
    ensure!(first.len() == 1, "guests: {first:?}");
    ensure!(first[0]["vnc"] == json!(0), "guest display: {first:?}");
    let first_pid = first[0]["pid"].as_i64().context("pid")?;
    ensure!(first_pid > 0, "guest not alive: {first:?}");
    ensure!(
        sim.vm_ids().is_empty(),
        "a Linux VM was made: {:?}",
        sim.vm_ids()
    );

    // R10: the guest's QEMU dies; the 30 s sweep lists it dead and starts it in place, with
    // its display, and the pod is Ready again.
    sim.run(&[
        "--personality",
        "macos",
        "sim",
        "fault",
        "crash",
        "vk-default-mac-a",
    ])?;
    let before = until("the dead guest started in place", LIMIT, || async {
        let g = guests(sim)?;
        let pid = g.first().and_then(|v| v["pid"].as_i64()).unwrap_or(0);
        Ok(
            (g.len() == 1 && pid > 0 && pid != first_pid && g[0]["state"] == "running")
                .then_some(g),
        )
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        before[0]["vnc"] == json!(0),
        "display after the restart: {before:?}"
    );
    let pid = before[0]["pid"].as_i64().context("pid")?;
    wait_ready(&pods, "mac-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;

    let events: Api<Event> = Api::namespaced(tb.client()?, NS);
    until("mac-a's create reported", LIMIT, || async {
        let ok = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("mac-a"))
            .any(|e| e.reason.as_deref() == Some("ProviderCreateSuccess"));
        Ok(ok.then_some(()))
    })
    .await?;

    // B1: kill -9 and restart: the guest is adopted, never run again; the pod stays Ready.
    d.proc.signal(libc::SIGKILL);
    let journal2 = tb.run_dir().join("journal-2").join("events.journal");
    d = daemon::start(
        &tb,
        &opts,
        &journal2,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(5) {
        ensure!(
            is_ready(&pods.get("mac-a").await?),
            "mac-a lost Ready across the restart\n{}",
            d.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    until("the restarted daemon lists cocoon-macos", LIMIT, || async {
        Ok(journal_text(&journal2)?
            .contains(r#""verb":"macos_list""#)
            .then_some(()))
    })
    .await?;
    let after = guests(sim)?;
    ensure!(after.len() == 1, "guests after the restart: {after:?}");
    ensure!(
        after[0]["pid"].as_i64() == Some(pid),
        "the guest changed across the restart: {before:?} -> {after:?}"
    );
    let runs = journal_text(&journal2)?
        .matches(r#""verb":"macos_run""#)
        .count();
    ensure!(runs == 0, "the restarted daemon ran {runs} guests");

    // D2: the delete removes the guest; the pod object goes.
    pods.delete("mac-a", &DeleteParams::default()).await?;
    until("mac-a gone", LIMIT, || async {
        Ok(pods.get_opt("mac-a").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let left = guests(sim)?;
    ensure!(left.is_empty(), "guests after the delete: {left:?}");

    drop(d);
    // C14: the guest's display had its own password, and neither it nor the node's is kept.
    let guest = vk_cocoon::cocoon::macos::guest_password(PASSWORD, NS, "vk-default-mac-a");
    for j in [&journal1, &journal2] {
        let text = journal_text(j)?;
        ensure!(
            !text.contains(PASSWORD) && !text.contains(&guest),
            "a VNC password is in the journal {}",
            j.display()
        );
        daemon::replay_verify(j)?;
    }
    Ok(())
}
