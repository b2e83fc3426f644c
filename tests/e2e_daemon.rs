//! The daemon end to end: the real binary against a real kube-apiserver + etcd and
//! the cocoon simulator with real guests. Every daemon run's journal is replayed with --verify.

use e2e::daemon;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    annotation, create_pod, is_ready, phase, pod_ip, pod_manifest, terminated_reason, until,
    wait_ready, watch_for, DaemonOptions,
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
    daemon::seed_clone_snapshot(&tb)?;
    let sim = tb.sim.as_ref().context("sim")?;
    let journal1 = tb.run_dir().join("journal-1").join("events.journal");
    let opts = DaemonOptions::default();
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(
        &tb,
        &opts,
        &journal1,
        metrics_port,
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

    // The shared sample feeds per-VM series from the guests' cgroup scopes and /proc.
    let rss = until("per-VM RSS on /metrics", LIMIT, || async {
        let v = daemon::metric(metrics_port, "cocoon_vk_vm_memory_rss_bytes").await?;
        Ok((v > 0.0).then_some(v))
    })
    .await?;
    ensure!(rss > 0.0);
    ensure!(daemon::metric(metrics_port, "cocoon_vk_node_cpu_seconds_total").await? > 0.0);
    // The COW disk holds data, and the probes' pings went through each VM's TAP both ways
    // (guests on 127.x addresses, where namespaces are unavailable, have no TAP).
    let run_id = annotation(&pods.get("run-a").await?, "vm.cocoonstack.io/id").context("id")?;
    let inspect: serde_json::Value = serde_json::from_str(&sim.run(&["vm", "inspect", &run_id])?)?;
    let has_tap = inspect["network_configs"][0]["netns_path"]
        .as_str()
        .is_some_and(|p| !p.is_empty());
    let mut series = vec!["cocoon_vk_vm_disk_cow_bytes"];
    if has_tap {
        series.extend([
            "cocoon_vk_vm_network_rx_bytes_total",
            "cocoon_vk_vm_network_tx_bytes_total",
        ]);
    }
    for series in series {
        until(&format!("{series} on /metrics"), LIMIT, || async {
            let v = daemon::metric(metrics_port, series).await?;
            Ok((v > 0.0).then_some(()))
        })
        .await?;
    }

    // kubectl logs reaches the daemon's kubelet API through the apiserver (K3).
    tb.kubectl(&["logs", "run-a"])
        .await
        .context("kubectl logs run-a")?;
    let no_vm = tb
        .kubectl(&["logs", "bad-a"])
        .await
        .context("kubectl logs bad-a")?;
    ensure!(
        no_vm.contains("pod has no live VM"),
        "kubectl logs bad-a said {no_vm:?}"
    );

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
    // R2: the first status, the one with the pod IP, came once the probes had failed for the
    // whole probe deadline; the port is still closed, so the pod is not Ready.
    ensure!(
        !is_ready(&probe.1) && !is_ready(&pods.get("probe-a").await?),
        "probe-a must not be Ready before port 9099 opens"
    );
    sim.run(&["sim", "fault", "open-port", &probe.0, "9099"])?;
    wait_ready(&pods, "probe-a", LIMIT).await?;

    // 4: kill -9 and restart: the same VMs are adopted, none created, pods stay Ready.
    let before = vm_ids(&tb);
    d.proc.signal(libc::SIGKILL);
    let journal2 = tb.run_dir().join("journal-2").join("events.journal");
    let metrics_port = e2e::ports::free_port()?;
    d = daemon::start(
        &tb,
        &opts,
        &journal2,
        metrics_port,
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
    let inspect: serde_json::Value = serde_json::from_str(&sim.run(&["vm", "inspect", &run_id])?)?;
    let run_mac = inspect["network_configs"][0]["mac"]
        .as_str()
        .context("run-a's MAC")?
        .to_ascii_lowercase();
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
    // D6: its DHCP lease went back to cocoon-net through the control socket.
    until("run-a's lease released", LIMIT, || async {
        let leases = std::fs::read_to_string(&sim.leases)?.to_ascii_lowercase();
        Ok((!leases.contains(&run_mac)).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(daemon::metric(metrics_port, "cocoon_vk_lease_release_total").await? >= 1.0);
    // E1: the pod controller reported run-a's create and its delete, as a kubelet would.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(tb.client()?, NS);
    until("run-a's create and delete reported", LIMIT, || async {
        let reported: Vec<(String, String)> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("run-a"))
            .filter_map(|e| Some((e.reason?, e.source?.component?)))
            .collect();
        let by_controller = |reason: &str| {
            reported
                .iter()
                .any(|(r, c)| r == reason && c == &format!("{NODE}/pod-controller"))
        };
        Ok(
            (by_controller("ProviderCreateSuccess") && by_controller("ProviderDeleteSuccess"))
                .then_some(()),
        )
    })
    .await?;

    // 6: a VM that vanishes turns its pod Failed / VMGone (latency is measured, not asserted).
    let clone_id =
        annotation(&pods.get("clone-a").await?, "vm.cocoonstack.io/id").context("clone-a id")?;
    let vmgone =
        |p: &Pod| phase(p) == "Failed" && terminated_reason(p).as_deref() == Some("VMGone");
    let seen = watch_for(pods.clone(), "clone-a", vmgone);
    let t0 = Instant::now();
    sim.run(&["sim", "fault", "vanish", &clone_id])?;
    seen.wait("clone-a Failed/VMGone", LIMIT)
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

fn guest_pid(tb: &Testbed, id: &str) -> Result<i64> {
    let info = tb
        .sim
        .as_ref()
        .context("sim")?
        .run(&["vm", "inspect", id])?;
    let v: serde_json::Value = serde_json::from_str(&info)?;
    Ok(v["pid"].as_i64().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_crashes_stream_kill_and_apiserver_restart() -> Result<()> {
    let mut tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let img = "ghcr.io/cocoonstack/ubuntu:24.04";
    {
        let sim = tb.sim.as_ref().context("sim")?;
        sim.run(&["image", "pull", img])?;
        sim.run(&["vm", "run", "--output", "json", "--name", "orphan-x", img])?;
    }
    let orphan = vm_ids(&tb);
    ensure!(orphan.len() == 1, "expected one orphan VM, have {orphan:?}");

    // 5a: alert keeps the orphan and counts it.
    let j_alert = tb.run_dir().join("journal-alert").join("events.journal");
    let alert = DaemonOptions {
        orphan_policy: "alert",
        ..DaemonOptions::default()
    };
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(
        &tb,
        &alert,
        &j_alert,
        metrics_port,
        e2e::ports::free_port()?,
    )?;
    wait_node(&tb).await.with_context(|| d.proc.log_tail(40))?;
    let counted = until("orphan counted", LIMIT, || async {
        let n = daemon::metric(metrics_port, "cocoon_vk_orphan_vm_total").await?;
        Ok((n >= 1.0).then_some(n))
    })
    .await?;
    ensure!(counted == 1.0, "orphan counted {counted} times");
    ensure!(vm_ids(&tb) == orphan, "alert must keep the orphan VM");
    d.proc.stop();

    // 5b: destroy removes it.
    let j_destroy = tb.run_dir().join("journal-destroy").join("events.journal");
    let opts = DaemonOptions::default();
    d = daemon::start(
        &tb,
        &opts,
        &j_destroy,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    until("orphan destroyed", LIMIT, || async {
        Ok(vm_ids(&tb).is_empty().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let run_pod = |name: &str| {
        pod_manifest(
            NS,
            name,
            NODE,
            json!({"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/name": format!("vk-default-{name}"),
                   "cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": img}),
        )
    };

    // 6: a crashed VM is restarted in place; a second crash inside 30 s evicts RestartCooldown.
    create_pod(&pods, &run_pod("crash-a")?).await?;
    let p = wait_ready(&pods, "crash-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let id = annotation(&p, "vm.cocoonstack.io/id").context("crash-a id")?;
    let pid_before = guest_pid(&tb, &id)?;
    tb.sim
        .as_ref()
        .context("sim")?
        .run(&["sim", "fault", "crash", &id])?;
    until("crash-a restarted in place", LIMIT, || async {
        let pid = guest_pid(&tb, &id)?;
        Ok((pid != 0 && pid != pid_before).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        vm_ids(&tb).contains(&id),
        "the restart must keep the same VM"
    );
    wait_ready(&pods, "crash-a", LIMIT).await?;
    // The stream reports a change only once a poll (200 ms) has seen it: let it see the VM
    // running again, or the second crash would look like the first one continuing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let evicted = watch_for(pods.clone(), "crash-a", |p| {
        phase(p) == "Failed" && terminated_reason(p).as_deref() == Some("RestartCooldown")
    });
    tb.sim
        .as_ref()
        .context("sim")?
        .run(&["sim", "fault", "crash", &id])?;
    evicted
        .wait("crash-a evicted RestartCooldown", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;

    // 7a: killed event streams reconnect. A VM that vanishes while the stream is down (no
    // event will ever say so) is found by the sweep at the reconnect; a vanish after it is
    // seen by the stream.
    create_pod(&pods, &run_pod("gap-a")?).await?;
    let p = wait_ready(&pods, "gap-a", LIMIT).await?;
    let gap_id = annotation(&p, "vm.cocoonstack.io/id").context("gap-a id")?;
    let gap_seen = watch_for(pods.clone(), "gap-a", |p| {
        terminated_reason(p).as_deref() == Some("VMGone")
    });
    tb.sim
        .as_ref()
        .context("sim")?
        .run(&["sim", "fault", "kill-streams"])?;
    // Inside the daemon's fixed 2 s reconnect delay.
    tb.sim
        .as_ref()
        .context("sim")?
        .run(&["sim", "fault", "vanish", &gap_id])?;
    gap_seen
        .wait(
            "gap-a evicted VMGone after the stream gap",
            Duration::from_secs(20),
        )
        .await
        .with_context(|| d.proc.log_tail(60))?;
    create_pod(&pods, &run_pod("after-kill")?).await?;
    let p = wait_ready(&pods, "after-kill", LIMIT).await?;
    let id = annotation(&p, "vm.cocoonstack.io/id").context("after-kill id")?;
    // The next vanish is for the stream to see: its reconnect after the kill is done.
    until("the daemon's event stream back", LIMIT, || async {
        Ok(event_stream_running(d.proc.pid()).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    let seen = watch_for(pods.clone(), "after-kill", |p| {
        terminated_reason(p).as_deref() == Some("VMGone")
    });
    tb.sim
        .as_ref()
        .context("sim")?
        .run(&["sim", "fault", "vanish", &id])?;
    seen.wait("after-kill evicted VMGone", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;

    // 7b: an apiserver restart loses no pod: a pod made before is still Ready, one made after runs.
    create_pod(&pods, &run_pod("before-restart")?).await?;
    wait_ready(&pods, "before-restart", LIMIT).await?;
    tb.restart_apiserver().await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod("after-restart")?).await?;
    wait_ready(&pods, "after-restart", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(
        is_ready(&pods.get("before-restart").await?),
        "before-restart lost Ready"
    );

    d.proc.stop();
    daemon::replay_verify(&j_alert)?;
    daemon::replay_verify(&j_destroy)?;
    Ok(())
}

/// Closes net.ipv4.ping_group_range (no group may open unprivileged ICMP sockets) for as long
/// as it lives, then puts the old value back.
struct PingGroupRangeClosed {
    saved: Option<String>,
}

impl PingGroupRangeClosed {
    const PATH: &'static str = "/proc/sys/net/ipv4/ping_group_range";

    fn new() -> Result<Self> {
        let saved = std::fs::read_to_string(Self::PATH)?;
        let bounds: Vec<u64> = saved
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if matches!(bounds[..], [lo, hi] if lo > hi) {
            return Ok(Self { saved: None });
        }
        std::fs::write(Self::PATH, "1 0").context("closing ping_group_range")?;
        Ok(Self { saved: Some(saved) })
    }
}

impl Drop for PingGroupRangeClosed {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            if let Err(e) = std::fs::write(Self::PATH, saved.trim()) {
                eprintln!("could not restore {} to {saved:?}: {e}", Self::PATH);
            }
        }
    }
}

/// Whether the daemon `pid` has its cocoon event stream (`vm status --event`, a child of its
/// own) running.
fn event_stream_running(pid: u32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let dir = e.path();
        let ppid = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| {
                let (_, after) = s.rsplit_once(')')?;
                after.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        ppid == Some(pid)
            && std::fs::read(dir.join("cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"--event"))
    })
}

/// R9 end to end: a daemon without CAP_NET_RAW, on a host where unprivileged ICMP is closed,
/// opens no ICMP socket; its ICMP probes pass on a resolved IP, so pods still go Ready, and
/// /metrics says the probes are degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn icmp_probes_degrade_without_net_raw() -> Result<()> {
    let Some(setpriv) = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        e2e::skip::required(
            "setpriv (util-linux, e2e/scripts/ci-setup.sh) is not installed, so CAP_NET_RAW cannot be dropped",
        );
    };
    let _closed = PingGroupRangeClosed::new()?;
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal-degraded").join("events.journal");
    let opts = DaemonOptions {
        launcher: [
            setpriv,
            "--inh-caps=-net_raw",
            "--bounding-set=-net_raw",
            "--",
        ]
        .map(String::from)
        .to_vec(),
        ..DaemonOptions::default()
    };
    let metrics_port = e2e::ports::free_port()?;
    let mut d = daemon::start(&tb, &opts, &journal, metrics_port, e2e::ports::free_port()?)?;
    wait_node(&tb).await.with_context(|| d.proc.log_tail(40))?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(
        &pods,
        &pod_manifest(
            NS,
            "degraded-a",
            NODE,
            json!({"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/name": "vk-default-degraded-a",
                   "cocoonset.cocoonstack.io/mode": "run", "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"}),
        )?,
    )
    .await?;
    let p = wait_ready(&pods, "degraded-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    ensure!(pod_ip(&p).is_some(), "a degraded probe still needs an IP");
    ensure!(
        daemon::metric(metrics_port, "cocoon_vk_probe_icmp_degraded").await? == 1.0,
        "cocoon_vk_probe_icmp_degraded must be 1 without any ICMP socket"
    );
    let log = std::fs::read_to_string(d.proc.log_path())?;
    ensure!(
        log.matches("no ICMP socket").count() == 1,
        "the degraded mode is announced once:\n{}",
        d.proc.log_tail(40)
    );

    d.proc.stop();
    daemon::replay_verify(&journal)?;
    Ok(())
}
