//! The daemon's configuration: every variable the daemon reads (CFG-1), the journal's included,
//! parsed and validated in one place. A bad value is an error that names the variable and
//! says what a good value looks like; all of them are reported at once.
//!
//! Empty means unset (CFG-1), except where emptiness is itself a setting:
//! `VK_COCOON_NET_CONTROL_SOCKET=` disables lease releases and `VK_JOURNAL_PATH=` disables
//! the journal.

mod node_ip;
mod parse;
mod read;
mod table;
mod vars;

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use reconcilers::config::{OrphanPolicy, RestoreMode};

use crate::journal::JournalSettings;

pub use table::{effective_table, value_of};
pub use vars::{Var, VARS};

/// A quantity as written and as parsed (thousandths, so `1500m` is exact).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantity {
    pub text: String,
    pub milli: i128,
}

impl Quantity {
    /// Whole units, rounded up (`1500m` → 2), as capacity is counted (N12).
    pub fn units(&self) -> i128 {
        (self.milli + 999).div_euclid(1000)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// The names logrus accepted, so an existing unit file keeps working.
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "trace" => LogLevel::Trace,
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "warn" | "warning" => LogLevel::Warn,
            "error" | "fatal" | "panic" => LogLevel::Error,
            _ => return Err("must be one of trace, debug, info, warn, error".into()),
        })
    }

    /// The `tracing_subscriber::EnvFilter` directive.
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// A value that must never reach a log or a terminal.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpSource {
    Env,
    Detected,
    /// No non-loopback IPv4 exists: the node address is 127.0.0.1, with a warning (DEC-6).
    Fallback,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotTransfer {
    pub zstd_level: u32,
    pub chunk_size_mib: u32,
    pub concurrency: u32,
    pub memory_budget_mib: u64,
    pub pull_budget_mib: u64,
}

/// K7.1: what the peer API authenticates with: the CA that signs every node's certificate and
/// this node's own certificate, presented both when serving and when dialing a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTls {
    /// `VK_PEER_CA_FILE`.
    pub ca_file: PathBuf,
    /// `VK_PEER_CERT`.
    pub cert: PathBuf,
    /// `VK_PEER_KEY`; the certificate file when unset (a kubelet's client PEM holds both).
    pub key: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub kubeconfig: Option<PathBuf>,
    pub node_name: String,
    pub node_pool: String,
    pub snapshot_cpu_class: Option<String>,
    pub node_ip: IpAddr,
    pub node_ip_source: IpSource,
    pub provider_id: Option<String>,
    pub kubelet_port: u16,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// K9: the CA of the client certificates the kubelet API accepts; `None`: tokens only.
    pub client_ca_file: Option<PathBuf>,
    /// K9: requests without credentials are served unchecked.
    pub kubelet_anonymous: bool,
    /// K4: the Node declares `ExtendWebSocketsToKubelet`, so the apiserver passes exec and
    /// port-forward WebSockets through instead of turning them into SPDY.
    pub kubelet_websocket: bool,
    /// K4: how long an exec session may see nothing move either way.
    pub exec_idle_timeout: std::time::Duration,
    /// T12: how long the host may take to fetch a run-mode pod's image.
    pub image_pull_timeout: std::time::Duration,
    /// C13: how long a clone's guest fix-up is tried.
    pub post_clone_budget_ms: i64,
    pub metrics_addr: SocketAddr,
    /// K7: `VK_NODE_IP` at port 12501 unless set.
    pub peer_addr: SocketAddr,
    /// K7.1: the node credentials of the peer API; `None` turns it off.
    pub peer_tls: Option<PeerTls>,
    pub log_level: LogLevel,
    pub oci_registry: Option<String>,
    pub google_application_credentials: Option<PathBuf>,
    pub orphan_policy: OrphanPolicy,
    pub dhcp_leases_path: PathBuf,
    /// `None`: lease releases are disabled.
    pub cocoon_net_control_socket: Option<PathBuf>,
    pub cocoon_bin: PathBuf,
    pub cocoon_macos_bin: PathBuf,
    pub macos_vnc_password: Option<Secret>,
    pub restore_mode: RestoreMode,
    pub staging_dir: PathBuf,
    /// T4: the only directory `clone-from-dir` paths may lie under; unset, the annotation is
    /// refused.
    pub clone_from_dir_root: Option<PathBuf>,
    /// T12: the hosts `http(s)://` run images may come from.
    pub image_url_hosts: Vec<String>,
    /// T14: by namespace (`*`: every one), the named networks its pods may join.
    pub networks: std::collections::BTreeMap<String, Vec<String>>,
    /// T15: the repositories whose snapshots without an owner record are public bases.
    pub public_snapshots: Vec<String>,
    pub cocoon_snapshot_dir: PathBuf,
    pub cocoon_root_dir: PathBuf,
    pub cgroup_parent: String,
    pub reserve_percent: u32,
    pub node_cpu: Option<Quantity>,
    pub node_mem: Option<Quantity>,
    pub node_storage: Option<Quantity>,
    pub node_hugepages: Option<Quantity>,
    pub node_pods: u32,
    pub snapshot: SnapshotTransfer,
    /// `None`: journaling is disabled.
    pub journal: Option<JournalSettings>,
    /// Variables that were set (non-empty) in the environment.
    pub set: BTreeSet<&'static str>,
    /// Accepted values that deserve a word (unknown orphan policy, no registry, …).
    pub warnings: Vec<String>,
}

