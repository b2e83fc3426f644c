//! Running the real `vk-cocoon` daemon against a testbed, wired to its simulator, and waiting
//! on what it does: what the root package's e2e tests, benchmarks and `make demo` share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::procs::Proc;
use crate::testbed::Testbed;

/// The `vk-cocoon` binary cargo built next to the running test: `CARGO_BIN_EXE_vk-cocoon`
/// when cargo sets it at run time, otherwise the target dir's `vk-cocoon` above the test's
/// own `deps/` directory.
pub fn vk_cocoon_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CARGO_BIN_EXE_vk-cocoon") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().context("the running executable")?;
    let mut dir = exe.parent().context("the executable's directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("the target directory")?;
    }
    let bin = dir.join("vk-cocoon");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo builds it for the root package's tests; \
             otherwise `cargo build -j2 --bin vk-cocoon`)",
            bin.display()
        );
    }
    Ok(bin)
}

/// Everything a launch of `vk-cocoon run` is given; [`start`] fills it from [`DaemonOptions`].
pub struct Launch {
    /// The `vk-cocoon` binary ([`vk_cocoon_bin`] for a test of the root package).
    pub bin: PathBuf,
    pub node: String,
    pub orphan_policy: String,
    pub journal: PathBuf,
    pub metrics_port: u16,
    pub kubelet_port: u16,
    /// The node's InternalIP, where peers dial its peer API (a loopback address).
    pub node_ip: String,
    /// `VK_PEER_ADDR`: a free loopback port unless set, so daemons of parallel tests never
    /// meet on the default port.
    pub peer_addr: String,
    /// Which cocoon host the daemon drives: `None` for the testbed's own simulator, or a name
    /// given to `Testbed::add_host`.
    pub host: Option<String>,
    /// Extra environment, e.g. simulator timing for a benchmark.
    pub env: Vec<(String, String)>,
    /// A program and its arguments that start the daemon instead of running it directly, e.g.
    /// `setpriv` to take a capability away from it.
    pub launcher: Vec<String>,
    /// The peer API's credentials (`VK_PEER_CA_FILE`, `VK_PEER_CERT`, `VK_PEER_KEY`).
    pub peer_tls: PeerTls,
}

/// How a launch authenticates to its peers.
#[derive(Clone, Debug, Default)]
pub enum PeerTls {
    /// The testbed CA and a node certificate issued for the launch's node.
    #[default]
    Testbed,
    /// No credentials: the peer API stays off.
    Off,
}

impl Launch {
    pub fn new(bin: impl Into<PathBuf>, journal: PathBuf) -> Result<Self> {
        Ok(Self {
            bin: bin.into(),
            node: "node-a".into(),
            orphan_policy: "destroy".into(),
            journal,
            metrics_port: crate::ports::free_port()?,
            kubelet_port: crate::ports::free_port()?,
            node_ip: "127.0.0.1".into(),
            peer_addr: format!("127.0.0.1:{}", crate::ports::free_port()?),
            host: None,
            env: Vec::new(),
            launcher: Vec::new(),
            peer_tls: PeerTls::Testbed,
        })
    }
}

/// Whether an owner record (a manifest's annotation, or a local description's tail) names
/// `pod` (`<namespace>/<pod>`), whatever namespace UID it carries (T16).
pub fn owned_by(record: Option<&str>, pod: &str) -> bool {
    let record = record.map(|r| r.strip_prefix("vk-cocoon owner=").unwrap_or(r));
    record.and_then(|r| r.split('@').next()) == Some(pod)
}

/// The repositories of the clone bases the suites seed without an owner record
/// (`seed_clone_snapshot`, the guest and resume suites' bases, the registry's `agent-base`).
pub const PUBLIC_BASES: &str =
    "acme/agent,agent-base,acme-agent,guest/fc,guest/static,guest/windows,resume/static,bench-vm";

