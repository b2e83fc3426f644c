//! A "VM" is a real long-lived process: this binary re-executed as `cocoon sim guest`. It
//! enters the VM's netns, opens the guest's TCP ports after the boot delay, answers SSH and
//! HTTP, and plays the guest's DHCP client by writing its lease after the lease delay.
//! The CLI steers it through `<root>/vms/<ID>/guest.json`, which it polls.
//! With `COCOON_SIM_GUESTS=shared` the same behaviour runs as a thread of the root's hub
//! process instead (see `hub`); the VM's `pid` is then that thread's ID.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Env;
use crate::error::{fail, Result};
use crate::model::StoredVm;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Control {
    pub id: String,
    pub name: String,
    pub ip: String,
    /// Empty in loopback mode: the guest then binds its 127.x address on the host.
    pub netns: String,
    pub ports: Vec<u16>,
    pub boot_ms: u64,
    pub dhcp: bool,
    pub lease_mac: String,
    pub lease_delay_ms: u64,
    pub withhold: bool,
    pub leases_path: String,
    /// A clone waiting for its post-clone fixup: network down.
    #[serde(default)]
    pub fixup_pending: bool,
    #[serde(default)]
    pub prefix: i64,
    #[serde(default)]
    pub gateway: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sac: Option<SacControl>,
    /// The VM log, which a hub guest writes itself (a guest process has it as stderr).
    #[serde(default)]
    pub log_file: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SacControl {
    pub socket: String,
    pub state_file: String,
    pub boot: crate::model::SacBoot,
    pub fault: crate::faults::SacFault,
}

pub fn control_path(env: &Env, id: &str) -> PathBuf {
    env.vm_state_dir(id).join("guest.json")
}

pub fn lease_mac(vm: &StoredVm) -> String {
    if !vm.sim.lease.mac.is_empty() {
        return vm.sim.lease.mac.clone();
    }
    if !vm.sim.guest_mac.is_empty() {
        return vm.sim.guest_mac.clone();
    }
    vm.network_configs
        .first()
        .map(|n| n.mac.clone())
        .unwrap_or_default()
}

pub fn control_for(env: &Env, vm: &StoredVm) -> Control {
    let lease = &vm.sim.lease;
    let static0 = vm.network_configs.first().and_then(|n| n.network.as_ref());
    Control {
        id: vm.id.clone(),
        name: vm.config.name.clone(),
        ip: vm.sim.ip.clone(),
        netns: vm.sim.netns.clone(),
        ports: vm.sim.ports.clone(),
        boot_ms: env.boot_ms,
        dhcp: vm
            .network_configs
            .first()
            .is_some_and(|n| n.network.is_none()),
        lease_mac: lease_mac(vm),
        lease_delay_ms: lease.delay_ms.unwrap_or(env.lease_delay_ms),
        withhold: lease.withhold || (lease.until_renew && !lease.renewed),
        leases_path: env.leases.display().to_string(),
        fixup_pending: crate::fixup::pending(vm),
        prefix: static0.map(|n| n.prefix).unwrap_or(16),
        gateway: static0
            .map(|n| n.gateway.clone())
            .unwrap_or_else(|| crate::vmnet::gateway_of(&vm.sim.ip)),
        sac: vm.sim.sac.as_ref().map(|boot| SacControl {
            socket: crate::sac::socket_path(vm).display().to_string(),
            state_file: env
                .vm_state_dir(&vm.id)
                .join("sac.json")
                .display()
                .to_string(),
            boot: boot.clone(),
            fault: crate::faults::sac_fault(env, &vm.id),
        }),
        log_file: vm.log_file(),
    }
}

fn write_control_file(env: &Env, vm: &StoredVm) -> Result<()> {
    let c = control_for(env, vm);
    crate::lock::write_atomic(&control_path(env, &vm.id), &serde_json::to_vec_pretty(&c)?)?;
    Ok(())
}

/// A guest process polls its control file; a hub guest is told to read it again.
pub fn write_control(env: &Env, vm: &StoredVm) -> Result<()> {
    write_control_file(env, vm)?;
    if hub_root(vm.sim.pid).is_some() {
        crate::hub::refresh(&env.root, &vm.id);
    }
    Ok(())
}

fn cmdline(pid: i32) -> Vec<Vec<u8>> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(<[u8]>::to_vec)
        .collect()
}

