//! The event stream (CLI-7): ADDED burst, MODIFIED on the tuple, DELETED with the
//! last seen record, exit 0 on SIGTERM, non-zero when killed by the fault.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

struct Stream {
    child: Child,
    lines: Receiver<String>,
}

impl Stream {
    fn open(sim: &Sim) -> Stream {
        let mut child = sim.spawn(&["vm", "status", "--event", "--format", "json"]);
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Stream { child, lines: rx }
    }

    /// Next event matching `pred`, skipping others; bounded.
    #[track_caller]
    fn next_where(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no event: {what}"));
            assert!(!line.contains("\n  "), "stream lines are compact");
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
            if pred(&v) {
                return v;
            }
        }
    }

    fn terminate(mut self) -> Option<i32> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap().code()
    }
}

fn is(ev: &'static str, name: &'static str) -> impl Fn(&Value) -> bool {
    move |v| v["event"] == ev && v["vm"]["config"]["name"] == name
}

#[test]
fn added_burst_then_modified_on_crash_then_deleted_with_last_record() {
    let sim = Sim::new();
    let a = sim.run_vm("ev-a", &[]);
    sim.run_vm("ev-b", &[]);
    let s = Stream::open(&sim);
    let added = s.next_where("ADDED ev-a", is("ADDED", "ev-a"));
    assert_eq!(added["vm"]["id"], a["id"]);
    assert_eq!(added["vm"]["state"], "running");
    s.next_where("ADDED ev-b", is("ADDED", "ev-b"));

    sim.run(&["sim", "fault", "crash", "ev-a"]).ok();
    let m = s.next_where("MODIFIED ev-a", is("MODIFIED", "ev-a"));
    assert_eq!(m["vm"]["state"], "stopped (stale)");
    assert!(
        m["vm"]["pid"].as_i64().unwrap() > 0,
        "stale record still carries the dead pid"
    );

    sim.run(&["vm", "start", "ev-a"]).ok();
    let back = s.next_where("MODIFIED ev-a running", is("MODIFIED", "ev-a"));
    assert_eq!(back["vm"]["state"], "running");

    sim.run(&["vm", "rm", "--force", "ev-b"]).ok();
    let d = s.next_where("DELETED ev-b", is("DELETED", "ev-b"));
    assert_eq!(
        d["vm"]["state"], "running",
        "DELETED carries the last seen record"
    );

    sim.run_vm("ev-c", &[]);
    s.next_where("ADDED ev-c", is("ADDED", "ev-c"));
    assert_eq!(s.terminate(), Some(0));
}

#[test]
fn vanish_and_state_faults_show_up_in_the_stream() {
    let sim = Sim::new();
    sim.run_vm("gone", &[]);
    sim.run_vm("err", &[]);
    let s = Stream::open(&sim);
    s.next_where("ADDED err", is("ADDED", "err"));
    sim.run(&["sim", "fault", "set-state", "err", "error"]).ok();
    let m = s.next_where("MODIFIED err", is("MODIFIED", "err"));
    assert_eq!(m["vm"]["state"], "error");
    assert_eq!(sim.inspect("err")["last_transition_reason"], "error");
    sim.run(&["sim", "fault", "vanish", "gone"]).ok();
    s.next_where("DELETED gone", is("DELETED", "gone"));
    sim.run(&["vm", "inspect", "gone"]).err("VM not found");
    assert_eq!(s.terminate(), Some(0));
}

#[test]
fn kill_streams_fault_ends_every_stream_non_zero() {
    let sim = Sim::new();
    sim.run_vm("k", &[]);
    let s1 = Stream::open(&sim);
    let s2 = Stream::open(&sim);
    s1.next_where("ADDED k", is("ADDED", "k"));
    s2.next_where("ADDED k", is("ADDED", "k"));
    sim.run(&["sim", "fault", "kill-streams"]).ok();
    for mut s in [s1, s2] {
        let st = s.child.wait().unwrap();
        assert_eq!(st.code(), Some(1));
    }
    let s3 = Stream::open(&sim);
    s3.next_where("ADDED after reconnect", is("ADDED", "k"));
    assert_eq!(s3.terminate(), Some(0));
}

#[test]
fn a_failed_list_pass_gives_spurious_deleted_then_added() {
    let sim = Sim::new();
    sim.run_vm("flaky", &[]);
    let s = Stream::open(&sim);
    s.next_where("ADDED", is("ADDED", "flaky"));
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm status",
        "--times",
        "1",
        "--message",
        "list: index busy",
    ])
    .ok();
    s.next_where("spurious DELETED", is("DELETED", "flaky"));
    s.next_where("re-ADDED", is("ADDED", "flaky"));
    assert_eq!(s.terminate(), Some(0));
}

/// A VM removed is reported at once, as cocoon's stream is driven by file-system
/// notifications: with the stream's poll set to ten minutes, `vm rm` and a vanished record
/// are still reported, which only a notification can have caused.
#[test]
fn a_removed_vm_is_reported_without_waiting_for_the_poll() {
    let sim = Sim::with_env(&[("COCOON_SIM_EVENT_POLL_MS", "600000")]);
    sim.run_vm("removed", &[]);
    sim.run_vm("vanished", &[]);
    let s = Stream::open(&sim);
    s.next_where("ADDED removed", is("ADDED", "removed"));
    s.next_where("ADDED vanished", is("ADDED", "vanished"));
    sim.run(&["vm", "rm", "--force", "removed"]).ok();
    s.next_where("DELETED removed", is("DELETED", "removed"));
    sim.run(&["sim", "fault", "vanish", "vanished"]).ok();
    s.next_where("DELETED vanished", is("DELETED", "vanished"));
    assert_eq!(s.terminate(), Some(0));
}
