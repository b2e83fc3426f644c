//! The argv grammar: cocoon's verbs and flags (cobra spelling), plus the simulator's `sim`
//! verbs. Positional counts are checked by the handlers so errors read like cobra's.

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "cocoon",
    about = "Cocoon - MicroVM Engine (simulator)",
    disable_version_flag = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
}

#[derive(Args, Debug, Default)]
pub struct Global {
    #[arg(long, global = true)]
    pub config: Option<String>,
    #[arg(long = "root-dir", global = true)]
    pub root_dir: Option<String>,
    #[arg(long = "run-dir", global = true)]
    pub run_dir: Option<String>,
    #[arg(long = "log-dir", global = true)]
    pub log_dir: Option<String>,
    #[arg(long = "cni-conf-dir", global = true)]
    pub cni_conf_dir: Option<String>,
    #[arg(long = "cni-bin-dir", global = true)]
    pub cni_bin_dir: Option<String>,
    #[arg(long, global = true)]
    pub dns: Option<String>,
    #[arg(long = "log-level", global = true)]
    pub log_level: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Manage virtual machines
    #[command(subcommand)]
    Vm(VmCmd),
    /// Manage VM snapshots
    #[command(subcommand)]
    Snapshot(SnapCmd),
    /// Manage images
    #[command(subcommand)]
    Image(ImageCmd),
    /// Simulator controls (faults, cleanup, seeding)
    #[command(subcommand)]
    Sim(SimCmd),
}

/// The flags `vm run` and `vm clone` share: output, name, resources, network, host CPU policy.
#[derive(Args, Debug, Default)]
pub struct VmShapeArgs {
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub cpu: Option<i64>,
    #[arg(long)]
    pub memory: Option<String>,
    #[arg(long)]
    pub storage: Option<String>,
    #[arg(long)]
    pub nics: Option<i64>,
    #[arg(long = "queue-size")]
    pub queue_size: Option<i64>,
    #[arg(long = "disk-queue-size")]
    pub disk_queue_size: Option<i64>,
    #[arg(long)]
    pub network: Option<String>,
    #[arg(long)]
    pub bridge: Option<String>,
    #[arg(long = "cpu-weight")]
    pub cpu_weight: Option<i64>,
    #[arg(long = "cpu-quota-us")]
    pub cpu_quota_us: Option<i64>,
    #[arg(long = "cpu-period-us")]
    pub cpu_period_us: Option<i64>,
}

#[derive(Args, Debug, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub vm: VmShapeArgs,
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub password: Option<String>,
    #[arg(long = "no-direct-io")]
    pub no_direct_io: bool,
    #[arg(long)]
    pub windows: bool,
    #[arg(long)]
    pub fc: bool,
    #[arg(long = "data-disk")]
    pub data_disk: Vec<String>,
    pub args: Vec<String>,
}