/// Spawns `vk-cocoon run` as part of the testbed's run (torn down with it).
pub fn launch(tb: &Testbed, o: &Launch) -> Result<Proc> {
    let mut cmd = match o.launcher.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&o.bin);
            c
        }
        None => Command::new(&o.bin),
    };
    cmd.arg("run");
    match &tb.real_cocoon {
        Some(_) => real_cocoon_env(&mut cmd, tb.real_host(o.host.as_deref())?),
        None => {
            let sim = tb.host(o.host.as_deref())?;
            cmd.envs(sim.env())
                .env("VK_COCOON_BIN", &sim.bin)
                .env("VK_LEASES_PATH", &sim.leases)
                .env("COCOON_ROOT_DIR", &sim.root)
                .env("COCOON_CGROUP_PARENT", &sim.cgroup_parent)
                .env("VK_COCOON_NET_CONTROL_SOCKET", &sim.control_socket)
                .env("VK_STAGING_DIR", sim.root.join("vk-staging"))
                .env("VK_COCOON_SNAPSHOT_DIR", sim.root.join("snapshots"))
                // The simulator's named network, open to every namespace as an operator lists it.
                .env("VK_NETWORKS", "*=cocoon-static");
        }
    }
    // T15: the clone bases the suites publish with cocoon's own tools (no owner record) are
    // listed as public, as an operator lists the platform's bases.
    cmd.env("VK_PUBLIC_SNAPSHOTS", PUBLIC_BASES);
    cmd.env("KUBECONFIG", tb.kubeconfig()?)
        .env("VK_NODE_NAME", &o.node)
        .env("VK_NODE_IP", &o.node_ip)
        .env("VK_PEER_ADDR", &o.peer_addr)
        .env("VK_KUBELET_PORT", o.kubelet_port.to_string())
        .env("VK_METRICS_ADDR", format!("127.0.0.1:{}", o.metrics_port))
        .env("VK_ORPHAN_POLICY", &o.orphan_policy)
        .env("VK_JOURNAL_PATH", &o.journal)
        .env("VK_LOG_LEVEL", "info")
        // The scheduler places pods by allocatable: the node stands for a host big enough for
        // the benchmark's 1,000 pods of `pod_manifest`'s size (500m, 512Mi), after the default
        // 20 % reserve, rather than for this machine's own few cores.
        .env("VK_NODE_CPU", "640")
        .env("VK_NODE_MEM", "640Gi")
        .env("VK_NODE_PODS", "1024");
    // The apiserver presents its kubelet client certificate, signed by the testbed CA, when
    // it calls the kubelet API (kubectl logs); the daemon checks callers against that CA.
    if let Some(pki) = &tb.pki {
        cmd.env("VK_CLIENT_CA_FILE", &pki.ca.cert);
        // Nodes of one testbed trust each other as kubeadm nodes do: the cluster CA and each
        // node's own client certificate.
        if let PeerTls::Testbed = o.peer_tls {
            let node = pki.issue_node(&o.node)?;
            cmd.env("VK_PEER_CA_FILE", &pki.ca.cert)
                .env("VK_PEER_CERT", &node.cert)
                .env("VK_PEER_KEY", &node.key);
        }
    }
    cmd.envs(o.env.iter().cloned());
    tb.spawn("vk-cocoon", cmd)
}

/// The daemon on the real cocoon: its environment, the CLI as `VK_COCOON_BIN`, cocoon's own
/// snapshot store for the peer API. No cocoon-net runs beside it: its addresses come from the
/// run's CNI network, so there is no lease file (the path names nothing) and no lease release.
fn real_cocoon_env(cmd: &mut Command, real: &crate::real_cocoon::RealCocoon) {
    cmd.envs(real.env())
        .env("VK_COCOON_BIN", &real.bin)
        .env(
            "VK_LEASES_PATH",
            real.root.join("no-cocoon-net/leases.json"),
        )
        .env("VK_STAGING_DIR", real.root.join("vk-staging"))
        .env(
            "VK_COCOON_SNAPSHOT_DIR",
            real.root.join("snapshot/localfile"),
        );
}

pub struct Daemon {
    pub proc: Proc,
}

pub struct DaemonOptions {
    pub node: String,
    pub orphan_policy: &'static str,
    /// Extra environment, e.g. simulator timing for a benchmark.
    pub env: Vec<(String, String)>,
    /// Starts the daemon through this program and arguments (see [`Launch::launcher`]).
    pub launcher: Vec<String>,
    /// A second node's cocoon host and address (see [`Launch`]); `None` keeps
    /// the testbed's simulator, 127.0.0.1 and a free peer port.
    pub host: Option<String>,
    pub node_ip: Option<String>,
    pub peer_addr: Option<String>,
    /// The peer API's credentials (see [`Launch::peer_tls`]).
    pub peer_tls: PeerTls,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        Self {
            node: "node-a".into(),
            orphan_policy: "destroy",
            env: Vec::new(),
            launcher: Vec::new(),
            host: None,
            node_ip: None,
            peer_addr: None,
            peer_tls: PeerTls::Testbed,
        }
    }
}

