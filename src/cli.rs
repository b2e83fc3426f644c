//! The command line: `run`, `replay`, `check-config`, `version`. Exit codes: 0 success,
//! 1 the command failed (a replay mismatch, a broken journal, the daemon stopped on an
//! error), 2 bad configuration or bad usage.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use reconcilers::pod::PodKey;

use vk_cocoon::config::{effective_table, Config, ConfigErrors};
use vk_cocoon::journal::FORMAT_VERSION;
use vk_cocoon::replay::{self, Failure, Options};
use vk_cocoon::version;

const FAILED: u8 = 1;
const BAD_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "vk-cocoon",
    about = "Turns one cocoon MicroVM host into a Kubernetes node",
    disable_version_flag = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node daemon (configured by environment variables; see check-config).
    Run,
    /// Feed a journal through the reducer again, print its timeline and check that it
    /// produces the journaled actions.
    Replay(ReplayArgs),
    /// Parse and validate every configuration variable and print the effective values.
    CheckConfig,
    /// Print the version.
    Version,
    /// Operator commands on snapshots (configured by the daemon's environment).
    #[command(subcommand)]
    Snapshots(SnapshotsCommand),
    /// Print the VNC password of one macOS guest, for its tenant: each guest has its own,
    /// derived from COCOON_MACOS_VNC_PASSWORD, the pod's namespace and the guest's name.
    VncPassword {
        /// The namespace of the guest's pod.
        namespace: String,
        /// The guest's name (the pod's vm.cocoonstack.io/name).
        guest: String,
    },
}

#[derive(Subcommand)]
enum SnapshotsCommand {
    /// Record which pod a snapshot made before owner records existed belongs to, so pods of
    /// that namespace may use it again (a snapshot that already has a record is left as it
    /// is). Public bases are listed in VK_PUBLIC_SNAPSHOTS instead.
    Own(OwnArgs),
}

#[derive(Args)]
struct OwnArgs {
    /// The registry tag (`<repository>[:<tag>]`, tag `latest` if omitted) or, with --local,
    /// this host's cocoon snapshot name.
    #[arg(value_name = "SNAPSHOT")]
    target: String,
    /// The pod it belongs to, as NAMESPACE/POD (any pod of that namespace may then use it).
    #[arg(long, value_name = "NS/POD", value_parser = parse_owner)]
    owner: reconcilers::owner::Owner,
    /// The snapshot is this host's local cocoon snapshot (moved through a file in
    /// VK_STAGING_DIR: export, remove, import with the record), not a registry tag.
    #[arg(long)]
    local: bool,
}

fn parse_owner(s: &str) -> Result<reconcilers::owner::Owner, String> {
    reconcilers::owner::Owner::parse(s).ok_or_else(|| {
        format!("{s:?} is not NAMESPACE/POD (a namespace name, a slash, a pod name)")
    })
}

#[derive(Args)]
struct ReplayArgs {
    /// Journal files, in any order (they are sorted by the file number in their headers),
    /// e.g. /var/lib/vk-cocoon/journal/events.journal*
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Show only the events and actions of this pod.
    #[arg(long, value_name = "NS/NAME", value_parser = parse_pod_key)]
    pod: Option<PodKey>,
    /// Stop after the event with this seq.
    #[arg(long, value_name = "SEQ")]
    until: Option<u64>,
    /// Fail (exit 1) at the first step whose actions differ from the journaled ones.
    #[arg(long)]
    verify: bool,
    /// Print the final State as JSON after the timeline.
    #[arg(long)]
    state: bool,
    /// Do not print the timeline.
    #[arg(long, short)]
    quiet: bool,
    /// Write one self-contained HTML page to OUT instead of printing the timeline: a
    /// collapsible row per pod (and one for the node) with its events, phase changes,
    /// actions and statuses in time order, repeats folded.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,
    /// Print the records themselves, one JSON line each (the files hold them compressed),
    /// instead of the timeline; every record is still checked, and a damaged file prints
    /// the lines before the damage. The output is a journal of plain lines, hashes and
    /// all: `replay` (and `--verify`) read it as they read the files.
    #[arg(long, conflicts_with_all = ["html", "pod", "state"])]
    json: bool,
}

