//! The daemon on the real cocoon CLI (the reference release `make deps` builds) over the
//! cloud-hypervisor stand-in, on the run's CNI network (e2e/src/real_cocoon.rs): a run-mode pod
//! goes Ready on probes that travel the bridge, veth and TAP cocoon made; what that release
//! lacks is refused naming the verb (CLI-10); a clone keeps its snapshot's value and says what
//! the node could not do for it; hibernate then wake brings the value back; a killed
//! hypervisor reaches the pod through cocoon's own event stream (W3, W4); a daemon killed in
//! the middle of a create converges after its restart. Each test ends with nothing left: no
//! VM, netns, TAP or address allocation.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{
    self, annotate, annotation, create_pod, lifecycle_is, pod_ip, until, wait_ready, DaemonOptions,
};
use e2e::guest_wire::{alive, banner, ping, value_port};
use e2e::real_cocoon::{netns_name, RealCocoon};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
/// An image pull converts the layers with mkfs.erofs; the rest takes a second or two.
const LIMIT: Duration = Duration::from_secs(90);

/// The testbed with the real cocoon. A host that lacks what it needs fails the test with the
/// command that provides it: nothing here passes by being skipped.
async fn testbed() -> Result<Testbed> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!(
            "the real cocoon creates network namespaces and TAPs: run this test as root (sudo make e2e)"
        );
    }
    for b in ["cocoon-real", "mkfs.erofs", "registry"] {
        e2e::bins::built(b)?;
    }
    let opts = TestbedOptions::control_plane()
        .with_registry()
        .with_real_cocoon();
    Testbed::start(opts).await
}

fn real(tb: &Testbed) -> Result<&RealCocoon> {
    tb.real_cocoon
        .as_ref()
        .context("testbed without the real cocoon")
}

fn guest_image(tb: &Testbed) -> Result<String> {
    tb.guest_image
        .clone()
        .context("no guest image in the registry")
}

fn pod(name: &str, annotations: serde_json::Value) -> Result<Pod> {
    let mut a = json!({"cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": format!("vk-{NS}-{name}")});
    let extra = annotations.as_object().context("annotations")?.clone();
    a.as_object_mut().context("object")?.extend(extra);
    daemon::pod_manifest(NS, name, NODE, a)
}

fn run_pod(tb: &Testbed, name: &str) -> Result<Pod> {
    pod(
        name,
        json!({"cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": guest_image(tb)?}),
    )
}

struct Ran {
    code: i32,
    stderr: String,
}

