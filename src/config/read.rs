//! The readers of `Config::from_lookup` that do more than parse one variable: a derived
//! value, a warning, or a group of variables read together.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use reconcilers::config::{OrphanPolicy, RestoreMode};

use super::{
    node_ip, parse, ConfigError, Env, IpSource, PeerTls, Secret, SnapshotTransfer, DAY_MS, MIB,
};
use crate::journal::JournalSettings;

impl Env<'_> {
    /// `VK_NODE_IP`, else the first non-loopback IPv4 address, else 127.0.0.1 (with a warning).
    pub(super) fn node_ip(&mut self) -> (IpAddr, IpSource) {
        let (node_ip, node_ip_source) = match self.parsed("VK_NODE_IP", parse::ip) {
            Some(ip) => (ip, IpSource::Env),
            None => match node_ip::first_non_loopback_ipv4() {
                Some(ip) => (IpAddr::V4(ip), IpSource::Detected),
                None => (IpAddr::V4(Ipv4Addr::LOCALHOST), IpSource::Fallback),
            },
        };
        if node_ip_source == IpSource::Fallback && !self.set.contains("VK_NODE_IP") {
            self.warnings.push(
                "no non-loopback IPv4 address found; the node advertises 127.0.0.1 \
                 (set VK_NODE_IP to the address peers should dial)"
                    .into(),
            );
        }
        (node_ip, node_ip_source)
    }

    /// K7.1: `VK_PEER_CA_FILE` and `VK_PEER_CERT` together turn the peer API on; one without
    /// the other is an error, so a half-configured node does not silently stay off.
    pub(super) fn peer_tls(&mut self) -> Option<PeerTls> {
        let ca_file = self.get("VK_PEER_CA_FILE").map(std::path::PathBuf::from);
        let cert = self.get("VK_PEER_CERT").map(std::path::PathBuf::from);
        let key = self.get("VK_PEER_KEY").map(std::path::PathBuf::from);
        match (ca_file, cert) {
            (Some(ca_file), Some(cert)) => Some(PeerTls {
                key: key.unwrap_or_else(|| cert.clone()),
                ca_file,
                cert,
            }),
            (None, None) => {
                if key.is_some() {
                    self.missing("VK_PEER_KEY", "VK_PEER_CERT and VK_PEER_CA_FILE");
                }
                None
            }
            (Some(_), None) => {
                self.missing("VK_PEER_CA_FILE", "VK_PEER_CERT");
                None
            }
            (None, Some(_)) => {
                self.missing("VK_PEER_CERT", "VK_PEER_CA_FILE");
                None
            }
        }
    }

    fn missing(&mut self, var: &'static str, needs: &str) {
        self.errors.push(ConfigError {
            var,
            value: None,
            message: format!(
                "is set without {needs}: the peer API needs the cluster CA and this node's \
                 certificate together"
            ),
        });
    }

    pub(super) fn warn_if_anonymous(&mut self, anonymous: bool) {
        if anonymous {
            self.warnings.push(
                "VK_KUBELET_ANONYMOUS=true: the kubelet API serves reads without credentials, \
                 unchecked; anyone who reaches its port reads pod logs, stats and metrics \
                 (exec, attach and port-forward still need credentials)"
                    .into(),
            );
        }
    }

    pub(super) fn warn_if_no_registry(&mut self, unset: bool) {
        if unset {
            self.warnings.push(
                "OCI_REGISTRY is not set: deleted pods' VMs are removed without their delete-time \
                 snapshot, and clone bases, hibernates and wakes that need the registry fail"
                    .into(),
            );
        }
    }

    pub(super) fn exec_idle_timeout(&mut self) -> Duration {
        self.or("VK_EXEC_IDLE_TIMEOUT", Duration::from_secs(30), |s| {
            parse::duration_ms(s).map(|ms| Duration::from_millis(ms as u64))
        })
    }

    /// T12: from a minute to six hours.
    pub(super) fn image_pull_timeout(&mut self) -> Duration {
        self.or(
            "VK_IMAGE_PULL_TIMEOUT",
            crate::cocoon::timeouts::IMAGE_PULL,
            |s| match parse::duration_ms(s)? {
                ms if (60_000..=6 * 3_600_000).contains(&ms) => {
                    Ok(Duration::from_millis(ms as u64))
                }
                _ => Err("must be from 1m to 6h".into()),
            },
        )
    }

    /// C13: from 3 s (one attempt) to an hour.
    pub(super) fn post_clone_budget_ms(&mut self) -> i64 {
        self.or(
            "VK_POST_CLONE_BUDGET",
            reconcilers::config::FIXUP_BUDGET_MS,
            |s| match parse::duration_ms(s)? {
                ms if (3_000..=3_600_000).contains(&ms) => Ok(ms),
                _ => Err("must be from 3s to 1h".into()),
            },
        )
    }

    pub(super) fn metrics_addr(&mut self) -> SocketAddr {
        self.or(
            "VK_METRICS_ADDR",
            // Loopback: the metrics name every pod and namespace of the node, and this port
            // asks for no credentials; scrapers in the cluster read the kubelet port (K8).
            parse::listen_addr("127.0.0.1:9091").expect("default"),
            parse::listen_addr,
        )
    }

    /// `VK_IMAGE_URL_HOSTS`, else the host of `OCI_REGISTRY` (`registry`), else none.
    pub(super) fn image_url_hosts(&mut self, registry: Option<&str>) -> Vec<String> {
        self.parsed("VK_IMAGE_URL_HOSTS", parse::url_hosts)
            .unwrap_or_else(|| {
                registry
                    .and_then(parse::registry_host)
                    .into_iter()
                    .collect()
            })
    }

    /// T14: unset, every namespace joins only the node's default network.
    pub(super) fn networks(&mut self) -> std::collections::BTreeMap<String, Vec<String>> {
        self.parsed("VK_NETWORKS", parse::networks)
            .unwrap_or_default()
    }

    /// T15: unset, no record-less snapshot is public.
    pub(super) fn public_bases(&mut self) -> Vec<String> {
        self.parsed("VK_PUBLIC_SNAPSHOTS", parse::public_bases)
            .unwrap_or_default()
    }

    pub(super) fn orphan_policy(&mut self) -> OrphanPolicy {
        match self.get("VK_ORPHAN_POLICY") {
            None => OrphanPolicy::Destroy,
            Some(v) => {
                let p = OrphanPolicy::parse(v.trim());
                if !matches!(v.trim(), "destroy" | "alert" | "keep") {
                    self.warnings.push(format!(
                        "VK_ORPHAN_POLICY={v:?} is not destroy, alert or keep; behaving as alert (B8)"
                    ));
                }
                p
            }
        }
    }

    pub(super) fn vnc_password(&mut self) -> Option<Secret> {
        match self.get("COCOON_MACOS_VNC_PASSWORD") {
            Some(p) if p.len() > 8 => {
                self.errors.push(ConfigError {
                    var: "COCOON_MACOS_VNC_PASSWORD",
                    value: None,
                    message: format!("is {} bytes; VNC passwords are at most 8 bytes", p.len()),
                });
                None
            }
            p => p.map(Secret),
        }
    }

    pub(super) fn restore_mode(&mut self) -> RestoreMode {
        self.or("VK_RESTORE_MODE", RestoreMode::Ondemand, |s| match s {
            "copy" => Ok(RestoreMode::Copy),
            "ondemand" => Ok(RestoreMode::Ondemand),
            "mmap" => Ok(RestoreMode::Mmap),
            _ => Err("must be one of copy, ondemand, mmap".into()),
        })
    }

    pub(super) fn snapshot_transfer(&mut self) -> SnapshotTransfer {
        SnapshotTransfer {
            zstd_level: self.or("SNAPSHOT_ZSTD_LEVEL", 0, |s| parse::int_in(s, 0, 22)),
            chunk_size_mib: self.or("SNAPSHOT_CHUNK_SIZE_MIB", 0, |s| {
                parse::int_in(s, 0, 1 << 20)
            }),
            concurrency: self.or("SNAPSHOT_TRANSFER_CONCURRENCY", 8, |s| {
                parse::int_in(s, 1, 1024)
            }),
            memory_budget_mib: self.or("SNAPSHOT_MEMORY_BUDGET_MIB", 9216, |s| {
                parse::int_in(s, 1, 1 << 30)
            }),
            pull_budget_mib: self.or("SNAPSHOT_PULL_BUDGET_MIB", 2048, |s| {
                parse::int_in(s, 1, 1 << 30)
            }),
        }
    }

    /// `VK_JOURNAL_*`: `None` when `VK_JOURNAL_PATH` turns the journal off.
    pub(super) fn journal(&mut self) -> Option<JournalSettings> {
        let journal_path = self.path_or_off(
            "VK_JOURNAL_PATH",
            "/var/lib/vk-cocoon/journal/events.journal",
        );
        let max_bytes = self.or("VK_JOURNAL_MAX_BYTES", 64 * MIB as u64, |s| {
            let q = parse::quantity(s)?;
            if q.units() < MIB {
                return Err(
                    "must be at least 1Mi: a file also holds a snapshot of the state".into(),
                );
            }
            u64::try_from(q.units()).map_err(|_| "is too large".to_string())
        });
        let max_age_ms = self.or("VK_JOURNAL_MAX_AGE", DAY_MS, |s| {
            let ms = parse::duration_ms(s)?;
            if ms < 60_000 {
                return Err("must be at least 1m".into());
            }
            Ok(ms)
        });
        let files = self.or("VK_JOURNAL_FILES", 8, |s| parse::int_in(s, 1, 1000));
        journal_path.map(|path| JournalSettings {
            path,
            max_bytes,
            max_age_ms,
            files,
        })
    }
}
