//! `make crash-sweep`: the daemon killed with SIGKILL at seeded random moments, and restarted.
//!
//! One testbed (control plane, registry, simulator) and one journal for the whole sweep. A
//! handful of pods — run mode, clone mode, a fork of a long-lived main pod, and two sleepers
//! that hibernate and wake — cycle through the operations: create, delete, a VM removed
//! behind the daemon's back (`vm rm --force`), a guest crash (`sim fault crash`), hibernate,
//! wake, and a kill during the startup reconcile itself. Each kill point triggers one
//! operation, waits a random delay, kills the daemon's process group (the cocoon calls it
//! started live on in their own groups, as they would on a host) and starts a new daemon.
//!
//! After every restart each pod must converge within 10 s: Ready with a live guest under
//! its VM name for pods that should run (B4, B5, B7, W3, W4); gone for deleted ones, with the
//! delete-time snapshot their policy asks for (D4, D5, D8, B11); `hibernated` with its
//! `<vm>:hibernate` tag for pods asked to hibernate (B6, B9, U3); Ready again for woken ones,
//! with the file written in the guest before the hibernate (U5). No VM may be held by no pod
//! (leaked) or share its name with another (duplicated). A pod whose VM vanished may end
//! either way: evicted (W6) or made again (B7). The journal is replayed with --verify at the
//! end.
//!
//! `CRASH_POINTS` (200) kill points; `CRASH_SEED` repeats a run's choices (the seed is
//! printed). Timing still varies between runs, so a replay meets the same operations and
//! delays but not necessarily the same outcome. The journal and the daemon's log are kept
//! under `target/tmp/crash-sweep-<seed>/`.

use e2e::daemon;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::daemon::{annotation, is_ready, phase, pod_manifest, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vk_cocoon::registry::Registry;

const NS: &str = "default";
const NODE: &str = "node-a";
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
/// The clone base `daemon::seed_clone_snapshot` puts on the host.
const CLONE_BASE: &str = "acme/agent:v1";
const PREFIX: &str = "cocoon";
/// Every pod converges within this long after a restart.
const GOAL: Duration = Duration::from_secs(10);
/// How long a point that missed the goal is still watched, to tell slow from stuck.
const PATIENCE: Duration = Duration::from_secs(45);
/// A converged world is looked at once more after this long, and must still be converged.
const HOLD: Duration = Duration::from_secs(1);
/// Delays are `u² × MAX_DELAY_MS` for a uniform `u`: dense near the trigger, where most
/// steps of an operation happen, and reaching past the slowest (a hibernate's push).
const MAX_DELAY_MS: f64 = 2000.0;
const LIFECYCLE: &str = "vm.cocoonstack.io/lifecycle-state";
const VM_ID: &str = "vm.cocoonstack.io/id";

/// splitmix64: small, seedable, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Run mode; only ever restarted under: the fork pods' source.
    Main,
    Run,
    Clone,
    Fork,
    /// Hibernates and wakes (run or clone mode).
    Sleeper {
        clone: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Absent,
    Ready,
    Hibernated,
    /// Its VM vanished or crashed: evicted (gone) or running again both converge.
    ReadyOrGone,
}

struct Slot {
    name: &'static str,
    kind: Kind,
    /// `cocoonset.cocoonstack.io/snapshot-policy`: `always` pushes `<vm>:latest` at delete.
    policy: &'static str,
    want: Want,
    /// Written into the guest before its last hibernate; the woken guest must hold it.
    marker: Option<String>,
}

impl Slot {
    fn vm(&self) -> String {
        format!("vk-default-{}", self.name)
    }

    fn manifest(&self) -> Result<Pod> {
        let mut a = json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": self.vm(),
            "cocoonset.cocoonstack.io/snapshot-policy": self.policy,
        });
        let extra = match self.kind {
            Kind::Main | Kind::Run | Kind::Sleeper { clone: false } => json!({
                "cocoonset.cocoonstack.io/mode": "run",
                "cocoonset.cocoonstack.io/image": IMAGE}),
            Kind::Clone | Kind::Sleeper { clone: true } => {
                json!({"cocoonset.cocoonstack.io/image": CLONE_BASE})
            }
            Kind::Fork => json!({
                "vm.cocoonstack.io/fork-from": "vk-default-main",
                "cocoonset.cocoonstack.io/image": IMAGE}),
        };
        a.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        pod_manifest(NS, self.name, NODE, a)
    }
}

