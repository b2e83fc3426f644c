//! Exposes the shared sample on `/metrics` (M3 per-VM and node series); counters are the
//! kernel's cumulative figures. The text is rendered once per sample and reused by every
//! scrape while the sample is (M1): at 1,000 VMs that is 7,000 series a scrape would
//! otherwise rebuild, hash and encode.

use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Encoder, GaugeVec, Opts, TextEncoder};

use crate::metrics::Rendered;
use crate::stats::{Sample, Sampler};

pub struct StatsCollector {
    sampler: Arc<Sampler>,
    /// The families' names, listed by the metrics registry.
    names: Vec<String>,
    /// The text of the last sample rendered, with that sample.
    last: Mutex<Option<(Arc<Sample>, Arc<str>)>>,
}

const VM_LABELS: [&str; 4] = ["vm", "pod", "namespace", "backend"];

fn counter(name: &str, help: &str, labels: &[&str]) -> CounterVec {
    CounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

struct Families {
    vm_cpu: CounterVec,
    vm_throttled: CounterVec,
    vm_periods: CounterVec,
    vm_rss: GaugeVec,
    vm_cow: GaugeVec,
    vm_rx: CounterVec,
    vm_tx: CounterVec,
    node_cpu: CounterVec,
    node_mem: GaugeVec,
    storage_avail: GaugeVec,
    storage_total: GaugeVec,
}

impl Families {
    fn new() -> Self {
        Self {
            vm_cpu: counter(
                "cocoon_vk_vm_cpu_seconds_total",
                "Per-VM cumulative CPU (cgroup scope usage_usec)",
                &VM_LABELS,
            ),
            vm_throttled: counter(
                "cocoon_vk_vm_cpu_throttled_seconds_total",
                "Per-VM time throttled by the CPU quota",
                &VM_LABELS,
            ),
            vm_periods: counter(
                "cocoon_vk_vm_cpu_throttled_periods_total",
                "Per-VM throttled enforcement periods",
                &VM_LABELS,
            ),
            vm_rss: gauge("cocoon_vk_vm_memory_rss_bytes", "Per-VM RSS", &VM_LABELS),
            vm_cow: gauge(
                "cocoon_vk_vm_disk_cow_bytes",
                "Per-VM bytes allocated to the COW disk",
                &VM_LABELS,
            ),
            vm_rx: counter(
                "cocoon_vk_vm_network_rx_bytes_total",
                "Per-VM bytes received by the first NIC's TAP on the host (its rx column: what the guest sent)",
                &VM_LABELS,
            ),
            vm_tx: counter(
                "cocoon_vk_vm_network_tx_bytes_total",
                "Per-VM bytes transmitted by the first NIC's TAP on the host (its tx column: what the guest received)",
                &VM_LABELS,
            ),
            node_cpu: counter(
                "cocoon_vk_node_cpu_seconds_total",
                "Node cumulative busy CPU (idle and iowait excluded)",
                &[],
            ),
            node_mem: gauge("cocoon_vk_node_memory_used_bytes", "Node used memory", &[]),
            storage_avail: gauge(
                "cocoon_vk_node_storage_available_bytes",
                "Cocoon root filesystem available bytes",
                &[],
            ),
            storage_total: gauge(
                "cocoon_vk_node_storage_total_bytes",
                "Cocoon root filesystem total bytes",
                &[],
            ),
        }
    }

    fn collectors(&self) -> [&dyn Collector; 11] {
        [
            &self.vm_cpu,
            &self.vm_throttled,
            &self.vm_periods,
            &self.vm_rss,
            &self.vm_cow,
            &self.vm_rx,
            &self.vm_tx,
            &self.node_cpu,
            &self.node_mem,
            &self.storage_avail,
            &self.storage_total,
        ]
    }
}

impl StatsCollector {
    pub fn new(sampler: Arc<Sampler>) -> Self {
        let names = Families::new()
            .collectors()
            .iter()
            .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
            .collect();
        Self {
            sampler,
            names,
            last: Mutex::new(None),
        }
    }
}

impl Rendered for StatsCollector {
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn text(&self) -> Arc<str> {
        let sample = self.sampler.sample();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((of, text)) = last.as_ref() {
            if Arc::ptr_eq(of, &sample) {
                return text.clone();
            }
        }
        let mut buf = Vec::new();
        // As the registry's gather does: a family without series (no VM yet) is left out,
        // where the encoder would refuse the whole text.
        let mut families = families(&sample);
        families.retain(|f| !f.get_metric().is_empty());
        let _ = TextEncoder::new().encode(&families, &mut buf);
        let text: Arc<str> = String::from_utf8(buf).unwrap_or_default().into();
        *last = Some((sample, text.clone()));
        text
    }
}

fn families(s: &Sample) -> Vec<MetricFamily> {
    let f = Families::new();
    for v in &s.vms {
        let l = [
            v.vm.vm_name.as_str(),
            v.vm.pod.as_str(),
            v.vm.namespace.as_str(),
            v.vm.backend.as_str(),
        ];
        f.vm_cpu.with_label_values(&l).inc_by(v.cpu.usage_seconds);
        f.vm_throttled
            .with_label_values(&l)
            .inc_by(v.cpu.throttled_seconds);
        f.vm_periods
            .with_label_values(&l)
            .inc_by(v.cpu.throttled_periods);
        f.vm_rss.with_label_values(&l).set(v.rss as f64);
        f.vm_cow.with_label_values(&l).set(v.cow_bytes as f64);
        f.vm_rx.with_label_values(&l).inc_by(v.net.rx as f64);
        f.vm_tx.with_label_values(&l).inc_by(v.net.tx as f64);
    }
    f.node_cpu
        .with_label_values::<&str>(&[])
        .inc_by(s.node.cpu_seconds);
    f.node_mem
        .with_label_values::<&str>(&[])
        .set(s.node.memory_used as f64);
    f.storage_avail
        .with_label_values::<&str>(&[])
        .set(s.node.storage_available as f64);
    f.storage_total
        .with_label_values::<&str>(&[])
        .set(s.node.storage_total as f64);
    f.collectors().iter().flat_map(|c| c.collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Sources;
    use crate::views::{Views, VmView};

    /// M2/M3: the per-VM network series are the first TAP's own columns, rx the first value of
    /// its `/proc/<pid>/net/dev` line and tx the ninth, as the spec and the kubelet summary
    /// report them.
    #[test]
    fn network_series_are_the_taps_own_columns() {
        let dir = tempfile::tempdir().unwrap();
        let pid_dir = dir.path().join("4242/net");
        std::fs::create_dir_all(&pid_dir).unwrap();
        std::fs::write(
            pid_dir.join("dev"),
            "Inter-| Receive | Transmit\n face |bytes packets|bytes packets\ntapWEB00000-0: 5000 10 0 0 0 0 0 0 7000 20 0 0 0 0 0 0\n",
        )
        .unwrap();
        let views = Views::default();
        views.vms.insert(
            "demo/web-0".into(),
            VmView {
                vm_id: "WEB00000".into(),
                vm_name: "vk-demo-web-0".into(),
                namespace: "demo".into(),
                pod: "web-0".into(),
                pid: 4242,
                ip: None,
                backend: "cloud-hypervisor".into(),
                unmanaged: false,
                windows: false,
                taps: vec!["tapWEB00000-0".into()],
                cow: None,
            },
        );
        let sources = Sources {
            proc: dir.path().to_path_buf(),
            scopes: None,
            page_size: 4096,
            user_hz: 100.0,
        };
        let c = StatsCollector::new(Arc::new(Sampler::with_sources(views, sources, "/")));
        let value = |name: &str| {
            let f = families(&c.sampler.sample())
                .into_iter()
                .find(|f| f.name() == name);
            f.unwrap().get_metric()[0].get_counter().get_value()
        };
        assert_eq!(value("cocoon_vk_vm_network_rx_bytes_total"), 5000.0);
        assert_eq!(value("cocoon_vk_vm_network_tx_bytes_total"), 7000.0);
    }

    /// M1: every scrape within a sample's life copies the text rendered from it; the next
    /// sample renders anew. A scrape of the node shows them after the core families.
    #[test]
    fn a_scrape_reuses_the_text_of_the_current_sample() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        std::fs::write(&stat, "cpu  100 0 100 0 0 0 0 0 0 0\n").unwrap();
        let sources = Sources {
            proc: dir.path().to_path_buf(),
            scopes: None,
            page_size: 4096,
            user_hz: 100.0,
        };
        let sampler = Arc::new(Sampler::with_sources(Views::default(), sources, "/"));
        let c = Arc::new(StatsCollector::new(sampler.clone()));
        let first = c.text();
        assert!(
            first.contains("cocoon_vk_node_cpu_seconds_total 2"),
            "{first}"
        );
        std::fs::write(&stat, "cpu  900 0 100 0 0 0 0 0 0 0\n").unwrap();
        assert!(
            Arc::ptr_eq(&first, &c.text()),
            "rendered again within the sample"
        );
        sampler.expire();
        let next = c.text();
        assert!(
            next.contains("cocoon_vk_node_cpu_seconds_total 10"),
            "{next}"
        );

        let metrics = crate::metrics::Metrics::new();
        metrics.attach(c);
        let scrape = metrics.render();
        assert!(
            scrape.contains("\ncocoon_vk_cap_refusals_total{"),
            "{scrape}"
        );
        assert!(scrape.ends_with(&*next), "the stats text closes the scrape");
        assert!(metrics
            .families()
            .contains("cocoon_vk_vm_network_rx_bytes_total"));
    }
}