/// One bad variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    /// `None` for secrets: the value is not repeated back.
    pub value: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={v:?}: {}", self.var, self.message),
            None => write!(f, "{}: {}", self.var, self.message),
        }
    }
}

/// Every bad variable, reported together so one edit fixes them all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

const MIB: i128 = 1 << 20;
const DAY_MS: i64 = 86_400_000;

/// Reads variables through `lookup`, remembering every error instead of stopping at one.
struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
    warnings: Vec<String>,
    set: BTreeSet<&'static str>,
}

impl Env<'_> {
    /// Set and non-empty (CFG-1: empty = unset).
    fn get(&mut self, var: &'static str) -> Option<String> {
        let v = (self.lookup)(var).filter(|v| !v.is_empty())?;
        self.set.insert(var);
        Some(v)
    }

    fn parsed<T>(
        &mut self,
        var: &'static str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let raw = self.get(var)?;
        match parse(raw.trim()) {
            Ok(v) => Some(v),
            Err(message) => {
                self.errors.push(ConfigError {
                    var,
                    value: Some(raw),
                    message,
                });
                None
            }
        }
    }

    fn or<T>(
        &mut self,
        var: &'static str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> T {
        self.parsed(var, parse).unwrap_or(default)
    }

    fn text(&mut self, var: &'static str, default: &str) -> String {
        self.get(var).unwrap_or_else(|| default.to_string())
    }

    fn path(&mut self, var: &'static str, default: &str) -> PathBuf {
        PathBuf::from(self.text(var, default))
    }

    /// A path whose explicit empty value turns the feature off.
    fn path_or_off(&mut self, var: &'static str, default: &str) -> Option<PathBuf> {
        match (self.lookup)(var) {
            Some(v) if v.is_empty() => {
                self.set.insert(var);
                None
            }
            _ => Some(self.path(var, default)),
        }
    }
}

impl Config {
    /// Reads the process environment. A variable that is not valid UTF-8 is an error too.
    pub fn from_env() -> Result<Config, ConfigErrors> {
        let mut not_utf8 = Vec::new();
        for v in VARS {
            if let Some(raw) = std::env::var_os(v.name) {
                if raw.to_str().is_none() {
                    not_utf8.push(ConfigError {
                        var: v.name,
                        value: None,
                        message: "is not valid UTF-8".into(),
                    });
                }
            }
        }
        let lookup = |name: &str| std::env::var(name).ok();
        match Self::from_lookup(&lookup) {
            Ok(c) if not_utf8.is_empty() => Ok(c),
            Ok(_) => Err(ConfigErrors(not_utf8)),
            Err(mut e) => {
                e.0.extend(not_utf8);
                Err(e)
            }
        }
    }

