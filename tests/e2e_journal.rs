//! The journal as evidence (F3, M4) end to end: the real daemon against a real kube-apiserver
//! and the cocoon simulator, its journal on a disk that fills up mid-run.
//!
//! The daemon runs as root, so taking write permission away would not stop it; and renaming the
//! directory away would not either, since it writes through a file it already holds open. A
//! small tmpfs mounted over the journal directory and then filled makes every append fail
//! with ENOSPC exactly as a full disk does, whatever the writer's privileges (tmpfs reserves
//! nothing for root). Mounting needs root with CAP_SYS_ADMIN, which the testbed runs with.

use e2e::daemon;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use e2e::daemon::{create_pod, pod_manifest, until, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

/// A tmpfs mounted at a directory for the life of the value.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "cannot mount a tmpfs at {} (this test needs root with CAP_SYS_ADMIN): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Writes a file until the filesystem is full; returns its path.
    fn fill(&self) -> Result<PathBuf> {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path)?;
        let chunk = vec![0u8; 64 << 10];
        loop {
            if let Err(e) = f.write_all(&chunk) {
                ensure!(
                    e.raw_os_error() == Some(libc::ENOSPC),
                    "filling the tmpfs: {e}"
                );
                break;
            }
        }
        // Whatever whole pages are left below a 64 KiB chunk, byte by byte.
        while f.write_all(&[0u8; 512]).is_ok() {}
        while f.write_all(&[0u8]).is_ok() {}
        Ok(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

async fn metric(port: u16, name: &str) -> Result<f64> {
    daemon::metric(port, name).await
}

fn run_pod(name: &str) -> Result<Pod> {
    pod_manifest(
        NS,
        name,
        NODE,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": format!("vk-default-{name}"),
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04",
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_disk_that_fills_up_mid_run_is_survived() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let dir = tb.run_dir().join("journal");
    // Dropped before the testbed, which removes the run directory.
    let disk = Tmpfs::mount(&dir, "8m")?;
    let journal = dir.join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        metrics_port,
        e2e::ports::free_port()?,
    )?;
    let nodes: Api<Node> = Api::all(tb.client()?);
    until("node registered", LIMIT, || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod("before")?).await?;
    wait_ready(&pods, "before", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(metric(metrics_port, "cocoon_vk_journal_up").await? == 1.0);
    ensure!(metric(metrics_port, "cocoon_vk_journal_write_errors_total").await? == 0.0);
    let mode = std::fs::metadata(&journal)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "journal file mode {mode:o}");

    // The disk fills up under the running daemon. A Ready pod whose guest answers costs no
    // journal record, so the next record is the new pod's: the first write to fail. Records
    // are compressed and a few could still fit in the journal file's last partial page, so
    // the new pod carries 16 KiB of random text, which no compression shrinks below a page.
    let filled = std::time::Instant::now();
    let filler = disk.fill()?;
    let asked = std::time::Instant::now();
    let mut during = run_pod("during")?;
    let mut noise = vec![0u8; 8 << 10];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut noise)?;
    let noise: String = noise.iter().map(|b| format!("{b:02x}")).collect();
    during
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("e2e.cocoonstack.io/incompressible".into(), noise);
    create_pod(&pods, &during).await?;
    until("the journal reported down", LIMIT, || async {
        let up = metric(metrics_port, "cocoon_vk_journal_up").await?;
        let errors = metric(metrics_port, "cocoon_vk_journal_write_errors_total").await?;
        Ok((up == 0.0 && errors >= 1.0).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    eprintln!("journal down {:?} after the disk filled", filled.elapsed());

    // Pods are still served: the new one comes up, the old one stays Ready.
    wait_ready(&pods, "during", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    eprintln!(
        "pod Ready {:?} after its create, journal down",
        asked.elapsed()
    );
    wait_ready(&pods, "before", Duration::from_secs(5)).await?;
    let dropped = metric(metrics_port, "cocoon_vk_journal_records_dropped_total").await?;
    ensure!(dropped > 0.0, "no step was counted as not journaled");
    ensure!(metric(metrics_port, "cocoon_vk_journal_up").await? == 0.0);

    // Room again: the journal comes back on its own (its retries wait at most 30 s).
    std::fs::remove_file(&filler)?;
    let freed = std::time::Instant::now();
    until("the journal back up", LIMIT, || async {
        Ok((metric(metrics_port, "cocoon_vk_journal_up").await? == 1.0).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    eprintln!(
        "journal up {:?} after the disk was freed; down for {:?}, {dropped} steps not journaled by then",
        freed.elapsed(),
        filled.elapsed()
    );
    create_pod(&pods, &run_pod("after")?).await?;
    wait_ready(&pods, "after", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    d.proc.stop();

    // Replayable across the gap, which replay names.
    daemon::replay_verify(&journal)?;
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["replay", "--verify", "--quiet"])
        .arg(&journal)
        .output()?;
    let verdict =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // One gap, or more if a retry fitted its header into the last partial page and the
    // next step found the disk still full.
    ensure!(
        verdict.contains("where steps were not journaled"),
        "{verdict}"
    );
    drop(disk);
    Ok(())
}
