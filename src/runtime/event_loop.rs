//! The loop: one event at a time is reduced against the State, journaled with its actions,
//! and only then are the actions executed. It owns everything it started, and stops it all
//! when it ends (N18).

use anyhow::Result;
use kube::Client;
use reconcilers::{reduce_touching, Action, Envelope, Event, State};
use tokio::task::JoinHandle;

use super::{now_ms, register, Evidence, Settings, Shutdown};
use crate::effects::Executor;
use crate::metrics::Metrics;
use crate::sources::{cocoon_stream, EventRx, EventTx};
use crate::views;

pub(super) struct Loop {
    settings: Settings,
    client: Client,
    tx: EventTx,
    metrics: Metrics,
    exec: Executor,
    tasks: Vec<JoinHandle<()>>,
    state: State,
    evidence: Option<Evidence>,
    publisher: views::Publisher,
    seq: u64,
}

impl Loop {
    pub(super) fn new(
        settings: Settings,
        client: Client,
        tx: EventTx,
        metrics: Metrics,
        exec: Executor,
        tasks: Vec<JoinHandle<()>>,
        views: views::Views,
    ) -> Self {
        let state = State::new(settings.core.clone());
        // F3: a journal that cannot be opened is logged and retried, never fatal.
        let evidence = settings.journal.clone().map(|j| {
            Evidence::start(
                j,
                &settings.core,
                &state,
                metrics.journal.clone(),
                tokio::time::Instant::now(),
            )
        });
        Self {
            settings,
            client,
            tx,
            metrics,
            exec,
            tasks,
            state,
            evidence,
            publisher: views::Publisher::new(views),
            seq: 0,
        }
    }

    /// Until the queue closes, a signal comes or the core aborts; then stops what was started.
    pub(super) async fn run(mut self, mut rx: EventRx, shutdown: &mut Shutdown) -> Result<()> {
        let result = loop {
            let retry_at = self.evidence.as_ref().and_then(Evidence::retry_at);
            let event = tokio::select! {
                ev = rx.recv() => match ev { Some(ev) => ev, None => break Ok(()) },
                signal = shutdown.requested() => {
                    tracing::info!(signal, "shutting down; VMs keep running");
                    break Ok(());
                }
                // A down journal is tried again on time even when no event comes.
                () = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)),
                    if retry_at.is_some() => {
                    if let Some(e) = self.evidence.as_mut() {
                        e.retry(&self.state, self.seq, tokio::time::Instant::now());
                    }
                    continue;
                }
            };
            if let Some(message) = self.step(event) {
                break Err(anyhow::anyhow!(message));
            }
        };
        self.stop().await;
        result
    }

    /// One event: reduced, journaled, its actions executed. Returns the core's abort message.
    fn step(&mut self, event: Event) -> Option<String> {
        self.seq += 1;
        let envelope = Envelope {
            seq: self.seq,
            at: now_ms(),
            event,
        };
        let reducing = std::time::Instant::now();
        let (actions, touched) = reduce_touching(&mut self.state, envelope.clone());
        let took = reducing.elapsed();
        self.metrics.reduce_duration.observe(took.as_secs_f64());
        if let Some(e) = self.evidence.as_mut() {
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            e.record(
                &envelope,
                &actions,
                us,
                &self.state,
                tokio::time::Instant::now(),
            );
        }
        // INV-7: the node's API serves what the step changed before the cluster hears of it.
        self.publisher.step(&self.state, &touched, &actions);
        let mut fatal = None;
        for action in actions {
            match action {
                Action::Abort { message } => fatal = Some(message),
                Action::RegisterNode => self.register_node(),
                other => self.exec.execute(other),
            }
        }
        self.metrics
            .vm_table_size
            .set(self.state.vm_ids.len() as f64);
        fatal
    }

    /// The node's registration (then its heartbeat and Lease) and the VM event stream.
    fn register_node(&mut self) {
        let s = &self.settings;
        self.tasks.push(tokio::spawn(register(
            self.client.clone(),
            s.node.clone(),
            self.tx.clone(),
            self.metrics.lease.clone(),
        )));
        self.tasks.push(tokio::spawn(cocoon_stream::run(
            s.cocoon.clone(),
            self.tx.clone(),
        )));
    }

    /// N18: stop everything we started; VMs keep running. A cocoon call still running is
    /// killed with everything it started; what a finished call left (a VM) is not ours.
    async fn stop(mut self) {
        self.exec.probes.stop_all();
        let killed = self.settings.cocoon.groups.kill_all();
        if killed > 0 {
            tracing::info!("killed {killed} cocoon process group(s) still running");
        }
        for t in self.tasks {
            t.abort();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
