//! Executors: each action becomes a call; each call's outcome returns to the loop as an event.
//! Concurrency lives here (bounded per kind); the core already guarantees one VM operation
//! per pod, so nothing here needs to know about pods.

pub mod dhcp_release;
pub mod event_lane;
pub mod fair_slots;
pub mod icmp;
#[cfg(test)]
mod kube_lanes_tests;
pub mod kube_writes;
pub mod node;
pub mod probes;
pub mod registry;
pub mod sac;
mod sac_call;
mod sac_console;
#[cfg(test)]
mod sac_fake;
#[cfg(test)]
mod sac_tests;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use reconcilers::action::{EventSource, EventType, Level, RegistryCall, SacNic};
use reconcilers::cocoon::CocoonCmd;
use reconcilers::pod::PodKey;
use reconcilers::{Action, Event, OpId, Timer};
use tokio::sync::Semaphore;

use crate::metrics::{ActionSlot, ApiWrite, Metrics};
use crate::sources::EventTx;

pub struct Executor {
    pub cocoon: crate::cocoon::CocoonCli,
    pub client: Client,
    pub tx: EventTx,
    pub probes: probes::Probes,
    pub metrics: Metrics,
    pub node_name: String,
    /// cocoon-net's control socket (D6); `None`: releases are off.
    pub dhcp_release_socket: Option<std::path::PathBuf>,
    /// The registry (`OCI_REGISTRY`); `None`: unset.
    pub transfers: Option<Arc<registry::Transfers>>,
    /// `COCOON_ROOT_DIR`: where a VM's serial console socket lives (C15).
    pub cocoon_root_dir: std::path::PathBuf,
    /// T13: shared fairly between namespaces.
    cocoon_slots: Arc<fair_slots::FairSlots>,
    /// Status writes and deletes: the writes that move pods. Events never take one (F4).
    kube_slots: Arc<Semaphore>,
    events: event_lane::EventLane,
}

impl Executor {
    pub fn new(
        cocoon: crate::cocoon::CocoonCli,
        client: Client,
        tx: EventTx,
        probes: probes::Probes,
        metrics: Metrics,
        node_name: String,
        dhcp_release_socket: Option<std::path::PathBuf>,
    ) -> Self {
        Self {
            cocoon,
            client,
            tx,
            probes,
            node_name,
            dhcp_release_socket,
            transfers: None,
            cocoon_root_dir: std::path::PathBuf::from("/var/lib/cocoon"),
            cocoon_slots: fair_slots::FairSlots::new(
                fair_slots::SLOTS,
                fair_slots::NAMESPACE_SLOTS,
            ),
            kube_slots: Arc::new(Semaphore::new(reconcilers::config::WRITE_SLOTS as usize)),
            events: event_lane::EventLane::new(metrics.events_dropped.clone()),
            metrics,
        }
    }

    /// SAC dialogs dial consoles under `root` (`COCOON_ROOT_DIR`).
    pub fn with_root_dir(mut self, root: std::path::PathBuf) -> Self {
        self.cocoon_root_dir = root;
        self
    }

    /// Registry calls go through `transfers` (built from `OCI_REGISTRY`).
    pub fn with_transfers(mut self, transfers: Option<Arc<registry::Transfers>>) -> Self {
        self.transfers = transfers;
        self
    }

    /// Runs one action. `RegisterNode` and `Fatal` are the loop's own business.
    pub fn execute(&mut self, action: Action) {
        match action {
            Action::RunCocoon { op, key, cmd } => self.run_cocoon(op, key.as_ref(), cmd),
            Action::PatchPod {
                op,
                key,
                uid,
                status,
                annotations,
            } => self.kube(op, ApiWrite::Pod, move |c| async move {
                kube_writes::patch_pod(&c, &key, &uid, status.as_ref(), &annotations).await
            }),
            Action::DeletePod {
                op,
                key,
                uid,
                grace_seconds,
            } => self.kube(op, ApiWrite::Delete, move |c| async move {
                kube_writes::delete_pod(&c, &key, &uid, grace_seconds).await
            }),
            Action::ReleaseDhcpLease { op, mac } => self.release_dhcp_lease(op, mac),
            Action::RecordEvent {
                key,
                uid,
                kind,
                reason,
                message,
                source,
            } => self.record_event(key, uid, kind, reason, message, source),
            Action::RunProbe {
                key,
                seq,
                target,
                after_ms,
                standing,
            } => self.probes.schedule(key, seq, target, after_ms, standing),
            Action::StopProbe { key } => self.probes.stop(&key),
            Action::ArmTimer { timer, after_ms } => self.arm_timer(timer, after_ms),
            Action::Count { counter } => self.metrics.count(&counter),
            Action::Observe { histogram, millis } => self.metrics.observe(&histogram, millis),
            Action::ObserveCount { histogram, count } => {
                self.metrics.observe_count(&histogram, count)
            }
            Action::RunSac {
                op,
                vm_id,
                nic_count,
                nics,
                ..
            } => self.run_sac(op, vm_id, nic_count, nics),
            Action::Log { level, message } => log(level, &message),
            Action::CallRegistry { op, key, call } => self.call_registry(op, key, call),
            // The journal line is the record; nothing else is done with it.
            Action::Hold { .. } => {}
            Action::RegisterNode | Action::Abort { .. } => {}
        }
    }

