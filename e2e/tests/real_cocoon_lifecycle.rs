//! The real cocoon CLI (built from shared/vendor by `make deps`) driving the cloud-hypervisor
//! stand-in: run, snapshot save, clone, export, import on a second root (a second node), clone
//! there, a stand-in killed and reported through cocoon's own event stream, and removal that
//! leaves no stand-in process. The VMs have no NIC (`--nics 0`), so no CNI set-up is needed;
//! the guest's network path is the stand-in's own test (e2e/ch-standin/tests/network.rs).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One cocoon root: its own root, run and log directories.
struct Root {
    bin: PathBuf,
    standin: PathBuf,
    dir: PathBuf,
}

impl Root {
    fn new(bin: &Path, standin: &Path, dir: PathBuf) -> Self {
        // A cloud image boots through UEFI firmware; the stand-in only checks the file exists.
        let fw = dir.join("root/firmware");
        std::fs::create_dir_all(&fw).unwrap();
        std::fs::write(fw.join("CLOUDHV.fd"), b"placeholder firmware").unwrap();
        Self {
            bin: bin.into(),
            standin: standin.into(),
            dir,
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("COCOON_ROOT_DIR", self.dir.join("root"))
            .env("COCOON_RUN_DIR", self.dir.join("run"))
            .env("COCOON_LOG_DIR", self.dir.join("log"))
            .env("COCOON_CH_BINARY", &self.standin)
            .stdin(Stdio::null());
        c
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "cocoon {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let s = self.ok(args);
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("cocoon {}: {e}: {s}", args.join(" ")))
    }
}

fn tools() -> Option<(PathBuf, PathBuf)> {
    let real = e2e::real_cocoon::cli_for_tests()?;
    let standin = match e2e::real_cocoon::standin_binary() {
        Ok(p) => p,
        Err(e) => panic!("building the stand-in failed: {e}"),
    };
    Some((real, standin))
}

fn alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Lines of `cocoon vm status --event --format json`, read on a thread.
fn events(root: &Root) -> (Child, mpsc::Receiver<Value>) {
    let mut child = root
        .command()
        .args(["vm", "status", "--event", "--format", "json", "-n", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    (child, rx)
}

fn wait_event(rx: &mpsc::Receiver<Value>, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) if pred(&v) => return v,
            Ok(_) => {}
            Err(e) => panic!("no event {what} within 30 s ({e})"),
        }
    }
}

#[test]
fn run_snapshot_clone_export_import_crash_and_remove() {
    let Some((real, standin)) = tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let a = Root::new(&real, &standin, tmp.path().join("a"));
    let b = Root::new(&real, &standin, tmp.path().join("b"));
    let disk = tmp.path().join("guest.qcow2");
    let made = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&disk)
        .arg("64M")
        .status()
        .unwrap();
    assert!(made.success());
    a.ok(&["image", "import", "guest", disk.to_str().unwrap()]);

    let vm = a.json(&[
        "vm",
        "run",
        "-o",
        "json",
        "--name",
        "vk-real-1",
        "--nics",
        "0",
        "--cpu",
        "1",
        "--memory",
        "512M",
        "--storage",
        "10G",
        "guest",
    ]);
    assert_eq!(vm["state"], "running", "{vm}");
    let pid = vm["pid"].as_i64().unwrap();
    assert!(
        pid > 0 && alive(pid),
        "the stand-in runs as the VM's process"
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(String::from_utf8_lossy(&cmdline).contains("--api-socket"));

    a.ok(&["snapshot", "save", "--name", "snap1", "vk-real-1"]);
    let snap = a.json(&["snapshot", "inspect", "snap1"]);
    assert_eq!(snap["hypervisor"], "cloud-hypervisor");
    assert_eq!(snap["name"], "snap1");

    // A tier-S clone record is running with no PID yet (CLI-6.5).
    let clone = a.json(&[
        "vm",
        "clone",
        "-o",
        "json",
        "--name",
        "vk-real-c1",
        "--on-demand",
        "snap1",
    ]);
    assert_eq!(clone["state"], "running");
    assert_eq!(clone["pid"], 0);
    let clone_pid = a.json(&["vm", "inspect", "vk-real-c1"])["pid"]
        .as_i64()
        .unwrap();
    assert!(clone_pid > 0 && alive(clone_pid));

    let archive = a
        .command()
        .args(["snapshot", "export", "snap1", "-o", "-"])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(archive.status.success());
    let mut tar = tar::Archive::new(&archive.stdout[..]);
    let names: Vec<String> = tar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.first().map(String::as_str),
        Some("snapshot.json"),
        "{names:?}"
    );
    for f in ["config.json", "state.json", "memory-ranges"] {
        assert!(
            names.iter().any(|n| n == f),
            "{f} in the archive: {names:?}"
        );
    }

    let mut import = b
        .command()
        .args(["snapshot", "import", "--name", "snap1"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut import.stdin.take().unwrap(), &archive.stdout).unwrap();
    assert!(import.wait().unwrap().success());
    let there = b.json(&[
        "vm",
        "clone",
        "-o",
        "json",
        "--name",
        "vk-real-b1",
        "--pull",
        "snap1",
    ]);
    assert_eq!(
        there["state"], "running",
        "the second node clones the imported snapshot"
    );

    // A crashed hypervisor reaches clients through the real event stream (CLI-7).
    let id = vm["id"].as_str().unwrap().to_string();
    let (mut stream, rx) = events(&a);
    wait_event(&rx, "ADDED for the VM", |v| {
        v["event"] == "ADDED" && v["vm"]["id"] == id
    });
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let ev = wait_event(&rx, "MODIFIED to not running", |v| {
        v["event"] == "MODIFIED" && v["vm"]["id"] == id && v["vm"]["state"] != "running"
    });
    assert_eq!(ev["vm"]["state"], "stopped (stale)");
    stream.kill().unwrap();
    stream.wait().unwrap();

    a.ok(&["vm", "rm", "--force", "vk-real-1", "vk-real-c1"]);
    b.ok(&["vm", "rm", "--force", "vk-real-b1"]);
    assert_eq!(a.ok(&["vm", "list", "-o", "json"]), "No VMs found.\n");
    assert_eq!(b.ok(&["vm", "list", "-o", "json"]), "No VMs found.\n");
    assert!(!alive(clone_pid), "vm rm stops the clone's stand-in");
}
