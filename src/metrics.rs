//! vk-cocoon's own Prometheus metrics (M3, prefix `cocoon_vk_`). Counters and the waits the
//! core decides arrive as `Action::Count`/`Observe`; the shell measures only what the core
//! cannot see: probe time, the reduce call, an action's wait for its slot, the Lease (M6).

mod families;
pub mod labels;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
    TextEncoder,
};
use reconcilers::action::{CountHistogram, Counter, Histogram as CoreHistogram};

use families::{CoreCounters, CoreHistograms, Reg, ShellFamilies};
pub use labels::{ActionSlot, ApiWrite, Cap, DropReason, HibernatePhase, Outcome, PostCloneKind};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Every family registered, series or not (`families`).
    names: Arc<Mutex<BTreeSet<String>>>,
    core: CoreCounters,
    times: CoreHistograms,
    pub probe_duration: Histogram,
    pub vm_table_size: Gauge,
    pub unexpected_outcome: IntCounter,
    pub probe_degraded: Gauge,
    /// By `kind` ([`ApiWrite`]).
    pub api_writes: IntCounterVec,
    /// F4: Kubernetes Events not delivered, by `reason` ([`DropReason`]).
    pub events_dropped: IntCounterVec,
    /// What each cap on a tenant's or caller's spending refused or cut, by `cap` ([`Cap`]).
    pub cap_refusals: IntCounterVec,
    /// M4: registered only while a journal is configured (`enable_journal`), so a node that
    /// runs without one on purpose shows no journal series and raises no journal alert.
    pub journal: JournalMetrics,
    /// M6: one `reduce` call, event in to actions out.
    pub reduce_duration: Histogram,
    /// M6: an action handed to the executor until its call starts, by `kind` ([`ActionSlot`]).
    pub action_wait: HistogramVec,
    pub lease: LeaseRenewals,
    /// Families that render themselves (the VM stats), appended to each scrape as text.
    rendered: Arc<Mutex<Vec<Arc<dyn Rendered>>>>,
}

/// A source of families that keeps its own exposition text, so a scrape copies it rather than
/// rebuilding thousands of series: the VM stats change only when the shared sample does.
pub trait Rendered: Send + Sync {
    /// The families' names, listed by [`Metrics::families`].
    fn names(&self) -> Vec<String>;
    /// The text exposition of the families as of now.
    fn text(&self) -> Arc<str>;
}

/// M6: the node Lease's successful renewals: the interval between two, and the age of the
/// last one, read at scrape time so a renew loop that is stuck shows it growing.
#[derive(Clone)]
pub struct LeaseRenewals {
    interval: Histogram,
    last: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl LeaseRenewals {
    pub fn renewed(&self) {
        let now = std::time::Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = last.replace(now) {
            self.interval
                .observe(now.duration_since(prev).as_secs_f64());
        }
    }
}

/// The age of the last renewal; no series before the first.
struct LeaseAge {
    last: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    gauge: Gauge,
}

impl Collector for LeaseAge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Some(last) = last else { return Vec::new() };
        self.gauge.set(last.elapsed().as_secs_f64());
        self.gauge.collect()
    }
}

/// M4: the journal's health.
#[derive(Clone)]
pub struct JournalMetrics {
    pub up: IntGauge,
    pub write_errors: IntCounter,
    pub records_dropped: IntCounter,
}

impl JournalMetrics {
    fn new() -> Self {
        Self {
            up: IntGauge::new(
                "cocoon_vk_journal_up",
                "1 while the journal is being written, 0 while it cannot be (VK_JOURNAL_PATH)",
            )
            .expect("valid metric"),
            write_errors: IntCounter::new(
                "cocoon_vk_journal_write_errors_total",
                "Failed attempts to write the journal: a step that could not be written, or an open that failed",
            )
            .expect("valid metric"),
            records_dropped: IntCounter::new(
                "cocoon_vk_journal_records_dropped_total",
                "Reduce steps (an event and its actions) that were not journaled",
            )
            .expect("valid metric"),
        }
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Reg::default();
        let core = CoreCounters::register(&r);
        let times = CoreHistograms::register(&r);
        let shell = ShellFamilies::register(&r);
        let lease = LeaseRenewals {
            interval: shell.lease_interval,
            last: Default::default(),
        };
        r.register(Box::new(LeaseAge {
            last: lease.last.clone(),
            gauge: Gauge::new(
                "cocoon_vk_lease_renew_age_seconds",
                "Seconds since the node Lease was last renewed (absent before the first renewal)",
            )
            .expect("valid metric"),
        }))
        .expect("unique metric");
        Self {
            unexpected_outcome: core.unexpected_outcome.clone(),
            core,
            times,
            probe_duration: shell.probe_duration,
            vm_table_size: shell.vm_table_size,
            probe_degraded: shell.probe_degraded,
            api_writes: shell.api_writes,
            events_dropped: shell.events_dropped,
            cap_refusals: shell.cap_refusals,
            journal: JournalMetrics::new(),
            reduce_duration: shell.reduce_duration,
            action_wait: shell.action_wait,
            lease,
            registry: r.registry,
            names: r.names,
            rendered: Default::default(),
        }
        .zeroed()
    }

