//! The metric families, registered by group: what the core counts, what the core times, and
//! what only the shell can measure. Names, help texts and buckets are a contract with the
//! dashboards and alerts in `packaging/`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

/// The registry, and the name of every family registered in it: a family whose series do not
/// exist yet is absent from a scrape, but not from this list.
#[derive(Clone, Default)]
pub(super) struct Reg {
    pub registry: Registry,
    pub names: Arc<Mutex<BTreeSet<String>>>,
}

impl Reg {
    pub fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        let names: Vec<String> = c.desc().iter().map(|d| d.fq_name.clone()).collect();
        self.registry.register(c)?;
        let mut known = self.names.lock().unwrap_or_else(|e| e.into_inner());
        known.extend(names);
        Ok(())
    }

    fn add<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.register(Box::new(c.clone())).expect("unique metric");
        c
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help).expect("valid metric"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        self.add(Gauge::new(name, help).expect("valid metric"))
    }

    pub fn seconds(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(Histogram::with_opts(opts).expect("valid metric"))
    }

    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels).expect("valid metric"))
    }
}

/// What the core counts (`Action::Count`).
#[derive(Clone)]
pub(super) struct CoreCounters {
    pub pod_lifecycle: IntCounterVec,
    pub orphan_vm: IntCounter,
    pub snapshot_kept: IntCounter,
    pub inspect_transient: IntCounter,
    pub evict_failure: IntCounter,
    pub adopt_by_name: IntCounter,
    pub stale_create: IntCounterVec,
    pub lease_release: IntCounterVec,
    pub wake_ip_wait: IntCounterVec,
    pub snapshot_pull: IntCounterVec,
    pub snapshot_save: IntCounterVec,
    pub snapshot_push: IntCounterVec,
    pub hibernate: IntCounterVec,
    pub wake: IntCounterVec,
    pub snapshot_verify: IntCounterVec,
    pub hibernate_evidence: IntCounterVec,
    pub peer_restore: IntCounterVec,
    pub wake_renew_nudge: IntCounterVec,
    pub postclone: IntCounterVec,
    pub clone_from_dir: IntCounterVec,
    pub startup_resume: IntCounterVec,
    pub unexpected_outcome: IntCounter,
}

impl CoreCounters {
    pub fn register(r: &Reg) -> Self {
        let result = |name: &str, help: &str| r.counter_vec(name, help, &["result"]);
        Self {
            pod_lifecycle: r.counter_vec(
                "cocoon_vk_pod_lifecycle_total",
                "Pod lifecycle operations",
                &["op", "result", "reason"],
            ),
            orphan_vm: r.counter("cocoon_vk_orphan_vm_total", "Orphan VMs at startup"),
            snapshot_kept: r.counter(
                "cocoon_vk_snapshot_kept_total",
                "Deleted VMs whose state was kept on the node because their push was refused",
            ),
            inspect_transient: r.counter(
                "cocoon_vk_vm_inspect_transient_fail_total",
                "Transient VM inspect failures",
            ),
            evict_failure: r.counter("cocoon_vk_pod_evict_failure_total", "Failed pod evictions"),
            adopt_by_name: r.counter(
                "cocoon_vk_reconcile_adopt_by_name_total",
                "Startup reconcile adoptions matched by VM name",
            ),
            stale_create: r.counter_vec(
                "cocoon_vk_stale_create_reconcile_total",
                "Stale-create verb attempts",
                &["outcome"],
            ),
            lease_release: result(
                "cocoon_vk_lease_release_total",
                "DHCP lease releases through cocoon-net's control socket (D6)",
            ),
            wake_ip_wait: result(
                "cocoon_vk_wake_ip_wait_total",
                "Post-clone and wake DHCP-lease-wait outcomes",
            ),
            snapshot_pull: result("cocoon_vk_snapshot_pull_total", "Snapshot pull counts"),
            snapshot_save: result("cocoon_vk_snapshot_save_total", "Snapshot save counts"),
            snapshot_push: result("cocoon_vk_snapshot_push_total", "Snapshot push counts"),
            hibernate: r.counter_vec(
                "cocoon_vk_hibernate_total",
                "Hibernate stage outcomes",
                &["phase", "result"],
            ),
            wake: result("cocoon_vk_wake_total", "Wake operation outcomes"),
            snapshot_verify: result(
                "cocoon_vk_snapshot_verify_total",
                "Wake-time verification of the local snapshot against the registry tag",
            ),
            hibernate_evidence: r.counter_vec(
                "cocoon_vk_hibernate_evidence_total",
                "Fresh boots intercepted by hibernate evidence",
                &["verdict"],
            ),
            peer_restore: result(
                "cocoon_vk_snapshot_peer_restore_total",
                "Wake-time copies of a hibernate snapshot from the node that pushed it",
            ),
            wake_renew_nudge: result(
                "cocoon_vk_wake_renew_nudge_total",
                "ipconfig /renew nudges sent to woken Windows guests still without a lease",
            ),
            postclone: r.counter_vec(
                "cocoon_vk_postclone_total",
                "Guest fix-ups of copied VMs and Windows SAC static addresses, by kind and outcome",
                &["kind", "result"],
            ),
            clone_from_dir: result(
                "cocoon_vk_clone_from_dir_total",
                "Annotation-driven --from-dir clone attempts",
            ),
            startup_resume: r.counter_vec(
                "cocoon_vk_startup_resume_total",
                "Interrupted operations re-dispatched by startup reconcile",
                &["op"],
            ),
            unexpected_outcome: r.counter(
                "cocoon_vk_unexpected_outcome_total",
                "Operation outcomes the core could not place (a cocoon contract mismatch or a bug)",
            ),
        }
    }
}

