//! The shipped packaging stays consistent with the code: alert rules parse and pass their unit
//! tests (promtool, which `make deps` installs), the Grafana dashboard parses, and both name
//! only metric families the daemon's registry holds; the unit runs the real subcommand.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;

use vk_cocoon::metrics::Metrics;
use vk_cocoon::stats::Sampler;
use vk_cocoon::stats_collector::StatsCollector;
use vk_cocoon::views::Views;

fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("cocoon_vk_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The families the daemon registers, read from its registry as `run` builds it: its own
/// metrics, the journal's (as with a journal configured), the queue depth and the VM stats.
fn exported() -> BTreeSet<String> {
    let metrics = Metrics::new();
    metrics.enable_journal();
    let (tx, _rx) = vk_cocoon::sources::event_queue();
    metrics.watch_event_queue(&tx);
    let sampler = Sampler::new(Views::default(), "cocoon.slice", "/nonexistent");
    metrics.attach(Arc::new(StatsCollector::new(Arc::new(sampler))));
    let families = metrics.families();
    // What a scrape shows is a subset of the list: the list is the registry's.
    for f in metrics.registry.gather() {
        assert!(families.contains(f.name()), "{}", f.name());
    }
    assert!(families.len() > 40, "{families:?}");
    families
}

/// A histogram's series carry its name with a suffix.
fn is_exported(exported: &BTreeSet<String>, name: &str) -> bool {
    exported.contains(name)
        || ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .any(|base| exported.contains(base))
}

#[test]
fn alert_rules_name_only_exported_metrics() {
    let alerts = std::fs::read_to_string("packaging/alerts.yaml").unwrap();
    let exported = exported();
    for name in metric_names(&alerts) {
        assert!(
            is_exported(&exported, &name),
            "packaging/alerts.yaml uses {name}, which this build does not export"
        );
    }
}

/// M6: every panel of packaging/grafana-dashboard.json queries something, and only metrics
/// this build exports.
#[test]
fn dashboard_names_only_exported_metrics() {
    let text = std::fs::read_to_string("packaging/grafana-dashboard.json").unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let mut exprs = 0;
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        exprs += targets.len();
    }
    assert!(exprs > 20, "{exprs} queries");
    let exported = exported();
    for name in metric_names(&text) {
        assert!(
            is_exported(&exported, &name),
            "packaging/grafana-dashboard.json uses {name}, which this build does not export"
        );
    }
}

/// M2, M3: every family of the per-VM and node sample has a panel, so an operator sees each
/// VM's CPU, throttling, memory, disk and network, and what the storage alert watches.
#[test]
fn dashboard_charts_every_sampled_family() {
    use vk_cocoon::metrics::Rendered;
    let text = std::fs::read_to_string("packaging/grafana-dashboard.json").unwrap();
    let charted = metric_names(&text);
    let sampler = Sampler::new(Views::default(), "cocoon.slice", "/nonexistent");
    let stats = StatsCollector::new(Arc::new(sampler));
    let families = stats.names();
    assert_eq!(families.len(), 11, "{families:?}");
    for name in families {
        assert!(
            charted.contains(&name),
            "packaging/grafana-dashboard.json has no panel for {name}"
        );
    }
}

#[test]
fn alert_rules_pass_promtool() {
    let Ok(out) = Command::new("promtool")
        .args(["check", "rules", "packaging/alerts.yaml"])
        .output()
    else {
        panic!("promtool is missing: run `make deps` (it installs Debian's prometheus package)");
    };
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// packaging/alerts_test.yaml: the journal alert fires after 5 minutes down, not before, and
/// clears when the journal is back.
#[test]
fn alert_rules_pass_their_promtool_unit_tests() {
    let Ok(out) = Command::new("promtool")
        .args(["test", "rules", "packaging/alerts_test.yaml"])
        .output()
    else {
        panic!("promtool is missing: run `make deps` (it installs Debian's prometheus package)");
    };
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn systemd_unit_runs_the_daemon_and_keeps_vms_on_stop() {
    let unit = std::fs::read_to_string("packaging/vk-cocoon.service").unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/vk-cocoon run"));
    assert!(unit.contains("Restart=always") && unit.contains("RestartSec=5"));
    // Only the daemon gets the signal; VMs (and their cocoon children) are not its cgroup's to kill.
    assert!(unit.contains("KillMode=process"));
}

/// The quoted annotation keys in a list variable of packaging/annotation-policy.yaml.
fn policy_list(variable: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string("packaging/annotation-policy.yaml").unwrap();
    let start = text
        .find(&format!("- name: {variable}\n"))
        .expect("the policy's variable");
    let end = start + text[start..].find(']').expect("the end of the list");
    text[start..end]
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn key_set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// T9: the stateful-annotation policy guards every key of the VMSpec the daemon reads, plus
/// the create-time inputs, spelled as the daemon spells them. Of the keys the daemon writes
/// itself, only those that name an unmanaged pod's VM are guarded, and only on such a pod;
/// any other would refuse the daemon's own status patches.
#[test]
fn annotation_policy_guards_the_vm_spec_and_leaves_vks_own_keys() {
    use reconcilers::keys as k;
    let guarded = key_set(&[
        k::VM_NAME,
        k::MODE,
        k::IMAGE,
        k::OS,
        k::STORAGE,
        k::MANAGED,
        k::SNAPSHOT_POLICY,
        k::NETWORK,
        k::FORCE_PULL,
        k::BACKEND,
        k::NO_DIRECT_IO,
        k::PROBE_PORT,
        k::FORK_FROM,
        k::CLONE_FROM_DIR,
        k::RESTORE_FROM_HIBERNATE,
    ]);
    assert_eq!(policy_list("keys"), guarded);
    let unmanaged = key_set(&[k::VM_ID, k::VM_IP, k::VNC_PORT]);
    assert_eq!(policy_list("staticKeys"), unmanaged);
    let written_by_vk = [
        k::VM_ID,
        k::VM_IP,
        k::VNC_PORT,
        k::POST_CLONE_STATE,
        k::POST_CLONE_HINT,
        k::POST_CLONE_ERRORS,
        k::LIFECYCLE_STATE,
        k::LIFECYCLE_GENERATION,
        k::LIFECYCLE_MESSAGE,
    ];
    for key in written_by_vk {
        assert!(!guarded.contains(key), "{key} is vk-cocoon's to write");
    }
}