fn workload() -> Vec<Slot> {
    let slot = |name, kind, policy| Slot {
        name,
        kind,
        policy,
        want: Want::Ready,
        marker: None,
    };
    vec![
        slot("main", Kind::Main, "never"),
        slot("run-a", Kind::Run, "never"),
        slot("run-b", Kind::Run, "always"),
        slot("clone-a", Kind::Clone, "always"),
        slot("fork-a", Kind::Fork, "never"),
        slot("sleep-a", Kind::Sleeper { clone: false }, "never"),
        slot("sleep-b", Kind::Sleeper { clone: true }, "never"),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Create,
    Delete,
    /// `cocoon vm rm --force` behind the daemon's back.
    Remove,
    /// `cocoon sim fault crash`: the guest is SIGKILLed, its record stays.
    Crash,
    Hibernate,
    Wake,
    /// Kill a daemon that is still in its startup reconcile.
    Restart,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::Create,
        Op::Delete,
        Op::Remove,
        Op::Crash,
        Op::Hibernate,
        Op::Wake,
        Op::Restart,
    ];

    fn applies(self, s: &Slot) -> bool {
        let sleeper = matches!(s.kind, Kind::Sleeper { .. });
        match self {
            Op::Create => s.kind != Kind::Main && s.want == Want::Absent,
            Op::Delete => s.kind != Kind::Main && matches!(s.want, Want::Ready | Want::Hibernated),
            Op::Remove | Op::Crash => {
                matches!(s.kind, Kind::Run | Kind::Clone | Kind::Fork) && s.want == Want::Ready
            }
            Op::Hibernate => sleeper && s.want == Want::Ready,
            Op::Wake => sleeper && s.want == Want::Hibernated,
            Op::Restart => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Delete => "delete",
            Op::Remove => "vm-rm",
            Op::Crash => "crash",
            Op::Hibernate => "hibernate",
            Op::Wake => "wake",
            Op::Restart => "restart",
        }
    }
}

/// An operation with a candidate pod, the operation first, then the pod, each uniformly.
fn choose(slots: &[Slot], rng: &mut Rng) -> (Op, usize) {
    let ops: Vec<Op> = Op::ALL
        .into_iter()
        .filter(|op| slots.iter().any(|s| op.applies(s)))
        .collect();
    let op = ops[rng.below(ops.len())];
    let idx: Vec<usize> = (0..slots.len())
        .filter(|&i| op.applies(&slots[i]))
        .collect();
    (op, idx[rng.below(idx.len())])
}

/// The simulator, driven directly (quietly: the sweep polls it ten times a second).
struct Sim {
    bin: PathBuf,
    env: Vec<(String, String)>,
}

