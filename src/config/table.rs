//! The effective configuration as `check-config` prints it: one row per variable, in the
//! order of `VARS`, secrets shown only as set or unset.

use std::path::Path;

use super::{Config, IpSource, Quantity, VARS};

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn opt_q(q: &Option<Quantity>, auto: &str) -> String {
    match q {
        Some(q) => q.text.clone(),
        None => auto.to_string(),
    }
}

/// T12, T14, T15: what a pod may make the host reach, and which snapshots every pod may use.
fn tenant_reach(c: &Config, var: &str) -> String {
    let list = |l: &[String], none: &str| match l.is_empty() {
        true => none.to_string(),
        false => l.join(","),
    };
    match var {
        "VK_IMAGE_URL_HOSTS" => list(&c.image_url_hosts, "(none: no image is fetched by URL)"),
        "VK_PUBLIC_SNAPSHOTS" => list(
            &c.public_snapshots,
            "(none: snapshots without an owner record are nobody's)",
        ),
        _ if c.networks.is_empty() => "(none: every pod joins the node's default network)".into(),
        _ => c
            .networks
            .iter()
            .map(|(ns, nets)| format!("{ns}={}", nets.join(",")))
            .collect::<Vec<_>>()
            .join(";"),
    }
}

/// The effective value of `var`; `None` for a name this build does not read.
pub fn value_of(c: &Config, var: &str) -> Option<String> {
    let unset = || "(unset)".to_string();
    Some(match var {
        "KUBECONFIG" => c
            .kubeconfig
            .as_deref()
            .map(path)
            .unwrap_or_else(|| "(unset: ~/.kube/config, then in-cluster)".into()),
        "VK_NODE_NAME" => c.node_name.clone(),
        "VK_NODE_POOL" => c.node_pool.clone(),
        "VK_SNAPSHOT_CPU_CLASS" => c.snapshot_cpu_class.clone().unwrap_or_else(unset),
        "VK_NODE_IP" => match c.node_ip_source {
            IpSource::Env => c.node_ip.to_string(),
            IpSource::Detected => format!("{} (detected)", c.node_ip),
            IpSource::Fallback => format!("{} (fallback: no other IPv4 found)", c.node_ip),
        },
        "VK_PROVIDER_ID" => c.provider_id.clone().unwrap_or_else(unset),
        "VK_KUBELET_PORT" => c.kubelet_port.to_string(),
        "VK_TLS_CERT" => path(&c.tls_cert),
        "VK_TLS_KEY" => path(&c.tls_key),
        "VK_CLIENT_CA_FILE" => c
            .client_ca_file
            .as_deref()
            .map(path)
            .unwrap_or_else(|| "(unset: client certificates are not accepted)".into()),
        "VK_KUBELET_ANONYMOUS" => c.kubelet_anonymous.to_string(),
        "VK_KUBELET_WEBSOCKET" => c.kubelet_websocket.to_string(),
        "VK_EXEC_IDLE_TIMEOUT" => format!("{}s", c.exec_idle_timeout.as_secs()),
        "VK_IMAGE_PULL_TIMEOUT" => format!("{}s", c.image_pull_timeout.as_secs()),
        "VK_POST_CLONE_BUDGET" => format!("{}s", c.post_clone_budget_ms / 1000),
        "VK_METRICS_ADDR" => c.metrics_addr.to_string(),
        "VK_PEER_ADDR" => match c.peer_tls {
            Some(_) => c.peer_addr.to_string(),
            None => format!(
                "{} (off: VK_PEER_CA_FILE and VK_PEER_CERT unset)",
                c.peer_addr
            ),
        },
        "VK_PEER_CA_FILE" => c
            .peer_tls
            .as_ref()
            .map(|t| path(&t.ca_file))
            .unwrap_or_else(|| "(unset: peer API off)".into()),
        "VK_PEER_CERT" => c
            .peer_tls
            .as_ref()
            .map(|t| path(&t.cert))
            .unwrap_or_else(|| "(unset: peer API off)".into()),
        "VK_PEER_KEY" => c
            .peer_tls
            .as_ref()
            .map(|t| path(&t.key))
            .unwrap_or_else(unset),
        "VK_LOG_LEVEL" => c.log_level.as_filter().to_string(),
        "OCI_REGISTRY" => c
            .oci_registry
            .clone()
            .unwrap_or_else(|| "(unset: snapshot push/pull disabled)".into()),
        "GOOGLE_APPLICATION_CREDENTIALS" => c
            .google_application_credentials
            .as_deref()
            .map(path)
            .unwrap_or_else(unset),
        "VK_ORPHAN_POLICY" => format!("{:?}", c.orphan_policy).to_lowercase(),
        "VK_LEASES_PATH" => path(&c.dhcp_leases_path),
        "VK_COCOON_NET_CONTROL_SOCKET" => c
            .cocoon_net_control_socket
            .as_deref()
            .map(path)
            .unwrap_or_else(|| "(disabled: leases are not released)".into()),
        "VK_COCOON_BIN" => path(&c.cocoon_bin),
        "VK_COCOON_MACOS_BIN" => path(&c.cocoon_macos_bin),
        "COCOON_MACOS_VNC_PASSWORD" => match &c.macos_vnc_password {
            Some(_) => "(set, hidden)".into(),
            None => "(unset: no VNC)".into(),
        },
        "VK_RESTORE_MODE" => c.restore_mode.as_str().to_string(),
        "VK_STAGING_DIR" => path(&c.staging_dir),
        "VK_CLONE_FROM_DIR_ROOT" => c
            .clone_from_dir_root
            .as_deref()
            .map(path)
            .unwrap_or_else(|| "(unset: clone-from-dir is refused)".into()),
        "VK_IMAGE_URL_HOSTS" | "VK_NETWORKS" | "VK_PUBLIC_SNAPSHOTS" => tenant_reach(c, var),
        "VK_COCOON_SNAPSHOT_DIR" => path(&c.cocoon_snapshot_dir),
        "COCOON_ROOT_DIR" => path(&c.cocoon_root_dir),
        "COCOON_CGROUP_PARENT" => c.cgroup_parent.clone(),
        "VK_RESERVE_PERCENT" => c.reserve_percent.to_string(),
        "VK_NODE_CPU" => opt_q(&c.node_cpu, "auto (logical CPUs)"),
        "VK_NODE_MEM" => opt_q(&c.node_mem, "auto (MemTotal)"),
        "VK_NODE_STORAGE" => opt_q(&c.node_storage, "auto (statfs of COCOON_ROOT_DIR)"),
        "VK_NODE_HUGEPAGES" => opt_q(&c.node_hugepages, "auto (/proc/meminfo)"),
        "VK_NODE_PODS" => c.node_pods.to_string(),
        "SNAPSHOT_ZSTD_LEVEL" => c.snapshot.zstd_level.to_string(),
        "SNAPSHOT_CHUNK_SIZE_MIB" => c.snapshot.chunk_size_mib.to_string(),
        "SNAPSHOT_TRANSFER_CONCURRENCY" => c.snapshot.concurrency.to_string(),
        "SNAPSHOT_MEMORY_BUDGET_MIB" => c.snapshot.memory_budget_mib.to_string(),
        "SNAPSHOT_PULL_BUDGET_MIB" => c.snapshot.pull_budget_mib.to_string(),
        "VK_JOURNAL_PATH" => match &c.journal {
            Some(j) => path(&j.path),
            None => "(disabled)".into(),
        },
        "VK_JOURNAL_MAX_BYTES" => match &c.journal {
            Some(j) => j.max_bytes.to_string(),
            None => "-".into(),
        },
        "VK_JOURNAL_MAX_AGE" => match &c.journal {
            Some(j) => format!("{}s", j.max_age_ms / 1000),
            None => "-".into(),
        },
        "VK_JOURNAL_FILES" => match &c.journal {
            Some(j) => j.files.to_string(),
            None => "-".into(),
        },
        _ => return None,
    })
}

/// `VARIABLE  VALUE  SOURCE` rows, aligned.
pub fn effective_table(c: &Config) -> String {
    let rows: Vec<(&str, String, &str)> = VARS
        .iter()
        .map(|v| {
            let value = value_of(c, v.name).unwrap_or_else(|| "?".into());
            let source = if c.set.contains(v.name) {
                "env"
            } else {
                "default"
            };
            (v.name, value, source)
        })
        .collect();
    let w_name = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w_value = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
    let mut out = format!("{:w_name$}  {:w_value$}  SOURCE\n", "VARIABLE", "VALUE");
    for (name, value, source) in rows {
        out.push_str(&format!("{name:w_name$}  {value:w_value$}  {source}\n"));
    }
    out
}
