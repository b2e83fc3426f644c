//! The command line, declared as cloud-hypervisor declares it (clap, same long names, same
//! defaults, `--disk`/`--net` taking several values, the VM options requiring a payload), for
//! the options cocoon passes and a few it could. Any other argument fails in clap's words.

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};

/// The VM half of the command line, still in cloud-hypervisor's option syntax.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmParams {
    pub cpus: String,
    pub memory: String,
    pub kernel: Option<String>,
    pub firmware: Option<String>,
    pub initramfs: Option<String>,
    pub cmdline: Option<String>,
    pub disks: Vec<String>,
    pub nets: Vec<String>,
    pub rng: String,
    pub balloon: Option<String>,
    pub serial: String,
    pub console: String,
    pub watchdog: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Version,
    Vmm {
        api_socket: Option<String>,
        /// Present when a payload (`--kernel`/`--firmware`) was given: create and boot at once.
        vm: Option<Box<VmParams>>,
        /// `--restore source_url=…`: restore at once.
        restore: Option<String>,
        log_file: Option<String>,
        no_shutdown: bool,
    },
}

fn command() -> Command {
    let one = |name: &'static str, group: &'static str| {
        Arg::new(name).long(name).num_args(1).group(group)
    };
    let many = |name: &'static str| {
        Arg::new(name)
            .long(name)
            .num_args(1..)
            .action(ArgAction::Append)
            .group("vm-config")
    };
    Command::new("cloud-hypervisor")
        .about("Launch a cloud-hypervisor VMM.")
        .arg_required_else_help(true)
        .disable_version_flag(true)
        .groups([
            ArgGroup::new("vm-config")
                .multiple(true)
                .requires("vm-payload"),
            ArgGroup::new("vmm-config").multiple(true),
            ArgGroup::new("logging").multiple(true),
            ArgGroup::new("vm-payload").multiple(true),
        ])
        .args([
            one("api-socket", "vmm-config"),
            one("balloon", "vm-config"),
            one("cmdline", "vm-config"),
            one("console", "vm-config").default_value("tty"),
            one("cpus", "vm-config").default_value("boot=1"),
            many("disk"),
            one("firmware", "vm-payload"),
            one("initramfs", "vm-config"),
            one("kernel", "vm-payload"),
            one("log-file", "logging"),
            one("memory", "vm-config").default_value("size=512M"),
            many("net"),
            Arg::new("no-shutdown")
                .long("no-shutdown")
                .num_args(0)
                .action(ArgAction::SetTrue)
                .group("vmm-config"),
            one("restore", "vmm-config"),
            one("rng", "vm-config").default_value("src=/dev/urandom"),
            Arg::new("seccomp")
                .long("seccomp")
                .num_args(1)
                .value_parser(["true", "false", "log", "errno"])
                .default_value("true"),
            one("serial", "vm-config").default_value("null"),
            Arg::new("v")
                .short('v')
                .action(ArgAction::Count)
                .group("logging"),
            Arg::new("version")
                .short('V')
                .long("version")
                .num_args(0)
                .action(ArgAction::SetTrue),
            Arg::new("watchdog")
                .long("watchdog")
                .num_args(0)
                .action(ArgAction::SetTrue)
                .group("vm-config"),
        ])
}

/// Parses argv (without the program name's special meaning: `args[0]` is skipped by clap).
pub fn parse<I, T>(args: I) -> Result<Launch, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let m = command().try_get_matches_from(args)?;
    if m.get_flag("version") {
        return Ok(Launch::Version);
    }
    let payload = m.contains_id("kernel") || m.contains_id("firmware");
    Ok(Launch::Vmm {
        api_socket: string(&m, "api-socket"),
        vm: payload.then(|| Box::new(vm_params(&m))),
        restore: string(&m, "restore"),
        log_file: string(&m, "log-file"),
        no_shutdown: m.get_flag("no-shutdown"),
    })
}

fn vm_params(m: &ArgMatches) -> VmParams {
    let all = |name: &str| -> Vec<String> {
        m.get_many::<String>(name)
            .map(|v| v.cloned().collect())
            .unwrap_or_default()
    };
    VmParams {
        cpus: string(m, "cpus").unwrap_or_default(),
        memory: string(m, "memory").unwrap_or_default(),
        kernel: string(m, "kernel"),
        firmware: string(m, "firmware"),
        initramfs: string(m, "initramfs"),
        cmdline: string(m, "cmdline"),
        disks: all("disk"),
        nets: all("net"),
        rng: string(m, "rng").unwrap_or_default(),
        balloon: string(m, "balloon"),
        serial: string(m, "serial").unwrap_or_default(),
        console: string(m, "console").unwrap_or_default(),
        watchdog: m.get_flag("watchdog"),
    }
}

fn string(m: &ArgMatches, name: &str) -> Option<String> {
    m.get_one::<String>(name).cloned()
}

/// `--api-socket` is either a bare path or `path=…` (the `fd=` form needs an inherited fd,
/// which cocoon never passes).
pub fn api_socket_path(value: &str) -> String {
    value.strip_prefix("path=").unwrap_or(value).to_string()
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
