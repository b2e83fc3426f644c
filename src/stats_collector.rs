//! Exposes the shared sample on `/metrics` (M3 per-VM and node series); counters are the
//! kernel's cumulative figures. The text is rendered once per sample and reused by every
//! scrape while the sample is (M1): at 1,000 VMs that is 7,000 series a scrape would
//! otherwise rebuild, hash and encode.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use crate::metrics::Rendered;
use crate::stats::{Sample, Sampler, VmSample};

pub struct StatsCollector {
    sampler: Arc<Sampler>,
    /// The text of the last sample rendered, with that sample.
    last: Mutex<Option<(Arc<Sample>, Arc<str>)>>,
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One family: its name, help and kind, and how its value is read from the sample.
struct Family<T> {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    value: fn(&T) -> f64,
}

const VM_FAMILIES: [Family<VmSample>; 7] = [
    Family {
        name: "cocoon_vk_vm_cpu_seconds_total",
        help: "Per-VM cumulative CPU (cgroup scope usage_usec)",
        kind: Kind::Counter,
        value: |v| v.cpu.usage_seconds,
    },
    Family {
        name: "cocoon_vk_vm_cpu_throttled_seconds_total",
        help: "Per-VM time throttled by the CPU quota",
        kind: Kind::Counter,
        value: |v| v.cpu.throttled_seconds,
    },
    Family {
        name: "cocoon_vk_vm_cpu_throttled_periods_total",
        help: "Per-VM throttled enforcement periods",
        kind: Kind::Counter,
        value: |v| v.cpu.throttled_periods,
    },
    Family {
        name: "cocoon_vk_vm_memory_rss_bytes",
        help: "Per-VM RSS",
        kind: Kind::Gauge,
        value: |v| v.rss as f64,
    },
    Family {
        name: "cocoon_vk_vm_disk_cow_bytes",
        help: "Per-VM bytes allocated to the COW disk",
        kind: Kind::Gauge,
        value: |v| v.cow_bytes as f64,
    },
    Family {
        name: "cocoon_vk_vm_network_rx_bytes_total",
        help: "Per-VM bytes received by the first NIC's TAP on the host (its rx column: what the guest sent)",
        kind: Kind::Counter,
        value: |v| v.net.rx as f64,
    },
    Family {
        name: "cocoon_vk_vm_network_tx_bytes_total",
        help: "Per-VM bytes transmitted by the first NIC's TAP on the host (its tx column: what the guest received)",
        kind: Kind::Counter,
        value: |v| v.net.tx as f64,
    },
];

const NODE_FAMILIES: [Family<Sample>; 4] = [
    Family {
        name: "cocoon_vk_node_cpu_seconds_total",
        help: "Node cumulative busy CPU (idle and iowait excluded)",
        kind: Kind::Counter,
        value: |s| s.node.cpu_seconds,
    },
    Family {
        name: "cocoon_vk_node_memory_used_bytes",
        help: "Node used memory",
        kind: Kind::Gauge,
        value: |s| s.node.memory_used as f64,
    },
    Family {
        name: "cocoon_vk_node_storage_available_bytes",
        help: "Cocoon root filesystem available bytes",
        kind: Kind::Gauge,
        value: |s| s.node.storage_available as f64,
    },
    Family {
        name: "cocoon_vk_node_storage_total_bytes",
        help: "Cocoon root filesystem total bytes",
        kind: Kind::Gauge,
        value: |s| s.node.storage_total as f64,
    },
];

impl StatsCollector {
    pub fn new(sampler: Arc<Sampler>) -> Self {
        Self {
            sampler,
            last: Mutex::new(None),
        }
    }
}

impl Rendered for StatsCollector {
    fn names(&self) -> Vec<String> {
        let vm = VM_FAMILIES.iter().map(|f| f.name);
        vm.chain(NODE_FAMILIES.iter().map(|f| f.name))
            .map(String::from)
            .collect()
    }

