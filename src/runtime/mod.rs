//! The daemon: sources feed one loop that owns the core's State; every event is reduced,
//! journaled with its actions, and only then are the actions executed.

mod event_loop;
mod evidence;
mod settings;
mod shutdown;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::Client;
use reconcilers::cocoon::CocoonCmd;
use reconcilers::event::CocoonOk;
use reconcilers::Event;

use crate::cocoon::CocoonCli;
use crate::effects::node::{self, NodeSettings};
use crate::effects::probes::{Pinger, Probes};
use crate::effects::Executor;
use crate::journal::JournalSettings;
use crate::metrics::{self, Metrics};
use crate::sources::{dhcp_leases, pods};
use crate::views;

pub use evidence::Evidence;
pub use shutdown::Shutdown;

pub struct Settings {
    pub core: reconcilers::Config,
    pub node: NodeSettings,
    pub cocoon: CocoonCli,
    pub dhcp_leases_path: PathBuf,
    pub metrics_addr: Option<SocketAddr>,
    pub journal: Option<JournalSettings>,
    pub cgroup_parent: String,
    pub root_dir: String,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// The kubelet API listens on this address only (`VK_NODE_IP`).
    pub node_ip: std::net::IpAddr,
    /// `VK_CLIENT_CA_FILE`.
    pub client_ca_file: Option<PathBuf>,
    /// `VK_KUBELET_ANONYMOUS`.
    pub kubelet_anonymous: bool,
    /// K4: an exec session in which nothing moves either way this long ends.
    pub exec_idle: std::time::Duration,
    pub dhcp_release_socket: Option<PathBuf>,
    /// `OCI_REGISTRY`.
    pub registry: Option<String>,
    pub staging_dir: PathBuf,
    /// `VK_COCOON_SNAPSHOT_DIR`: cocoon's local snapshot store, served to peers.
    pub snapshot_dir: PathBuf,
    /// `VK_PEER_ADDR`.
    pub peer_addr: SocketAddr,
    /// K7.1: `None` keeps the peer API off and every wake on the registry.
    pub peer_tls: Option<crate::config::PeerTls>,
    pub snapshot: crate::config::SnapshotTransfer,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub async fn run(mut settings: Settings) -> Result<()> {
    // First, so a signal that comes during startup is not lost either.
    let mut shutdown = Shutdown::listen()?;
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (set KUBECONFIG or run in-cluster)")?;
    let staging_dir = staging_dir(&settings)?;
    // N19: never another node's name.
    node::refuse_foreign(&client, &settings.node.name).await?;
    sweep_staging(&settings, &staging_dir);
    let (tx, rx) = crate::sources::event_queue();
    let metrics = Metrics::new();
    settings.cocoon.caps = metrics.cap_count();
    // CLI-10: before the kubelet API and the loop take their copies of the client, and before
    // the core's configuration is journaled.
    settings.cocoon.verbs = crate::cocoon::tier::detect(&settings.cocoon).await;
    settings.core.cocoon = settings.cocoon.verbs;
    let peer = serve_peers(&settings, &client, &metrics)?;
    metrics.watch_event_queue(&tx);
    if settings.journal.is_some() {
        metrics.enable_journal();
    }
    let views = views::Views::default();
    let sampler = std::sync::Arc::new(crate::stats::Sampler::new(
        views.clone(),
        &settings.cgroup_parent,
        &settings.root_dir,
    ));
    metrics.attach(std::sync::Arc::new(
        crate::stats_collector::StatsCollector::new(sampler.clone()),
    ));
    serve_kubelet(&settings, &client, views.clone(), sampler, &metrics)?;
    if let Some(addr) = settings.metrics_addr {
        metrics::spawn_server(addr, metrics.clone())?;
    }
    let pinger = Pinger::open();
    metrics
        .probe_degraded
        .set(if pinger.degraded() { 1.0 } else { 0.0 });
    let probes = Probes::new(pinger, tx.clone(), metrics.clone());
    let exec = Executor::new(
        settings.cocoon.clone(),
        client.clone(),
        tx.clone(),
        probes,
        metrics.clone(),
        settings.node.name.clone(),
        settings.dhcp_release_socket.clone(),
    )
    .with_transfers(transfers(
        &settings,
        &client,
        &staging_dir,
        (peer, views.objects.clone()),
    )?)
    .with_root_dir(settings.root_dir.clone().into());
    // T11: the holder records are the core's first event, before any source can send one.
    let _ = tx.send(restore_holders(&settings)).await;
    // T16: every namespace's UID before the pod relist, so the startup claim has them.
    let mut seen = crate::sources::namespaces::Seen::default();
    crate::sources::namespaces::first_list(&client, &tx, &mut seen).await;
    let objects = pods::Objects::new(views.objects.clone());
    let mut tasks = start_sources(&settings, &client, &tx, objects);
    tasks.push(tokio::spawn(crate::sources::namespaces::run(
        client.clone(),
        tx.clone(),
        seen,
    )));
    let daemon = event_loop::Loop::new(settings, client, tx, metrics, exec, tasks, views);
    daemon.run(rx, &mut shutdown).await
}

/// T11: the VM holder records the journal holds, as the event that hands them to the core.
fn restore_holders(settings: &Settings) -> Event {
    let Some(journal) = &settings.journal else {
        tracing::warn!(
            "the journal is off (VK_JOURNAL_PATH is empty), so which pod holds each VM is not \
             kept across restarts: after one, a VM that pods of two namespaces name is handed \
             to neither"
        );
        return Event::HoldersRestored {
            holders: Default::default(),
            problem: Some("the journal is off".into()),
        };
    };
    let started = std::time::Instant::now();
    let back = crate::journal::holders::read_back(journal);
    tracing::info!(
        records = back.holders.len(),
        steps = back.steps,
        took_ms = started.elapsed().as_millis() as u64,
        journal = %journal.path.display(),
        "VM holder records read back from the journal"
    );
    if let Some(problem) = &back.problem {
        tracing::warn!(%problem, "the journal could not be read to its end; holder records may be incomplete");
    }
    Event::HoldersRestored {
        holders: back.holders,
        problem: back.problem,
    }
}

/// `VK_STAGING_DIR`, created if missing. Staged copies are cloned with `--from-dir`, which
/// must resolve to itself (T4): the directory is used by its real path.
fn staging_dir(settings: &Settings) -> Result<PathBuf> {
    std::fs::create_dir_all(&settings.staging_dir).with_context(|| {
        format!(
            "creating the staging directory {} (VK_STAGING_DIR)",
            settings.staging_dir.display()
        )
    })?;
    std::fs::canonicalize(&settings.staging_dir).with_context(|| {
        format!(
            "resolving VK_STAGING_DIR {}",
            settings.staging_dir.display()
        )
    })
}

/// B10: what a killed process left half-staged is never a source, so it goes before anything
/// can look at it.
fn sweep_staging(settings: &Settings, staging_dir: &std::path::Path) {
    match crate::peer::sweep_staging(staging_dir) {
        Ok((0, _)) => {}
        Ok((n, bytes)) => tracing::info!(
            dir = %settings.staging_dir.display(),
            "removed {n} stale staging entries ({} MiB)",
            bytes / (1 << 20)
        ),
        Err(e) => tracing::warn!(
            dir = %settings.staging_dir.display(),
            error = %e,
            "could not sweep the staging directory (VK_STAGING_DIR)"
        ),
    }
}

/// The kubelet API on `VK_NODE_IP`. K1: a certificate that cannot be loaded is fatal, before
/// anything registers; so is a client CA that cannot (K9).
fn serve_kubelet(
    settings: &Settings,
    client: &Client,
    views: views::Views,
    sampler: std::sync::Arc<crate::stats::Sampler>,
    metrics: &Metrics,
) -> Result<()> {
    let tls = crate::kubelet::tls::server_config(
        &settings.tls_cert,
        &settings.tls_key,
        settings.client_ca_file.as_deref(),
        &settings.node.name,
        &settings.node.ip,
    )
    .context("kubelet API TLS (VK_TLS_CERT / VK_TLS_KEY / VK_CLIENT_CA_FILE)")?;
    let guard = crate::kubelet::auth::Guard::new(
        client.clone(),
        settings.node.name.clone(),
        settings.client_ca_file.is_some(),
        settings.kubelet_anonymous,
        metrics.clone(),
    );
    guard.announce();
    crate::kubelet::spawn(
        SocketAddr::new(settings.node_ip, settings.node.kubelet_port),
        tls,
        guard,
        crate::kubelet::Ctx {
            views,
            cocoon: settings.cocoon.clone(),
            sampler,
            node: settings.node.name.clone(),
            started: k8s_openapi::jiff::Timestamp::now().to_string(),
            log_streams: crate::kubelet::log_streams(metrics.cap_count()),
            streams: crate::kubelet::streams(metrics.cap_count()),
            exec_idle: settings.exec_idle,
            metrics: metrics.clone(),
        },
    )
}

/// K7.1, K7.2: the peer API, only with node credentials; what restores dial peers with, if any.
/// A listener that cannot bind or credentials that cannot be loaded are fatal. K7.4: `client`
/// is how it learns which node wakes a pod.
fn serve_peers(
    settings: &Settings,
    client: &Client,
    metrics: &Metrics,
) -> Result<Option<crate::effects::registry::PeerAccess>> {
    let Some(t) = &settings.peer_tls else {
        tracing::warn!(
            "peer API off: set VK_PEER_CA_FILE (the cluster CA) and VK_PEER_CERT (a node \
             certificate: O=system:nodes, CN=system:node:<name>, e.g. the kubelet's \
             kubelet-client-current.pem) to serve and use peer restores; hibernated VMs wake \
             from the registry meanwhile"
        );
        return Ok(None);
    };
    let what = "peer API credentials (VK_PEER_CA_FILE / VK_PEER_CERT / VK_PEER_KEY)";
    let tls = crate::peer::NodeTls::load(t).context(what)?;
    let dial = std::sync::Arc::new(tls.client_config().context(what)?);
    let counters = crate::peer::PeerCounters::new();
    metrics
        .register(counters.collector())
        .context("registering the peer refusal counter")?;
    crate::peer::spawn(
        settings.peer_addr,
        settings.snapshot_dir.clone(),
        settings.cocoon.clone(),
        client.clone(),
        &tls,
        crate::peer::Counting {
            metrics: metrics.clone(),
            peer: counters.clone(),
        },
    )?;
    tracing::info!(
        addr = %settings.peer_addr,
        identity = %tls.node,
        "peer API serving other nodes over mutual TLS"
    );
    // K7.4: peers serve a wake only to the host whose certificate speaks for the pod's Node.
    if !crate::peer::acts_as(&tls.node, &settings.node.name) {
        tracing::warn!(
            identity = %tls.node,
            node = %settings.node.name,
            "VK_NODE_NAME is neither the certificate's node nor <node>-cocoon: peers will \
             refuse this node's wakes, which pull from the registry instead"
        );
    }
    Ok(Some(crate::effects::registry::PeerAccess {
        tls: dial,
        counters,
    }))
}

/// The pod watch's objects by pod key.
type WatchedPods = std::sync::Arc<dashmap::DashMap<String, crate::sources::pods::StoredPod>>;

/// Registry transfers (`OCI_REGISTRY`), with peer restores; `None` while it is unset.
fn transfers(
    settings: &Settings,
    client: &Client,
    staging_dir: &std::path::Path,
    (access, pods): (Option<crate::effects::registry::PeerAccess>, WatchedPods),
) -> Result<Option<std::sync::Arc<crate::effects::registry::Transfers>>> {
    let Some(base) = &settings.registry else {
        return Ok(None);
    };
    let transfers = crate::effects::registry::Transfers::new(
        base,
        staging_dir,
        &settings.snapshot,
        settings.cocoon.clone(),
        settings.node.name.clone(),
        (
            crate::effects::registry::Peers {
                client: client.clone(),
                pods,
                port: settings.peer_addr.port(),
                staging: staging_dir.to_path_buf(),
                limiter: crate::peer::Limiter::per_node(),
                access,
            },
            settings.core.public_snapshots.clone().unwrap_or_default(),
        ),
    )
    .with_context(|| format!("OCI_REGISTRY={base:?}"))?;
    Ok(Some(std::sync::Arc::new(transfers)))
}

/// The sources that run from the start: the pod watch, the DHCP leases and (B1) the VM
/// inventory, listed concurrently with the pods.
fn start_sources(
    settings: &Settings,
    client: &Client,
    tx: &crate::sources::EventTx,
    objects: pods::Objects,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (cli, list_tx) = (settings.cocoon.clone(), tx.clone());
    vec![
        crate::heap::spawn_trimmer(),
        tokio::spawn(pods::run(
            client.clone(),
            settings.node.name.clone(),
            tx.clone(),
            objects,
        )),
        tokio::spawn(dhcp_leases::run(
            settings.dhcp_leases_path.clone(),
            tx.clone(),
        )),
        tokio::spawn(async move {
            let event = match cli.call(&CocoonCmd::VmList).await {
                Ok(CocoonOk::Vms { vms }) => Event::VmListed { vms },
                Ok(_) => unreachable!("vm list decodes to Vms"),
                Err(error) => Event::VmListFailed { error },
            };
            let _ = list_tx.send(event).await;
        }),
    ]
}

async fn register(
    client: Client,
    s: NodeSettings,
    tx: crate::sources::EventTx,
    lease: metrics::LeaseRenewals,
) {
    let mut backoff = node::RENEW_RETRY;
    loop {
        match node::register(&client, &s).await {
            Ok(uid) => {
                tracing::info!(node = %s.name, "node registered");
                let _ = tx.send(Event::NodeRegistered).await;
                node::heartbeat(client, s, uid, lease).await;
                return;
            }
            Err(e) => {
                let backoff = backoff.failed();
                tracing::warn!(error = %e, ?backoff, "node registration failed; retrying");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}