/// The root whose hub `pid` belongs to, when it is a hub's thread or the hub itself.
fn hub_root(pid: i32) -> Option<PathBuf> {
    if pid <= 0 {
        return None;
    }
    let args = cmdline(pid);
    let at = args.iter().position(|a| a == b"hub")?;
    if at == 0 || args[at - 1] != b"sim" {
        return None;
    }
    let root = args.iter().position(|a| a == b"--root")?;
    let root = args.get(root + 1)?;
    Some(PathBuf::from(String::from_utf8_lossy(root).into_owned()))
}

/// The task's own stat: `/proc/<tid>/stat` of a hub thread would sum the CPU time of every
/// thread of the hub, which costs as much as the hub has guests.
fn task_stat(pid: i32) -> String {
    format!("/proc/{pid}/task/{pid}/stat")
}

/// Remembers which (PID, VM) pairs were verified as that VM's guest, by the task's start
/// time, so a caller that asks every tick (the event stream) reads one /proc file per VM,
/// not three. A reused PID has another start time and is verified again.
#[derive(Default)]
pub struct AliveCache(std::collections::HashMap<(i32, String), String>);

impl AliveCache {
    pub fn is_alive(&mut self, pid: i32, id: &str) -> bool {
        if pid <= 0 {
            return false;
        }
        let Ok(stat) = fs::read_to_string(task_stat(pid)) else {
            return false;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_ascii_whitespace();
        if matches!(fields.next(), Some("Z") | Some("X") | None) {
            return false;
        }
        // Field 22 of stat (starttime) is the 19th after the state.
        let start = fields.nth(18).unwrap_or_default();
        let key = (pid, id.to_string());
        if self.0.get(&key).is_some_and(|s| s == start) {
            return true;
        }
        let alive = is_alive(pid, id);
        if alive {
            self.0.insert(key, start.to_string());
        }
        alive
    }
}

/// Alive = the PID exists, is not a zombie, and is our guest for this VM (PIDs get reused):
/// a guest process with the VM's ID in its argv, or a hub thread named after the VM.
pub fn is_alive(pid: i32, id: &str) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(stat) = fs::read_to_string(task_stat(pid)) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    if matches!(state, Some('Z') | Some('X') | None) {
        return false;
    }
    let args = cmdline(pid);
    if args.iter().any(|a| a == b"guest") && args.iter().any(|a| a == id.as_bytes()) {
        return true;
    }
    hub_root(pid).is_some()
        && fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end() == crate::hub::thread_name(id))
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: plain kill(2); pid was verified to be our guest just before.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// SIGTERM (or SIGKILL when `hard`), wait for the exit, escalate if it lingers.
pub fn kill(pid: i32, id: &str, hard: bool) {
    if !is_alive(pid, id) {
        return;
    }
    if let Some(root) = hub_root(pid) {
        crate::hub::stop(&root, id);
        let deadline = Instant::now() + Duration::from_secs(3);
        while is_alive(pid, id) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        return;
    }
    signal(pid, if hard { libc::SIGKILL } else { libc::SIGTERM });
    let deadline = Instant::now() + Duration::from_secs(3);
    while is_alive(pid, id) {
        if Instant::now() > deadline {
            signal(pid, libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(50));
            if !is_alive(pid, id) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts the guest detached (own session, stdio to the VM log, optionally in its cgroup
/// scope from the first instruction) and returns its PID. No shell is involved.
pub fn spawn(env: &Env, vm: &StoredVm) -> Result<i32> {
    write_control_file(env, vm)?;
    if env.shared_guest(vm) {
        let tid = crate::hub::start(env, &vm.id, &control_path(env, &vm.id))?;
        write_pid_file(vm, tid);
        return Ok(tid);
    }
    let log_path = vm.log_file();
    if let Some(dir) = Path::new(&log_path).parent() {
        fs::create_dir_all(dir)?;
    }
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let exe = std::env::current_exe()?;
    let control = control_path(env, &vm.id);
    let procs = (!vm.sim.cgroup.is_empty())
        .then(|| CString::new(format!("{}/cgroup.procs", vm.sim.cgroup)).ok())
        .flatten();
    let mut cmd = Command::new(exe);
    cmd.arg("sim")
        .arg("guest")
        .arg("--id")
        .arg(&vm.id)
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: only async-signal-safe calls (setsid, open, write, close) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = child.id() as i32;
    write_pid_file(vm, pid);
    Ok(pid)
}

fn write_pid_file(vm: &StoredVm, pid: i32) {
    let pid_file = format!(
        "{}/{}",
        vm.sim.run_dir,
        if vm.hypervisor == crate::model::FC {
            "fc.pid"
        } else {
            "ch.pid"
        }
    );
    let _ = fs::write(pid_file, format!("{pid}\n"));
}

// ---- the guest process itself ----

fn say(id: &str, msg: impl std::fmt::Display) {
    let ts = crate::timefmt::rfc3339_nano(crate::timefmt::now_ns());
    eprintln!("{ts} guest {id}: {msg}");
}

pub fn serve(mut s: TcpStream, port: u16, name: String) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    if port == 22 {
        let _ = s.write_all(b"SSH-2.0-cocoon-sim\r\n");
        let mut sink = [0u8; 512];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        return;
    }
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = &buf[..n];
    let is_http = ["GET ", "HEAD ", "POST ", "PUT ", "OPTIONS "]
        .iter()
        .any(|m| head.starts_with(m.as_bytes()));
    if is_http {
        let body = format!("cocoon-sim {name}\n");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(resp.as_bytes());
    }
}

fn listen(l: TcpListener, port: u16, name: String, stop: Arc<AtomicBool>) {
    let _ = l.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((s, _)) => {
                let name = name.clone();
                std::thread::spawn(move || serve(s, port, name));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

pub fn read_control(path: &Path) -> Option<Control> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// Feeds the control's view into SAC and asks whether NIC 0 still waits for its address.
fn sac_holds(ctl: &Control, sac: Option<&Mutex<crate::sac::Sac>>) -> bool {
    let (Some(c), Some(sac)) = (&ctl.sac, sac) else {
        return false;
    };
    let mut g = sac.lock().unwrap_or_else(|p| p.into_inner());
    g.refuse_set = c.fault.refuse_set;
    g.no_prompt = c.fault.no_prompt;
    g.live0 = match g.boot.nics.first() {
        Some(n) if !ctl.fixup_pending && !ctl.ip.is_empty() => Some(crate::model::SacNic {
            net: n.net,
            ip: ctl.ip.clone(),
            mask: crate::sac::mask(ctl.prefix),
            gateway: ctl.gateway.clone(),
        }),
        _ => None,
    };
    !g.satisfied(&ctl.ip)
}

/// Where a guest's TCP listeners live: its own threads (a guest process) or the hub's poller.
pub trait Listeners {
    fn open(&mut self, host: &str, port: u16, name: &str) -> std::io::Result<()>;
    fn close(&mut self, port: u16);
}

/// A guest process serves each port on a thread of its own.
#[derive(Default)]
struct OwnThreads {
    stops: BTreeMap<u16, Arc<AtomicBool>>,
}

impl Listeners for OwnThreads {
    fn open(&mut self, host: &str, port: u16, name: &str) -> std::io::Result<()> {
        let l = TcpListener::bind((host, port))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (name, s2) = (name.to_string(), stop.clone());
        std::thread::spawn(move || listen(l, port, name, s2));
        self.stops.insert(port, stop);
        Ok(())
    }

    fn close(&mut self, port: u16) {
        if let Some(stop) = self.stops.remove(&port) {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Where a guest's own log lines go: stderr for a guest process (its stderr is the VM log),
/// the VM log file for a hub guest.
pub enum Log {
    Stderr,
    File(fs::File),
}

/// What a guest does with its control file's view, whoever runs it: after the boot delay its
/// ports open (and close again when the control drops them), a network held down by a
/// pending fixup or SAC has no address and no open port, and a DHCP NIC writes its lease
/// after the lease delay.
pub struct Behaviour<L: Listeners> {
    id: String,
    booted: Instant,
    open: std::collections::BTreeSet<u16>,
    last_bind_try: Instant,
    leased: Option<String>,
    wanted: Option<(String, Instant)>,
    announced: bool,
    /// None = as plumbed; Some(on) = whether eth0 carries the VM's address.
    addr_on: Option<bool>,
    sac: Option<Arc<Mutex<crate::sac::Sac>>>,
    pub listeners: L,
    log: Log,
}

const BIND_RETRY: Duration = Duration::from_millis(500);

impl<L: Listeners> Behaviour<L> {
    pub fn new(id: &str, listeners: L, log: Log) -> Self {
        Behaviour {
            id: id.to_string(),
            booted: Instant::now(),
            open: Default::default(),
            last_bind_try: Instant::now() - Duration::from_secs(10),
            leased: None,
            wanted: None,
            announced: false,
            addr_on: None,
            sac: None,
            listeners,
            log,
        }
    }

    pub fn say(&mut self, msg: impl std::fmt::Display) {
        match &mut self.log {
            Log::Stderr => say(&self.id, msg),
            Log::File(f) => {
                let ts = crate::timefmt::rfc3339_nano(crate::timefmt::now_ns());
                let _ = writeln!(f, "{ts} guest {}: {msg}", self.id);
            }
        }
    }

    /// Closes every port, as a powered-off guest does.
    pub fn power_off(&mut self) {
        for port in std::mem::take(&mut self.open) {
            self.listeners.close(port);
        }
    }

    /// Brings the guest in line with `ctl`; returns how long until something falls due
    /// (`None`: nothing will until the control changes).
    pub fn step(&mut self, ctl: &Control) -> Option<Duration> {
        let mut due: Option<Duration> = None;
        let mut at = |d: Duration| due = Some(due.map_or(d, |x: Duration| x.min(d)));
        let held = ctl.fixup_pending || sac_holds(ctl, self.sac.as_deref());
        if !ctl.netns.is_empty() {
            self.addr_on = self.set_address(ctl, held);
        }
        let ports: Vec<u16> = if held { Vec::new() } else { ctl.ports.clone() };
        let boot = Duration::from_millis(ctl.boot_ms);
        let since_boot = self.booted.elapsed();
        if since_boot < boot {
            at(boot - since_boot);
        } else {
            if !self.announced {
                self.say("boot complete");
                self.announced = true;
            }
            let gone: Vec<u16> = self
                .open
                .iter()
                .copied()
                .filter(|p| !ports.contains(p))
                .collect();
            for port in gone {
                self.open.remove(&port);
                self.listeners.close(port);
                self.say(format!("closed port {port}"));
            }
            let missing: Vec<u16> = ports
                .iter()
                .copied()
                .filter(|p| !self.open.contains(p))
                .collect();
            if !missing.is_empty() {
                if self.last_bind_try.elapsed() >= BIND_RETRY {
                    self.last_bind_try = Instant::now();
                    let host = if ctl.netns.is_empty() {
                        ctl.ip.clone()
                    } else {
                        "0.0.0.0".to_string()
                    };
                    let mut failed = false;
                    for port in missing {
                        match self.listeners.open(&host, port, &ctl.name) {
                            Ok(()) => {
                                self.open.insert(port);
                                self.say(format!("listening on {host}:{port}"));
                            }
                            Err(e) => {
                                failed = true;
                                self.say(format!("bind {host}:{port}: {e}"));
                            }
                        }
                    }
                    if failed {
                        at(BIND_RETRY);
                    }
                } else {
                    at(BIND_RETRY.saturating_sub(self.last_bind_try.elapsed()));
                }
            }
        }
        let want = (ctl.dhcp && !ctl.withhold && !held && !ctl.lease_mac.is_empty())
            .then(|| ctl.lease_mac.clone());
        if want.as_ref() != self.wanted.as_ref().map(|w| &w.0) {
            self.wanted = want.map(|m| (m, Instant::now()));
        }
        if let Some((mac, since)) = self.wanted.clone() {
            let delay = Duration::from_millis(ctl.lease_delay_ms);
            if self.leased.as_ref() != Some(&mac) {
                if since.elapsed() >= delay {
                    match crate::leases::grant(Path::new(&ctl.leases_path), &mac, &ctl.ip) {
                        Ok(()) => {
                            self.say(format!("dhcp lease {} for {mac}", ctl.ip));
                            self.leased = Some(mac.clone());
                        }
                        Err(e) => {
                            self.say(format!("dhcp lease write failed: {e}"));
                            at(Duration::from_millis(100));
                        }
                    }
                } else {
                    at(delay - since.elapsed());
                }
            }
        }
        due
    }

    /// A guest whose network is down has no address on eth0, so nothing reaches it; the
    /// address comes back once it is up. Runs inside the VM's netns.
    fn set_address(&mut self, ctl: &Control, held: bool) -> Option<bool> {
        let on = self.addr_on;
        let cidr = format!("{}/{}", ctl.ip, ctl.prefix);
        let (args, now): (Vec<&str>, bool) = match (held, on) {
            (true, None | Some(true)) => (vec!["addr", "flush", "dev", "eth0"], false),
            (false, Some(false)) => (vec!["addr", "replace", &cidr, "dev", "eth0"], true),
            _ => return on,
        };
        match crate::netns::ip(&args) {
            Ok(()) => {
                self.say(if now {
                    format!("network up: {cidr}")
                } else {
                    "network down".into()
                });
                Some(now)
            }
            Err(e) => {
                self.say(format!("eth0: {e}"));
                on
            }
        }
    }
}

pub fn run(id: &str, control_file: &Path) -> Result<()> {
    let Some(mut ctl) = read_control(control_file) else {
        return fail(format!(
            "guest {id}: no control file {}",
            control_file.display()
        ));
    };
    if !ctl.netns.is_empty() {
        crate::netns::enter(&ctl.netns)
            .map_err(|e| crate::error::Error::Msg(format!("enter netns {}: {e}", ctl.netns)))?;
    }
    say(
        id,
        format!(
            "booting {} ip={} pid={}",
            ctl.name,
            ctl.ip,
            std::process::id()
        ),
    );
    let vm_dir = control_file
        .parent()
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    let mut guest = Behaviour::new(id, OwnThreads::default(), Log::Stderr);
    let sac = ctl
        .sac
        .as_ref()
        .map(|c| Arc::new(Mutex::new(crate::sac::Sac::resume(c))));
    if let (Some(c), Some(shared)) = (&ctl.sac, &sac) {
        if c.fault.no_socket {
            say(id, "SAC console off (injected)");
        } else {
            match crate::sac::serve(
                Path::new(&c.socket),
                shared.clone(),
                PathBuf::from(&c.state_file),
            ) {
                Ok(()) => say(id, format!("SAC console on {}", c.socket)),
                Err(e) => say(id, format!("SAC console {}: {e}", c.socket)),
            }
        }
    }
    guest.sac = sac;
    loop {
        // The VM dir vanishes with rm/cleanup: never outlive our own record.
        if !vm_dir.is_dir() {
            say(id, "vm dir gone, powering off");
            return Ok(());
        }
        if let Some(c) = read_control(control_file) {
            ctl = c;
        }
        guest.step(&ctl);
        std::thread::sleep(Duration::from_millis(100));
    }
}