    /// M6: the outcome series a dashboard and its alerts rate over exist at 0 from the start,
    /// so a node where nothing has failed yet shows a flat line rather than no data, and a
    /// first failure is a rise a `rate` can see. Each label value comes from its enum's `ALL`.
    fn zeroed(self) -> Self {
        for c in labels::zeroed_counters() {
            self.series(&c);
        }
        for h in labels::zeroed_count_histograms() {
            self.count_series(&h);
        }
        for reason in DropReason::ALL {
            self.events_dropped.with_label_values(&[reason.as_str()]);
        }
        for cap in Cap::ALL {
            self.cap_refusals.with_label_values(&[cap.as_str()]);
        }
        self
    }

    /// Registers a collector of the shell's own (the VM stats), so it is scraped and listed.
    pub fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        self.reg().register(c)
    }

    /// Adds families that render themselves (the VM stats) to every scrape.
    pub fn attach(&self, r: Arc<dyn Rendered>) {
        let mut known = self.names.lock().unwrap_or_else(|e| e.into_inner());
        known.extend(r.names());
        drop(known);
        self.rendered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
    }

    fn reg(&self) -> Reg {
        Reg {
            registry: self.registry.clone(),
            names: self.names.clone(),
        }
    }

    /// The name of every family registered, including those without a series yet (a
    /// labelled family before its first count, the Lease age before the first renewal).
    pub fn families(&self) -> BTreeSet<String> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One write to the Kubernetes API.
    pub fn api_write(&self, kind: ApiWrite) {
        self.api_writes.with_label_values(&[kind.as_str()]).inc();
    }

    /// The handle a cap's enforcer counts its refusals with.
    pub fn cap_count(&self) -> crate::caps::CapCount {
        crate::caps::CapCount::new(self.cap_refusals.clone())
    }

    /// A cap refused or cut something (a connection, a stream, a review, bytes).
    pub fn cap_refused(&self, cap: Cap) {
        self.cap_refusals.with_label_values(&[cap.as_str()]).inc();
    }

    /// M6: started when an action is handed over, recorded when its call starts.
    pub fn action_waiting(&self, slot: ActionSlot) -> prometheus::HistogramTimer {
        self.action_wait
            .with_label_values(&[slot.as_str()])
            .start_timer()
    }

    /// Exposes the journal's series (M4); once, when a journal is configured.
    pub fn enable_journal(&self) {
        for c in [
            Box::new(self.journal.up.clone()) as Box<dyn Collector>,
            Box::new(self.journal.write_errors.clone()),
            Box::new(self.journal.records_dropped.clone()),
        ] {
            self.register(c).expect("unique metric");
        }
    }

    /// Exposes how many events wait in the loop's queue (M5), read at each scrape from the
    /// queue itself, so a loop that is stuck still shows its queue growing.
    pub fn watch_event_queue(&self, tx: &crate::sources::EventTx) {
        let c = QueueDepth {
            tx: tx.downgrade(),
            gauge: IntGauge::new(
                "cocoon_vk_event_queue_depth",
                "Events waiting in the loop's queue (its capacity: sources::EVENT_QUEUE)",
            )
            .expect("valid metric"),
        };
        self.register(Box::new(c)).expect("unique metric");
    }

    pub fn count(&self, c: &Counter) {
        self.series(c).inc()
    }

    /// The one series a core counter moves, created at 0 if it is not there yet.
    fn series(&self, c: &Counter) -> IntCounter {
        let core = &self.core;
        match c {
            Counter::PodLifecycle { op, result, reason } => core
                .pod_lifecycle
                .with_label_values(&[op.as_str(), result.as_str(), reason.as_str()]),
            Counter::OrphanVm => core.orphan_vm.clone(),
            Counter::SnapshotKept => core.snapshot_kept.clone(),
            Counter::VmInspectTransientFail => core.inspect_transient.clone(),
            Counter::PodEvictFailure => core.evict_failure.clone(),
            Counter::ReconcileAdoptByName => core.adopt_by_name.clone(),
            Counter::StaleCreateReconcile { outcome } => {
                core.stale_create.with_label_values(&[outcome.as_str()])
            }
            Counter::WakeIpWait { result } => {
                core.wake_ip_wait.with_label_values(&[result.as_str()])
            }
            Counter::SnapshotPull { result } => {
                core.snapshot_pull.with_label_values(&[result.as_str()])
            }
            Counter::CloneFromDir { result } => {
                core.clone_from_dir.with_label_values(&[result.as_str()])
            }
            Counter::StartupResume { op } => core.startup_resume.with_label_values(&[op.as_str()]),
            Counter::LeaseRelease { result } => {
                core.lease_release.with_label_values(&[result.as_str()])
            }
            Counter::UnexpectedOutcome => self.unexpected_outcome.clone(),
            Counter::SnapshotSave { result } => {
                core.snapshot_save.with_label_values(&[result.as_str()])
            }
            Counter::SnapshotPush { result } => {
                core.snapshot_push.with_label_values(&[result.as_str()])
            }
            Counter::Hibernate { phase, result } => core
                .hibernate
                .with_label_values(&[phase.as_str(), result.as_str()]),
            Counter::Wake { result } => core.wake.with_label_values(&[result.as_str()]),
            Counter::SnapshotVerify { result } => {
                core.snapshot_verify.with_label_values(&[result.as_str()])
            }
            Counter::HibernateEvidence { verdict } => core
                .hibernate_evidence
                .with_label_values(&[verdict.as_str()]),
            Counter::SnapshotPeerRestore { result } => {
                core.peer_restore.with_label_values(&[result.as_str()])
            }
            Counter::WakeRenewNudge { result } => {
                core.wake_renew_nudge.with_label_values(&[result.as_str()])
            }
            Counter::PostClone { kind, result } => core
                .postclone
                .with_label_values(&[kind.as_str(), result.as_str()]),
        }
    }

    pub fn observe(&self, h: &CoreHistogram, millis: u64) {
        match h {
            CoreHistogram::VmBootDuration { mode, backend } => self
                .times
                .boot_duration
                .with_label_values(&[mode, backend])
                .observe(millis as f64 / 1000.0),
            CoreHistogram::SnapshotSaveDuration => {
                self.times.save_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPushDuration => {
                self.times.push_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPullDuration => {
                self.times.pull_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPeerRestoreDuration => self
                .times
                .peer_restore_duration
                .observe(millis as f64 / 1000.0),
            CoreHistogram::PodStartup { stage } => self
                .times
                .pod_startup
                .with_label_values(&[stage.as_str()])
                .observe(millis as f64 / 1000.0),
            CoreHistogram::VmEventToStatus => {
                self.times.vm_event_status.observe(millis as f64 / 1000.0)
            }
        }
    }

    pub fn observe_count(&self, h: &CountHistogram, count: u64) {
        self.count_series(h).observe(count as f64)
    }

    fn count_series(&self, h: &CountHistogram) -> Histogram {
        match h {
            CountHistogram::PostCloneRetryAttempts { result } => self
                .times
                .postclone_attempts
                .with_label_values(&[result.as_str()]),
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        let mut out = String::from_utf8(buf).unwrap_or_default();
        let rendered = self
            .rendered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for r in rendered {
            out.push_str(&r.text());
        }
        out
    }
}

/// The loop queue's depth, read at scrape time. A weak handle, so the metric never keeps the
/// queue open after every source is gone.
struct QueueDepth {
    tx: tokio::sync::mpsc::WeakSender<reconcilers::Event>,
    gauge: IntGauge,
}

impl Collector for QueueDepth {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let depth = self
            .tx
            .upgrade()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity());
        self.gauge.set(depth as i64);
        self.gauge.collect()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves `/metrics` on a thread of its own: actix's server is not `Send`, and a scrape must
/// never compete with the loop's runtime anyway.
/// Binds first, so an address that cannot be had stops the start with the variable named.
pub fn spawn_server(addr: std::net::SocketAddr, metrics: Metrics) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        anyhow::anyhow!("VK_METRICS_ADDR: cannot listen on {addr} for /metrics: {e}")
    })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            if let Err(e) = actix_web::rt::System::new().block_on(serve(listener, metrics)) {
                tracing::error!(%addr, error = %e, "metrics listener failed");
            }
        })
        .map_err(|e| anyhow::anyhow!("cannot start the metrics thread: {e}"))?;
    Ok(())
}