pub fn start(
    tb: &Testbed,
    opts: &DaemonOptions,
    journal: &Path,
    metrics_port: u16,
    kubelet_port: u16,
) -> Result<Daemon> {
    let mut o = Launch::new(vk_cocoon_bin()?, journal.to_path_buf())?;
    o.node = opts.node.clone();
    o.orphan_policy = opts.orphan_policy.into();
    o.metrics_port = metrics_port;
    o.kubelet_port = kubelet_port;
    o.env = opts.env.clone();
    o.launcher = opts.launcher.clone();
    o.host = opts.host.clone();
    if let Some(ip) = &opts.node_ip {
        o.node_ip = ip.clone();
    }
    if let Some(addr) = &opts.peer_addr {
        o.peer_addr = addr.clone();
    }
    o.peer_tls = opts.peer_tls.clone();
    Ok(Daemon {
        proc: launch(tb, &o)?,
    })
}

/// The daemon as most tests run it: default options, its journal under the run dir, free
/// ports. Returns the journal's path with it.
pub fn start_default(tb: &Testbed) -> Result<(Daemon, PathBuf)> {
    let journal = tb.run_dir().join("journal").join("events.journal");
    let d = start(
        tb,
        &DaemonOptions::default(),
        &journal,
        crate::ports::free_port()?,
        crate::ports::free_port()?,
    )?;
    Ok((d, journal))
}

/// Polls `f` every 100 ms until it yields `Some`, for at most `limit`; the error names `what`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "timed out waiting for {what}{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<Pod> {
    Ok(api.create(&PostParams::default(), pod).await?)
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

pub fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref().and_then(|s| s.pod_ip.clone())
}

pub fn annotation(p: &Pod, k: &str) -> Option<String> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k).cloned())
}

pub async fn wait_ready(api: &Api<Pod>, name: &str, limit: Duration) -> Result<Pod> {
    until(&format!("pod {name} Ready"), limit, || async {
        let p = api.get(name).await?;
        Ok(is_ready(&p).then_some(p))
    })
    .await
}

/// An Event kube-scheduler reported (FailedScheduling while a pod waits for a node, say), not
/// the daemon.
pub fn from_the_scheduler(e: &k8s_openapi::api::core::v1::Event) -> bool {
    let scheduler = Some("default-scheduler");
    e.reporting_component.as_deref() == scheduler
        || e.source.as_ref().and_then(|s| s.component.as_deref()) == scheduler
}

/// Replays the run's journal with `--verify`: the same events must give the same actions.
pub fn replay_verify(journal: &Path) -> Result<()> {
    let dir = journal.parent().context("journal path has no parent")?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let out = Command::new(vk_cocoon_bin()?)
        .arg("replay")
        .arg("--verify")
        .args(&files)
        .output()?;
    if !out.status.success() {
        bail!(
            "replay --verify failed on {files:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

pub async fn metric(port: u16, name: &str) -> Result<f64> {
    let body = reqwest_get(&format!("http://127.0.0.1:{port}/metrics")).await?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Every series of one metric as (labels, value), labels as printed (`kind="pod"`).
pub async fn metric_series(port: u16, name: &str) -> Result<Vec<(String, f64)>> {
    let body = reqwest_get(&format!("http://127.0.0.1:{port}/metrics")).await?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let labels = series
                .split_once('{')
                .map_or("", |(_, rest)| rest.trim_end_matches('}'));
            Some((labels.to_string(), value.parse::<f64>().ok()?))
        })
        .collect())
}

async fn reqwest_get(url: &str) -> Result<String> {
    Ok(crate::ready::http().get(url).send().await?.text().await?)
}

/// Watches one pod from now on and resolves with the first version matching `pred`. Started
/// before the trigger, so a state the pod passes through quickly (Failed, then force-deleted
/// within milliseconds) is still seen.
pub struct Seen(
    tokio::sync::oneshot::Receiver<Pod>,
    tokio::task::JoinHandle<()>,
);

pub fn watch_for(api: Api<Pod>, name: &str, pred: impl Fn(&Pod) -> bool + Send + 'static) -> Seen {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, cfg).boxed();
        let mut tx = Some(tx);
        while let Some(ev) = stream.next().await {
            let pod = match ev {
                Ok(
                    watcher::Event::Apply(p)
                    | watcher::Event::InitApply(p)
                    | watcher::Event::Delete(p),
                ) => p,
                _ => continue,
            };
            if pred(&pod) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(pod);
                }
                return;
            }
        }
    });
    Seen(rx, task)
}

