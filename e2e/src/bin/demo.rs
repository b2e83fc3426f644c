//! `make demo`: the main job on an embedded default. A testbed (kube-apiserver + etcd, the
//! cocoon simulator), the real daemon, and three sample pods — run mode, clone mode, and one
//! with a probe-port — shown going Ready with kubectl. Ctrl-C tears it all down.
//! `DEMO_ONCE=1` exits 0 once every pod is Ready (non-zero with the reason otherwise).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::daemon::{self, Launch};
use e2e::step;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const NODE: &str = "cocoon-demo";
const BOUND: Duration = Duration::from_secs(120);

fn sample(name: &str, extra: serde_json::Value) -> Result<Pod> {
    let mut annotations = json!({
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": format!("vk-default-{name}"),
    });
    annotations
        .as_object_mut()
        .context("object")?
        .extend(extra.as_object().context("object")?.clone());
    daemon::pod_manifest("default", name, NODE, annotations)
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn vk_cocoon_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("VK_COCOON_DEMO_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("exe dir")?.join("vk-cocoon");
    if !bin.exists() {
        bail!("{} not found: build it first (`cargo build -j2 --bin vk-cocoon`, which `make demo` does)", bin.display());
    }
    Ok(bin)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let once = std::env::var("DEMO_ONCE").is_ok_and(|v| v == "1");
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    daemon::seed_clone_snapshot(&tb)?;
    let mut opts = Launch::new(
        vk_cocoon_bin()?,
        tb.run_dir().join("journal").join("events.journal"),
    )?;
    opts.node = NODE.into();
    let mut d = daemon::launch(&tb, &opts)?;
    step!(
        "vk-cocoon started (log: {}); its journal: {}",
        d.log_path().display(),
        opts.journal.display()
    );

    let pods: Api<Pod> = Api::namespaced(tb.client()?, "default");
    let samples = [
        sample(
            "demo-run",
            json!({"cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"}),
        )?,
        sample(
            "demo-clone",
            json!({"cocoonset.cocoonstack.io/image": "acme/agent:v1"}),
        )?,
        sample(
            "demo-probe",
            json!({"cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04",
                                    "vm.cocoonstack.io/probe-port": "8080"}),
        )?,
    ];
    for p in &samples {
        pods.create(&PostParams::default(), p).await?;
    }
    step!("created 3 sample pods: run mode, clone mode, probe-port 8080");
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let table = tb.kubectl(&["get", "pods", "-o", "wide"]).await?;
        if table != last {
            println!(
                "\n$ kubectl get pods -o wide   (t+{:.1}s)\n{table}",
                started.elapsed().as_secs_f64()
            );
            last = table;
        }
        let mut ready = 0;
        for p in &samples {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            if pods.get_opt(name).await?.as_ref().is_some_and(is_ready) {
                ready += 1;
            }
        }
        if ready == samples.len() {
            break;
        }
        if started.elapsed() > BOUND || !d.running() {
            eprintln!("{}", d.log_tail(30));
            bail!(
                "not every sample pod was Ready within {BOUND:?} (daemon running: {})",
                d.running()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "\n$ kubectl get node -o wide\n{}",
        tb.kubectl(&["get", "node", "-o", "wide"]).await?
    );
    println!(
        "every sample pod is Ready after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    if !once {
        println!(
            "Ctrl-C tears everything down. Meanwhile, in another shell: export KUBECONFIG={}",
            tb.kubeconfig()?.display()
        );
        tokio::signal::ctrl_c().await?;
    }
    step!("tearing down");
    d.stop();
    // The run directory goes with the testbed; the journal is the one thing worth keeping.
    let kept = keep_journal(&opts.journal)?;
    println!(
        "the run's journal is kept in {}; replay it with: vk-cocoon replay --verify {}",
        kept.display(),
        kept.display()
    );
    Ok(())
}

/// Copies the journal's files (rotation may have made several) out of the run directory to
/// `<target>/demo-journal/`, replacing an earlier run's, and returns the current file's path.
fn keep_journal(journal: &std::path::Path) -> Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe
        .parent()
        .and_then(|d| d.parent())
        .context("the target directory")?;
    let keep = target.join("demo-journal");
    if keep.exists() {
        std::fs::remove_dir_all(&keep)?;
    }
    std::fs::create_dir_all(&keep)?;
    let dir = journal.parent().context("journal dir")?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        std::fs::copy(e.path(), keep.join(e.file_name()))?;
    }
    Ok(keep.join(journal.file_name().context("journal file name")?))
}
