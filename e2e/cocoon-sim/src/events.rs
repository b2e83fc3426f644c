//! `vm status --event --format json` (CLI-7): an ADDED burst on connect, then a diff by ID on
//! (name, reconciled state, cpu, memory, static IPs, image) every 200 ms
//! (`COCOON_SIM_EVENT_POLL_MS`), and at once when a VM's record is removed, as cocoon's stream
//! is driven by file-system notifications (so a vanished VM is reported in the time the
//! daemon takes, not the poll's). Runs until SIGTERM/SIGINT (exit 0); `sim fault kill-streams`
//! makes it exit 1.

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
    let changed = watch_records(&store);
    let poll = Duration::from_millis(env.event_poll_ms.max(20));
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
        if wait_for_change(&changed, poll) {
            return Ok(());
        }
    }
}

/// Removals under `<root>/vms/`, as a channel that carries one unit per notification; the
/// watcher lives as long as the returned value.
fn watch_records(store: &Store) -> Changes {
    let dir = store.vms_dir();
    let _ = std::fs::create_dir_all(&dir);
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|ev| is_a_change(&ev.kind)) {
            let _ = tx.send(());
        }
    })
    .and_then(|mut w| {
        notify::Watcher::watch(&mut w, &dir, notify::RecursiveMode::Recursive)?;
        Ok(w)
    });
    match watcher {
        Ok(w) => Changes {
            rx,
            _watcher: Some(w),
        },
        Err(e) => {
            warn(
                "event stream",
                format!("cannot watch {}: {e}; polling only", dir.display()),
            );
            Changes { rx, _watcher: None }
        }
    }
}

/// A record removed: a VM gone is reported at once. Writes of a record are left to the poll,
/// as they always were, so a VM's passing states (`created` on its way to `running`, a crash
/// just before a state fault) are not reported one by one; opens and reads never wake it, or
/// the stream's own reads of the records would.
fn is_a_change(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    match kind {
        EventKind::Remove(_) => true,
        EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Access(_)
        | EventKind::Any
        | EventKind::Other => false,
    }
}

struct Changes {
    rx: std::sync::mpsc::Receiver<()>,
    _watcher: Option<notify::RecommendedWatcher>,
}

/// Waits until a record changes or `poll` has passed, in short slices so a signal ends the
/// stream promptly; true when the stream should end.
fn wait_for_change(changes: &Changes, poll: Duration) -> bool {
    const SLICE: Duration = Duration::from_millis(20);
    let mut left = poll;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return true;
        }
        match changes.rx.recv_timeout(SLICE.min(left)) {
            Ok(()) => {
                // One pass covers every change so far; a burst of writes is one diff.
                while changes.rx.try_recv().is_ok() {}
                return false;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(SLICE.min(left));
            }
        }
        left = left.saturating_sub(SLICE);
        if left.is_zero() {
            return false;
        }
    }
}