impl Sim {
    fn new(tb: &Testbed) -> Result<Sim> {
        let sim = tb.sim.as_ref().context("simulator")?;
        let mut env = sim.env();
        env.push((
            e2e::procs::MARKER.to_string(),
            tb.run_dir().display().to_string(),
        ));
        // `vm exec` runs on the host in the guest's directory (the marker file).
        env.push(("COCOON_SIM_EXEC".into(), "host".into()));
        Ok(Sim {
            bin: sim.bin.clone(),
            env,
        })
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bin)
            .envs(self.env.iter().cloned())
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        ensure!(
            out.status.success(),
            "cocoon {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn vms(&self) -> Result<Vec<Vm>> {
        let out = self.run(&["vm", "list", "-o", "json"])?;
        if out.trim().starts_with("No VMs found") {
            return Ok(Vec::new());
        }
        let list: Vec<serde_json::Value> = serde_json::from_str(&out)
            .with_context(|| format!("vm list -o json printed {out:?}"))?;
        Ok(list
            .into_iter()
            .map(|v| Vm {
                id: v["id"].as_str().unwrap_or_default().to_string(),
                name: v["config"]["name"].as_str().unwrap_or_default().to_string(),
                state: v["state"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }
}

struct Vm {
    id: String,
    name: String,
    state: String,
}

/// What the cluster and the host hold at one moment.
struct World {
    pods: BTreeMap<String, Pod>,
    vms: Vec<Vm>,
    /// VM ids whose guest process is alive.
    alive: BTreeSet<String>,
}

async fn observe(pods: &Api<Pod>, sim: &Sim) -> Result<World> {
    let list = pods.list(&ListParams::default()).await?;
    let pods = list
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect();
    let vms = sim.vms()?;
    let alive = e2e::sim::guest_processes()
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    Ok(World { pods, vms, alive })
}

/// What keeps the world from being converged, by kind.
#[derive(Clone, Default)]
struct Problems {
    pods: Vec<String>,
    leaks: Vec<String>,
    duplicates: Vec<String>,
}

impl Problems {
    fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.leaks.is_empty() && self.duplicates.is_empty()
    }

    fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.pods.is_empty() {
            parts.push(self.pods.join("; "));
        }
        if !self.leaks.is_empty() {
            parts.push(format!("leaked: {}", self.leaks.join(", ")));
        }
        if !self.duplicates.is_empty() {
            parts.push(format!("duplicated: {}", self.duplicates.join(", ")));
        }
        parts.join("; ")
    }
}

fn describe(p: &Pod) -> String {
    format!(
        "phase={} ready={} lifecycle={} id={} deleting={}",
        phase(p),
        is_ready(p),
        annotation(p, LIFECYCLE).unwrap_or_else(|| "-".into()),
        annotation(p, VM_ID).unwrap_or_else(|| "-".into()),
        p.metadata.deletion_timestamp.is_some()
    )
}

/// `Ok` when the pod runs as it should: Ready, lifecycle `ready`, its id naming a running VM
/// of its name whose guest is alive.
fn runs(slot: &Slot, w: &World) -> Result<(), String> {
    let name = slot.name;
    let Some(p) = w.pods.get(name) else {
        return Err(format!("{name} is gone, want Ready"));
    };
    let bad = |why: &str| Err(format!("{name} {why} ({})", describe(p)));
    if p.metadata.deletion_timestamp.is_some() || !is_ready(p) {
        return bad("not Ready");
    }
    if annotation(p, LIFECYCLE).as_deref() != Some("ready") {
        return bad("lifecycle is not ready");
    }
    let Some(id) = annotation(p, VM_ID) else {
        return bad("has no VM id");
    };
    let Some(vm) = w.vms.iter().find(|v| v.id == id) else {
        return bad("names a VM that does not exist");
    };
    if vm.name != slot.vm() {
        return bad(&format!("holds VM {} of another name", vm.name));
    }
    if vm.state != "running" {
        return bad(&format!("holds a VM in state {}", vm.state));
    }
    if !w.alive.contains(&id) {
        return bad("is Ready on a VM whose guest is dead");
    }
    Ok(())
}

fn check_slot(slot: &Slot, w: &World) -> Result<(), String> {
    let name = slot.name;
    match slot.want {
        Want::Ready => runs(slot, w),
        Want::Absent => match w.pods.get(name) {
            None => Ok(()),
            Some(p) => Err(format!("{name} still exists ({})", describe(p))),
        },
        Want::ReadyOrGone => match w.pods.get(name) {
            None => Ok(()),
            Some(_) => runs(slot, w),
        },
        Want::Hibernated => {
            let Some(p) = w.pods.get(name) else {
                return Err(format!("{name} is gone, want hibernated"));
            };
            let vm = slot.vm();
            if annotation(p, LIFECYCLE).as_deref() != Some("hibernated")
                || annotation(p, VM_ID).is_some()
                || w.vms.iter().any(|v| v.name == vm)
            {
                let vms = w.vms.iter().filter(|v| v.name == vm).count();
                return Err(format!(
                    "{name} not hibernated ({}, {vms} VMs named {vm})",
                    describe(p)
                ));
            }
            Ok(())
        }
    }
}

fn problems(slots: &[Slot], w: &World) -> Problems {
    let mut p = Problems::default();
    for slot in slots {
        if let Err(e) = check_slot(slot, w) {
            p.pods.push(e);
        }
    }
    let held: BTreeSet<String> = w
        .pods
        .values()
        .filter_map(|p| annotation(p, VM_ID))
        .collect();
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for vm in &w.vms {
        *names.entry(vm.name.as_str()).or_default() += 1;
        if !held.contains(&vm.id) {
            p.leaks
                .push(format!("{} ({} {})", vm.name, vm.id, vm.state));
        }
    }
    for (name, n) in names {
        if n > 1 {
            p.duplicates.push(format!("{n} VMs named {name}"));
        }
    }
    p
}

/// How one restart ended.
struct Convergence {
    took: Duration,
    /// What was still wrong when the goal passed, if anything was.
    at_goal: Option<Problems>,
    /// What was wrong again a second after it had converged.
    relapse: Option<Problems>,
    /// What was still wrong when patience ran out.
    stuck: Option<Problems>,
    world: World,
}

async fn converge(
    slots: &[Slot],
    pods: &Api<Pod>,
    sim: &Sim,
    d: &mut daemon::Daemon,
    log_from: u64,
    since: Instant,
) -> Result<Convergence> {
    let mut at_goal = None;
    loop {
        let w = observe(pods, sim).await?;
        let mut p = problems(slots, &w);
        if !d.proc.running() {
            p.pods.push("the daemon exited by itself".into());
        } else if !started(d, log_from) {
            p.pods
                .push("the daemon has not finished its startup reconcile".into());
        }
        let took = since.elapsed();
        if p.is_empty() {
            // It must also hold: a second look a second later sees the same.
            tokio::time::sleep(HOLD).await;
            let w = observe(pods, sim).await?;
            let again = problems(slots, &w);
            if again.is_empty() {
                return Ok(Convergence {
                    took,
                    at_goal,
                    relapse: None,
                    stuck: None,
                    world: w,
                });
            }
            return Ok(Convergence {
                took,
                at_goal,
                relapse: Some(again),
                stuck: None,
                world: w,
            });
        }
        if took > GOAL && at_goal.is_none() {
            at_goal = Some(p.clone());
        }
        if took > PATIENCE {
            return Ok(Convergence {
                took,
                at_goal,
                relapse: None,
                stuck: Some(p),
                world: w,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the daemon started at `log_from` in its log has registered the node, which it
/// does once its startup reconcile is done (B1–B8): only what it did after looking counts.
fn started(d: &daemon::Daemon, log_from: u64) -> bool {
    let log = std::fs::read(d.proc.log_path()).unwrap_or_default();
    let since = log.get(log_from as usize..).unwrap_or_default();
    String::from_utf8_lossy(since).contains("node registered")
}

/// The daemon of the sweep: every run appends to one journal and one log.
struct Runner<'a> {
    tb: &'a Testbed,
    opts: DaemonOptions,
    journal: PathBuf,
}

impl Runner<'_> {
    fn start(&self) -> Result<daemon::Daemon> {
        daemon::start(
            self.tb,
            &self.opts,
            &self.journal,
            e2e::ports::free_port()?,
            e2e::ports::free_port()?,
        )
    }

    /// SIGKILL to the daemon's group; returns once the process is gone.
    async fn kill(&self, d: &mut daemon::Daemon) -> Result<()> {
        d.proc.signal(libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.proc.running() {
            ensure!(Instant::now() < deadline, "the daemon survived SIGKILL");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn log_len(&self, d: &daemon::Daemon) -> u64 {
        std::fs::metadata(d.proc.log_path()).map_or(0, |m| m.len())
    }
}

/// How the journal ended when its writer was killed.
#[derive(Debug, PartialEq, Eq)]
enum Tail {
    Whole,
    /// The file ends inside its last frame.
    Torn,
}

fn journal_tail(path: &Path) -> Result<Tail> {
    use vk_cocoon::journal::frame::{read_frame, FrameError};
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (mut r, mut payload) = (&bytes[..], Vec::new());
    loop {
        match read_frame(&mut r, &mut payload) {
            Ok(None) => return Ok(Tail::Whole),
            Ok(Some(_)) => {}
            Err(FrameError::Torn) => return Ok(Tail::Torn),
            Err(e) => anyhow::bail!("{}: {e:?}", path.display()),
        }
    }
}

/// What `vk-cocoon replay --verify` says of a copy of the journal as the kill left it.
fn replay_message(copy: &Path) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["replay", "--verify", "--quiet"])
        .arg(copy)
        .output()?;
    Ok(format!(
        "exit {}: {}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// One thing that went wrong at a kill point.
struct Failure {
    point: usize,
    what: String,
}

#[derive(Default)]
struct Figures {
    points: usize,
    times: Vec<Duration>,
    slow: usize,
    relapsed: usize,
    stuck: usize,
    /// Points where a VM no pod holds was still there 10 s after the restart.
    leaks: usize,
    duplicates: usize,
    lost_snapshots: usize,
    lost_markers: usize,
    lost_delete_snapshots: usize,
    torn_tails: usize,
    /// Event streams of killed daemons still running when the sweep ends.
    stray_streams: usize,
    first_torn: Option<String>,
    per_op: BTreeMap<&'static str, usize>,
    failures: Vec<Failure>,
}

impl Figures {
    fn fail(&mut self, point: usize, what: String) {
        eprintln!("  FAILURE at point {point}: {what}");
        self.failures.push(Failure { point, what });
    }

    fn count_vms(&mut self, p: &Problems) {
        self.leaks += usize::from(!p.leaks.is_empty());
        self.duplicates += usize::from(!p.duplicates.is_empty());
    }

    fn percentile(&self, q: f64) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        if t.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * t.len() as f64).ceil() as usize).clamp(1, t.len());
        t[rank - 1]
    }

    fn print(&self, seed: u64, replay: &Result<()>, kept: &Path) {
        eprintln!("\n== crash sweep, seed {seed} ==");
        eprintln!("kill points run: {}", self.points);
        let ops: Vec<String> = self
            .per_op
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        eprintln!("  by operation: {}", ops.join(", "));
        let max = self.times.iter().max().copied().unwrap_or_default();
        eprintln!(
            "convergence after restart (n={}): p50 {:.1} s, p99 {:.1} s, max {:.1} s",
            self.times.len(),
            self.percentile(0.5).as_secs_f64(),
            self.percentile(0.99).as_secs_f64(),
            max.as_secs_f64()
        );
        eprintln!(
            "over 10 s but converged: {}; broke again after converging: {}; never converged (in {} s): {}",
            self.slow,
            self.relapsed,
            PATIENCE.as_secs(),
            self.stuck
        );
        eprintln!(
            "points with a leaked VM: {}, with a duplicated VM: {}",
            self.leaks, self.duplicates
        );
        eprintln!(
            "lost hibernate snapshots: {}, woken guests without their file: {}, deletes without their snapshot: {}",
            self.lost_snapshots, self.lost_markers, self.lost_delete_snapshots
        );
        eprintln!(
            "event streams of killed daemons still running at the end: {}",
            self.stray_streams
        );
        eprintln!("journal left torn by a kill: {}", self.torn_tails);
        if let Some(t) = &self.first_torn {
            eprintln!("  first: {t}");
        }
        match replay {
            Ok(()) => eprintln!("replay --verify of every journal file: ok"),
            Err(e) => eprintln!("replay --verify of every journal file: FAILED: {e:#}"),
        }
        eprintln!("journal and daemon log kept in {}", kept.display());
        for f in &self.failures {
            eprintln!("failure: seed {seed} point {}: {}", f.point, f.what);
        }
    }
}

async fn tag_id(reg: &Registry, vm: &str, tag: &str) -> Result<Option<String>> {
    Ok(reg
        .inspect(vm, tag)
        .await
        .map_err(|e| anyhow::anyhow!("inspect {vm}:{tag}: {e}"))?
        .map(|t| t.snapshot_id))
}

async fn set_hibernate(pods: &Api<Pod>, name: &str, on: bool) -> Result<()> {
    let value = on.then_some("true");
    let patch = json!({"metadata": {"annotations": {"vm.cocoonstack.io/hibernate": value}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn seed() -> u64 {
    if let Some(s) = std::env::var("CRASH_SEED").ok().filter(|s| !s.is_empty()) {
        return s.parse().expect("CRASH_SEED must be a whole number");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::new(nanos ^ u64::from(std::process::id())).next() % 1_000_000_000
}

fn points() -> usize {
    std::env::var("CRASH_POINTS")
        .ok()
        .filter(|s| !s.is_empty())
        .map_or(200, |s| {
            s.parse().expect("CRASH_POINTS must be a whole number")
        })
}

/// Copies the journal directory and the daemon's log out of the run directory, which the
/// testbed removes when it stops.
fn keep(journal_dir: &Path, log: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest.join("journal"))?;
    for e in std::fs::read_dir(journal_dir)?.flatten() {
        std::fs::copy(e.path(), dest.join("journal").join(e.file_name()))?;
    }
    std::fs::copy(log, dest.join("vk-cocoon.log"))?;
    Ok(())
}

/// One kill point as chosen from the seed.
struct Point {
    n: usize,
    op: Op,
    slot: usize,
    delay: Duration,
    /// The operation's slowest cocoon call, delayed 1.5 s by a simulator fault.
    stretch: Option<&'static str>,
}

impl Point {
    fn choose(seed: u64, n: usize, slots: &[Slot]) -> Point {
        let mut rng = Rng::new(seed ^ (n as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let (op, slot) = choose(slots, &mut rng);
        let delay = Duration::from_millis((rng.unit().powi(2) * MAX_DELAY_MS) as u64);
        // One time in three, so that a kill lands inside that call more often.
        let stretch = rng.below(3) == 0;
        let s = &slots[slot];
        let verb = match (op, s.kind) {
            (Op::Create, Kind::Run | Kind::Sleeper { clone: false }) => Some("vm run"),
            (Op::Create | Op::Wake, _) => Some("vm clone"),
            (Op::Delete, _) if s.policy == "always" && s.want == Want::Ready => {
                Some("snapshot save")
            }
            (Op::Delete, _) => Some("vm rm"),
            (Op::Hibernate, _) => Some("snapshot export"),
            (Op::Remove | Op::Crash | Op::Restart, _) => None,
        };
        Point {
            n,
            op,
            slot,
            delay,
            stretch: verb.filter(|_| stretch),
        }
    }

    fn describe(&self, slots: &[Slot]) -> String {
        let ms = self.delay.as_millis();
        let name = slots[self.slot].name;
        match (self.op, self.stretch) {
            (Op::Restart, _) => format!("restart during startup (kill after {ms} ms)"),
            (op, Some(v)) => format!("{} {name} ({v} +1.5 s, kill after {ms} ms)", op.name()),
            (op, None) => format!("{} {name} (kill after {ms} ms)", op.name()),
        }
    }
}

/// What must hold once a point converged, besides the pods' states.
#[derive(Default)]
struct Owed {
    /// A delete under policy `always`: `<vm>:latest` must be a new snapshot (its id before).
    latest_before: Option<Option<String>>,
    /// A hibernate: `<vm>:hibernate` must be a new snapshot (its id before).
    hibernate_before: Option<Option<String>>,
}

struct Sweep<'a> {
    seed: u64,
    points: usize,
    tb: &'a Testbed,
    runner: Runner<'a>,
    pods: Api<Pod>,
    sim: Sim,
    reg: Registry,
    slots: Vec<Slot>,
    fig: Figures,
    /// When the last kill was, UTC, to find it in the journal's timeline.
    killed_at: String,
}

/// The wall clock as the journal's timeline prints it (UTC, `HH:MM:SS.mmm`).
fn clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000
    )
}

impl Sweep<'_> {
    /// Sets the operation going; the daemon is killed `delay` later.
    async fn trigger(&mut self, p: &Point, d: &mut daemon::Daemon) -> Result<Owed> {
        let mut owed = Owed::default();
        self.sim.run(&["sim", "fault", "clear"])?;
        if let Some(verb) = p.stretch {
            self.sim
                .run(&["sim", "fault", "delay", verb, "1500", "--times", "1"])?;
        }
        let slot = &mut self.slots[p.slot];
        let (name, vm) = (slot.name, slot.vm());
        let world = observe(&self.pods, &self.sim).await?;
        let id = || {
            world
                .pods
                .get(name)
                .and_then(|p| annotation(p, VM_ID))
                .context("a Ready pod without an id")
        };
        match p.op {
            Op::Create => {
                self.pods
                    .create(&PostParams::default(), &slot.manifest()?)
                    .await?;
                slot.want = Want::Ready;
            }
            Op::Delete => {
                if slot.policy == "always" && slot.want == Want::Ready {
                    owed.latest_before = Some(tag_id(&self.reg, &vm, "latest").await?);
                }
                self.pods.delete(name, &DeleteParams::default()).await?;
                slot.want = Want::Absent;
                slot.marker = None;
            }
            Op::Remove => {
                self.sim.run(&["vm", "rm", "--force", &id()?])?;
                slot.want = Want::ReadyOrGone;
            }
            Op::Crash => {
                self.sim.run(&["sim", "fault", "crash", &id()?])?;
                slot.want = Want::ReadyOrGone;
            }
            Op::Hibernate => {
                let marker = format!("seed-{}-point-{}", self.seed, p.n);
                let write = format!("echo {marker} > marker");
                self.sim
                    .run(&["vm", "exec", &id()?, "--", "sh", "-c", &write])?;
                owed.hibernate_before = Some(tag_id(&self.reg, &vm, "hibernate").await?);
                set_hibernate(&self.pods, name, true).await?;
                slot.want = Want::Hibernated;
                slot.marker = Some(marker);
            }
            Op::Wake => {
                set_hibernate(&self.pods, name, false).await?;
                slot.want = Want::Ready;
            }
            Op::Restart => {
                self.runner.kill(d).await?;
                *d = self.runner.start()?;
            }
        }
        Ok(owed)
    }

    /// Kills the daemon and notes how its journal ended.
    async fn kill(&mut self, p: &Point, d: &mut daemon::Daemon) -> Result<()> {
        self.runner.kill(d).await?;
        self.killed_at = clock();
        let tail = journal_tail(&self.runner.journal)?;
        if tail == Tail::Whole {
            return Ok(());
        }
        self.fig.torn_tails += 1;
        if self.fig.first_torn.is_none() {
            let copy = self.tb.run_dir().join("torn.journal");
            std::fs::copy(&self.runner.journal, &copy)?;
            self.fig.first_torn = Some(format!(
                "point {}: {tail:?}; replay --verify of the file as the kill left it: {}",
                p.n,
                replay_message(&copy)?
            ));
        }
        Ok(())
    }

    /// Waits for the restarted daemon to converge and records how it went; a point that never
    /// converges is repaired so that the sweep can go on.
    async fn judge(&mut self, p: &Point, d: &mut daemon::Daemon, log_from: u64) -> Result<()> {
        let head = format!(
            "kill point {}/{}: {}",
            p.n,
            self.points,
            p.describe(&self.slots)
        );
        let what = format!("{}, killed at {}", p.describe(&self.slots), self.killed_at);
        let since = Instant::now();
        let mut c = converge(&self.slots, &self.pods, &self.sim, d, log_from, since).await?;
        if let Some(late) = &c.at_goal {
            self.fig.count_vms(late);
        }
        if let Some(broke) = c.relapse.take() {
            self.fig.relapsed += 1;
            self.fig.count_vms(&broke);
            self.fig.fail(
                p.n,
                format!(
                    "{what}: converged in {:.1} s, then a second later: {}",
                    c.took.as_secs_f64(),
                    broke.summary()
                ),
            );
            c = converge(&self.slots, &self.pods, &self.sim, d, log_from, since).await?;
        }
        match (&c.stuck, &c.at_goal) {
            (None, None) => {
                self.fig.times.push(c.took);
                eprintln!("{head}: converged in {:.1} s", c.took.as_secs_f64());
            }
            (None, Some(late)) => {
                self.fig.times.push(c.took);
                self.fig.slow += 1;
                let took = c.took.as_secs_f64();
                eprintln!("{head}: converged in {took:.1} s (over 10 s)");
                let why = format!(
                    "{what}: converged only after {took:.1} s; at 10 s: {}",
                    late.summary()
                );
                self.fig.fail(p.n, why);
            }
            (Some(stuck), _) => {
                self.fig.stuck += 1;
                eprintln!("{head}: NOT converged after {:.0} s", c.took.as_secs_f64());
                let why = format!(
                    "{what}: not converged after {:.0} s: {}\n    daemon warnings since the restart:\n    {}",
                    c.took.as_secs_f64(),
                    stuck.summary(),
                    warnings(d, log_from).join("\n    ")
                );
                self.fig.fail(p.n, why);
                repair(&mut self.slots, &self.pods, &self.sim, &c.world).await?;
                let again = converge(
                    &self.slots,
                    &self.pods,
                    &self.sim,
                    d,
                    log_from,
                    Instant::now(),
                )
                .await?;
                if let Some(s) = again.stuck {
                    bail!("point {}: still stuck after a repair: {}", p.n, s.summary());
                }
            }
        }
        // A pod whose VM went away either ran on or was evicted: follow what happened.
        let w = observe(&self.pods, &self.sim).await?;
        for slot in self
            .slots
            .iter_mut()
            .filter(|s| s.want == Want::ReadyOrGone)
        {
            slot.want = match w.pods.contains_key(slot.name) {
                true => Want::Ready,
                false => Want::Absent,
            };
        }
        Ok(())
    }

    /// The snapshots: every hibernated pod's tag is in the registry (a new one after this
    /// point's hibernate), a woken guest holds the file written before its hibernate, and a
    /// delete under policy `always` pushed `<vm>:latest`.
    async fn check_snapshots(&mut self, p: &Point, owed: Owed) -> Result<()> {
        let what = format!("{}, killed at {}", p.describe(&self.slots), self.killed_at);
        let slot = &self.slots[p.slot];
        let (name, vm) = (slot.name, slot.vm());
        let mut lost = Vec::new();
        for s in self.slots.iter().filter(|s| s.want == Want::Hibernated) {
            let tag = tag_id(&self.reg, &s.vm(), "hibernate").await?;
            match tag {
                None => lost.push(format!(
                    "{what}: {}:hibernate is not in the registry",
                    s.vm()
                )),
                Some(id) if s.name == name && owed.hibernate_before == Some(Some(id.clone())) => {
                    lost.push(format!(
                        "{what}: {}:hibernate still holds the previous snapshot {id}",
                        s.vm()
                    ))
                }
                Some(_) => {}
            }
        }
        for why in lost {
            self.fig.lost_snapshots += 1;
            self.fig.fail(p.n, why);
        }
        if p.op == Op::Wake && self.slots[p.slot].want == Want::Ready {
            if let Some(marker) = self.slots[p.slot].marker.take() {
                let w = observe(&self.pods, &self.sim).await?;
                let id = w
                    .pods
                    .get(name)
                    .and_then(|p| annotation(p, VM_ID))
                    .context("a woken pod without an id")?;
                let got = self
                    .sim
                    .run(&["vm", "exec", &id, "--", "cat", "marker"])
                    .unwrap_or_else(|e| format!("<{e:#}>"));
                if got.trim() != marker {
                    self.fig.lost_markers += 1;
                    let why = format!(
                        "{what}: the woken guest's file holds {:?}, want {marker:?}",
                        got.trim()
                    );
                    self.fig.fail(p.n, why);
                }
            }
        }
        if let Some(before) = owed.latest_before {
            let now = tag_id(&self.reg, &vm, "latest").await?;
            if now.is_none() || now == before {
                self.fig.lost_delete_snapshots += 1;
                let why = format!(
                    "{what}: snapshot policy always, but no new {vm}:latest was pushed (before {before:?}, after {now:?})"
                );
                self.fig.fail(p.n, why);
            }
        }
        Ok(())
    }
}

/// The daemon's lines above INFO since `log_from`, at most 40.
fn warnings(d: &daemon::Daemon, log_from: u64) -> Vec<String> {
    let log = std::fs::read(d.proc.log_path()).unwrap_or_default();
    let since = log.get(log_from as usize..).unwrap_or_default();
    String::from_utf8_lossy(since)
        .lines()
        .filter(|l| !l.contains(" INFO "))
        .take(40)
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: 200 daemon restarts on the testbed (make crash-sweep)"]
async fn crash_sweep() -> Result<()> {
    let seed = seed();
    let points = points();
    eprintln!("crash sweep: seed {seed} (CRASH_SEED={seed} repeats it), {points} kill points");

    let tb = Testbed::start(TestbedOptions::control_plane().with_sim().with_registry()).await?;
    daemon::seed_clone_snapshot(&tb)?;
    let addr = tb.registry.as_ref().context("registry")?.addr.clone();
    let spool = tb.run_dir().join("test-spool");
    std::fs::create_dir_all(&spool)?;
    let journal_dir = tb.run_dir().join("journal");
    let mut sw = Sweep {
        seed,
        points,
        tb: &tb,
        runner: Runner {
            tb: &tb,
            opts: DaemonOptions {
                env: vec![
                    ("OCI_REGISTRY".into(), format!("{addr}/{PREFIX}")),
                    ("COCOON_SIM_EXEC".into(), "host".into()),
                    // Small files, all kept: the journal rotates during the sweep, and every
                    // file is replayed at the end.
                    ("VK_JOURNAL_MAX_BYTES".into(), "4Mi".into()),
                    ("VK_JOURNAL_FILES".into(), "1000".into()),
                ],
                ..DaemonOptions::default()
            },
            journal: journal_dir.join("events.journal"),
        },
        pods: Api::namespaced(tb.client()?, NS),
        sim: Sim::new(&tb)?,
        reg: Registry::from_config(&format!("{addr}/{PREFIX}"))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .with_spool_dir(spool),
        slots: workload(),
        fig: Figures::default(),
        killed_at: String::new(),
    };
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-sweep-{seed}"));
    let _ = std::fs::remove_dir_all(&kept);

    let mut d = sw.runner.start()?;
    for slot in &sw.slots {
        sw.pods
            .create(&PostParams::default(), &slot.manifest()?)
            .await?;
        // The main pod first: the fork pod needs its VM.
        if slot.kind == Kind::Main {
            daemon::wait_ready(&sw.pods, slot.name, Duration::from_secs(60))
                .await
                .with_context(|| d.proc.log_tail(60))?;
        }
    }
    let up = converge(&sw.slots, &sw.pods, &sw.sim, &mut d, 0, Instant::now()).await?;
    if let Some(p) = up.stuck {
        bail!(
            "the workload never came up: {}\n{}",
            p.summary(),
            d.proc.log_tail(80)
        );
    }
    eprintln!(
        "workload up: {} pods in {:.1} s",
        sw.slots.len(),
        up.took.as_secs_f64()
    );

    for n in 1..=points {
        let p = Point::choose(seed, n, &sw.slots);
        *sw.fig.per_op.entry(p.op.name()).or_default() += 1;
        let owed = sw.trigger(&p, &mut d).await?;
        tokio::time::sleep(p.delay).await;
        sw.kill(&p, &mut d).await?;
        let log_from = sw.runner.log_len(&d);
        d = sw.runner.start()?;
        sw.fig.points += 1;
        sw.judge(&p, &mut d, log_from).await?;
        sw.check_snapshots(&p, owed).await?;
    }

    // A killed daemon's cocoon calls run on in their own process groups; its event stream
    // ends only when it next has something to write. The live daemon has one.
    let streams = tb
        .processes()
        .iter()
        .filter(|(_, cmd)| cmd.contains("vm status --event"))
        .count();
    sw.fig.stray_streams = streams.saturating_sub(1);
    // The last daemon stops cleanly, so its journal ends where it stopped.
    let log = d.proc.log_path().to_path_buf();
    d.proc.stop();
    let replay = daemon::replay_verify(&sw.runner.journal);
    keep(&journal_dir, &log, &kept)?;
    sw.fig.print(seed, &replay, &kept);
    replay?;
    ensure!(
        sw.fig.failures.is_empty(),
        "{} failures in {} kill points (seed {seed})",
        sw.fig.failures.len(),
        sw.fig.points
    );
    Ok(())
}

/// After a point that never converged: take away what is stuck, so the sweep can go on. A
/// stuck pod is deleted with grace 0 and its VMs removed; a leaked VM is removed.
async fn repair(slots: &mut [Slot], pods: &Api<Pod>, sim: &Sim, w: &World) -> Result<()> {
    for slot in slots.iter_mut() {
        if check_slot(slot, w).is_ok() {
            continue;
        }
        if slot.kind == Kind::Main {
            bail!("the main pod is stuck: {:?}", check_slot(slot, w));
        }
        eprintln!("  repair: deleting {} and its VMs", slot.name);
        if w.pods.contains_key(slot.name) {
            let _ = pods
                .delete(slot.name, &DeleteParams::default().grace_period(0))
                .await;
        }
        for vm in w.vms.iter().filter(|v| v.name == slot.vm()) {
            let _ = sim.run(&["vm", "rm", "--force", &vm.id]);
        }
        slot.want = Want::Absent;
        slot.marker = None;
    }
    let held: BTreeSet<String> = w
        .pods
        .values()
        .filter_map(|p| annotation(p, VM_ID))
        .collect();
    for vm in w.vms.iter().filter(|v| !held.contains(&v.id)) {
        eprintln!("  repair: removing leaked VM {} ({})", vm.name, vm.id);
        let _ = sim.run(&["vm", "rm", "--force", &vm.id]);
    }
    Ok(())
}
