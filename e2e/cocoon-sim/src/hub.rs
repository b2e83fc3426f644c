//! `COCOON_SIM_GUESTS=shared`: one long-lived process per root, `cocoon sim hub --root R`,
//! runs every guest of that root as a thread instead of a process each, so a thousand idle
//! guests cost a thousand parked threads and no polling.
//!
//! - Each guest thread is named `vg<first 13 chars of the ID>`, enters the VM's netns (setns
//!   is per thread), opens its listeners there, and then sleeps until the CLI tells it
//!   something or its next boot/lease deadline falls due. Its thread ID is the VM's `pid`:
//!   `/proc/<pid>/stat` is the guest's own task, `/proc/<pid>/net/dev` shows the guest's netns.
//! - One poller thread watches every guest's listeners and hands each connection to a
//!   short-lived thread, as a guest process does.
//! - The CLI talks to the hub over `<root>/hub.sock`, one request line per connection:
//!   `start ID CONTROL` (answers `ok TID` once the guest has opened its ports), `stop ID`
//!   (answers once the thread is gone and its ports are closed), `refresh ID` (answers once
//!   the guest has read its control file again and acted on it, so a port the control drops
//!   is closed when the CLI returns). The first `start` launches the hub; a hub that dies
//!   takes every guest with it, and the CLI sees them all as not running.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Env;
use crate::error::{fail, Error, Result};
use crate::guest::{self, Behaviour, Listeners, Log};
use crate::lock;

const STACK: usize = 256 * 1024;

pub fn thread_name(id: &str) -> String {
    format!("vg{}", &id[..id.len().min(13)])
}

fn socket_path(root: &Path) -> PathBuf {
    root.join("hub.sock")
}

// ---- the CLI's side ----

fn ask(root: &Path, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket_path(root))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    Ok(reply.trim_end().to_string())
}

