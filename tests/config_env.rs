//! Configuration from the environment (CFG-1–CFG-3): every variable, the journal's too, with a
//! good value and with bad ones, the defaults, the warnings, and the binary's exit code 2.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use reconcilers::config::{OrphanPolicy, RestoreMode};
use vk_cocoon::config::{value_of, Config, ConfigErrors, LogLevel, VARS};

use support::vk_cocoon;

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let map: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(&|name| map.get(name).cloned())
}

/// A good, non-default value for every variable.
const EVERY: &[(&str, &str)] = &[
    ("KUBECONFIG", "/etc/kube/admin.conf"),
    ("VK_NODE_NAME", "cocoon-a1.zone-b"),
    ("VK_NODE_POOL", "gpu_pool"),
    ("VK_SNAPSHOT_CPU_CLASS", "amd-epyc-9004"),
    ("VK_NODE_IP", "10.1.2.3"),
    ("VK_PROVIDER_ID", "gce://proj/zone/vm-1"),
    ("VK_KUBELET_PORT", "10351"),
    ("VK_TLS_CERT", "/tls/c.crt"),
    ("VK_TLS_KEY", "/tls/c.key"),
    ("VK_CLIENT_CA_FILE", "/tls/clients-ca.crt"),
    ("VK_KUBELET_ANONYMOUS", "false"),
    ("VK_KUBELET_WEBSOCKET", "false"),
    ("VK_POST_CLONE_BUDGET", "90s"),
    ("VK_IMAGE_PULL_TIMEOUT", "5m"),
    ("VK_EXEC_IDLE_TIMEOUT", "2m"),
    ("VK_METRICS_ADDR", "127.0.0.1:9100"),
    ("VK_PEER_ADDR", "[::]:12600"),
    ("VK_PEER_CA_FILE", "/etc/kubernetes/pki/ca.crt"),
    (
        "VK_PEER_CERT",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    ),
    ("VK_PEER_KEY", "/var/lib/kubelet/pki/kubelet-client-key.pem"),
    ("VK_LOG_LEVEL", "DEBUG"),
    ("OCI_REGISTRY", "us-docker.pkg.dev/proj/vms"),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/secrets/sa.json"),
    ("VK_ORPHAN_POLICY", "keep"),
    ("VK_LEASES_PATH", "/run/leases.json"),
    ("VK_COCOON_NET_CONTROL_SOCKET", "/run/cn.sock"),
    ("VK_COCOON_BIN", "/opt/cocoon"),
    ("VK_COCOON_MACOS_BIN", "/opt/cocoon-macos"),
    ("COCOON_MACOS_VNC_PASSWORD", "s3cret"),
    ("VK_RESTORE_MODE", "mmap"),
    ("VK_CLONE_FROM_DIR_ROOT", "/data/import"),
    ("VK_IMAGE_URL_HOSTS", "images.example,mirror.example:8443"),
    ("VK_NETWORKS", "team-a=isolated-a;*=shared"),
    ("VK_PUBLIC_SNAPSHOTS", "ubuntu-24.04,bases/win11"),
    ("VK_STAGING_DIR", "/data/staging"),
    ("VK_COCOON_SNAPSHOT_DIR", "/data/snap"),
    ("COCOON_ROOT_DIR", "/data/cocoon"),
    ("COCOON_CGROUP_PARENT", "vms.slice"),
    ("VK_RESERVE_PERCENT", "0"),
    ("VK_NODE_CPU", "1500m"),
    ("VK_NODE_MEM", "64Gi"),
    ("VK_NODE_STORAGE", "2T"),
    ("VK_NODE_HUGEPAGES", "8Gi"),
    ("VK_NODE_PODS", "110"),
    ("SNAPSHOT_ZSTD_LEVEL", "3"),
    ("SNAPSHOT_CHUNK_SIZE_MIB", "64"),
    ("SNAPSHOT_TRANSFER_CONCURRENCY", "16"),
    ("SNAPSHOT_MEMORY_BUDGET_MIB", "4096"),
    ("SNAPSHOT_PULL_BUDGET_MIB", "1024"),
    ("VK_JOURNAL_PATH", "/data/journal/ev.jsonl"),
    ("VK_JOURNAL_MAX_BYTES", "16Mi"),
    ("VK_JOURNAL_MAX_AGE", "12h"),
    ("VK_JOURNAL_FILES", "3"),
];

