//! The guest's console: the PTY (`--console pty`, reported in vm.info as
//! `config.console.file`), the serial socket (`--serial socket=…`), a file, or the VMM's own
//! terminal. Every guest line also goes to stderr, which cocoon sends to cloud-hypervisor.log.

use std::ffi::CStr;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

enum Sink {
    Pty(Arc<OwnedFd>),
    Socket(Arc<Mutex<Vec<UnixStream>>>),
    File(std::fs::File),
    Tty,
}

#[derive(Default)]
pub struct Console {
    sinks: Mutex<Vec<Sink>>,
}

impl Console {
    /// One guest console line, to every sink; a sink that cannot take it (a full PTY nobody
    /// reads, a gone socket client) loses it, as a guest's console output is lost.
    pub fn line(&self, text: &str) {
        eprintln!("guest: {text}");
        let bytes = format!("{text}\r\n");
        let mut sinks = self.sinks.lock().unwrap_or_else(|e| e.into_inner());
        for sink in sinks.iter_mut() {
            match sink {
                Sink::Pty(fd) => {
                    // SAFETY: writes from a live buffer to an fd this sink owns.
                    unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
                }
                Sink::Socket(clients) => {
                    let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
                    clients.retain_mut(|c| c.write_all(bytes.as_bytes()).is_ok());
                }
                Sink::File(f) => {
                    let _ = f.write_all(bytes.as_bytes());
                }
                Sink::Tty => {
                    let _ = std::io::stdout().write_all(bytes.as_bytes());
                }
            }
        }
    }

    /// Opens the devices `config`'s console and serial ask for, replacing any before, and
    /// writes the PTY's path into `config.console.file` / `config.serial.file` as
    /// cloud-hypervisor does.
    pub fn open(&self, config: &mut Value) -> Result<(), String> {
        let mut sinks = Vec::new();
        for key in ["console", "serial"] {
            let mode = config[key]["mode"].as_str().unwrap_or("Off").to_string();
            match mode.as_str() {
                "Pty" => {
                    let (master, path) =
                        open_pty().map_err(|e| format!("Error creating {key} PTY: {e}"))?;
                    config[key]["file"] = Value::String(path);
                    sinks.push(Sink::Pty(master));
                }
                "Socket" => {
                    let path = config[key]["socket"]
                        .as_str()
                        .ok_or("socket mode without a socket")?;
                    sinks.push(Sink::Socket(listen(path)?));
                }
                "File" => {
                    let path = config[key]["file"]
                        .as_str()
                        .ok_or("file mode without a file")?;
                    let f = std::fs::File::create(path)
                        .map_err(|e| format!("Error opening {key} file {path}: {e}"))?;
                    sinks.push(Sink::File(f));
                }
                "Tty" => sinks.push(Sink::Tty),
                _ => {}
            }
        }
        *self.sinks.lock().unwrap_or_else(|e| e.into_inner()) = sinks;
        Ok(())
    }

    pub fn close(&self) {
        self.sinks.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A raw-mode PTY pair; the master stays here (non-blocking), the slave's path is what
/// cocoon opens for `vm console`. Input typed there is read and dropped by a thread: the
/// stand-in guest has no shell.
fn open_pty() -> std::io::Result<(Arc<OwnedFd>, String)> {
    // SAFETY: plain libc calls on a descriptor we own; ptsname_r writes into `buf`.
    unsafe {
        let fd =
            libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let master = Arc::new(OwnedFd::from_raw_fd(fd));
        if libc::grantpt(fd) != 0 || libc::unlockpt(fd) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = [0 as libc::c_char; 128];
        if libc::ptsname_r(fd, buf.as_mut_ptr(), buf.len()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut tio: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut tio) == 0 {
            libc::cfmakeraw(&mut tio);
            libc::tcsetattr(fd, libc::TCSANOW, &tio);
        }
        let path = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
        let reader = master.clone();
        std::thread::spawn(move || drain(reader));
        Ok((master, path))
    }
}

/// Ends once the console let go of the PTY (the last other holder of `fd`).
fn drain(fd: Arc<OwnedFd>) {
    let mut buf = [0u8; 1024];
    while Arc::strong_count(&fd) > 1 {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; read into a live buffer.
        let n = unsafe {
            libc::poll(&mut pfd, 1, 500);
            libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
        };
        let err = std::io::Error::last_os_error().raw_os_error();
        if n == 0 || (n < 0 && err != Some(libc::EAGAIN) && err != Some(libc::EINTR)) {
            // With no slave open the master reads EIO; wait for one to appear.
            if pfd.revents & libc::POLLHUP != 0 {
                std::thread::park_timeout(std::time::Duration::from_millis(200));
            }
        }
    }
}

fn listen(path: &str) -> Result<Arc<Mutex<Vec<UnixStream>>>, String> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).map_err(|e| format!("Error binding serial socket {path}: {e}"))?;
    let clients = Arc::new(Mutex::new(Vec::new()));
    let accepted = clients.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            accepted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(stream);
        }
    });
    Ok(clients)
}