/// Launches the root's hub unless one answers; concurrent callers start at most one.
fn ensure(root: &Path) -> Result<()> {
    if ask(root, "ping").is_ok() {
        return Ok(());
    }
    let _l = lock::exclusive(&root.join("hub.start.lock"))?;
    if ask(root, "ping").is_ok() {
        return Ok(());
    }
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("hub.log"))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["sim", "hub", "--root"])
        .arg(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the hub must outlive the CLI call that starts it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if ask(root, "ping").is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return fail(format!("guest hub exited at start ({st})"));
        }
        if Instant::now() > deadline {
            return fail("guest hub did not answer within 10 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Starts the VM's guest in the hub and returns its thread ID.
pub fn start(env: &Env, id: &str, control: &Path) -> Result<i32> {
    ensure(&env.root)?;
    let reply = ask(&env.root, &format!("start {id} {}", control.display()))
        .map_err(|e| Error::Msg(format!("guest hub: {e}")))?;
    match reply.strip_prefix("ok ").map(str::parse) {
        Some(Ok(tid)) => Ok(tid),
        _ => fail(format!("guest hub: {reply}")),
    }
}

/// Powers the guest off; returns once its ports are closed and its thread is gone.
pub fn stop(root: &Path, id: &str) {
    let _ = ask(root, &format!("stop {id}"));
}

pub fn refresh(root: &Path, id: &str) {
    let _ = ask(root, &format!("refresh {id}"));
}

// ---- the hub ----

struct Entry {
    listener: TcpListener,
    port: u16,
    name: String,
}

/// Every guest's listeners in one poll(2) set, plus a pipe to wake it when the set changes.
struct Poller {
    entries: Mutex<BTreeMap<RawFd, Entry>>,
    wake_r: RawFd,
    wake_w: RawFd,
}

impl Poller {
    fn new() -> std::io::Result<Arc<Poller>> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors, which the poller owns from here on.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Poller {
            entries: Mutex::default(),
            wake_r: fds[0],
            wake_w: fds[1],
        }))
    }

    fn wake(&self) {
        // SAFETY: a one-byte write to our own non-blocking pipe; a full pipe wakes anyway.
        unsafe {
            libc::write(self.wake_w, b"x".as_ptr().cast(), 1);
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<RawFd, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, listener: TcpListener, port: u16, name: &str) -> std::io::Result<RawFd> {
        listener.set_nonblocking(true)?;
        let fd = listener.as_raw_fd();
        self.entries().insert(
            fd,
            Entry {
                listener,
                port,
                name: name.to_string(),
            },
        );
        self.wake();
        Ok(fd)
    }

    /// The port stops listening at once: shutdown(2) ends the listen state even while poll
    /// still holds a reference to the socket.
    fn remove(&self, fd: RawFd) {
        if let Some(e) = self.entries().remove(&fd) {
            // SAFETY: shutdown on a descriptor the entry owns until it drops just after.
            unsafe {
                libc::shutdown(e.listener.as_raw_fd(), libc::SHUT_RDWR);
            }
        }
        self.wake();
    }

    fn run(&self) {
        let mut buf = [0u8; 256];
        loop {
            let mut fds: Vec<libc::pollfd> = std::iter::once(self.wake_r)
                .chain(self.entries().keys().copied())
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: poll over a vector of pollfd we own.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n <= 0 {
                continue;
            }
            // SAFETY: draining our own non-blocking pipe.
            while unsafe { libc::read(self.wake_r, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
            for p in &fds[1..] {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                let entries = self.entries();
                let Some(e) = entries.get(&p.fd) else {
                    continue;
                };
                while let Ok((s, _)) = e.listener.accept() {
                    let (port, name) = (e.port, e.name.clone());
                    let _ = std::thread::Builder::new()
                        .stack_size(STACK)
                        .spawn(move || guest::serve(s, port, name));
                }
            }
        }
    }
}

/// A hub guest's ports live in the poller; they are bound on the guest's thread, so inside
/// its netns.
struct Polled {
    poller: Arc<Poller>,
    fds: BTreeMap<u16, RawFd>,
}

impl Listeners for Polled {
    fn open(&mut self, host: &str, port: u16, name: &str) -> std::io::Result<()> {
        let l = TcpListener::bind((host, port))?;
        let fd = self.poller.add(l, port, name)?;
        self.fds.insert(port, fd);
        Ok(())
    }

    fn close(&mut self, port: u16) {
        if let Some(fd) = self.fds.remove(&port) {
            self.poller.remove(fd);
        }
    }
}

enum Msg {
    /// Read the control file again, act on it, then answer on the sender.
    Refresh(mpsc::Sender<()>),
    Stop,
}

struct Running {
    tx: mpsc::Sender<Msg>,
    thread: JoinHandle<()>,
    tid: i32,
}

type Guests = Arc<Mutex<HashMap<String, Running>>>;

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn guest_main(
    id: String,
    control: PathBuf,
    poller: Arc<Poller>,
    rx: mpsc::Receiver<Msg>,
    ready: mpsc::Sender<std::result::Result<i32, String>>,
) {
    let Some(mut ctl) = guest::read_control(&control) else {
        let _ = ready.send(Err(format!("no control file {}", control.display())));
        return;
    };
    if !ctl.netns.is_empty() {
        if let Err(e) = crate::netns::enter(&ctl.netns) {
            let _ = ready.send(Err(format!("enter netns {}: {e}", ctl.netns)));
            return;
        }
    }
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&ctl.log_file)
        .map(Log::File)
        .unwrap_or(Log::Stderr);
    let listeners = Polled {
        poller,
        fds: BTreeMap::new(),
    };
    let mut g = Behaviour::new(&id, listeners, log);
    let tid = gettid();
    g.say(format!(
        "booting {} ip={} pid={tid} (hub {})",
        ctl.name,
        ctl.ip,
        std::process::id()
    ));
    let mut due = g.step(&ctl);
    let _ = ready.send(Ok(tid));
    loop {
        let msg = match due {
            Some(d) => rx.recv_timeout(d),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        let mut applied = None;
        match msg {
            Ok(Msg::Refresh(done)) => {
                if let Some(c) = guest::read_control(&control) {
                    ctl = c;
                }
                applied = Some(done);
            }
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                g.power_off();
                g.say("powered off");
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        due = g.step(&ctl);
        if let Some(done) = applied {
            let _ = done.send(());
        }
    }
}

fn guests(g: &Guests) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    g.lock().unwrap_or_else(|p| p.into_inner())
}

fn stop_guest(g: &Guests, id: &str) {
    let Some(r) = guests(g).remove(id) else {
        return;
    };
    let _ = r.tx.send(Msg::Stop);
    let _ = r.thread.join();
    // The thread ID lingers in /proc for a moment after the join.
    let deadline = Instant::now() + Duration::from_secs(1);
    while guest::is_alive(r.tid, id) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn start_guest(g: &Guests, poller: &Arc<Poller>, id: &str, control: &str) -> String {
    stop_guest(g, id);
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready) = mpsc::channel();
    let (gid, control, p) = (id.to_string(), PathBuf::from(control), poller.clone());
    let spawned = std::thread::Builder::new()
        .name(thread_name(id))
        .stack_size(STACK)
        .spawn(move || guest_main(gid, control, p, rx, ready_tx));
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => return format!("error spawn guest thread: {e}"),
    };
    match ready.recv() {
        Ok(Ok(tid)) => {
            guests(g).insert(id.to_string(), Running { tx, thread, tid });
            format!("ok {tid}")
        }
        Ok(Err(e)) => format!("error {e}"),
        Err(_) => "error guest thread died at start".into(),
    }
}

fn handle(conn: UnixStream, g: &Guests, poller: &Arc<Poller>) {
    let mut line = String::new();
    if BufReader::new(&conn).read_line(&mut line).is_err() {
        return;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let reply = match words.as_slice() {
        ["ping"] => "ok".to_string(),
        ["start", id, control] => start_guest(g, poller, id, control),
        ["stop", id] => {
            stop_guest(g, id);
            "ok".into()
        }
        ["refresh", id] => {
            let (done_tx, done) = mpsc::channel();
            let sent = guests(g)
                .get(*id)
                .is_some_and(|r| r.tx.send(Msg::Refresh(done_tx)).is_ok());
            // A guest that stops instead drops the sender, which ends the wait too.
            if sent {
                let _ = done.recv();
            }
            "ok".into()
        }
        _ => format!("error unknown request {:?}", line.trim_end()),
    };
    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
}

/// A guest never outlives its VM's directory, nor the hub its root, as with guest processes.
fn sweep(root: &Path, g: &Guests) {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if !root.is_dir() {
            eprintln!("hub: root {} gone, exiting", root.display());
            std::process::exit(0);
        }
        let gone: Vec<String> = guests(g)
            .keys()
            .filter(|id| !root.join("vms").join(id).is_dir())
            .cloned()
            .collect();
        for id in gone {
            stop_guest(g, &id);
        }
    }
}

pub fn run(root: &Path) -> Result<()> {
    lock::set_durable(!crate::config::zero_boot()?);
    let Some(_only) = lock::try_exclusive(&root.join("hub.lock"))? else {
        return fail(format!("another guest hub serves {}", root.display()));
    };
    let path = socket_path(root);
    let _ = fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| Error::Msg(format!("bind {}: {e}", path.display())))?;
    let poller = Poller::new()?;
    let g: Guests = Arc::default();
    {
        let p = poller.clone();
        std::thread::Builder::new()
            .name("hub-poller".into())
            .spawn(move || p.run())?;
    }
    {
        let (r, g) = (root.to_path_buf(), g.clone());
        std::thread::Builder::new()
            .name("hub-sweep".into())
            .spawn(move || sweep(&r, &g))?;
    }
    eprintln!(
        "hub: serving {} (pid {})",
        root.display(),
        std::process::id()
    );
    for conn in listener.incoming().flatten() {
        let (g, p) = (g.clone(), poller.clone());
        let _ = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || handle(conn, &g, &p));
    }
    Ok(())
}