    /// Reads variables from `lookup` (`None` = unset): the testable core of `from_env`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut env = Env {
            lookup,
            errors: Vec::new(),
            warnings: Vec::new(),
            set: BTreeSet::new(),
        };
        let e = &mut env;

        let kubeconfig = e.get("KUBECONFIG").map(PathBuf::from);
        let node_name = e.or("VK_NODE_NAME", "cocoon-pool".into(), parse::dns_subdomain);
        let node_pool = e.or("VK_NODE_POOL", "default".into(), parse::label_value);
        let snapshot_cpu_class = e.parsed("VK_SNAPSHOT_CPU_CLASS", parse::label_value);
        let (node_ip, node_ip_source) = e.node_ip();
        let provider_id = e.get("VK_PROVIDER_ID");
        let kubelet_port = e.or("VK_KUBELET_PORT", 10250, parse::port);
        let tls_cert = e.path("VK_TLS_CERT", "/etc/cocoon/vk/tls/vk-kubelet.crt");
        let tls_key = e.path("VK_TLS_KEY", "/etc/cocoon/vk/tls/vk-kubelet.key");
        let client_ca_file = e.get("VK_CLIENT_CA_FILE").map(PathBuf::from);
        let kubelet_anonymous = e.or("VK_KUBELET_ANONYMOUS", false, parse::boolean);
        e.warn_if_anonymous(kubelet_anonymous);
        let kubelet_websocket = e.or("VK_KUBELET_WEBSOCKET", true, parse::boolean);
        let exec_idle_timeout = e.exec_idle_timeout();
        let image_pull_timeout = e.image_pull_timeout();
        let post_clone_budget_ms = e.post_clone_budget_ms();
        let metrics_addr = e.metrics_addr();
        let peer_addr = e.or(
            "VK_PEER_ADDR",
            SocketAddr::new(node_ip, 12501),
            parse::listen_addr,
        );
        let peer_tls = e.peer_tls();
        let log_level = e.or("VK_LOG_LEVEL", LogLevel::Info, LogLevel::parse);
        let oci_registry = e.get("OCI_REGISTRY");
        e.warn_if_no_registry(oci_registry.is_none());
        let google_application_credentials =
            e.get("GOOGLE_APPLICATION_CREDENTIALS").map(PathBuf::from);
        let orphan_policy = e.orphan_policy();
        let dhcp_leases_path = e.path("VK_LEASES_PATH", "/var/lib/cocoon/net/leases.json");
        let cocoon_net_control_socket = e.path_or_off(
            "VK_COCOON_NET_CONTROL_SOCKET",
            "/run/cocoon-net/control.sock",
        );
        let cocoon_bin = e.path("VK_COCOON_BIN", "/usr/local/bin/cocoon");
        let cocoon_macos_bin = e.path("VK_COCOON_MACOS_BIN", "/usr/local/bin/cocoon-macos");
        let macos_vnc_password = e.vnc_password();
        let restore_mode = e.restore_mode();
        let staging_dir = e.path("VK_STAGING_DIR", "/var/lib/cocoon/vk-staging");
        let clone_from_dir_root = e.parsed("VK_CLONE_FROM_DIR_ROOT", parse::absolute_dir);
        let image_url_hosts = e.image_url_hosts(oci_registry.as_deref());
        let networks = e.networks();
        let public_snapshots = e.public_bases();
        let cocoon_snapshot_dir = e.path(
            "VK_COCOON_SNAPSHOT_DIR",
            "/var/lib/cocoon/snapshot/localfile",
        );
        let cocoon_root_dir = e.path("COCOON_ROOT_DIR", "/var/lib/cocoon");
        let cgroup_parent = e.text("COCOON_CGROUP_PARENT", "cocoon.slice");
        let reserve_percent = e.or("VK_RESERVE_PERCENT", 20, |s| parse::int_in(s, 0, 100));
        let node_cpu = e.parsed("VK_NODE_CPU", parse::quantity);
        let node_mem = e.parsed("VK_NODE_MEM", parse::quantity);
        let node_storage = e.parsed("VK_NODE_STORAGE", parse::quantity);
        let node_hugepages = e.parsed("VK_NODE_HUGEPAGES", parse::quantity);
        let node_pods = e.or("VK_NODE_PODS", 256, |s| parse::int_in(s, 0, 1_000_000));
        let snapshot = e.snapshot_transfer();
        let journal = e.journal();

        if !env.errors.is_empty() {
            return Err(ConfigErrors(env.errors));
        }
        Ok(Config {
            kubeconfig,
            node_name,
            node_pool,
            snapshot_cpu_class,
            node_ip,
            node_ip_source,
            provider_id,
            kubelet_port,
            tls_cert,
            tls_key,
            client_ca_file,
            kubelet_anonymous,
            kubelet_websocket,
            exec_idle_timeout,
            image_pull_timeout,
            post_clone_budget_ms,
            metrics_addr,
            peer_addr,
            peer_tls,
            log_level,
            oci_registry,
            google_application_credentials,
            orphan_policy,
            dhcp_leases_path,
            cocoon_net_control_socket,
            cocoon_bin,
            cocoon_macos_bin,
            macos_vnc_password,
            restore_mode,
            staging_dir,
            clone_from_dir_root,
            image_url_hosts,
            networks,
            public_snapshots,
            cocoon_snapshot_dir,
            cocoon_root_dir,
            cgroup_parent,
            reserve_percent,
            node_cpu,
            node_mem,
            node_storage,
            node_hugepages,
            node_pods,
            snapshot,
            journal,
            set: env.set,
            warnings: env.warnings,
        })
    }

    /// The settings the pure core decides with (also written into every journal header).
    pub fn to_core(&self) -> reconcilers::Config {
        reconcilers::Config {
            node_name: self.node_name.clone(),
            registry: self.oci_registry.clone(),
            node_ip: self.node_ip.to_string(),
            orphan_policy: self.orphan_policy,
            cpu_class: self.snapshot_cpu_class.clone(),
            restore_mode: self.restore_mode,
            release_dhcp_leases: self.cocoon_net_control_socket.is_some(),
            clone_from_dir_root: self
                .clone_from_dir_root
                .as_ref()
                .map(|p| p.display().to_string()),
            macos_vnc: self.macos_vnc_password.is_some(),
            // CLI-10: learned from the binary at startup (`cocoon::tier::detect`).
            cocoon: reconcilers::cocoon_caps::CocoonCaps::CURRENT,
            // The executor's kube write lane is built to this size.
            write_slots: reconcilers::config::WRITE_SLOTS,
            image_url_hosts: Some(self.image_url_hosts.clone()),
            networks: Some(self.networks.clone()),
            public_snapshots: Some(self.public_snapshots.clone()),
            fixup_budget_ms: self.post_clone_budget_ms,
        }
    }
}