#[test]
fn the_test_sets_every_variable_the_daemon_reads() {
    let set: Vec<&str> = EVERY.iter().map(|(k, _)| *k).collect();
    let known: Vec<&str> = VARS.iter().map(|v| v.name).collect();
    assert_eq!(set, known);
}

#[test]
fn every_variable_is_read() {
    let c = parse(EVERY).expect("all good");
    assert_eq!(c.kubeconfig, Some(PathBuf::from("/etc/kube/admin.conf")));
    assert_eq!(c.node_name, "cocoon-a1.zone-b");
    assert_eq!(c.node_pool, "gpu_pool");
    assert_eq!(c.snapshot_cpu_class.as_deref(), Some("amd-epyc-9004"));
    assert_eq!(c.node_ip.to_string(), "10.1.2.3");
    assert_eq!(c.provider_id.as_deref(), Some("gce://proj/zone/vm-1"));
    assert_eq!(c.kubelet_port, 10351);
    assert_eq!(c.tls_cert, PathBuf::from("/tls/c.crt"));
    assert_eq!(c.tls_key, PathBuf::from("/tls/c.key"));
    assert_eq!(c.client_ca_file, Some(PathBuf::from("/tls/clients-ca.crt")));
    assert!(!c.kubelet_anonymous);
    assert_eq!(
        c.metrics_addr,
        "127.0.0.1:9100".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(c.peer_addr, "[::]:12600".parse::<SocketAddr>().unwrap());
    assert_eq!(c.log_level, LogLevel::Debug);
    assert_eq!(
        c.oci_registry.as_deref(),
        Some("us-docker.pkg.dev/proj/vms")
    );
    assert_eq!(
        c.google_application_credentials,
        Some(PathBuf::from("/secrets/sa.json"))
    );
    assert_eq!(c.orphan_policy, OrphanPolicy::Keep);
    assert!(!c.kubelet_websocket);
    assert_eq!(c.exec_idle_timeout, std::time::Duration::from_secs(120));
    assert_eq!(c.dhcp_leases_path, PathBuf::from("/run/leases.json"));
    assert_eq!(
        c.cocoon_net_control_socket,
        Some(PathBuf::from("/run/cn.sock"))
    );
    assert_eq!(c.cocoon_bin, PathBuf::from("/opt/cocoon"));
    assert_eq!(c.cocoon_macos_bin, PathBuf::from("/opt/cocoon-macos"));
    assert_eq!(
        c.macos_vnc_password.as_ref().map(|s| s.expose()),
        Some("s3cret")
    );
    assert_eq!(c.restore_mode, RestoreMode::Mmap);
    assert_eq!(c.staging_dir, PathBuf::from("/data/staging"));
    assert_eq!(c.cocoon_snapshot_dir, PathBuf::from("/data/snap"));
    assert_eq!(c.cocoon_root_dir, PathBuf::from("/data/cocoon"));
    assert_eq!(c.cgroup_parent, "vms.slice");
    assert_eq!(c.reserve_percent, 0);
    assert_eq!(c.node_cpu.as_ref().map(|q| q.units()), Some(2));
    assert_eq!(c.node_mem.as_ref().map(|q| q.units()), Some(64 << 30));
    assert_eq!(
        c.node_storage.as_ref().map(|q| q.units()),
        Some(2_000_000_000_000)
    );
    assert_eq!(c.node_hugepages.as_ref().map(|q| q.units()), Some(8 << 30));
    assert_eq!(c.node_pods, 110);
    assert_eq!(c.snapshot.zstd_level, 3);
    assert_eq!(c.snapshot.chunk_size_mib, 64);
    assert_eq!(c.snapshot.concurrency, 16);
    assert_eq!(c.snapshot.memory_budget_mib, 4096);
    assert_eq!(c.snapshot.pull_budget_mib, 1024);
    assert_eq!(c.clone_from_dir_root, Some(PathBuf::from("/data/import")));
    assert_eq!(c.post_clone_budget_ms, 90_000);
    assert_eq!(c.image_pull_timeout, std::time::Duration::from_secs(300));
    assert_eq!(c.image_url_hosts, ["images.example", "mirror.example:8443"]);
    assert_eq!(c.networks["team-a"], ["isolated-a"]);
    assert_eq!(c.networks["*"], ["shared"]);
    assert_eq!(c.public_snapshots, ["ubuntu-24.04", "bases/win11"]);
    let j = c.journal.as_ref().expect("journal on");
    assert_eq!(j.path, PathBuf::from("/data/journal/ev.jsonl"));
    assert_eq!(
        (j.max_bytes, j.max_age_ms, j.files),
        (16 << 20, 12 * 3_600_000, 3)
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.set.len(), VARS.len());

    let core = c.to_core();
    assert_eq!(core.node_name, "cocoon-a1.zone-b");
    assert_eq!(core.node_ip, "10.1.2.3");
    assert_eq!(core.orphan_policy, OrphanPolicy::Keep);
    assert_eq!(core.cpu_class.as_deref(), Some("amd-epyc-9004"));
    assert_eq!(core.restore_mode, RestoreMode::Mmap);
    assert_eq!(
        core.public_snapshots.as_deref(),
        Some(&["ubuntu-24.04".to_string(), "bases/win11".to_string()][..])
    );
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = parse(&[]).expect("defaults are valid");
    assert_eq!(c.kubeconfig, None);
    assert_eq!(c.node_name, "cocoon-pool");
    assert_eq!(c.node_pool, "default");
    assert_eq!(c.snapshot_cpu_class, None);
    assert_eq!(c.kubelet_port, 10250);
    assert_eq!(c.client_ca_file, None);
    assert!(!c.kubelet_anonymous);
    assert!(c.kubelet_websocket);
    assert_eq!(c.exec_idle_timeout, std::time::Duration::from_secs(30));
    assert_eq!(c.metrics_addr.to_string(), "127.0.0.1:9091");
    // K7.1, K7.2: on the node's own address, and off until the node credentials are given.
    assert_eq!(c.peer_addr, SocketAddr::new(c.node_ip, 12501));
    assert_eq!(c.peer_tls, None);
    assert_eq!(c.log_level, LogLevel::Info);
    assert_eq!(c.orphan_policy, OrphanPolicy::Destroy);
    assert_eq!(c.restore_mode, RestoreMode::Ondemand);
    assert_eq!(c.reserve_percent, 20);
    assert_eq!(c.post_clone_budget_ms, 180_000);
    assert_eq!(c.node_pods, 256);
    // T12: no registry, so no image is fetched by URL; with one, its host only.
    assert!(c.image_url_hosts.is_empty());
    // T14: the node's default network only.
    assert!(c.networks.is_empty());
    let c2 = parse(&[("OCI_REGISTRY", "127.0.0.1:5000/vms")]).expect("valid");
    assert_eq!(c2.image_url_hosts, ["127.0.0.1:5000"]);
    assert_eq!(
        c.cocoon_net_control_socket,
        Some(PathBuf::from("/run/cocoon-net/control.sock"))
    );
    assert_eq!(
        (
            c.snapshot.zstd_level,
            c.snapshot.chunk_size_mib,
            c.snapshot.concurrency,
            c.snapshot.memory_budget_mib,
            c.snapshot.pull_budget_mib
        ),
        (0, 0, 8, 9216, 2048)
    );
    let j = c.journal.clone().expect("journal on by default");
    assert_eq!(
        j.path,
        PathBuf::from("/var/lib/vk-cocoon/journal/events.journal")
    );
    assert_eq!(
        (j.max_bytes, j.max_age_ms, j.files),
        (64 << 20, 86_400_000, 8)
    );
    // OCI_REGISTRY: this build runs without it, with a warning (CFG-3).
    assert_eq!(c.oci_registry, None);
    assert!(c.warnings.iter().any(|w| w.contains("OCI_REGISTRY")));
    // Every row of check-config has a value.
    for v in VARS {
        assert!(value_of(&c, v.name).is_some(), "{} has no row", v.name);
    }
}

#[test]
fn empty_means_unset_except_where_empty_switches_a_feature_off() {
    let c = parse(&[
        ("VK_NODE_NAME", ""),
        ("VK_RESTORE_MODE", ""),
        ("VK_NODE_CPU", ""),
    ])
    .unwrap();
    assert_eq!(c.node_name, "cocoon-pool");
    assert_eq!(c.restore_mode, RestoreMode::Ondemand);
    assert_eq!(c.node_cpu, None);
    let c = parse(&[
        ("VK_JOURNAL_PATH", ""),
        ("VK_COCOON_NET_CONTROL_SOCKET", ""),
    ])
    .unwrap();
    assert_eq!(c.journal, None);
    assert_eq!(c.cocoon_net_control_socket, None);
}

#[test]
fn an_unknown_orphan_policy_behaves_as_alert_with_a_warning() {
    let c = parse(&[("VK_ORPHAN_POLICY", "nuke")]).unwrap();
    assert_eq!(c.orphan_policy, OrphanPolicy::Alert);
    assert!(c.warnings.iter().any(|w| w.contains("VK_ORPHAN_POLICY")));
    for (v, p) in [
        ("destroy", OrphanPolicy::Destroy),
        ("alert", OrphanPolicy::Alert),
        ("keep", OrphanPolicy::Keep),
    ] {
        assert_eq!(parse(&[("VK_ORPHAN_POLICY", v)]).unwrap().orphan_policy, p);
    }
}

#[test]
fn an_anonymous_kubelet_api_is_accepted_with_a_warning() {
    let c = parse(&[("VK_KUBELET_ANONYMOUS", "true")]).unwrap();
    assert!(c.kubelet_anonymous);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("VK_KUBELET_ANONYMOUS")));
}

