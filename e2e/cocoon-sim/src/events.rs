//! `vm status --event --format json` (CLI-7): an ADDED burst on connect, then a diff every
//! 200 ms by ID on (name, reconciled state, cpu, memory, static IPs, image). Runs until
//! SIGTERM/SIGINT (exit 0); `sim fault kill-streams` makes it exit 1.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::Env;
use crate::error::{fail, Result};
use crate::faults;
use crate::guest::AliveCache;
use crate::model::{StoredVm, VmOut};
use crate::output::{compact, warn};
use crate::store::{RecordCache, Store};
use crate::vm::reconciled_state_with;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}

#[derive(PartialEq, Clone)]
struct Tuple {
    name: String,
    state: String,
    cpu: i64,
    memory: i64,
    ips: String,
    image: String,
}

fn tuple(vm: &StoredVm, state: &str) -> Tuple {
    let ips: Vec<&str> = vm
        .network_configs
        .iter()
        .filter_map(|n| n.network.as_ref().map(|s| s.ip.as_str()))
        .filter(|ip| !ip.is_empty())
        .collect();
    Tuple {
        name: vm.config.name.clone(),
        state: state.to_string(),
        cpu: vm.config.cpu,
        memory: vm.config.memory,
        ips: ips.join(","),
        image: vm.config.image.clone(),
    }
}

#[derive(Serialize)]
struct Event<'a> {
    event: &'a str,
    vm: &'a VmOut,
}

fn matches(vm: &StoredVm, filters: &[String]) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| {
            vm.id == *f || vm.config.name == *f || (f.len() >= 3 && vm.id.starts_with(f.as_str()))
        })
}

/// A failed list counts as empty, as cocoon's listAndFilter does: spurious DELETEDs follow.
fn list(
    env: &Env,
    store: &Store,
    cache: &mut RecordCache,
    filters: &[String],
) -> (Vec<StoredVm>, bool) {
    let fx = match faults::on_verb(env, "vm status") {
        Ok(fx) => fx,
        Err(e) => {
            warn("cmd.vm.listAndFilter", format!("list: {e}"));
            return (Vec::new(), false);
        }
    };
    match store.vms_cached(cache) {
        Ok(mut v) => {
            v.retain(|vm| matches(vm, filters));
            v.sort_by_key(|vm| vm.created_ns);
            (v, fx.garbage)
        }
        Err(e) => {
            warn("cmd.vm.listAndFilter", format!("list: {e}"));
            (Vec::new(), fx.garbage)
        }
    }
}

type Stamp = (Option<crate::store::FileKey>, String);

fn line(json: bool, event: &str, vm: &VmOut) -> Result<String> {
    if json {
        return compact(&Event { event, vm });
    }
    Ok(format!(
        "{event}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        vm.id, vm.config.name, vm.state, vm.config.cpu, vm.config.memory, vm.config.image
    ))
}

pub fn status(
    env: &Env,
    event: bool,
    format: Option<&str>,
    filters: &[String],
    _interval: i64,
) -> Result<()> {
    if !event {
        return fail("cocoon-sim: only the event form `vm status --event` is simulated");
    }
    let json = format == Some("json");
    install_signal_handlers();
    let store = Store::new(&env.root);
    let generation = faults::read(env).stream_generation;
    let mut prev: BTreeMap<String, (Tuple, VmOut, Stamp)> = BTreeMap::new();
    let mut cache = RecordCache::default();
    let mut alive = AliveCache::default();
    let mut out = std::io::stdout();
    if !json {
        let _ = writeln!(out, "EVENT\tID\tNAME\tSTATE\tCPU\tMEMORY\tIMAGE");
    }
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        if !env.root.is_dir() {
            return fail("event stream: state dir gone");
        }
        if faults::read(env).stream_generation != generation {
            return fail("event stream killed (sim fault kill-streams)");
        }
        let (vms, garbage) = list(env, &store, &mut cache, filters);
        let mut text = String::new();
        if garbage {
            text.push_str(faults::GARBAGE);
        }
        let mut curr = BTreeMap::new();
        for vm in vms {
            let state = reconciled_state_with(&vm, |pid, id| alive.is_alive(pid, id));
            let t = tuple(&vm, &state);
            // The same record file in the same state prints the same document: reuse it.
            let stamp = (cache.key(&vm.id), state);
            let before = prev.remove(&vm.id);
            let o = match &before {
                Some((_, o, s)) if *s == stamp => o.clone(),
                _ => vm.to_out(&stamp.1),
            };
            match &before {
                None => text.push_str(&line(json, "ADDED", &o)?),
                Some((old, _, _)) if *old != t => text.push_str(&line(json, "MODIFIED", &o)?),
                _ => {}
            }
            curr.insert(vm.id, (t, o, stamp));
        }
        for (_, last, _) in prev.values() {
            text.push_str(&line(json, "DELETED", last)?);
        }
        prev = curr;
        if !text.is_empty() && (out.write_all(text.as_bytes()).is_err() || out.flush().is_err()) {
            // Reader went away: nothing left to report to.
            return Ok(());
        }
        for _ in 0..10 {
            if STOP.load(Ordering::SeqCst) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
