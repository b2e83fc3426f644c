//! Every environment variable the daemon reads (CFG-1), the journal's included,
//! its default and what it means. One list, so `check-config`, the README and the parser
//! cannot drift apart (a test holds them together).

pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn var(name: &'static str, default: &'static str, meaning: &'static str) -> Var {
    Var {
        name,
        default,
        meaning,
    }
}

pub const VARS: &[Var] = &[
    var(
        "KUBECONFIG",
        "unset → ~/.kube/config → in-cluster",
        "how to reach the API server",
    ),
    var(
        "VK_NODE_NAME",
        "cocoon-pool",
        "the Node this host registers as (DNS subdomain)",
    ),
    var(
        "VK_NODE_POOL",
        "default",
        "value of the node label cocoonstack.io/pool",
    ),
    var(
        "VK_SNAPSHOT_CPU_CLASS",
        "unset",
        "node label cocoonstack.io/snapshot-cpu-class; pods selecting another class are rejected",
    ),
    var(
        "VK_NODE_IP",
        "first non-loopback IPv4",
        "the node's InternalIP (peers dial it)",
    ),
    var("VK_PROVIDER_ID", "unset", "spec.providerID of the Node"),
    var(
        "VK_KUBELET_PORT",
        "10250",
        "kubelet API port, also advertised in the Node status",
    ),
    var(
        "VK_TLS_CERT",
        "/etc/cocoon/vk/tls/vk-kubelet.crt",
        "kubelet API certificate (self-signed when missing)",
    ),
    var(
        "VK_TLS_KEY",
        "/etc/cocoon/vk/tls/vk-kubelet.key",
        "kubelet API key",
    ),
    var(
        "VK_CLIENT_CA_FILE",
        "unset",
        "CA bundle that signs the client certificates the kubelet API accepts (the apiserver's --kubelet-client-certificate); unset: only tokens are accepted",
    ),
    var(
        "VK_KUBELET_ANONYMOUS",
        "false",
        "true: the kubelet API serves reads (container logs, stats, metrics) without credentials, unchecked (warning); exec, attach and port-forward still need credentials",
    ),
    var(
        "VK_KUBELET_WEBSOCKET",
        "true",
        "true: the Node declares ExtendWebSocketsToKubelet, so exec and port-forward reach the kubelet API as WebSockets; false: the apiserver speaks SPDY to it",
    ),
    var(
        "VK_POST_CLONE_BUDGET",
        "3m",
        "how long a clone's guest fix-up is tried (every 3 s) before it gives up (s, m or h; 3s to 1h)",
    ),
    var(
        "VK_IMAGE_PULL_TIMEOUT",
        "30m",
        "how long the host may take to fetch a run-mode pod's image (cocoon image pull or import), holding a slot of the shared cocoon lane meanwhile (s, m or h; 1m to 6h)",
    ),
    var(
        "VK_EXEC_IDLE_TIMEOUT",
        "30s",
        "an exec session in which nothing moves either way (client pings count) this long ends (s, m, h or d)",
    ),
    var(
        "VK_METRICS_ADDR",
        "127.0.0.1:9091",
        "listen address of the plain-HTTP /metrics (the same metrics are on the kubelet API port behind its authorization, nodes/metrics)",
    ),
    var(
        "VK_PEER_ADDR",
        "VK_NODE_IP:12501",
        "listen address of the snapshot peer API (only while VK_PEER_CA_FILE and VK_PEER_CERT are set)",
    ),
    var(
        "VK_PEER_CA_FILE",
        "unset (peer API off)",
        "CA bundle that signs every node's certificate (the cluster CA); with VK_PEER_CERT it turns the peer API on, mutual TLS between nodes only",
    ),
    var(
        "VK_PEER_CERT",
        "unset (peer API off)",
        "a node certificate (PEM) chained to VK_PEER_CA_FILE, subject O=system:nodes, CN=system:node:<name> (the host kubelet's client certificate, kubelet-client-current.pem); presented when serving and when dialing peers",
    ),
    var(
        "VK_PEER_KEY",
        "VK_PEER_CERT",
        "the key of VK_PEER_CERT (PEM); unset, it is read from the certificate file",
    ),
    var(
        "VK_LOG_LEVEL",
        "info",
        "trace, debug, info, warn or error (invalid → startup fails)",
    ),
    var(
        "OCI_REGISTRY",
        "unset (warning)",
        "registry base for snapshot push and pull (host[:port][/prefix]); without it deletes skip their snapshot and registry pulls fail",
    ),
    var(
        "GOOGLE_APPLICATION_CREDENTIALS",
        "unset",
        "service-account file for GCP application default credentials, used by the credential helper the Docker config names (docker-credential-gcloud), which inherits the daemon's environment",
    ),
    var(
        "VK_ORPHAN_POLICY",
        "destroy",
        "VMs no pod claims at startup: destroy, alert or keep (unknown → alert)",
    ),
    var(
        "VK_LEASES_PATH",
        "/var/lib/cocoon/net/leases.json",
        "cocoon-net DHCP lease file",
    ),
    var(
        "VK_COCOON_NET_CONTROL_SOCKET",
        "/run/cocoon-net/control.sock",
        "cocoon-net lease-release socket; set empty to disable releases",
    ),
    var("VK_COCOON_BIN", "/usr/local/bin/cocoon", "the cocoon CLI"),
    var(
        "VK_COCOON_MACOS_BIN",
        "/usr/local/bin/cocoon-macos",
        "the cocoon-macos CLI",
    ),
    var(
        "COCOON_MACOS_VNC_PASSWORD",
        "unset (no VNC)",
        "VNC password of macOS guests, at most 8 bytes (never printed)",
    ),
    var(
        "VK_RESTORE_MODE",
        "ondemand",
        "snapshot restore mode: copy, ondemand or mmap (invalid → startup fails)",
    ),
    var(
        "VK_CLONE_FROM_DIR_ROOT",
        "",
        "the directory clone-from-dir paths must lie under (unset: the annotation is refused)",
    ),
    var(
        "VK_IMAGE_URL_HOSTS",
        "",
        "hosts (host or host:port, comma-separated; * for any) that http(s):// run images may be \
         fetched from (unset: OCI_REGISTRY's host only)",
    ),
    var(
        "VK_NETWORKS",
        "",
        "named networks pods may join, by namespace: namespace=net[,net…] entries separated by ; \
         (* for every namespace; unset: the node's default network only)",
    ),
    var(
        "VK_PUBLIC_SNAPSHOTS",
        "",
        "repositories (comma-separated, no tag) whose snapshots without an owner record are \
         public bases any pod may clone and no pod may replace (unset: none; record-less \
         snapshots are nobody's)",
    ),
    var(
        "VK_STAGING_DIR",
        "/var/lib/cocoon/vk-staging",
        "scratch space for snapshot transfers",
    ),
    var(
        "VK_COCOON_SNAPSHOT_DIR",
        "/var/lib/cocoon/snapshot/localfile",
        "cocoon's local snapshot store",
    ),
    var(
        "COCOON_ROOT_DIR",
        "/var/lib/cocoon",
        "cocoon's root; its filesystem sizes ephemeral-storage",
    ),
    var(
        "COCOON_CGROUP_PARENT",
        "cocoon.slice",
        "cgroup parent of the VM scopes (stats)",
    ),
    var(
        "VK_RESERVE_PERCENT",
        "20",
        "share of capacity held back from allocatable, 0–100",
    ),
    var(
        "VK_NODE_CPU",
        "auto (logical CPUs)",
        "cpu capacity, a Kubernetes quantity",
    ),
    var(
        "VK_NODE_MEM",
        "auto (MemTotal)",
        "memory capacity, a quantity",
    ),
    var(
        "VK_NODE_STORAGE",
        "auto (statfs of COCOON_ROOT_DIR)",
        "ephemeral-storage capacity, a quantity",
    ),
    var(
        "VK_NODE_HUGEPAGES",
        "auto (HugePages_Total × size)",
        "huge-page capacity, a quantity",
    ),
    var("VK_NODE_PODS", "256", "pods capacity"),
    var(
        "SNAPSHOT_ZSTD_LEVEL",
        "0",
        "zstd level for pushed snapshots, 0–22 (0: v1 format)",
    ),
    var(
        "SNAPSHOT_CHUNK_SIZE_MIB",
        "0",
        "chunk size of pushed snapshots (0: v1 format)",
    ),
    var(
        "SNAPSHOT_TRANSFER_CONCURRENCY",
        "8",
        "parallel blob transfers",
    ),
    var(
        "SNAPSHOT_MEMORY_BUDGET_MIB",
        "9216",
        "memory a snapshot push may use",
    ),
    var(
        "SNAPSHOT_PULL_BUDGET_MIB",
        "2048",
        "memory a snapshot pull may use",
    ),
    var(
        "VK_JOURNAL_PATH",
        "/var/lib/vk-cocoon/journal/events.journal",
        "the event journal; set empty to disable it",
    ),
    var(
        "VK_JOURNAL_MAX_BYTES",
        "64Mi",
        "rotate a journal file at this size (a quantity, at least 1Mi)",
    ),
    var(
        "VK_JOURNAL_MAX_AGE",
        "24h",
        "rotate a journal file once its first record is this old (s, m, h or d; at least 1m)",
    ),
    var(
        "VK_JOURNAL_FILES",
        "8",
        "journal files kept, the current one included (1–1000)",
    ),
];
