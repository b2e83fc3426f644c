//! The daemon: sources feed one loop that owns the core's State; every event is reduced,
//! journaled with its actions, and only then are the actions executed.

mod evidence;
mod settings;
mod shutdown;
pub mod views;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use kube::Client;
use reconcilers::cocoon::CocoonCmd;
use reconcilers::event::CocoonOk;
use reconcilers::{reduce, Action, Envelope, Event, State};

use crate::effects::cocoon::CocoonCli;
use crate::effects::node::{self, NodeSettings};
use crate::effects::probes::{Pinger, Probes};
use crate::effects::Executor;
use crate::journal::JournalSettings;
use crate::metrics::{self, Metrics};
use crate::sources::{cocoon_stream, dhcp_leases, pods};

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
    pub snapshot: crate::config::SnapshotTransfer,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub async fn run(settings: Settings) -> Result<()> {
    // First, so a signal that comes during startup is not lost either.
    let mut shutdown = Shutdown::listen()?;
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (set KUBECONFIG or run in-cluster)")?;
    // Staged copies are cloned with `--from-dir`, which must resolve to itself (T4): the
    // directory is used by its real path.
    std::fs::create_dir_all(&settings.staging_dir).with_context(|| {
        format!(
            "creating the staging directory {} (VK_STAGING_DIR)",
            settings.staging_dir.display()
        )
    })?;
    let staging_dir = std::fs::canonicalize(&settings.staging_dir).with_context(|| {
        format!(
            "resolving VK_STAGING_DIR {}",
            settings.staging_dir.display()
        )
    })?;
    // N19: never another node's name.
    node::refuse_foreign(&client, &settings.node.name).await?;
    // B10: what a killed process left half-staged is never a source, so it goes before anything
    // can look at it.
    match crate::peer::sweep_staging(&staging_dir) {
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
    // K7: a peer API that cannot listen is fatal, like every listener.
    crate::peer::spawn(
        settings.peer_addr,
        settings.snapshot_dir.clone(),
        settings.cocoon.clone(),
    )?;
    let (tx, mut rx) = crate::sources::event_queue();
    let metrics = Metrics::new();
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
    metrics
        .registry
        .register(Box::new(crate::stats_collector::StatsCollector::new(
            sampler.clone(),
        )))
        .context("registering the VM stats collector")?;
    // K1: a certificate that cannot be loaded is fatal, before anything registers; so is a
    // client CA that cannot (K9).
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
    );
    guard.announce();
    crate::kubelet::spawn(
        SocketAddr::new(settings.node_ip, settings.node.kubelet_port),
        tls,
        guard,
        crate::kubelet::Ctx {
            views: views.clone(),
            cocoon: settings.cocoon.clone(),
            sampler,
            node: settings.node.name.clone(),
            started: k8s_openapi::jiff::Timestamp::now().to_string(),
            log_streams: crate::kubelet::log_streams(),
            streams: crate::kubelet::streams(),
            exec_idle: settings.exec_idle,
        },
    )?;
    if let Some(addr) = settings.metrics_addr {
        metrics::spawn_server(addr, metrics.clone())?;
    }
    let pinger = Pinger::open();
    metrics
        .probe_degraded
        .set(if pinger.degraded() { 1.0 } else { 0.0 });
    let probes = Probes::new(pinger, tx.clone(), metrics.clone());
    let transfers = match &settings.registry {
        Some(base) => Some(std::sync::Arc::new(
            crate::effects::registry::Transfers::new(
                base,
                &staging_dir,
                &settings.snapshot,
                settings.cocoon.clone(),
                settings.node.name.clone(),
                crate::effects::registry::Peers {
                    client: client.clone(),
                    port: settings.peer_addr.port(),
                    staging: staging_dir.clone(),
                    limiter: crate::peer::Limiter::per_node(),
                },
            )
            .with_context(|| format!("OCI_REGISTRY={base:?}"))?,
        )),
        None => None,
    };
    let mut exec = Executor::new(
        settings.cocoon.clone(),
        client.clone(),
        tx.clone(),
        probes,
        metrics.clone(),
        settings.node.name.clone(),
        settings.dhcp_release_socket.clone(),
    )
    .with_transfers(transfers)
    .with_root_dir(settings.root_dir.clone().into());

    let mut tasks = vec![
        tokio::spawn(pods::run(
            client.clone(),
            settings.node.name.clone(),
            tx.clone(),
        )),
        tokio::spawn(dhcp_leases::run(
            settings.dhcp_leases_path.clone(),
            tx.clone(),
        )),
    ];
    // B1: the VM inventory, listed concurrently with the pods.
    {
        let (cli, tx) = (settings.cocoon.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let event = match cli.call(&CocoonCmd::VmList).await {
                Ok(CocoonOk::Vms { vms }) => Event::VmListed { vms },
                Ok(_) => unreachable!("vm list decodes to Vms"),
                Err(error) => Event::VmListFailed { error },
            };
            let _ = tx.send(event).await;
        }));
    }

    let mut state = State::new(settings.core.clone());
    // F3: a journal that cannot be opened is logged and retried, never fatal.
    let mut evidence = settings.journal.clone().map(|j| {
        Evidence::start(
            j,
            &settings.core,
            &state,
            metrics.journal.clone(),
            tokio::time::Instant::now(),
        )
    });
    let mut publisher = views::Publisher::new(views.clone());
    let mut seq = 0u64;
    let result = loop {
        let retry_at = evidence.as_ref().and_then(Evidence::retry_at);
        let publish_at = publisher.due().map(tokio::time::Instant::from_std);
        let event = tokio::select! {
            ev = rx.recv() => match ev { Some(ev) => ev, None => break Ok(()) },
            signal = shutdown.requested() => {
                tracing::info!(signal, "shutting down; VMs keep running");
                break Ok(());
            }
            // A down journal is tried again on time even when no event comes.
            () = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)),
                if retry_at.is_some() => {
                if let Some(e) = evidence.as_mut() {
                    e.retry(&state, seq, tokio::time::Instant::now());
                }
                continue;
            }
            () = tokio::time::sleep_until(publish_at.unwrap_or_else(tokio::time::Instant::now)),
                if publish_at.is_some() => {
                publisher.publish(&state);
                continue;
            }
        };
        seq += 1;
        let envelope = Envelope {
            seq,
            at: now_ms(),
            event,
        };
        let reducing = std::time::Instant::now();
        let actions = reduce(&mut state, envelope.clone());
        let took = reducing.elapsed();
        metrics.reduce_duration.observe(took.as_secs_f64());
        if let Some(e) = evidence.as_mut() {
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            e.record(&envelope, &actions, us, &state, tokio::time::Instant::now());
        }
        let mut fatal = None;
        for action in actions {
            match action {
                Action::Abort { message } => fatal = Some(message),
                Action::RegisterNode => {
                    tasks.push(tokio::spawn(register(
                        client.clone(),
                        settings.node.clone(),
                        tx.clone(),
                        metrics.lease.clone(),
                    )));
                    tasks.push(tokio::spawn(cocoon_stream::run(
                        settings.cocoon.clone(),
                        tx.clone(),
                    )));
                }
                other => exec.execute(other),
            }
        }
        metrics.vm_table_size.set(state.vm_ids.len() as f64);
        publisher.maybe_publish(&state);
        if let Some(message) = fatal {
            break Err(anyhow::anyhow!(message));
        }
    };
    // N18: stop everything we started; VMs keep running. A cocoon call still running is
    // killed with everything it started; what a finished call left (a VM) is not ours.
    exec.probes.stop_all();
    let killed = settings.cocoon.groups.kill_all();
    if killed > 0 {
        tracing::info!("killed {killed} cocoon process group(s) still running");
    }
    for t in tasks {
        t.abort();
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    result
}

async fn register(
    client: Client,
    s: NodeSettings,
    tx: crate::sources::EventTx,
    lease: metrics::LeaseRenewals,
) {
    let mut backoff = std::time::Duration::from_millis(200);
    loop {
        match node::register(&client, &s).await {
            Ok(uid) => {
                tracing::info!(node = %s.name, "node registered");
                let _ = tx.send(Event::NodeRegistered).await;
                node::heartbeat(client, s, uid, lease).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, ?backoff, "node registration failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(7));
            }
        }
    }
}