    fn text(&self) -> Arc<str> {
        let sample = self.sampler.sample();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((of, text)) = last.as_ref() {
            if Arc::ptr_eq(of, &sample) {
                return text.clone();
            }
        }
        let text: Arc<str> = render(&sample).into();
        *last = Some((sample, text.clone()));
        text
    }
}

/// The sample in Prometheus' text format, written straight from it: building the client
/// library's families first took 7 MiB at 1,000 VMs for a text of a fraction of that. A
/// family without series (no VM yet) is left out, as the registry's gather leaves it out.
fn render(s: &Sample) -> String {
    let mut vms: Vec<&VmSample> = s.vms.iter().collect();
    vms.sort_by(|a, b| {
        let (a, b) = (&a.vm, &b.vm);
        (&a.namespace, &a.pod, &a.vm_name).cmp(&(&b.namespace, &b.pod, &b.vm_name))
    });
    let mut out = String::with_capacity(vms.len() * VM_FAMILIES.len() * 160 + 1024);
    if !vms.is_empty() {
        for f in &VM_FAMILIES {
            header(&mut out, f.name, f.help, f.kind);
            for v in &vms {
                out.push_str(f.name);
                out.push('{');
                let labels = [
                    ("vm", &v.vm.vm_name),
                    ("pod", &v.vm.pod),
                    ("namespace", &v.vm.namespace),
                    ("backend", &v.vm.backend),
                ];
                for (i, (name, value)) in labels.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(name);
                    out.push_str("=\"");
                    escape(&mut out, value, true);
                    out.push('"');
                }
                out.push_str("} ");
                number(&mut out, (f.value)(v));
                out.push('\n');
            }
        }
    }
    for f in &NODE_FAMILIES {
        header(&mut out, f.name, f.help, f.kind);
        out.push_str(f.name);
        out.push(' ');
        number(&mut out, (f.value)(s));
        out.push('\n');
    }
    out
}

fn header(out: &mut String, name: &str, help: &str, kind: Kind) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape(out, help, false);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push_str(match kind {
        Kind::Counter => " counter\n",
        Kind::Gauge => " gauge\n",
    });
}

/// The text format's escapes: backslash and newline everywhere, the double quote in label
/// values.
fn escape(out: &mut String, s: &str, quote: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn number(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
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
        let text = c.text();
        let labels =
            r#"{vm="vk-demo-web-0",pod="web-0",namespace="demo",backend="cloud-hypervisor"}"#;
        for line in [
            format!("cocoon_vk_vm_network_rx_bytes_total{labels} 5000\n"),
            format!("cocoon_vk_vm_network_tx_bytes_total{labels} 7000\n"),
            "# TYPE cocoon_vk_vm_network_rx_bytes_total counter\n".to_string(),
        ] {
            assert!(text.contains(&line), "{line} not in {text}");
        }
    }

    /// Label values are escaped as the text format asks; a value is written as the client
    /// library writes it.
    #[test]
    fn labels_are_escaped_and_values_written_plainly() {
        let mut out = String::new();
        escape(&mut out, "a\"b\\c\nd", true);
        assert_eq!(out, r#"a\"b\\c\nd"#);
        let mut out = String::new();
        escape(&mut out, "it's \"x\"", false);
        assert_eq!(out, "it's \"x\"");
        for (v, text) in [
            (5000.0, "5000"),
            (0.25, "0.25"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
        ] {
            let mut out = String::new();
            number(&mut out, v);
            assert_eq!(out, text);
        }
        // No VM: only the node's families, as the registry's gather leaves empty ones out.
        let text = render(&Sample::default());
        assert!(!text.contains("cocoon_vk_vm_"), "{text}");
        assert!(text.contains("# TYPE cocoon_vk_node_storage_total_bytes gauge\ncocoon_vk_node_storage_total_bytes 0\n"), "{text}");
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
