//! The harness the differential tests share: the simulator in tier S and the real cocoon CLI
//! (built from shared/vendor by `make deps`, launching the cloud-hypervisor stand-in), each on
//! a root of its own, given the same argv; and the comparison of their answers. Only the final
//! stderr line is compared (cocoon logs free text before it, clients match only that line,
//! CLI-3), and JSON by shape: the keys at each level, the type of each value, and the values
//! that are fixed for a given argv (state, hypervisor, names, sizes); not ids, times, pids or
//! paths.
#![allow(dead_code)]

pub mod shape;
pub mod web;

pub use shape::{masked, shape};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// What one invocation printed and returned.
#[derive(Debug, Clone)]
pub struct Answer {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub last_stderr_line: String,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.stdout).ok()
    }

    #[track_caller]
    pub fn ok(self, what: &str) -> Answer {
        assert_eq!(self.code, 0, "{what}: {self:?}");
        self
    }
}

/// One cocoon (simulated or real) on its own root.
pub struct Side {
    pub label: &'static str,
    pub bin: PathBuf,
    pub dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Side {
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("COCOON_ROOT_DIR", self.dir.join("root"))
            .env("COCOON_RUN_DIR", self.dir.join("run"))
            .env("COCOON_LOG_DIR", self.dir.join("log"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Answer {
        self.run_with_stdin(args, None)
    }

    pub fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Answer {
        let mut c = self.command();
        c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        if stdin.is_some() {
            c.stdin(Stdio::piped());
        }
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        if let Some(bytes) = stdin {
            let mut pipe = child.stdin.take().expect("a stdin pipe");
            // A verb that fails early stops reading; its answer is what counts.
            let _ = pipe.write_all(bytes);
        }
        let out = child.wait_with_output().expect("the child exits");
        let stderr = String::from_utf8_lossy(&out.stderr);
        Answer {
            code: out.status.code().expect("exited, not killed"),
            stdout: out.stdout,
            last_stderr_line: stderr.lines().last().unwrap_or("").to_string(),
        }
    }

    /// `vm status --event --format json`, polled every second.
    pub fn event_stream(&self) -> Child {
        self.command()
            .args(["vm", "status", "--event", "--format", "json", "-n", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the event stream starts")
    }
}

/// The simulator and the real CLI side by side, each on its own root in one temp dir.
pub struct Pair {
    pub sim: Side,
    pub real: Side,
    pub tmp: tempfile::TempDir,
}

impl Pair {
    /// Both sides, or `None` (skipped; a failure under CI) when the real CLI or qemu-img is
    /// missing.
    pub fn new() -> Option<Pair> {
        let real_bin = e2e::real_cocoon::cli_for_tests()?;
        let (sim_bin, standin) = built_once();
        let tmp = tempfile::tempdir().expect("a temp dir");
        let sim_dir = tmp.path().join("sim");
        let real_dir = tmp.path().join("real");
        // A cloud image boots through UEFI firmware; the stand-in only checks the file exists.
        let fw = real_dir.join("root/firmware");
        std::fs::create_dir_all(&fw).unwrap();
        std::fs::write(fw.join("CLOUDHV.fd"), b"placeholder firmware").unwrap();
        std::fs::create_dir_all(sim_dir.join("root")).unwrap();
        let sim = Side {
            label: "simulator",
            bin: sim_bin,
            env: vec![
                ("COCOON_SIM_TIER".into(), "S".into()),
                ("COCOON_SIM_ROOT".into(), path(&sim_dir.join("root"))),
                ("COCOON_SIM_NET".into(), "loopback".into()),
                ("COCOON_SIM_ZERO_BOOT".into(), "1".into()),
                ("COCOON_SIM_CGROUP_PARENT".into(), "none".into()),
            ],
            dir: sim_dir,
        };
        let real = Side {
            label: "real",
            bin: real_bin,
            env: vec![("COCOON_CH_BINARY".into(), path(&standin))],
            dir: real_dir,
        };
        Some(Pair { sim, real, tmp })
    }

    /// Both sides at once: they share nothing, and the suite runs twice as fast.
    pub fn both(&self, args: &[&str]) -> (Answer, Answer) {
        std::thread::scope(|scope| {
            let sim = scope.spawn(|| self.sim.run(args));
            let real = self.real.run(args);
            (sim.join().expect("the simulator's run"), real)
        })
    }

    /// A small qcow2 disk, imported on both sides as the cloud image `name`.
    pub fn import_guest_image(&self, name: &str) -> PathBuf {
        let disk = self.tmp.path().join(format!("{name}.qcow2"));
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&disk)
            .arg("64M")
            .status()
            .expect("qemu-img runs");
        assert!(made.success(), "qemu-img create");
        let file = path(&disk);
        let (s, r) = self.both(&["image", "import", name, &file]);
        s.ok("simulator image import");
        r.ok("real image import");
        disk
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = self.sim.run(&["sim", "cleanup"]);
        // The real VMs are stand-in processes; removing them is what stops those.
        if let Some(Value::Array(vms)) = self.real.run(&["vm", "list", "-o", "json"]).json() {
            let ids: Vec<String> = vms
                .iter()
                .filter_map(|v| v["id"].as_str().map(String::from))
                .collect();
            if !ids.is_empty() {
                let mut args = vec!["vm", "rm", "--force"];
                args.extend(ids.iter().map(String::as_str));
                let _ = self.real.run(&args);
            }
        }
    }
}

/// Enough of a stdout to tell two apart in a failure message.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]);
    format!("{} bytes: {text:?}", bytes.len())
}

pub fn path(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_string()
}

/// The simulator and the stand-in, built once per test binary: the tests of one binary run
/// side by side and would otherwise queue on cargo's lock.
fn built_once() -> (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let sim = e2e::sim::binary().expect("the simulator builds");
            let standin = e2e::real_cocoon::standin_binary().expect("the stand-in builds");
            (sim, standin)
        })
        .clone()
}

/// Collects every difference between the two sides' answers to one argv.
#[derive(Default)]
pub struct Differences(Vec<String>);

impl Differences {
    /// Exit code, final `Error:` line (masked), and stdout: by shape when it is JSON, else
    /// exactly.
    pub fn compare(&mut self, pair: &Pair, args: &[&str], sim: &Answer, real: &Answer) {
        if !self.compare_status(pair, args, sim, real) {
            return;
        }
        let what = format!("cocoon {}", args.join(" "));
        match (sim.json(), real.json()) {
            (Some(s), Some(r)) => {
                let (s, r) = (shape(&s), shape(&r));
                if s != r {
                    self.0.push(format!(
                        "{what}: JSON shape\n  simulator {s}\n  real      {r}"
                    ));
                }
            }
            _ if sim.stdout != real.stdout => self.0.push(format!(
                "{what}: stdout\n  simulator {}\n  real      {}",
                excerpt(&sim.stdout),
                excerpt(&real.stdout)
            )),
            _ => {}
        }
    }