#[test]
fn log_levels_accept_the_names_logrus_did() {
    for (v, l) in [
        ("trace", LogLevel::Trace),
        ("warning", LogLevel::Warn),
        ("Warn", LogLevel::Warn),
        ("fatal", LogLevel::Error),
    ] {
        assert_eq!(parse(&[("VK_LOG_LEVEL", v)]).unwrap().log_level, l);
    }
}

/// Each bad value is reported against its own variable.
const BAD: &[(&str, &str)] = &[
    ("VK_NODE_NAME", "Cocoon_Pool"),
    ("VK_NODE_POOL", "a pool"),
    ("VK_SNAPSHOT_CPU_CLASS", "-amd"),
    ("VK_SNAPSHOT_CPU_CLASS", "x/y"),
    ("VK_NODE_IP", "10.0.0"),
    ("VK_KUBELET_PORT", "0"),
    ("VK_KUBELET_PORT", "70000"),
    ("VK_KUBELET_PORT", "http"),
    ("VK_METRICS_ADDR", "9091"),
    ("VK_METRICS_ADDR", "metrics.local:9091"),
    ("VK_PEER_ADDR", ":port"),
    ("VK_LOG_LEVEL", "verbose"),
    ("VK_KUBELET_ANONYMOUS", "sometimes"),
    ("VK_EXEC_IDLE_TIMEOUT", "30"),
    ("VK_IMAGE_PULL_TIMEOUT", "10s"),
    ("VK_IMAGE_PULL_TIMEOUT", "7h"),
    ("VK_PUBLIC_SNAPSHOTS", "ubuntu:24.04"),
    ("COCOON_MACOS_VNC_PASSWORD", "longer-than-8"),
    ("VK_RESTORE_MODE", "lazy"),
    ("VK_RESTORE_MODE", "COPY"),
    ("VK_RESERVE_PERCENT", "101"),
    ("VK_RESERVE_PERCENT", "-1"),
    ("VK_RESERVE_PERCENT", "20%"),
    ("VK_NODE_CPU", "lots"),
    ("VK_NODE_MEM", "-1Gi"),
    ("VK_NODE_STORAGE", "1TB"),
    ("VK_NODE_HUGEPAGES", "2Mx"),
    ("VK_NODE_PODS", "many"),
    ("SNAPSHOT_ZSTD_LEVEL", "23"),
    ("SNAPSHOT_CHUNK_SIZE_MIB", "-4"),
    ("SNAPSHOT_TRANSFER_CONCURRENCY", "0"),
    ("SNAPSHOT_MEMORY_BUDGET_MIB", "0"),
    ("SNAPSHOT_PULL_BUDGET_MIB", "1.5"),
    ("VK_JOURNAL_MAX_BYTES", "1Ki"),
    ("VK_JOURNAL_MAX_BYTES", "big"),
    ("VK_JOURNAL_MAX_AGE", "30s"),
    ("VK_JOURNAL_MAX_AGE", "12"),
    ("VK_JOURNAL_FILES", "0"),
];