/// `GET /metrics` on `VK_METRICS_ADDR` (K8). Anything else is 404.
async fn serve(listener: std::net::TcpListener, metrics: Metrics) -> std::io::Result<()> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let data = web::Data::new(metrics);
    HttpServer::new(move || {
        App::new().app_data(data.clone()).route(
            "/metrics",
            web::get().to(|m: web::Data<Metrics>| async move {
                HttpResponse::Ok()
                    .content_type("text/plain; version=0.0.4")
                    .body(m.render())
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run()
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_series_exist_at_zero_from_the_start() {
        let text = Metrics::new().render();
        for series in [
            r#"cocoon_vk_snapshot_save_total{result="failed"} 0"#,
            r#"cocoon_vk_hibernate_total{phase="push",result="ok"} 0"#,
            r#"cocoon_vk_hibernate_total{phase="dhcp_release",result="failed"} 0"#,
            r#"cocoon_vk_postclone_total{kind="sac",result="failed"} 0"#,
            r#"cocoon_vk_events_dropped_total{reason="timeout"} 0"#,
            r#"cocoon_vk_wake_total{result="ok"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    /// Every labelled counter of the core's has its series at 0 before anything is counted,
    /// one per value of its labels' enums; of those only the lifecycle counter waits for its
    /// first count (`labels::zeroed_counters`).
    #[test]
    fn every_labelled_core_family_but_the_lifecycle_exists_at_zero() {
        let m = Metrics::new();
        let scraped: BTreeSet<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        let absent: Vec<String> = m
            .families()
            .into_iter()
            .filter(|f| !scraped.contains(f))
            .collect();
        assert_eq!(
            absent,
            [
                // The shell's own, and the core's timings: not outcomes a dashboard rates.
                "cocoon_vk_action_queue_wait_seconds",
                "cocoon_vk_api_writes_total",
                "cocoon_vk_lease_renew_age_seconds",
                "cocoon_vk_pod_lifecycle_total",
                "cocoon_vk_pod_startup_seconds",
                "cocoon_vk_vm_boot_duration_seconds",
            ],
            "families without a series at start"
        );
        let text = m.render();
        for series in [
            r#"cocoon_vk_stale_create_reconcile_total{outcome="not-creating"} 0"#,
            r#"cocoon_vk_wake_ip_wait_total{result="timeout"} 0"#,
            r#"cocoon_vk_snapshot_verify_total{result="stale"} 0"#,
            r#"cocoon_vk_lease_release_total{result="error"} 0"#,
            r#"cocoon_vk_hibernate_evidence_total{verdict="source_conflict"} 0"#,
            r#"cocoon_vk_startup_resume_total{op="classify_drop_nic"} 0"#,
            r#"cocoon_vk_postclone_retry_attempts_count{result="failed"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn a_count_lands_on_the_series_its_labels_name() {
        use reconcilers::labels::{LifecycleOp, LifecycleReason, LifecycleResult};
        let m = Metrics::new();
        m.count(&Counter::PodLifecycle {
            op: LifecycleOp::Delete,
            result: LifecycleResult::Skipped,
            reason: LifecycleReason::SeatRelease,
        });
        m.count(&Counter::Hibernate {
            phase: HibernatePhase::Netresize,
            result: Outcome::Failed,
        });
        let text = m.render();
        for series in [
            r#"cocoon_vk_pod_lifecycle_total{op="delete",reason="seat_release",result="skipped"} 1"#,
            r#"cocoon_vk_hibernate_total{phase="netresize",result="failed"} 1"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn families_list_what_a_scrape_shows_and_what_has_no_series_yet() {
        let m = Metrics::new();
        let families = m.families();
        for name in [
            "cocoon_vk_pod_lifecycle_total",
            "cocoon_vk_lease_renew_age_seconds",
        ] {
            assert!(families.contains(name), "{name} missing");
        }
        for f in m.registry.gather() {
            assert!(families.contains(f.name()), "{} not listed", f.name());
        }
    }

    #[test]
    fn the_lease_age_appears_with_the_first_renewal_and_the_interval_with_the_second() {
        let m = Metrics::new();
        assert!(!m.render().contains("cocoon_vk_lease_renew_age_seconds"));
        m.lease.renewed();
        let text = m.render();
        assert!(
            text.contains("cocoon_vk_lease_renew_age_seconds "),
            "{text}"
        );
        assert!(text.contains("cocoon_vk_lease_renew_interval_seconds_count 0"));
        m.lease.renewed();
        assert!(m
            .render()
            .contains("cocoon_vk_lease_renew_interval_seconds_count 1"));
    }

    #[test]
    fn startup_stages_are_labelled() {
        let m = Metrics::new();
        let stage = reconcilers::action::StartupStage::FirstProbeOk;
        m.observe(&CoreHistogram::PodStartup { stage }, 1500);
        let text = m.render();
        assert!(
            text.contains(r#"cocoon_vk_pod_startup_seconds_sum{stage="first_probe_ok"} 1.5"#),
            "{text}"
        );
    }
}
