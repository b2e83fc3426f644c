//! Verb faults: injected failures, garbage output, delays.

mod common;

use common::*;

#[test]
fn fail_next_n_calls_with_given_text() {
    let sim = Sim::new();
    sim.run_vm("f", &[]);
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm inspect",
        "--times",
        "2",
        "--message",
        "dial agent: retry shortly",
    ])
    .ok();
    sim.run(&["vm", "inspect", "f"])
        .err("dial agent: retry shortly");
    sim.run(&["vm", "inspect", "f"])
        .err("dial agent: retry shortly");
    sim.run(&["vm", "inspect", "f"]).ok();
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm.rm",
        "--message",
        "vm(s) deleted but network cleanup failed: x",
    ])
    .ok();
    sim.run(&["vm", "rm", "--force", "f"])
        .err("network cleanup failed");
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm reconcile-stale-create",
        "--message",
        "unknown command \"reconcile-stale-create\" for \"cocoon vm\"",
    ])
    .ok();
    sim.run(&["vm", "reconcile-stale-create", "f", "-o", "json"])
        .err("unknown command");
}

#[test]
fn garbage_json_once_then_normal() {
    let sim = Sim::new();
    sim.run_vm("g", &[]);
    sim.run(&["sim", "fault", "garbage", "vm list"]).ok();
    let r = sim.run(&["vm", "list", "-o", "json"]).ok();
    assert!(serde_json::from_str::<serde_json::Value>(&r.stdout).is_err());
    assert!(sim
        .run(&["vm", "list", "-o", "json"])
        .ok()
        .json()
        .is_array());
    sim.run(&["sim", "fault", "garbage", "vm run"]).ok();
    let r = sim
        .run(&["vm", "run", "--output", "json", "--name", "g2", IMAGE])
        .ok();
    assert!(serde_json::from_str::<serde_json::Value>(&r.stdout).is_err());
    assert_eq!(
        sim.inspect("g2")["state"],
        "running",
        "the VM exists even though output was garbage"
    );
}

#[test]
fn delay_is_consumed_and_the_verb_still_succeeds() {
    let sim = Sim::new();
    sim.run_vm("d", &[]);
    sim.run(&["sim", "fault", "delay", "vm inspect", "50", "--times", "1"])
        .ok();
    sim.run(&["vm", "inspect", "d"]).ok();
    let f = sim.run(&["sim", "fault", "list"]).ok().json();
    assert!(
        f["verbs"].get("vm inspect").is_none(),
        "one-shot delay consumed"
    );
}

#[test]
fn set_state_stopped_reads_as_not_running() {
    let sim = Sim::new();
    sim.run_vm("s", &[]);
    sim.run(&["sim", "fault", "set-state", "s", "stopped"]).ok();
    let v = sim.inspect("s");
    assert_eq!(v["state"], "stopped");
    assert_eq!(v["pid"], 0);
    assert_eq!(v["last_transition_reason"], "unexpected-exit");
    sim.run(&["vm", "start", "s"]).ok();
    assert_eq!(sim.inspect("s")["state"], "running");
}