#[test]
fn a_bad_value_is_an_error_naming_its_variable() {
    for (var, value) in BAD {
        let errs = parse(&[(var, value)]).expect_err(&format!("{var}={value:?} must fail"));
        assert_eq!(errs.0.len(), 1, "{errs}");
        let e = &errs.0[0];
        assert_eq!(e.var, *var);
        let text = e.to_string();
        assert!(text.starts_with(var), "{text}");
        assert!(!e.message.is_empty());
    }
}

#[test]
fn all_bad_variables_are_reported_together_and_secrets_are_not_echoed() {
    let errs = parse(&[
        ("VK_RESTORE_MODE", "lazy"),
        ("VK_RESERVE_PERCENT", "101"),
        ("COCOON_MACOS_VNC_PASSWORD", "hunter2hunter2"),
    ])
    .unwrap_err();
    let mut vars: Vec<&str> = errs.0.iter().map(|e| e.var).collect();
    vars.sort();
    assert_eq!(
        vars,
        [
            "COCOON_MACOS_VNC_PASSWORD",
            "VK_RESERVE_PERCENT",
            "VK_RESTORE_MODE"
        ]
    );
    assert!(!errs.to_string().contains("hunter2"));
}

#[test]
fn check_config_prints_the_effective_table_and_hides_secrets() {
    let out = vk_cocoon()
        .arg("check-config")
        .envs(EVERY.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for v in VARS {
        assert!(table.contains(v.name), "{} missing:\n{table}", v.name);
    }
    assert!(
        table.contains("VK_RESTORE_MODE                 mmap"),
        "{table}"
    );
    assert!(!table.contains("s3cret"), "{table}");
    assert!(table.contains("(set, hidden)"));
}

#[test]
fn check_config_and_run_exit_2_on_a_bad_value() {
    for cmd in ["check-config", "run"] {
        let out = vk_cocoon()
            .arg(cmd)
            .env("VK_RESTORE_MODE", "lazy")
            .env("VK_KUBELET_PORT", "0")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.contains("VK_RESTORE_MODE=\"lazy\": must be one of copy, ondemand, mmap"),
            "{err}"
        );
        assert!(err.contains("VK_KUBELET_PORT=\"0\""), "{err}");
    }
}