impl Seen {
    pub async fn wait(self, what: &str, limit: Duration) -> Result<Pod> {
        let r = tokio::time::timeout(limit, self.0).await;
        self.1.abort();
        match r {
            Ok(Ok(p)) => Ok(p),
            _ => bail!("timed out waiting for {what}"),
        }
    }
}

pub fn terminated_reason(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.reason.clone())
}

/// The value at quantile `p` of `sorted` (NaN when empty), for benchmark figures.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// (utime + stime in seconds, RSS bytes) of a process, from /proc.
pub fn usage(pid: u32) -> Result<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit(')').next().context("stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / tick;
    let rss = f[21].parse::<u64>()? * 4096;
    Ok((cpu, rss))
}

/// The HTTP status `curl` got, or `000` when the TLS handshake was refused.
pub async fn curl_status(url: &str, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(args)
        .arg(url)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .context("running curl")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Sets (`Some`) or removes (`None`) one annotation of pod `name`, as the operator does.
pub async fn annotate(pods: &Api<Pod>, name: &str, key: &str, value: Option<&str>) -> Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits up to 90 s until pod `name`'s lifecycle annotation says `want`.
pub async fn lifecycle_is(pods: &Api<Pod>, name: &str, want: &str) -> Result<Pod> {
    let limit = Duration::from_secs(90);
    until(&format!("{name} lifecycle {want}"), limit, || async {
        let p = pods.get(name).await?;
        let state = annotation(&p, "vm.cocoonstack.io/lifecycle-state");
        Ok((state.as_deref() == Some(want)).then_some(p))
    })
    .await
}

/// A managed run-mode pod `name` on `node`, its VM named `vk-<ns>-<name>`.
pub fn run_pod(ns: &str, name: &str, node: &str) -> Result<Pod> {
    pod_manifest(
        ns,
        name,
        node,
        serde_json::json!({"cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": format!("vk-{ns}-{name}"),
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"}),
    )
}

/// Waits until the daemon `d` has registered `node`; on a timeout the error carries the
/// daemon's log.
pub async fn node_registered(tb: &Testbed, d: &Daemon, node: &str, limit: Duration) -> Result<()> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(tb.client()?);
    until("node registered", limit, || async {
        Ok(nodes.get_opt(node).await?.map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))
}

/// The pool the daemons started here belong to (`VK_NODE_POOL` unset).
pub const POOL: &str = "default";

/// A pod as the operator makes it for a CocoonSet pinned to `node`: the scheduler places it by
/// the pool label and a required hostname affinity, the provider taint's toleration lets it
/// onto a cocoon node, and it tolerates the node going not-ready or unreachable forever. One
/// placeholder container `agent`, grace 1 s, and the given annotations.
pub fn pod_manifest(
    ns: &str,
    name: &str,
    node: &str,
    annotations: serde_json::Value,
) -> Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "nodeSelector": {"cocoonstack.io/pool": POOL},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "agent", "image": "ghcr.io/cocoonstack/placeholder:latest",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}],
            "tolerations": [
                {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
            ]
        }
    }))?)
}

/// The clone source the samples and tests use: snapshot `acme/agent:v1` of image `acme/base:1`.
pub fn seed_clone_snapshot(tb: &Testbed) -> Result<()> {
    let sim = tb.sim.as_ref().context("testbed without the simulator")?;
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "acme/agent:v1",
        "--image",
        "acme/base:1",
    ])?;
    Ok(())
}

/// The message of the first Warning the daemon (not the scheduler) recorded for pod `pod` in
/// `events`' namespace, with `reason` when one is given; waits up to `limit`.
pub async fn warning(
    events: &Api<k8s_openapi::api::core::v1::Event>,
    pod: &str,
    reason: Option<&str>,
    limit: Duration,
) -> Result<String> {
    let what = format!("a Warning {} for {pod}", reason.unwrap_or(""));
    until(&what, limit, || async {
        Ok(events
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.involved_object.name.as_deref() == Some(pod)
                    && reason.is_none_or(|r| e.reason.as_deref() == Some(r))
                    && !from_the_scheduler(e)
            })
            .and_then(|e| e.message))
    })
    .await
}
