//! What the loop needs, taken from the validated configuration. Node capacity is read here,
//! once, so a bad override or an unreadable /proc aborts startup before anything registers.

use anyhow::{Context, Result};

use super::Settings;
use crate::cocoon::CocoonCli;
use crate::config::Config;
use crate::effects::node::NodeSettings;
use crate::node_resources::{self, Overrides};

impl Settings {
    pub fn from_config(c: &Config) -> Result<Settings> {
        let text = |q: &Option<crate::config::Quantity>| q.as_ref().map(|q| q.text.clone());
        let overrides = Overrides {
            cpu: text(&c.node_cpu),
            memory: text(&c.node_mem),
            storage: text(&c.node_storage),
            hugepages: text(&c.node_hugepages),
            pods: Some(c.node_pods as u64),
            reserve_percent: c.reserve_percent,
            root_dir: c.cocoon_root_dir.display().to_string(),
        };
        let (capacity, allocatable) =
            node_resources::compute(&overrides).context("computing node capacity")?;
        Ok(Settings {
            core: c.to_core(),
            node: NodeSettings {
                name: c.node_name.clone(),
                ip: c.node_ip.to_string(),
                pool: c.node_pool.clone(),
                cpu_class: c.snapshot_cpu_class.clone(),
                provider_id: c.provider_id.clone(),
                kubelet_port: c.kubelet_port,
                websocket: c.kubelet_websocket,
                version: crate::version::kubelet_version().to_string(),
                capacity,
                allocatable,
            },
            cocoon: CocoonCli {
                macos_bin: c.cocoon_macos_bin.display().to_string(),
                macos_vnc_password: c
                    .macos_vnc_password
                    .as_ref()
                    .map(|p| p.expose().to_string()),
                timeouts: crate::cocoon::timeouts::Timeouts {
                    image: c.image_pull_timeout,
                    ..Default::default()
                },
                ..CocoonCli::new(c.cocoon_bin.display().to_string())
            },
            dhcp_leases_path: c.dhcp_leases_path.clone(),
            metrics_addr: Some(c.metrics_addr),
            journal: c.journal.clone(),
            cgroup_parent: c.cgroup_parent.clone(),
            tls_cert: c.tls_cert.clone(),
            tls_key: c.tls_key.clone(),
            node_ip: c.node_ip,
            client_ca_file: c.client_ca_file.clone(),
            kubelet_anonymous: c.kubelet_anonymous,
            exec_idle: c.exec_idle_timeout,
            root_dir: c.cocoon_root_dir.display().to_string(),
            dhcp_release_socket: c.cocoon_net_control_socket.clone(),
            registry: c.oci_registry.clone(),
            staging_dir: c.staging_dir.clone(),
            snapshot_dir: c.cocoon_snapshot_dir.clone(),
            peer_addr: c.peer_addr,
            peer_tls: c.peer_tls.clone(),
            snapshot: c.snapshot.clone(),
        })
    }
}
