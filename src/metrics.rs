//! vk-cocoon's own Prometheus metrics (M3, prefix `cocoon_vk_`). Counters and the waits the
//! core decides arrive as `Action::Count`/`Observe`; the shell measures only what the core
//! cannot see: probe time, the reduce call, an action's wait for its slot, the Lease (M6).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};
use reconcilers::action::{CountHistogram, Counter, Histogram as CoreHistogram};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pod_lifecycle: IntCounterVec,
    orphan_vm: IntCounter,
    inspect_transient: IntCounter,
    evict_failure: IntCounter,
    adopt_by_name: IntCounter,
    stale_create: IntCounterVec,
    lease_release: IntCounterVec,
    wake_ip_wait: IntCounterVec,
    snapshot_pull: IntCounterVec,
    snapshot_save: IntCounterVec,
    snapshot_push: IntCounterVec,
    hibernate: IntCounterVec,
    wake: IntCounterVec,
    snapshot_verify: IntCounterVec,
    hibernate_evidence: IntCounterVec,
    save_duration: Histogram,
    push_duration: Histogram,
    pull_duration: Histogram,
    peer_restore_duration: Histogram,
    peer_restore: IntCounterVec,
    wake_renew_nudge: IntCounterVec,
    postclone: IntCounterVec,
    postclone_attempts: HistogramVec,
    clone_from_dir: IntCounterVec,
    startup_resume: IntCounterVec,
    boot_duration: HistogramVec,
    pub probe_duration: Histogram,
    pub vm_table_size: Gauge,
    pub unexpected_outcome: IntCounter,
    pub probe_degraded: Gauge,
    pub api_writes: IntCounterVec,
    /// F4: Kubernetes Events not delivered, by `reason` (`lane_full`, `timeout`, `rejected`).
    pub events_dropped: IntCounterVec,
    /// M4: registered only while a journal is configured (`enable_journal`), so a node that
    /// runs without one on purpose shows no journal series and raises no journal alert.
    pub journal: JournalMetrics,
    pod_startup: HistogramVec,
    vm_event_status: Histogram,
    /// M6: one `reduce` call, event in to actions out.
    pub reduce_duration: Histogram,
    /// M6: an action handed to the executor until its call starts, by `kind`.
    pub action_wait: HistogramVec,
    pub lease: LeaseRenewals,
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

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let boot = HistogramVec::new(
            HistogramOpts::new(
                "cocoon_vk_vm_boot_duration_seconds",
                "VM creation time (run or clone)",
            )
            .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
            &["mode", "backend"],
        )
        .expect("valid metric");
        r.register(Box::new(boot.clone())).expect("unique metric");
        let postclone_attempts = HistogramVec::new(
            HistogramOpts::new(
                "cocoon_vk_postclone_retry_attempts",
                "Guest fix-up attempts used, by outcome",
            )
            .buckets(vec![1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0]),
            &["result"],
        )
        .expect("valid metric");
        r.register(Box::new(postclone_attempts.clone()))
            .expect("unique metric");
        let probe = Histogram::with_opts(
            HistogramOpts::new(
                "cocoon_vk_probe_duration_seconds",
                "Per-probe health check time (ICMP or TCP)",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
        )
        .expect("valid metric");
        r.register(Box::new(probe.clone())).expect("unique metric");
        let seconds = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric");
            r.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let save_duration = seconds(
            "cocoon_vk_snapshot_save_duration_seconds",
            "Snapshot save time",
            &[1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0],
        );
        let push_duration = seconds(
            "cocoon_vk_snapshot_push_duration_seconds",
            "Registry push time",
            &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
        );
        let pull_duration = seconds(
            "cocoon_vk_snapshot_pull_duration_seconds",
            "Registry pull time",
            &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
        );
        // The spec gives no buckets: the pull's, since a peer restore stands in for a pull.
        let peer_restore_duration = seconds(
            "cocoon_vk_snapshot_peer_restore_duration_seconds",
            "Peer raw-file restore time",
            &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
        );
        let pod_startup = HistogramVec::new(
            HistogramOpts::new(
                "cocoon_vk_pod_startup_seconds",
                "A pod's start-up by stage: first seen to VM created (vm_created), to the first probe ok (first_probe_ok), to the Ready status written (ready_pushed); total: first seen to Ready written",
            )
            .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]),
            &["stage"],
        )
        .expect("valid metric");
        r.register(Box::new(pod_startup.clone()))
            .expect("unique metric");
        let vm_event_status = seconds(
            "cocoon_vk_vm_event_status_seconds",
            "A cocoon VM event that changed a pod's status, until the server took that status",
            &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0],
        );
        let reduce_duration = seconds(
            "cocoon_vk_reduce_duration_seconds",
            "One reduce call of the loop: an event in, its actions out",
            &[
                0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                0.05,
            ],
        );
        let action_wait = HistogramVec::new(
            HistogramOpts::new(
                "cocoon_vk_action_queue_wait_seconds",
                "An action handed to the executor until its call starts (a cocoon or kube slot free), by kind",
            )
            .buckets(vec![
                0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
            ]),
            &["kind"],
        )
        .expect("valid metric");
        r.register(Box::new(action_wait.clone()))
            .expect("unique metric");
        let lease = LeaseRenewals {
            interval: seconds(
                "cocoon_vk_lease_renew_interval_seconds",
                "The node Lease: the age of the last successful renewal when the next one succeeds",
                &[5.0, 10.0, 11.0, 12.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0],
            ),
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
            pod_startup,
            vm_event_status,
            reduce_duration,
            action_wait,
            lease,
            save_duration,
            push_duration,
            pull_duration,
            peer_restore_duration,
            peer_restore: counter_vec(
                &r,
                "cocoon_vk_snapshot_peer_restore_total",
                "Wake-time copies of a hibernate snapshot from the node that pushed it",
                &["result"],
            ),
            wake_renew_nudge: counter_vec(
                &r,
                "cocoon_vk_wake_renew_nudge_total",
                "ipconfig /renew nudges sent to woken Windows guests still without a lease",
                &["result"],
            ),
            postclone: counter_vec(
                &r,
                "cocoon_vk_postclone_total",
                "Guest fix-ups of copied VMs and Windows SAC static addresses, by kind and outcome",
                &["kind", "result"],
            ),
            postclone_attempts,
            pod_lifecycle: counter_vec(
                &r,
                "cocoon_vk_pod_lifecycle_total",
                "Pod lifecycle operations",
                &["op", "result", "reason"],
            ),
            orphan_vm: counter(&r, "cocoon_vk_orphan_vm_total", "Orphan VMs at startup"),
            inspect_transient: counter(
                &r,
                "cocoon_vk_vm_inspect_transient_fail_total",
                "Transient VM inspect failures",
            ),
            evict_failure: counter(
                &r,
                "cocoon_vk_pod_evict_failure_total",
                "Failed pod evictions",
            ),
            adopt_by_name: counter(
                &r,
                "cocoon_vk_reconcile_adopt_by_name_total",
                "Startup reconcile adoptions matched by VM name",
            ),
            stale_create: counter_vec(
                &r,
                "cocoon_vk_stale_create_reconcile_total",
                "Stale-create verb attempts",
                &["outcome"],
            ),
            lease_release: counter_vec(
                &r,
                "cocoon_vk_lease_release_total",
                "DHCP lease releases through cocoon-net's control socket (D6)",
                &["result"],
            ),
            wake_ip_wait: counter_vec(
                &r,
                "cocoon_vk_wake_ip_wait_total",
                "Post-clone and wake DHCP-lease-wait outcomes",
                &["result"],
            ),
            snapshot_pull: counter_vec(
                &r,
                "cocoon_vk_snapshot_pull_total",
                "Snapshot pull counts",
                &["result"],
            ),
            snapshot_save: counter_vec(
                &r,
                "cocoon_vk_snapshot_save_total",
                "Snapshot save counts",
                &["result"],
            ),
            snapshot_push: counter_vec(
                &r,
                "cocoon_vk_snapshot_push_total",
                "Snapshot push counts",
                &["result"],
            ),
            hibernate: counter_vec(
                &r,
                "cocoon_vk_hibernate_total",
                "Hibernate stage outcomes",
                &["phase", "result"],
            ),
            wake: counter_vec(
                &r,
                "cocoon_vk_wake_total",
                "Wake operation outcomes",
                &["result"],
            ),
            snapshot_verify: counter_vec(
                &r,
                "cocoon_vk_snapshot_verify_total",
                "Wake-time verification of the local snapshot against the registry tag",
                &["result"],
            ),
            hibernate_evidence: counter_vec(
                &r,
                "cocoon_vk_hibernate_evidence_total",
                "Fresh boots intercepted by hibernate evidence",
                &["verdict"],
            ),
            clone_from_dir: counter_vec(
                &r,
                "cocoon_vk_clone_from_dir_total",
                "Annotation-driven --from-dir clone attempts",
                &["result"],
            ),
            startup_resume: counter_vec(
                &r,
                "cocoon_vk_startup_resume_total",
                "Interrupted operations re-dispatched by startup reconcile",
                &["op"],
            ),
            boot_duration: boot,
            probe_duration: probe,
            vm_table_size: gauge(&r, "cocoon_vk_vm_table_size", "Tracked VM count"),
            unexpected_outcome: counter(
                &r,
                "cocoon_vk_unexpected_outcome_total",
                "Operation outcomes the core could not place (a cocoon contract mismatch or a bug)",
            ),
            probe_degraded: gauge(
                &r,
                "cocoon_vk_probe_icmp_degraded",
                "1 when no ICMP socket could be opened and ICMP probes pass on a resolved IP",
            ),
            api_writes: counter_vec(
                &r,
                "cocoon_vk_api_writes_total",
                "Kubernetes API writes made for pods, by kind",
                &["kind"],
            ),
            events_dropped: counter_vec(
                &r,
                "cocoon_vk_events_dropped_total",
                "Kubernetes Events not delivered: their lane was full, the API did not answer in time, or it refused them",
                &["reason"],
            ),
            journal: JournalMetrics::new(),
            registry: r,
        }
        .zeroed()
    }

    /// M6: the outcome series a dashboard and its alerts rate over exist at 0 from the start,
    /// so a node where nothing has failed yet shows a flat line rather than no data, and a
    /// first failure is a rise a `rate` can see.
    fn zeroed(self) -> Self {
        const RESULTS: [&str; 2] = ["ok", "failed"];
        for result in RESULTS {
            for c in [
                &self.snapshot_save,
                &self.snapshot_push,
                &self.snapshot_pull,
                &self.wake,
            ] {
                c.with_label_values(&[result]);
            }
            for phase in ["snapshot", "push", "remove", "netresize"] {
                self.hibernate.with_label_values(&[phase, result]);
            }
            for kind in ["windows", "linux_fc", "linux_static", "sac"] {
                self.postclone.with_label_values(&[kind, result]);
            }
        }
        for reason in ["lane_full", "timeout", "rejected"] {
            self.events_dropped.with_label_values(&[reason]);
        }
        self
    }

    /// Exposes the journal's series (M4); once, when a journal is configured.
    pub fn enable_journal(&self) {
        for c in [
            Box::new(self.journal.up.clone()) as Box<dyn Collector>,
            Box::new(self.journal.write_errors.clone()),
            Box::new(self.journal.records_dropped.clone()),
        ] {
            self.registry.register(c).expect("unique metric");
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
        self.registry.register(Box::new(c)).expect("unique metric");
    }

    pub fn count(&self, c: &Counter) {
        match c {
            Counter::PodLifecycle { op, result, reason } => self
                .pod_lifecycle
                .with_label_values(&[op, result, reason])
                .inc(),
            Counter::OrphanVm => self.orphan_vm.inc(),
            Counter::VmInspectTransientFail => self.inspect_transient.inc(),
            Counter::PodEvictFailure => self.evict_failure.inc(),
            Counter::ReconcileAdoptByName => self.adopt_by_name.inc(),
            Counter::StaleCreateReconcile { outcome } => {
                self.stale_create.with_label_values(&[outcome]).inc()
            }
            Counter::WakeIpWait { result } => self.wake_ip_wait.with_label_values(&[result]).inc(),
            Counter::SnapshotPull { result } => {
                self.snapshot_pull.with_label_values(&[result]).inc()
            }
            Counter::CloneFromDir { result } => {
                self.clone_from_dir.with_label_values(&[result]).inc()
            }
            Counter::StartupResume { op } => self.startup_resume.with_label_values(&[op]).inc(),
            Counter::LeaseRelease { result } => {
                self.lease_release.with_label_values(&[result]).inc()
            }
            Counter::UnexpectedOutcome => self.unexpected_outcome.inc(),
            Counter::SnapshotSave { result } => {
                self.snapshot_save.with_label_values(&[result]).inc()
            }
            Counter::SnapshotPush { result } => {
                self.snapshot_push.with_label_values(&[result]).inc()
            }
            Counter::Hibernate { phase, result } => {
                self.hibernate.with_label_values(&[phase, result]).inc()
            }
            Counter::Wake { result } => self.wake.with_label_values(&[result]).inc(),
            Counter::SnapshotVerify { result } => {
                self.snapshot_verify.with_label_values(&[result]).inc()
            }
            Counter::HibernateEvidence { verdict } => {
                self.hibernate_evidence.with_label_values(&[verdict]).inc()
            }
            Counter::SnapshotPeerRestore { result } => {
                self.peer_restore.with_label_values(&[result]).inc()
            }
            Counter::WakeRenewNudge { result } => {
                self.wake_renew_nudge.with_label_values(&[result]).inc()
            }
            Counter::PostClone { kind, result } => {
                self.postclone.with_label_values(&[kind, result]).inc()
            }
        }
    }

    pub fn observe(&self, h: &CoreHistogram, millis: u64) {
        match h {
            CoreHistogram::VmBootDuration { mode, backend } => self
                .boot_duration
                .with_label_values(&[mode, backend])
                .observe(millis as f64 / 1000.0),
            CoreHistogram::SnapshotSaveDuration => {
                self.save_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPushDuration => {
                self.push_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPullDuration => {
                self.pull_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::SnapshotPeerRestoreDuration => {
                self.peer_restore_duration.observe(millis as f64 / 1000.0)
            }
            CoreHistogram::PodStartup { stage } => self
                .pod_startup
                .with_label_values(&[stage.as_str()])
                .observe(millis as f64 / 1000.0),
            CoreHistogram::VmEventToStatus => self.vm_event_status.observe(millis as f64 / 1000.0),
        }
    }

    pub fn observe_count(&self, h: &CountHistogram, count: u64) {
        match h {
            CountHistogram::PostCloneRetryAttempts { result } => self
                .postclone_attempts
                .with_label_values(&[result])
                .observe(count as f64),
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
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
            r#"cocoon_vk_postclone_total{kind="sac",result="failed"} 0"#,
            r#"cocoon_vk_events_dropped_total{reason="timeout"} 0"#,
            r#"cocoon_vk_wake_total{result="ok"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
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