/// What the core times (`Action::Observe`, `Action::ObserveCount`).
#[derive(Clone)]
pub(super) struct CoreHistograms {
    pub boot_duration: HistogramVec,
    pub save_duration: Histogram,
    pub push_duration: Histogram,
    pub pull_duration: Histogram,
    pub peer_restore_duration: Histogram,
    pub pod_startup: HistogramVec,
    pub vm_event_status: Histogram,
    pub postclone_attempts: HistogramVec,
}

/// A registry transfer's buckets: seconds to minutes.
const TRANSFER: [f64; 7] = [1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

impl CoreHistograms {
    pub fn register(r: &Reg) -> Self {
        Self {
            boot_duration: r.histogram_vec(
                "cocoon_vk_vm_boot_duration_seconds",
                "VM creation time (run or clone)",
                &[0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
                &["mode", "backend"],
            ),
            save_duration: r.seconds(
                "cocoon_vk_snapshot_save_duration_seconds",
                "Snapshot save time",
                &[1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0],
            ),
            push_duration: r.seconds(
                "cocoon_vk_snapshot_push_duration_seconds",
                "Registry push time",
                &TRANSFER,
            ),
            pull_duration: r.seconds(
                "cocoon_vk_snapshot_pull_duration_seconds",
                "Registry pull time",
                &TRANSFER,
            ),
            // The spec gives no buckets: the pull's, since a peer restore stands in for a pull.
            peer_restore_duration: r.seconds(
                "cocoon_vk_snapshot_peer_restore_duration_seconds",
                "Peer raw-file restore time",
                &TRANSFER,
            ),
            pod_startup: r.histogram_vec(
                "cocoon_vk_pod_startup_seconds",
                "A pod's start-up by stage: first seen to VM created (vm_created), to the first probe ok (first_probe_ok), to the Ready status written (ready_pushed); total: first seen to Ready written",
                &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
                &["stage"],
            ),
            vm_event_status: r.seconds(
                "cocoon_vk_vm_event_status_seconds",
                "A cocoon VM event that changed a pod's status, until the server took that status",
                &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0],
            ),
            postclone_attempts: r.histogram_vec(
                "cocoon_vk_postclone_retry_attempts",
                "Guest fix-up attempts used, by outcome",
                &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0],
                &["result"],
            ),
        }
    }
}

/// What only the shell can measure (M6) and the writes it makes.
pub(super) struct ShellFamilies {
    pub probe_duration: Histogram,
    pub vm_table_size: Gauge,
    pub probe_degraded: Gauge,
    pub api_writes: IntCounterVec,
    pub events_dropped: IntCounterVec,
    pub cap_refusals: IntCounterVec,
    pub reduce_duration: Histogram,
    pub action_wait: HistogramVec,
    pub lease_interval: Histogram,
}

impl ShellFamilies {
    pub fn register(r: &Reg) -> Self {
        Self {
            probe_duration: r.seconds(
                "cocoon_vk_probe_duration_seconds",
                "Per-probe health check time (ICMP or TCP)",
                &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
            ),
            vm_table_size: r.gauge("cocoon_vk_vm_table_size", "Tracked VM count"),
            probe_degraded: r.gauge(
                "cocoon_vk_probe_icmp_degraded",
                "1 when no ICMP socket could be opened and ICMP probes pass on a resolved IP",
            ),
            api_writes: r.counter_vec(
                "cocoon_vk_api_writes_total",
                "Kubernetes API writes made for pods, by kind",
                &["kind"],
            ),
            events_dropped: r.counter_vec(
                "cocoon_vk_events_dropped_total",
                "Kubernetes Events not delivered: their lane was full, the API did not answer in time, or it refused them",
                &["reason"],
            ),
            cap_refusals: r.counter_vec(
                "cocoon_vk_cap_refusals_total",
                "Requests, connections or bytes a cap refused or cut, by cap",
                &["cap"],
            ),
            reduce_duration: r.seconds(
                "cocoon_vk_reduce_duration_seconds",
                "One reduce call of the loop: an event in, its actions out",
                &[
                    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                    0.01, 0.05,
                ],
            ),
            action_wait: r.histogram_vec(
                "cocoon_vk_action_queue_wait_seconds",
                "An action handed to the executor until its call starts (a cocoon or kube slot free), by kind",
                &[0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0],
                &["kind"],
            ),
            lease_interval: r.seconds(
                "cocoon_vk_lease_renew_interval_seconds",
                "The node Lease: the age of the last successful renewal when the next one succeeds",
                &[5.0, 10.0, 11.0, 12.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0],
            ),
        }
    }
}