async fn kubectl(tb: &Testbed, args: &[&str]) -> Result<Ran> {
    let out = tokio::process::Command::new(e2e::bins::built("kubectl")?)
        .args(args)
        .env("KUBECONFIG", tb.kubeconfig()?)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .with_context(|| format!("kubectl {} did not finish", args.join(" ")))??;
    Ok(Ran {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The VM cocoon has for `name`: (id, pid, first NIC's address).
fn vm_of(real: &RealCocoon, name: &str) -> Result<(String, i64, String)> {
    let vm = real.json(&["vm", "inspect", name])?;
    let id = vm["id"].as_str().context("id")?.to_string();
    let pid = vm["pid"].as_i64().unwrap_or(0);
    let ip = vm["network_configs"][0]["network"]["ip"]
        .as_str()
        .with_context(|| format!("no static address on NIC 0: {vm}"))?
        .to_string();
    Ok((id, pid, ip))
}

/// Deletes `name` and waits until the pod object and its VM are gone and nothing of the VM is
/// left on the host.
async fn delete_and_check_nothing_left(tb: &Testbed, pods: &Api<Pod>, name: &str) -> Result<()> {
    let real = real(tb)?;
    let vm_name = format!("vk-{NS}-{name}");
    let before = vm_of(real, &vm_name).ok();
    pods.delete(name, &DeleteParams::default()).await?;
    until(&format!("{name} deleted"), LIMIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    ensure!(
        real.vm_ids()?.is_empty(),
        "VMs left after the delete: {:?}",
        real.vm_ids()?
    );
    if let Some((id, pid, _)) = before {
        ensure!(!alive(pid), "the stand-in of {id} still runs");
        let ns = netns_name(&id);
        ensure!(
            !e2e::sim::netns_list().contains(&ns),
            "netns {ns} is left after the delete"
        );
    }
    ensure!(
        real.network.allocations().is_empty(),
        "CNI allocations left: {:?}",
        real.network.allocations()
    );
    Ok(())
}

async fn events_of(tb: &Testbed, name: &str) -> Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(tb.client()?, NS);
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Ok(events.list(&lp).await?.items)
}

fn start_daemon(tb: &Testbed, env: Vec<(String, String)>) -> Result<daemon::Daemon> {
    let journal = tb.run_dir().join("journal").join("events.journal");
    let opts = DaemonOptions {
        env,
        ..DaemonOptions::default()
    };
    daemon::start(
        tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pod_is_ready_over_cni_and_what_the_release_lacks_is_named() -> Result<()> {
    let tb = testbed().await?;
    let d = start_daemon(&tb, Vec::new())?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod(&tb, "web")?).await?;
    let p = wait_ready(&pods, "web", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let (id, _, ip) = vm_of(real(&tb)?, "vk-default-web")?;
    ensure!(pod_ip(&p).as_deref() == Some(ip.as_str()), "pod IP {p:?}");
    ensure!(annotation(&p, "vm.cocoonstack.io/id") == Some(id), "id");
    ensure!(ping(&ip), "the guest at {ip} answers no ping");
    let b = banner(&ip)?;
    ensure!(b.starts_with("SSH-2.0-"), "banner {b:?}");
    ensure!(
        d.proc.log_tail(200).contains("cocoon is an older release"),
        "the daemon did not say what its cocoon lacks"
    );

    // CLI-10: the reference release has neither `vm exec` nor `vm logs`; kubectl says so.
    let exec = until("kubectl exec refused", LIMIT, || async {
        let r = kubectl(&tb, &["exec", "web", "--", "true"]).await?;
        Ok((r.code != 0 && r.stderr.contains("cocoon vm exec")).then_some(r))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    e2e::step!("kubectl exec: {}", exec.stderr.trim());
    let logs = kubectl(&tb, &["logs", "web"]).await?;
    ensure!(
        logs.code != 0 && logs.stderr.contains("cocoon vm logs"),
        "kubectl logs: code {}, {:?}",
        logs.code,
        logs.stderr
    );
    delete_and_check_nothing_left(&tb, &pods, "web").await
}

/// A VM made by hand, its value set, saved as `snapshot` and removed: a clone source of the
/// reference release (no owner record; the testbed lists it as a public base, T15). Returns
/// the address the guest had, which a restored guest keeps.
fn seed_snapshot(tb: &Testbed, snapshot: &str, value: &str) -> Result<String> {
    let real = real(tb)?;
    let image = guest_image(tb)?;
    real.run(&["image", "pull", &image])?;
    real.run(&["vm", "run", "--output", "json", "--name", "seed", &image])?;
    let (_, _, ip) = vm_of(real, "seed")?;
    let set = format!("SET {value}");
    let deadline = std::time::Instant::now() + LIMIT;
    while value_port(&ip, &set).ok().as_deref() != Some("OK") {
        ensure!(
            std::time::Instant::now() < deadline,
            "the seed guest at {ip} takes no value"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    real.run(&["snapshot", "save", "--name", snapshot, "seed"])?;
    real.run(&["vm", "rm", "--force", "seed"])?;
    Ok(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_keeps_its_snapshot_value_and_says_what_the_node_cannot_fix() -> Result<()> {
    let tb = testbed().await?;
    let seed_ip = seed_snapshot(&tb, "acme-agent", "written-before-the-snapshot")?;
    let d = start_daemon(&tb, Vec::new())?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(
        &pods,
        &pod(
            "agent",
            json!({"cocoonset.cocoonstack.io/image": "acme-agent"}),
        )?,
    )
    .await?;
    // CLI-10 with C13: the clone holds the snapshot's address until a fix-up that needs
    // `vm exec`; the node says so at once instead of retrying for 180 s.
    let failed = lifecycle_is(&pods, "agent", "failed")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let message =
        annotation(&failed, "vm.cocoonstack.io/lifecycle-state-message").unwrap_or_default();
    ensure!(
        message.contains("cocoon vm exec"),
        "lifecycle message {message:?}"
    );
    ensure!(
        annotation(&failed, "vm.cocoonstack.io/post-clone-state").as_deref() == Some("failed"),
        "post-clone-state"
    );
    ensure!(
        annotation(&failed, "vm.cocoonstack.io/post-clone-hint").is_some(),
        "no post-clone-hint to run by hand"
    );
    let events = events_of(&tb, "agent").await?;
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("PostCloneExecExhausted"))
        .with_context(|| format!("no PostCloneExecExhausted among {events:?}"))?;
    ensure!(
        warning
            .message
            .as_deref()
            .unwrap_or("")
            .contains("cocoon vm exec"),
        "{warning:?}"
    );
    ensure!(
        !daemon::is_ready(&pods.get("agent").await?),
        "a clone that kept its source's address is not Ready"
    );

    let (_, _, clone_ip) = vm_of(real(&tb)?, "vk-default-agent")?;
    ensure!(
        clone_ip != seed_ip,
        "host-local gave the clone the seed's address"
    );
    let got = until("the clone's guest answers GET", LIMIT, || async {
        Ok(value_port(&seed_ip, "GET").ok())
    })
    .await?;
    ensure!(
        got == "written-before-the-snapshot",
        "the clone's guest says {got:?}"
    );
    delete_and_check_nothing_left(&tb, &pods, "agent").await
}

fn registry_env(tb: &Testbed) -> Result<Vec<(String, String)>> {
    let addr = &tb.registry.as_ref().context("registry")?.addr;
    Ok(vec![("OCI_REGISTRY".into(), format!("{addr}/cocoon"))])
}

/// U3 then a wake: the real `snapshot save` and `snapshot export` go to the registry as
/// `<vm>:hibernate`, the VM goes; the wake clones it back under the same name. The guest's
/// value comes back with it, on the address it had (the fix-up that would move it needs
/// `vm exec`, so the wake says so as a clone does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_then_wake_brings_the_value_back() -> Result<()> {
    let tb = testbed().await?;
    let d = start_daemon(&tb, registry_env(&tb)?)?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod(&tb, "sleeper")?).await?;
    let p = wait_ready(&pods, "sleeper", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let ip = pod_ip(&p).context("pod IP")?;
    ensure!(
        value_port(&ip, "SET kept-across-hibernation")? == "OK",
        "SET"
    );

    annotate(
        &pods,
        "sleeper",
        "vm.cocoonstack.io/hibernate",
        Some("true"),
    )
    .await?;
    lifecycle_is(&pods, "sleeper", "hibernated")
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let real = real(&tb)?;
    ensure!(real.vm_ids()?.is_empty(), "the hibernated VM still exists");
    let tags = tb
        .registry
        .as_ref()
        .context("registry")?
        .tags("cocoon/vk-default-sleeper")
        .await?;
    ensure!(tags.contains(&"hibernate".to_string()), "tags {tags:?}");

    annotate(&pods, "sleeper", "vm.cocoonstack.io/hibernate", None).await?;
    let woken = until("the wake's VM", LIMIT, || async {
        Ok(vm_of(real, "vk-default-sleeper").ok())
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(woken.1 > 0, "the woken VM has no process");
    let got = until("the woken guest answers GET", LIMIT, || async {
        Ok(value_port(&ip, "GET").ok())
    })
    .await?;
    ensure!(
        got == "kept-across-hibernation",
        "the woken guest says {got:?}"
    );
    delete_and_check_nothing_left(&tb, &pods, "sleeper").await
}

/// W3/W4 over cocoon's own event stream: the hypervisor dies, the reference release reports
/// the VM `stopped (stale)` on its polled stream, and the daemon restarts it in place with
/// `vm start`: the same pod (no eviction), the same VM, a new process, Ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hypervisor_is_restarted_in_place() -> Result<()> {
    let tb = testbed().await?;
    let d = start_daemon(&tb, Vec::new())?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod(&tb, "crashy")?).await?;
    let before = wait_ready(&pods, "crashy", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let real = real(&tb)?;
    let (id, pid, ip) = vm_of(real, "vk-default-crashy")?;
    // SAFETY: plain syscall on the stand-in's pid, which this test just read from cocoon.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let (id2, pid2, _) = until("the VM restarted with a new process", LIMIT, || async {
        Ok(vm_of(real, "vk-default-crashy")
            .ok()
            .filter(|(_, p, _)| *p > 0 && *p != pid && alive(*p)))
    })
    .await
    .with_context(|| d.proc.log_tail(60))?;
    ensure!(id2 == id, "restarted as another VM: {id} → {id2}");
    let after = wait_ready(&pods, "crashy", LIMIT).await?;
    ensure!(
        after.metadata.uid == before.metadata.uid,
        "the pod was replaced, not restarted in place"
    );
    until("the restarted guest answers ping", LIMIT, || async {
        Ok(ping(&ip).then_some(()))
    })
    .await?;
    e2e::step!("stand-in {pid} killed, VM {id} restarted as {pid2}");
    delete_and_check_nothing_left(&tb, &pods, "crashy").await
}

/// The pid of a `cocoon vm run` child creating VM `name`, if one runs.
fn vm_run_child(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let run = args.windows(2).any(|w| w == [b"vm".as_slice(), b"run"]);
        let named = args.contains(&name.as_bytes());
        (run && named).then_some(pid)
    })
}

/// B3–B5 across kill -9: the daemon dies while cocoon creates the pod's VM; the next daemon
/// finds the pod's VM by its name (or makes it) and the pod converges with exactly one VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_create_converges_after_restart() -> Result<()> {
    let tb = testbed().await?;
    let d = start_daemon(&tb, Vec::new())?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    create_pod(&pods, &run_pod(&tb, "midway")?).await?;
    // A `vm run` lasts a tenth of a second or so here (the CNI set-up and the stand-in's
    // launch), so /proc is read every few milliseconds rather than at `until`'s pace.
    let deadline = std::time::Instant::now() + LIMIT;
    let child = loop {
        if let Some(pid) = vm_run_child("vk-default-midway") {
            break pid;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no cocoon vm run seen\n{}",
            d.proc.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    d.proc.signal(libc::SIGKILL);
    e2e::step!("daemon killed while cocoon vm run (pid {child}) was under way");
    // The same journal, as on a host: the new process reads back that the VM being made is
    // the pod's (T11).
    let d = start_daemon(&tb, Vec::new())?;
    wait_ready(&pods, "midway", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(80))?;
    let real = real(&tb)?;
    let ids = real.vm_ids()?;
    ensure!(ids.len() == 1, "one VM for one pod, found {ids:?}");
    delete_and_check_nothing_left(&tb, &pods, "midway").await
}

/// D4 across nodes: a delete under policy `always` pushes the real `snapshot export` archive
/// to the registry; a clone pod on a second node (its own cocoon root and network) pulls it
/// through `snapshot import` and its guest holds the value written on the first node. The
/// restored guest keeps the first node's address, so the host is told where that address now
/// lives (a /32 route to the second node's bridge, removed with the bridge) to ask it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pods_snapshot_clones_on_a_second_node() -> Result<()> {
    let mut tb = testbed().await?;
    tb.add_real_host("b")?;
    let peer_port = e2e::ports::free_port()?;
    let node_opts = |node: &str, ip: &str, host: Option<&str>| -> Result<DaemonOptions> {
        Ok(DaemonOptions {
            node: node.into(),
            env: registry_env(&tb)?,
            host: host.map(str::to_string),
            node_ip: Some(ip.into()),
            peer_addr: Some(format!("{ip}:{peer_port}")),
            ..DaemonOptions::default()
        })
    };
    let start = |opts: DaemonOptions, journal: &str| {
        daemon::start(
            &tb,
            &opts,
            &tb.run_dir().join(journal).join("events.journal"),
            e2e::ports::free_port()?,
            e2e::ports::free_port()?,
        )
    };
    let a = start(node_opts("node-a", "127.0.0.2", None)?, "journal-a")?;
    let b = start(node_opts("node-b", "127.0.0.3", Some("b"))?, "journal-b")?;
    daemon::node_registered(&tb, &a, "node-a", LIMIT).await?;
    daemon::node_registered(&tb, &b, "node-b", LIMIT).await?;

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let mut keeper = run_pod(&tb, "keeper")?;
    keeper.metadata.annotations.get_or_insert_default().insert(
        "cocoonset.cocoonstack.io/snapshot-policy".into(),
        "always".into(),
    );
    create_pod(&pods, &keeper).await?;
    let p = wait_ready(&pods, "keeper", LIMIT)
        .await
        .with_context(|| a.proc.log_tail(60))?;
    let ip = pod_ip(&p).context("pod IP")?;
    ensure!(value_port(&ip, "SET pushed-at-delete")? == "OK", "SET");
    pods.delete("keeper", &DeleteParams::default()).await?;
    until("keeper deleted", LIMIT, || async {
        Ok(pods.get_opt("keeper").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| a.proc.log_tail(60))?;
    let tags = tb
        .registry
        .as_ref()
        .context("registry")?
        .tags("cocoon/vk-default-keeper")
        .await?;
    ensure!(tags.contains(&"latest".to_string()), "tags {tags:?}");

    let heir = daemon::pod_manifest(
        NS,
        "heir",
        "node-b",
        json!({"cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-heir",
            "cocoonset.cocoonstack.io/image": "vk-default-keeper"}),
    )?;
    create_pod(&pods, &heir).await?;
    let real_b = tb.real_host(Some("b"))?;
    let waited = until("the heir's VM on node-b", LIMIT, || async {
        Ok(vm_of(real_b, "vk-default-heir").ok())
    })
    .await;
    if let Err(e) = waited {
        let heir = pods.get("heir").await?;
        let events = events_of(&tb, "heir").await?;
        let said: Vec<_> = events.iter().map(|e| (&e.reason, &e.message)).collect();
        return Err(e.context(format!(
            "heir: {:?} {:?}\nEvents: {said:?}\n{}",
            heir.status,
            heir.metadata.annotations,
            b.proc.log_tail(30)
        )));
    }
    // From node-a's gateway address, which the restored guest still takes for its own
    // subnet's, so it answers on its link without a route of its own.
    let gateway_a = &real(&tb)?.network.gateway;
    let route = [
        "route",
        "replace",
        &format!("{ip}/32"),
        "dev",
        &real_b.network.name,
        "src",
        gateway_a,
    ];
    let out = std::process::Command::new("ip").args(route).output()?;
    ensure!(out.status.success(), "ip {}: {:?}", route.join(" "), out);
    let got = until("the heir's guest answers GET", LIMIT, || async {
        Ok(value_port(&ip, "GET").ok())
    })
    .await?;
    ensure!(got == "pushed-at-delete", "the heir's guest says {got:?}");
    pods.delete("heir", &DeleteParams::default()).await?;
    until("heir deleted", LIMIT, || async {
        Ok(pods.get_opt("heir").await?.is_none().then_some(()))
    })
    .await?;
    for (node, real) in [("node-a", real(&tb)?), ("node-b", real_b)] {
        ensure!(real.vm_ids()?.is_empty(), "{node} kept a VM");
        ensure!(
            real.network.allocations().is_empty(),
            "{node} kept an address"
        );
    }
    Ok(())
}
