//! `cloud-hypervisor` (the stand-in): parse the command line, open the API socket, boot or
//! restore if asked, run the guest, and exit on SIGTERM/SIGINT, vmm.shutdown or a guest
//! power-off.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use ch_standin::cli::{self, Launch};
use ch_standin::console::Console;
use ch_standin::guest::{self, shared::GuestShared};
use ch_standin::vmm::{Vmm, VERSION};
use ch_standin::{config, server, RestoreRequest};

fn main() -> ExitCode {
    let launch = match cli::parse(std::env::args_os()) {
        Ok(l) => l,
        Err(e) => e.exit(),
    };
    let Launch::Vmm {
        api_socket,
        vm,
        restore,
        log_file,
        no_shutdown,
    } = launch
    else {
        println!("cloud-hypervisor {VERSION}-ch-standin");
        println!("Migration Protocol Versions: 1.0");
        return ExitCode::SUCCESS;
    };
    // SAFETY: umask only changes this process's file creation mask, as cloud-hypervisor does.
    unsafe { libc::umask(0o077) };
    if let Some(path) = log_file {
        if let Err(e) = redirect_stderr(&path) {
            eprintln!("Error creating log file {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error starting the VMM runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(
        api_socket.map(|s| PathBuf::from(cli::api_socket_path(&s))),
        vm,
        restore,
        no_shutdown,
    ))
}

async fn run(
    socket: Option<PathBuf>,
    vm: Option<Box<cli::VmParams>>,
    restore: Option<String>,
    no_shutdown: bool,
) -> ExitCode {
    // Both handlers exist before the socket does: whoever sees the socket may signal at once,
    // and a signal before the handler would kill the process instead of shutting it down.
    let signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .and_then(|t| {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .map(|i| (t, i))
        });
    let (mut term, mut int) = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("Error installing the signal handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    let guest = match GuestShared::new() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("Error creating the guest event: {e}");
            return ExitCode::FAILURE;
        }
    };
    let console = Arc::new(Console::default());
    guest::spawn(guest.clone(), console.clone());
    let vmm = Arc::new(Mutex::new(Vmm::new(guest.clone(), console, no_shutdown)));
    let listener = match socket.as_deref().map(server::bind).transpose() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("Error starting the HTTP API server: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = start_vm(&vmm, vm, restore) {
        eprintln!("{e}");
        remove(&socket);
        return ExitCode::FAILURE;
    }
    let api = async {
        match listener {
            Some(l) => server::serve(l, vmm.clone()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = api => eprintln!("VMM shutting down"),
        _ = term.recv() => eprintln!("received SIGTERM: VMM shutting down"),
        _ = int.recv() => eprintln!("received SIGINT: VMM shutting down"),
    }
    guest.update(|v| v.exit = true);
    remove(&socket);
    ExitCode::SUCCESS
}

/// A payload on the command line creates and boots the VM at once; `--restore` restores.
fn start_vm(
    vmm: &Mutex<Vmm>,
    vm: Option<Box<cli::VmParams>>,
    restore: Option<String>,
) -> Result<(), String> {
    let mut vmm = vmm.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(params) = vm {
        let cfg = config::from_params(&params)?;
        vmm.create(cfg)
            .map_err(|e| format!("Error creating VM: {}", e.messages.join(": ")))?;
        vmm.boot()
            .map_err(|e| format!("Error booting VM: {}", e.messages.join(": ")))?;
    } else if let Some(spec) = restore {
        let opts = ch_standin::options::Options::parse(
            &spec,
            &["source_url", "prefault", "memory_restore_mode", "resume"],
        )
        .map_err(|e| format!("Error parsing --restore: {e}"))?;
        let req = RestoreRequest {
            source_url: opts
                .get("source_url")
                .ok_or("Error parsing --restore: missing source_url")?
                .to_string(),
            prefault: opts.toggle("prefault")?.unwrap_or(false),
            memory_restore_mode: None,
            resume: opts.toggle("resume")?.unwrap_or(false),
        };
        vmm.restore(req)
            .map_err(|e| format!("Error restoring VM: {}", e.messages.join(": ")))?;
    }
    Ok(())
}

fn remove(socket: &Option<PathBuf>) {
    if let Some(p) = socket {
        let _ = std::fs::remove_file(p);
    }
}

fn redirect_stderr(path: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::create(path)?;
    // SAFETY: dup2 onto stderr of a descriptor we hold open.
    if unsafe { libc::dup2(f.as_raw_fd(), 2) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