    /// Exit code and final `Error:` line (masked) only, for stdout compared some other way
    /// (an archive); false when the exit codes differ.
    pub fn compare_status(
        &mut self,
        pair: &Pair,
        args: &[&str],
        sim: &Answer,
        real: &Answer,
    ) -> bool {
        let what = format!("cocoon {}", args.join(" "));
        let (s, r) = (
            masked(&sim.last_stderr_line, &pair.sim.dir),
            masked(&real.last_stderr_line, &pair.real.dir),
        );
        if sim.code != real.code {
            self.0.push(format!(
                "{what}: exit {} (simulator) vs {} (real)\n  simulator {s}\n  real      {r}",
                sim.code, real.code
            ));
            return false;
        }
        if sim.code != 0 && s != r {
            self.0.push(format!(
                "{what}: error line\n  simulator {s}\n  real      {r}"
            ));
        }
        true
    }

    /// Runs the argv on both sides, compares, and returns both answers.
    pub fn both(&mut self, pair: &Pair, args: &[&str]) -> (Answer, Answer) {
        let (s, r) = pair.both(args);
        self.compare(pair, args, &s, &r);
        (s, r)
    }

    /// `both` for an argv written as one line: words split at spaces.
    pub fn line(&mut self, pair: &Pair, line: &str) -> (Answer, Answer) {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.both(pair, &args)
    }

    pub fn note(&mut self, text: String) {
        self.0.push(text);
    }

    #[track_caller]
    pub fn assert_none(self) {
        assert!(
            self.0.is_empty(),
            "the simulator (tier S) differs from the real cocoon:\n{}",
            self.0.join("\n")
        );
    }
}