#[derive(Args, Debug, Default)]
pub struct CloneArgs {
    #[command(flatten)]
    pub vm: VmShapeArgs,
    #[arg(long = "no-direct-io")]
    pub no_direct_io: bool,
    #[arg(long)]
    pub pull: bool,
    #[arg(long = "on-demand")]
    pub on_demand: bool,
    #[arg(long = "restore-mode")]
    pub restore_mode: Option<String>,
    #[arg(long = "from-dir")]
    pub from_dir: Option<String>,
    pub args: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum VmCmd {
    /// Create and start a VM from an image
    Run(RunArgs),
    /// Clone a new VM from a snapshot
    Clone(CloneArgs),
    /// Start created/stopped VM(s)
    Start {
        #[arg(short = 'o', long)]
        output: Option<String>,
        args: Vec<String>,
    },
    /// Stop running VM(s)
    Stop {
        #[arg(short = 'o', long)]
        output: Option<String>,
        #[arg(long)]
        force: bool,
        #[arg(long)]
        timeout: Option<i64>,
        args: Vec<String>,
    },
    /// List VMs with status
    #[command(alias = "ls")]
    List {
        #[arg(short = 'o', long, default_value = "table")]
        format: String,
        args: Vec<String>,
    },
    /// Show detailed VM info (JSON)
    Inspect { args: Vec<String> },
    /// Delete VM(s) (--force to stop running VMs first)
    Rm {
        #[arg(short = 'o', long)]
        output: Option<String>,
        #[arg(long)]
        force: bool,
        args: Vec<String>,
    },
    /// Watch VM status (event stream)
    Status {
        #[arg(short = 'n', long, default_value_t = 5)]
        interval: i64,
        #[arg(long)]
        event: bool,
        #[arg(long)]
        format: Option<String>,
        args: Vec<String>,
    },
    /// Reclaim an ownerless `creating` placeholder
    #[command(name = "reconcile-stale-create")]
    ReconcileStaleCreate {
        #[arg(short = 'o', long)]
        output: Option<String>,
        args: Vec<String>,
    },
    /// Run a command in the guest
    Exec {
        #[arg(short = 'i', long)]
        interactive: bool,
        #[arg(short = 'e', long = "env")]
        env: Vec<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the hypervisor log
    Logs {
        #[arg(long)]
        tail: Option<i64>,
        #[arg(short = 'f', long)]
        follow: bool,
        args: Vec<String>,
    },
    /// Hot-resize the NIC count
    Net {
        #[arg(long)]
        nics: Option<i64>,
        #[arg(short = 'o', long)]
        output: Option<String>,
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SnapCmd {
    /// Snapshot a running VM
    Save {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        description: Option<String>,
        args: Vec<String>,
    },
    /// List snapshots
    #[command(alias = "ls")]
    List {
        #[arg(short = 'o', long, default_value = "table")]
        format: String,
        #[arg(long)]
        vm: Option<String>,
    },
    /// Show snapshot info (JSON)
    Inspect { args: Vec<String> },
    /// Delete snapshot(s)
    Rm { args: Vec<String> },
    /// Export a snapshot as a tar archive
    Export {
        #[arg(short = 'o', long)]
        output: Option<String>,
        #[arg(long)]
        gzip: bool,
        args: Vec<String>,
    },
    /// Import a snapshot archive (file or stdin)
    Import {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        description: Option<String>,
        args: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Pull an OCI image or cloud image URL
    Pull {
        #[arg(long)]
        force: bool,
        args: Vec<String>,
    },
    /// Show image info (JSON)
    Inspect { args: Vec<String> },
    /// Import an image from files or stdin
    Import { args: Vec<String> },
    /// List images
    #[command(alias = "ls")]
    List {
        #[arg(short = 'o', long, default_value = "table")]
        format: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum SimCmd {
    /// Inject faults
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Kill every guest and remove every netns, veth, bridge and cgroup scope of this root
    Cleanup {
        /// Also remove vksim- netns/links and guests whose owning root is gone
        #[arg(long = "all-leftovers")]
        all_leftovers: bool,
    },
    /// Create a snapshot directly (a clone source for tests)
    SeedSnapshot(SeedArgs),
    /// Edit the lease file by hand
    #[command(subcommand)]
    Lease(LeaseCmd),
    /// Print the simulator's view of a VM (address, netns, cgroup, ports)
    Info { args: Vec<String> },
    /// Serve cocoon-net's lease release API on a Unix socket (runs until killed)
    NetControl {
        #[arg(long)]
        socket: std::path::PathBuf,
    },
    /// The guest process of one VM (internal)
    #[command(hide = true)]
    Guest {
        #[arg(long)]
        id: String,
        #[arg(long)]
        control: String,
    },
    /// The process that runs every guest of a root with `COCOON_SIM_GUESTS=shared` (internal)
    #[command(hide = true)]
    Hub {
        #[arg(long)]
        root: String,
    },
}

#[derive(Args, Debug, Default)]
pub struct SeedArgs {
    #[arg(long)]
    pub name: String,
    #[arg(long, default_value = "cloud-hypervisor")]
    pub hypervisor: String,
    #[arg(long)]
    pub image: Option<String>,
    #[arg(long = "image-type")]
    pub image_type: Option<String>,
    #[arg(long = "image-digest")]
    pub image_digest: Option<String>,
    #[arg(long, default_value_t = 2)]
    pub cpu: i64,
    #[arg(long, default_value = "1G")]
    pub memory: String,
    #[arg(long, default_value = "10G")]
    pub storage: String,
    #[arg(long, default_value_t = 1)]
    pub nics: i64,
    #[arg(long)]
    pub network: Option<String>,
    #[arg(long)]
    pub windows: bool,
    #[arg(long)]
    pub description: Option<String>,
    /// MAC of the source VM's NIC 0 (what a Firecracker clone keeps in the guest)
    #[arg(long = "source-mac")]
    pub source_mac: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum FaultCmd {
    /// Fail the next N calls of VERB with `Error: TEXT`
    Fail {
        verb: String,
        #[arg(long, default_value_t = 1)]
        times: u32,
        #[arg(long)]
        message: Option<String>,
    },
    /// Delay VERB by MS milliseconds (inside the create/save window for run, clone, save, import)
    Delay {
        verb: String,
        ms: u64,
        #[arg(long)]
        times: Option<u32>,
    },
    /// Print garbage instead of JSON on the next N calls of VERB
    Garbage {
        verb: String,
        #[arg(long, default_value_t = 1)]
        times: u32,
    },
    /// Kill the VM's guest process (inspect then shows `stopped (stale)`)
    Crash { vm: String },
    /// Hold the VM's record lock until stdin closes (prints `held` once it has it): changes to
    /// that VM wait meanwhile, reads and other VMs do not
    Hold { vm: String },
    /// Kill the guest and store STATE (error or stopped)
    SetState { vm: String, state: String },
    /// Remove the VM record without rm (guest killed, network removed)
    Vanish { vm: String },
    /// Make every running event stream exit non-zero
    KillStreams,
    /// Steer the VM's DHCP lease
    Lease {
        vm: String,
        #[arg(long = "delay-ms")]
        delay_ms: Option<u64>,
        #[arg(long)]
        withhold: bool,
        /// Withhold until a renew command (ipconfig, dhclient, networkctl, udhcpc) is exec'd
        #[arg(long = "until-renew")]
        until_renew: bool,
        /// Lease under this MAC instead of the VM's
        #[arg(long)]
        mac: Option<String>,
        /// Drop the VM's current lease row (a DHCPRELEASE)
        #[arg(long)]
        release: bool,
        /// Back to normal behaviour
        #[arg(long)]
        reset: bool,
    },
    /// Open a TCP port in the guest
    OpenPort { vm: String, port: u16 },
    /// Close a TCP port in the guest
    ClosePort { vm: String, port: u16 },
    /// Script the result of the VM's next `vm exec` calls
    Exec {
        vm: String,
        #[arg(long = "exit-code", default_value_t = 0)]
        exit_code: i32,
        #[arg(long, default_value = "")]
        stdout: String,
        #[arg(long, default_value = "")]
        stderr: String,
        #[arg(long, default_value_t = 1)]
        times: u32,
        /// Print `--stdout` over and over until the reader goes away: a guest that never
        /// stops talking
        #[arg(long)]
        flood: bool,
    },
    /// Make post-clone fixups (`vm exec` of the fixup script) fail in the guest
    Fixup {
        /// VM ID or name, or `*` for every VM, later ones included
        vm: String,
        /// Fail this many attempts per VM, then let them through
        #[arg(long)]
        times: Option<u32>,
        /// Fail every attempt
        #[arg(long)]
        always: bool,
        #[arg(long)]
        message: Option<String>,
        /// Remove this fault
        #[arg(long)]
        clear: bool,
    },
    /// Make a Windows guest's SAC console misbehave
    Sac {
        /// VM ID or name, or `*` for every VM (a missing socket only affects guests started later)
        vm: String,
        /// Do not create the console socket
        #[arg(long = "no-socket")]
        no_socket: bool,
        /// Accept connections but never answer, not even the prompt
        #[arg(long = "no-prompt")]
        no_prompt: bool,
        /// Answer `i <net> <ip> <mask> <gw>` with a failure and keep the address
        #[arg(long = "refuse-set")]
        refuse_set: bool,
        /// Back to a well-behaved console
        #[arg(long)]
        reset: bool,
    },
    /// Remove all verb and exec faults
    Clear,
    /// Print the fault file
    List,
}

#[derive(Subcommand, Debug)]
pub enum LeaseCmd {
    /// Upsert a row
    Put {
        #[arg(long)]
        mac: String,
        #[arg(long)]
        ip: String,
        /// RFC 3339; default now+24h
        #[arg(long)]
        expiry: Option<String>,
    },
    /// Remove the row of a MAC
    Del {
        #[arg(long)]
        mac: String,
    },
    /// Print the rows
    List,
}
