//! `vm status --event --format json`, the stream the daemon watches: the simulator in tier S
//! and the real cocoon CLI (on the cloud-hypervisor stand-in) must print lines of the same
//! shape for a VM found at connect, one created, one whose hypervisor died, one restarted,
//! one stopped and ones removed.

mod differential_common;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use differential_common::{shape, Differences, Pair, Side};

/// One side's event stream, read on a thread. Lines that no wait has taken yet stay pending,
/// since two VMs' events of one poll pass come in either order.
struct Stream {
    child: Child,
    rx: mpsc::Receiver<Value>,
    pending: VecDeque<Value>,
    seen: Vec<String>,
}

impl Stream {
    fn start(side: &Side) -> Stream {
        let mut child = side.event_stream();
        let out = child.stdout.take().expect("a stdout pipe");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("an event line is JSON ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Stream {
            child,
            rx,
            pending: VecDeque::new(),
            seen: Vec::new(),
        }
    }

    /// The first pending or coming event that `pred` accepts, or `None` after 30 s.
    fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        if let Some(i) = self.pending.iter().position(&pred) {
            return self.pending.remove(i);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.rx.recv_timeout(left).ok()?;
            self.seen.push(format!(
                "{} {} {}",
                v["event"], v["vm"]["config"]["name"], v["vm"]["state"]
            ));
            if pred(&v) {
                return Some(v);
            }
            self.pending.push_back(v);
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn named(v: &Value, name: &str) -> bool {
    v["vm"]["config"]["name"] == name
}

/// A DELETED line carries the record as the stream last saw it: `running`, or, when a poll
/// fell inside `vm rm`, `stopped (stale)` (the hypervisor killed, the record still there) and
/// a zero pid (its PID file already gone). Which one is a race on either side, so only that
/// the state is one of the two and that there is a pid is compared.
fn last_seen(mut v: Value) -> Value {
    if v["event"] != "DELETED" {
        return v;
    }
    let state = &v["vm"]["state"];
    if *state == "running" || *state == "stopped (stale)" {
        v["vm"]["state"] = "running or stopped (stale)".into();
    }
    if v["vm"]["pid"].is_number() {
        v["vm"]["pid"] = "a pid, live or 0".into();
    }
    v
}

/// Waits on both streams for the event `pred` accepts and compares the two lines' shapes.
fn expect_alike(
    d: &mut Differences,
    streams: &mut [Stream; 2],
    what: &str,
    pred: impl Fn(&Value) -> bool,
) {
    let [sim, real] = streams;
    match (sim.until(&pred), real.until(&pred)) {
        (Some(s), Some(r)) => {
            let (s, r) = (shape(&last_seen(s)), shape(&last_seen(r)));
            if s != r {
                d.note(format!("event {what}\n  simulator {s}\n  real      {r}"));
            }
        }
        (s, r) => d.note(format!(
            "event {what}: simulator {} (seen {:?}), real {} (seen {:?})",
            if s.is_some() {
                "printed it"
            } else {
                "never printed it"
            },
            sim.seen,
            if r.is_some() {
                "printed it"
            } else {
                "never printed it"
            },
            real.seen
        )),
    }
}

fn pid_of(side: &Side, name: &str) -> i32 {
    let inspect = side.run(&["vm", "inspect", name]).ok("vm inspect");
    let v = inspect.json().expect("vm inspect prints JSON");
    let pid = v["pid"].as_i64().expect("a pid");
    assert!(pid > 0, "{} {name} runs: {v}", side.label);
    pid as i32
}

#[test]
fn event_lines_have_the_same_shape() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let mut d = Differences::default();
    pair.import_guest_image("guest");
    let run = |name: &str| {
        let args = [
            "vm", "run", "--name", name, "--nics", "0", "--cpu", "1", "--memory", "512M", "guest",
        ];
        let (s, r) = pair.both(&args);
        s.ok("simulator vm run");
        r.ok("real vm run");
    };
    run("e1");

    let mut streams = [Stream::start(&pair.sim), Stream::start(&pair.real)];
    expect_alike(&mut d, &mut streams, "ADDED at connect", |v| {
        v["event"] == "ADDED" && named(v, "e1")
    });

    // A VM created while the stream runs is first ADDED; whether the poll that saw it caught
    // it `creating`, `created` or already `running` is a race (the record's shape follows the
    // state, and the running shape is compared above), so the first line is compared by kind
    // and state class, then each side must report it running.
    run("e2");
    for (side, stream) in ["simulator", "real"].iter().zip(streams.iter_mut()) {
        let first = stream.until(|v| named(v, "e2"));
        let state = first.as_ref().map(|v| v["vm"]["state"].clone());
        let added = first.as_ref().is_some_and(|v| v["event"] == "ADDED")
            && state
                .as_ref()
                .is_some_and(|s| *s == "creating" || *s == "created" || *s == "running");
        if !added {
            d.note(format!(
                "{side}: e2's first line is not ADDED while starting: {first:?}"
            ));
        }
        if state != Some("running".into())
            && stream
                .until(|v| named(v, "e2") && v["vm"]["state"] == "running")
                .is_none()
        {
            d.note(format!(
                "{side}: e2 never reported running (seen {:?})",
                stream.seen
            ));
        }
    }

    for side in [&pair.sim, &pair.real] {
        // SAFETY: kill(2) on a pid the side's own inspect reported as its VM's process.
        unsafe { libc::kill(pid_of(side, "e1"), libc::SIGKILL) };
    }
    expect_alike(
        &mut d,
        &mut streams,
        "for a VM whose hypervisor died",
        |v| named(v, "e1") && v["vm"]["state"] != "running",
    );

    // inspect reconciles a dead hypervisor to `stopped (stale)`; list shows the stored state.
    d.both(&pair, &["vm", "inspect", "e1"]);
    d.both(&pair, &["vm", "list", "-o", "json"]);

    d.both(&pair, &["vm", "start", "e1"]);
    expect_alike(&mut d, &mut streams, "for a VM started again", |v| {
        named(v, "e1") && v["vm"]["state"] == "running"
    });

    d.both(&pair, &["vm", "stop", "e1"]);
    expect_alike(&mut d, &mut streams, "for a VM stopped", |v| {
        named(v, "e1") && v["vm"]["state"] == "stopped"
    });

    d.both(&pair, &["vm", "rm", "--force", "e1", "e2"]);
    for name in ["e1", "e2"] {
        expect_alike(&mut d, &mut streams, &format!("DELETED {name}"), |v| {
            v["event"] == "DELETED" && named(v, name)
        });
    }
    d.assert_none();
}
