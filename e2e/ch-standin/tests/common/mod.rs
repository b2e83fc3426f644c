//! Shared by the tests: launching the stand-in, a minimal HTTP/1.1 client for its API
//! socket, and waiting on conditions with a deadline.

#![allow(dead_code)]

pub mod netns;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cloud-hypervisor");

/// A launched stand-in, killed (SIGKILL) and reaped when dropped.
pub struct Vmm {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Vmm {
    /// Runs `prefix… cloud-hypervisor args…` and waits for the API socket.
    pub fn launch(prefix: &[&str], args: &[String], socket: &Path, log: &Path) -> Vmm {
        let out = std::fs::File::create(log).unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut vmm = Vmm {
            child,
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        };
        until("the API socket answers", Duration::from_secs(10), || {
            if let Ok(Some(status)) = vmm.child.try_wait() {
                panic!(
                    "the stand-in exited with {status}: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            UnixStream::connect(socket).is_ok()
        });
        vmm
    }

    pub fn call(&self, method: &str, endpoint: &str, body: Option<&str>) -> (u16, String) {
        call(&self.socket, method, endpoint, body)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut status = None;
        until("the stand-in exits", within, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a fresh connection; status and body.
pub fn call(socket: &Path, method: &str, endpoint: &str, body: Option<&str>) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.unwrap_or("");
    let head = format!(
        "{method} /api/v1/{endpoint} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{}\r\n",
        if body.is_empty() {
            String::new()
        } else {
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
        }
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Polls `cond` until it holds; panics naming `what` once `within` has passed.
pub fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The files a direct boot needs: kernel placeholder, initramfs guest program, COW disk.
pub struct Payload {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub disk: PathBuf,
}

impl Payload {
    pub fn write(dir: &Path, program: &str) -> Payload {
        let p = Payload {
            kernel: dir.join("vmlinuz"),
            initramfs: dir.join("initrd.img"),
            disk: dir.join("cow.raw"),
        };
        std::fs::write(&p.kernel, b"placeholder kernel").unwrap();
        std::fs::write(&p.initramfs, program).unwrap();
        std::fs::File::create(&p.disk)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        p
    }

    /// cocoon's buildCLIArgs for this VM (direct boot, PTY console), with `net` if given.
    pub fn args(&self, socket: &Path, cmdline: &str, net: Option<&str>) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--api-socket".into(), socket.display().to_string(),
            "--cpus".into(), "boot=1,max=1".into(),
            "--memory".into(), "size=268435456".into(),
            "--disk".into(), format!("path={},direct=on,sparse=on,image_type=raw,num_queues=1,queue_size=512,serial=cocoon-cow", self.disk.display()),
            "--kernel".into(), self.kernel.display().to_string(),
            "--initramfs".into(), self.initramfs.display().to_string(),
            "--cmdline".into(), cmdline.into(),
        ];
        if let Some(n) = net {
            a.extend(["--net".into(), n.into()]);
        }
        a.extend([
            "--rng".into(),
            "src=/dev/urandom".into(),
            "--watchdog".into(),
            "--serial".into(),
            "off".into(),
            "--console".into(),
            "pty".into(),
        ]);
        a
    }
}