/// The records of `files`, in journal order, as the JSON lines they were written as: one
/// journal of plain lines, which the reader takes as it is (rotated files follow each other).
fn print_lines(files: &[PathBuf], out: &mut impl Write) -> io::Result<()> {
    use vk_cocoon::journal::{frame, Reader};
    let ordered = match Reader::open(files) {
        Ok(r) => r.files().to_vec(),
        // The check that follows names the problem.
        Err(_) => files.to_vec(),
    };
    for path in ordered {
        let bytes = std::fs::read(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let lines = frame::lines_of_file(&bytes).unwrap_or_else(|(lines, _)| lines);
        out.write_all(&lines)?;
    }
    out.flush()
}

fn parse_pod_key(s: &str) -> Result<PodKey, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(PodKey::new(ns, name))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run => run(),
        Command::Replay(args) => replay(args),
        Command::CheckConfig => check_config(),
        Command::Snapshots(SnapshotsCommand::Own(args)) => own(args),
        Command::VncPassword { namespace, guest } => vnc_password(&namespace, &guest),
        Command::Version => {
            println!(
                "vk-cocoon {} (build {}, journal format {FORMAT_VERSION})",
                version::VERSION,
                version::kubelet_version()
            );
            ExitCode::SUCCESS
        }
    }
}

fn config_error(e: &ConfigErrors) -> ExitCode {
    eprintln!("vk-cocoon: invalid configuration:");
    for err in &e.0 {
        eprintln!("  {err}");
    }
    eprintln!("fix the variables above; `vk-cocoon check-config` shows every effective value");
    ExitCode::from(BAD_CONFIG)
}

fn own(args: OwnArgs) -> ExitCode {
    use vk_cocoon::snapshot_owner::{own, Place};
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let place = match args.local {
        true => Place::Local,
        false => Place::Registry,
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vk-cocoon snapshots own: {e}");
            return ExitCode::from(FAILED);
        }
    };
    match rt.block_on(own(&config, &args.target, &args.owner, place)) {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vk-cocoon snapshots own: {e:#}");
            ExitCode::from(FAILED)
        }
    }
}

fn vnc_password(namespace: &str, guest: &str) -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    match &config.macos_vnc_password {
        Some(node) => {
            let p = vk_cocoon::cocoon::macos::guest_password(node.expose(), namespace, guest);
            println!("{p}");
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("vk-cocoon vnc-password: COCOON_MACOS_VNC_PASSWORD is unset, so macOS guests have no VNC display");
            ExitCode::from(FAILED)
        }
    }
}

fn check_config() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    print!("{}", effective_table(&config));
    for w in &config.warnings {
        eprintln!("warning: {w}");
    }
    ExitCode::SUCCESS
}

fn run() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let filter = tracing_subscriber::EnvFilter::new(config.log_level.as_filter());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    match daemon(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("vk-cocoon: {e:#}");
            ExitCode::from(FAILED)
        }
    }
}

fn daemon(config: Config) -> anyhow::Result<()> {
    let settings = vk_cocoon::runtime::Settings::from_config(&config)?;
    vk_cocoon::heap::limit_arenas();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(vk_cocoon::runtime::run(settings))
}

fn replay(args: ReplayArgs) -> ExitCode {
    let opts = Options {
        files: args.files,
        pod: args.pod,
        until: args.until,
        verify: args.verify,
        quiet: args.quiet || args.json,
        html: args.html.is_some(),
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    if args.json {
        match print_lines(&opts.files, &mut out) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vk-cocoon replay: {e}");
                return ExitCode::from(FAILED);
            }
        }
    }
    let mut page = match &args.html {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(io::BufWriter::new(f)),
            Err(e) => {
                eprintln!("vk-cocoon replay: cannot create {}: {e}", path.display());
                return ExitCode::from(FAILED);
            }
        },
        None => None,
    };
    let target: &mut dyn Write = match &mut page {
        Some(p) => p,
        None => &mut out,
    };
    let result = replay::run(&opts, target).and_then(|(summary, state)| {
        if let Some(p) = &mut page {
            p.flush()?;
        }
        if args.state {
            if let Some(state) = state {
                serde_json::to_writer_pretty(&mut out, &state).map_err(io::Error::other)?;
                writeln!(out)?;
            }
        }
        out.flush()?;
        Ok(summary)
    });
    match result {
        Ok(summary) => {
            eprintln!("{}", replay::verdict(&summary, opts.verify, &opts.files));
            ExitCode::SUCCESS
        }
        // `replay … | head` closing the pipe is not a failure.
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(failure) => {
            let _ = out.flush();
            // A page cut short by a failure would read as a whole journal.
            if let Some(path) = &args.html {
                let _ = std::fs::remove_file(path);
            }
            eprintln!("vk-cocoon replay: {failure}");
            ExitCode::from(FAILED)
        }
    }
}