#[test]
fn check_config_warns_about_what_it_accepts() {
    let out = vk_cocoon()
        .arg("check-config")
        .env("VK_ORPHAN_POLICY", "sometimes")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("warning: VK_ORPHAN_POLICY=\"sometimes\""),
        "{err}"
    );
    assert!(err.contains("warning: OCI_REGISTRY is not set"), "{err}");
}

#[test]
fn the_readme_documents_every_variable() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    for v in VARS {
        assert!(
            readme.contains(&format!("`{}`", v.name)),
            "README.md does not document {}",
            v.name
        );
    }
}

#[test]
fn the_peer_api_needs_the_cluster_ca_and_the_node_certificate_together() {
    // K7.1: the key defaults to the certificate file, which a kubelet's client PEM holds both in.
    let c = parse(&[
        ("VK_PEER_CA_FILE", "/ca.crt"),
        ("VK_PEER_CERT", "/node.pem"),
    ])
    .unwrap();
    let t = c.peer_tls.expect("on with both");
    assert_eq!(
        (t.ca_file, t.cert, t.key),
        ("/ca.crt".into(), "/node.pem".into(), "/node.pem".into())
    );
    for (var, val) in [
        ("VK_PEER_CA_FILE", "/ca.crt"),
        ("VK_PEER_CERT", "/node.pem"),
        ("VK_PEER_KEY", "/node.key"),
    ] {
        let err = parse(&[(var, val)]).unwrap_err();
        assert!(
            err.0
                .iter()
                .any(|e| e.var == var && e.message.contains("without")),
            "{var}: {err}"
        );
    }
}