    /// A cocoon CLI call, in one of the bounded cocoon slots, its pod's namespace's (the
    /// node's own when it is no pod's).
    fn run_cocoon(&self, op: OpId, key: Option<&reconcilers::pod::PodKey>, cmd: CocoonCmd) {
        let namespace = key.map_or(String::new(), |k| k.namespace().to_string());
        let (cli, tx, slots) = (
            self.cocoon.clone(),
            self.tx.clone(),
            self.cocoon_slots.clone(),
        );
        let waited = self.waited(ActionSlot::Cocoon);
        tokio::spawn(async move {
            let _permit = slots.acquire(&namespace).await;
            waited.stop_and_record();
            let result = cli.call_in(&cmd, &namespace).await;
            let _ = tx.send(Event::CocoonDone { op, result }).await;
        });
    }

    /// A lease release through cocoon-net's control socket (D6).
    fn release_dhcp_lease(&self, op: OpId, mac: String) {
        let (socket, tx) = (self.dhcp_release_socket.clone(), self.tx.clone());
        tokio::spawn(async move {
            let result = match socket {
                Some(socket) => dhcp_release::release(&socket, &mac).await,
                None => Err("no cocoon-net control socket is configured".into()),
            };
            let _ = tx.send(Event::DhcpLeaseReleased { op, result }).await;
        });
    }

    /// A Kubernetes Event, on the event lane: it takes no kube slot (F4).
    fn record_event(
        &mut self,
        key: PodKey,
        uid: String,
        kind: EventType,
        reason: String,
        message: String,
        source: EventSource,
    ) {
        let (client, node) = (self.client.clone(), self.node_name.clone());
        self.metrics.api_write(ApiWrite::Event);
        let what = format!("{reason} on {key}");
        let kind = match kind {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        self.events.submit(what, async move {
            let event = kube_writes::PodEvent {
                key: &key,
                uid: &uid,
                kind,
                reason: &reason,
                message: &message,
                source,
            };
            kube_writes::record_event(&client, &node, &event)
                .await
                .map_err(|e| e.to_string())
        });
    }

    fn arm_timer(&self, timer: Timer, after_ms: u64) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            let _ = tx.send(Event::TimerFired { timer }).await;
        });
    }

    /// A SAC dialog on the VM's serial console (C15).
    fn run_sac(&self, op: OpId, vm_id: String, nic_count: u32, nics: Vec<SacNic>) {
        let (tx, root) = (self.tx.clone(), self.cocoon_root_dir.clone());
        let cap = self.cocoon.caps.clone();
        tokio::spawn(async move {
            let result = sac_call::run(&root, &vm_id, nic_count, &nics, &cap).await;
            let _ = tx.send(Event::SacDone { op, result }).await;
        });
    }

    /// A registry transfer through `transfers`; without a registry the call fails at once.
    fn call_registry(&self, op: OpId, key: Option<PodKey>, call: RegistryCall) {
        let (tx, transfers) = (self.tx.clone(), self.transfers.clone());
        let waited = self.waited(ActionSlot::Registry);
        tokio::spawn(async move {
            waited.stop_and_record();
            let result = match transfers {
                Some(t) => t.call(&call, key.as_ref()).await,
                None => Err(registry::not_configured(&call)),
            };
            let _ = tx.send(Event::RegistryDone { op, result }).await;
        });
    }

    /// M6: started when an action is handed over, recorded when its call starts.
    fn waited(&self, slot: ActionSlot) -> prometheus::HistogramTimer {
        self.metrics.action_waiting(slot)
    }

    fn kube<F, Fut>(&self, op: reconcilers::OpId, kind: ApiWrite, f: F)
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: std::future::Future<
                Output = Result<reconcilers::event::KubeOk, reconcilers::event::KubeError>,
            > + Send,
    {
        let (client, tx, slots) = (
            self.client.clone(),
            self.tx.clone(),
            self.kube_slots.clone(),
        );
        self.metrics.api_write(kind);
        let waited = self.waited(ActionSlot::Kube);
        tokio::spawn(async move {
            let _permit = slots.acquire_owned().await;
            waited.stop_and_record();
            let result = match tokio::time::timeout(Duration::from_secs(5), f(client)).await {
                Ok(r) => r,
                Err(_) => Err(reconcilers::event::KubeError {
                    kind: reconcilers::event::KubeErrorKind::Other,
                    message: format!("{} write timed out after 5s", kind.as_str()),
                }),
            };
            let _ = tx.send(Event::KubeDone { op, result }).await;
        });
    }
}

/// The core's log line, at its level.
fn log(level: Level, message: &str) {
    match level {
        Level::Info => tracing::info!("{message}"),
        Level::Warn => tracing::warn!("{message}"),
        Level::Error => tracing::error!("{message}"),
    }
}
