//! The shipped packaging stays consistent with the code: alert rules parse and pass their unit
//! tests (promtool, which `make deps` installs) and only name metrics this build exports; the unit runs the
//! real subcommand.

use std::collections::BTreeSet;
use std::process::Command;

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

#[test]
fn alert_rules_name_only_exported_metrics() {
    let alerts = std::fs::read_to_string("packaging/alerts.yaml").unwrap();
    let code = ["src/metrics.rs", "src/stats_collector.rs"]
        .map(|p| std::fs::read_to_string(p).unwrap())
        .join("\n");
    let exported = metric_names(&code);
    for name in metric_names(&alerts) {
        assert!(
            exported.contains(&name),
            "packaging/alerts.yaml uses {name}, which this build does not export"
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
    assert!(unit.contains("ExecStart=/usr/local/bin/vk-cocoon run"));
    assert!(unit.contains("Restart=always") && unit.contains("RestartSec=5"));
    // Only the daemon gets the signal; VMs (and their cocoon children) are not its cgroup's to kill.
    assert!(unit.contains("KillMode=process"));
}
