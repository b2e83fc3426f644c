//! Managed macOS guests on the cocoon-macos backend (C14, R10, D2, B1). The bring-up pulls
//! the image and runs the guest with a node-unique VNC display; a guest already under the
//! pod's name is adopted or started, never run a second time on the same overlay. cocoon's
//! event stream and `vm list` never show these guests, so the sweep lists them itself (R11)
//! and restarts a dead one in place, at most once a minute.

use std::collections::BTreeSet;

use crate::action::{Action, Histogram, Level};
use crate::cocoon::CocoonCmd;
use crate::event::CocoonOk;
use crate::labels::LifecycleReason;
use crate::model::macos::{Inventory, MacosStep, Then, RESTART_INTERVAL_MS, VNC_DISPLAYS};
use crate::phase::{Call, CreateStep, Creating, EvictReason, IpWait, Object, Phase, Purpose};
use crate::phase::{VmStep, VmTask};
use crate::pod::PodKey;
use crate::provider::{self, Op, Outcome};
use crate::spec::{Os, VmSpec};
use crate::state::{CocoonOwner, MacosSweep, PodEntry, State, Tracked, VmOwner};
use crate::vm::{CocoonError, CocoonErrorKind, VmRecord};
use crate::{create, delete, evict, lifecycle, outcome, probe, tracking};

/// A managed `os=macos` pod: its VM is cocoon-macos's (C3 path 1).
pub(crate) fn is_macos(e: &PodEntry) -> bool {
    e.spec
        .as_ref()
        .is_ok_and(|sp| sp.managed && sp.os == Os::Macos)
}

/// A guest is alive only when it says `running` and has a process (R10).
fn alive(vm: &VmRecord) -> bool {
    vm.is_running() && vm.pid > 0
}

/// C14: a fresh bring-up: lifecycle `creating`, a VNC display, then `image pull`.
pub(crate) fn begin(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    if let Some(msg) = crate::trust::name_taken(s, key, &spec.vm_name) {
        return create::fail(s, key, msg);
    }
    if spec.image.is_empty() {
        let msg = "a macOS guest needs cocoonset.cocoonstack.io/image".to_string();
        return create::fail_permanently(s, key, msg);
    }
    let (attempts, last_failure) = e.phase.prior_failure();
    lifecycle::attempt(s, key);
    let vnc = match allocate(s, key) {
        Ok(vnc) => vnc,
        Err(msg) => return create::fail(s, key, msg),
    };
    let cmd = CocoonCmd::MacosImagePull {
        image: spec.image.clone(),
    };
    let op = s.run_cocoon(Owner::pod(key), Some(key.clone()), cmd);
    let since = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        e.phase = Phase::Creating(Creating::first(
            CreateStep::Macos {
                macos: MacosStep::Pull { vnc },
            },
            op,
            since,
            attempts,
            last_failure,
            Purpose::Fresh,
        ));
    }
}

struct Owner;

impl Owner {
    fn pod(key: &PodKey) -> CocoonOwner {
        CocoonOwner::Pod { key: key.clone() }
    }
}

/// C14: the lowest VNC display no other macOS pod holds (its guest's, or the one its
/// bring-up was given), or `None` when VNC is off (no password).
fn allocate(s: &State, key: &PodKey) -> Result<Option<u16>, String> {
    if !s.config.macos_vnc {
        return Ok(None);
    }
    let held = held_displays(s, key);
    match (0..VNC_DISPLAYS).find(|d| !held.contains(d)) {
        Some(d) => Ok(Some(d)),
        None => Err(format!(
            "no free VNC port: 5900–5999 are all held by other macOS pods on node {}",
            s.config.node_name
        )),
    }
}

/// The displays of every macOS pod but `except`, walked in key order.
fn held_displays(s: &State, except: &PodKey) -> BTreeSet<u16> {
    let mut held: BTreeSet<u16> = s
        .pods
        .sorted()
        .into_iter()
        .filter(|(k, e)| *k != except && is_macos(e))
        .filter_map(|(_, e)| display_of(e))
        .collect();
    held.extend(s.macos_foreign.iter().copied());
    held
}

/// The displays of listed guests that no macOS pod names: their ports are taken too.
pub(crate) fn note_foreign(s: &mut State, vms: &[VmRecord]) {
    let names: BTreeSet<&str> = s
        .pods
        .sorted()
        .into_iter()
        .filter(|(_, e)| is_macos(e))
        .filter_map(|(_, e)| e.vm_name())
        .collect();
    let foreign = vms
        .iter()
        .filter(|v| !names.contains(v.name.as_str()))
        .filter_map(|v| v.vnc)
        .collect();
    s.macos_foreign = foreign;
}

fn display_of(e: &PodEntry) -> Option<u16> {
    match &e.phase {
        Phase::Creating(Creating {
            step: CreateStep::Macos { macos },
            ..
        }) => macos.vnc(),
        Phase::Creating(_)
        | Phase::Waiting
        | Phase::Failed(_)
        | Phase::Running(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => e.vm().and_then(|v| v.record.vnc),
    }
}

/// Sends the next step's call.
fn next(s: &mut State, key: &PodKey, step: MacosStep, cmd: CocoonCmd) {
    let op = s.run_cocoon(Owner::pod(key), Some(key.clone()), cmd);
    if let Some(Phase::Creating(c)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        c.step = CreateStep::Macos { macos: step };
        c.op = Some(op);
    }
}

fn inspect(spec: &VmSpec) -> CocoonCmd {
    CocoonCmd::MacosInspect {
        name: spec.vm_name.clone(),
    }
}

/// A record for a guest known only by its name (cocoon-macos addresses guests by name).
fn named(name: &str) -> VmRecord {
    VmRecord {
        id: name.to_string(),
        name: name.to_string(),
        state: "unknown".into(),
        ..VmRecord::default()
    }
}

fn tracked(record: VmRecord) -> Tracked {
    Tracked {
        record,
        ip: None,
        owner: VmOwner::Vk,
    }
}

/// The outcome of a macOS bring-up step (routed here by `create::advance`).
pub(crate) fn step_done(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    step: MacosStep,
    cancel: Option<Object>,
    result: Result<CocoonOk, CocoonError>,
) {
    if let Some(object) = cancel {
        return cancelled(s, key, spec, step, object, result);
    }
    let name = spec.vm_name.clone();
    match (step, result) {
        (MacosStep::Pull { vnc }, Ok(CocoonOk::Done)) => {
            let cmd = CocoonCmd::MacosRun {
                name,
                image: spec.image.clone(),
                cpus: spec.vcpus.and_then(|c| i64::try_from(c).ok()),
                memory_mib: spec
                    .memory_bytes
                    .and_then(|m| i64::try_from(m >> 20).ok())
                    .filter(|m| *m > 0),
                storage: spec.storage_bytes.and_then(|b| i64::try_from(b).ok()),
                vnc,
            };
            next(s, key, MacosStep::Run { vnc }, cmd)
        }
        (MacosStep::Run { vnc }, Ok(CocoonOk::Done)) => {
            let then = Then::Boot;
            next(s, key, MacosStep::Inspect { vnc, then }, inspect(spec))
        }
        // C14: the name is taken: that guest is this pod's; it is never run a second time.
        (
            MacosStep::Run { vnc },
            Err(CocoonError {
                kind: CocoonErrorKind::VmNameTaken,
                ..
            }),
        ) => {
            let then = Then::Adopt;
            next(s, key, MacosStep::Inspect { vnc, then }, inspect(spec))
        }
        (MacosStep::Start { vnc, then }, Ok(CocoonOk::Done)) => {
            next(s, key, MacosStep::Inspect { vnc, then }, inspect(spec))
        }
        (MacosStep::Inspect { then, .. }, Ok(CocoonOk::Vm { vm })) if alive(&vm) => match then {
            Then::Boot => booted(s, key, vm),
            Then::Adopt => create::adopt(s, key, vm, LifecycleReason::Adopted),
            Then::Resume => create::resume(s, key, vm),
        },
        // A dead guest under the pod's name is started in place, once.
        (
            MacosStep::Inspect {
                vnc,
                then: Then::Adopt,
            },
            Ok(CocoonOk::Vm { vm }),
        ) => {
            log_start(s, key, &vm);
            let then = Then::Boot;
            let cmd = CocoonCmd::MacosStart { name, vnc };
            next(s, key, MacosStep::Start { vnc, then }, cmd)
        }
        (
            MacosStep::Inspect {
                then: Then::Boot | Then::Resume,
                ..
            },
            Ok(CocoonOk::Vm { vm }),
        ) => {
            let msg = format!(
                "cocoon-macos: guest {name} is {:?} (pid {}) after it was started",
                vm.state, vm.pid
            );
            create::fail(s, key, msg)
        }
        (step, Err(err)) => {
            let msg = format!("cocoon-macos {} {name}: {}", verb(&step), err.message);
            create::fail(s, key, msg)
        }
        (step, Ok(other)) => {
            let verb = verb(&step);
            outcome::unexpected(
                s,
                &format!("pod {key}: cocoon-macos {verb} {name} answered {other:?}"),
            );
            create::fail(
                s,
                key,
                format!("cocoon-macos {verb} {name}: unexpected answer"),
            )
        }
    }
}

fn verb(step: &MacosStep) -> &'static str {
    match step {
        MacosStep::Pull { .. } => "image pull",
        MacosStep::Run { .. } => "vm run",
        MacosStep::Start { .. } => "vm start",
        MacosStep::Inspect { .. } => "vm inspect",
    }
}

fn log_start(s: &mut State, key: &PodKey, vm: &VmRecord) {
    s.emit(Action::Log {
        level: Level::Info,
        message: format!(
            "pod {key}: macOS guest {} is {:?} (pid {}); starting it in place",
            vm.name, vm.state, vm.pid
        ),
    });
}

/// A delete came while the step was out: a step that may have left a guest hands it to the
/// delete, which removes it (D2); otherwise the delete is done.
fn cancelled(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    step: MacosStep,
    object: Object,
    result: Result<CocoonOk, CocoonError>,
) {
    let record = match (step, result) {
        (MacosStep::Pull { .. }, _) => return delete::without_vm(s, key, object),
        // T1: a guest another pod holds under this name is not this pod's to remove.
        (_, _) if crate::trust::name_holder(s, key, &spec.vm_name).is_some() => {
            return delete::without_vm(s, key, object)
        }
        (_, Ok(CocoonOk::Vm { vm })) => vm,
        (MacosStep::Run { .. } | MacosStep::Start { .. } | MacosStep::Inspect { .. }, _) => {
            named(&spec.vm_name)
        }
    };
    delete::with_new_vm(s, key, tracked(record), object)
}

/// The guest this bring-up launched runs: track it, probe it (R10), and wait for its DHCP
/// lease before lifecycle `ready`.
fn booted(s: &mut State, key: &PodKey, vm: VmRecord) {
    let now = s.now;
    let Some(Phase::Creating(c)) = s.pod(key).map(|e| &e.phase) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: booted found it not Creating"));
    };
    let since = c.since;
    s.emit(Action::Observe {
        histogram: Histogram::VmBootDuration {
            mode: "run".into(),
            backend: "cocoon-macos".into(),
        },
        millis: (now - since).max(0) as u64,
    });
    if let Some(e) = s.pods.get_mut(key) {
        e.started_at = Some(now);
    }
    create::enter_running(s, key, tracked(vm));
    probe::start(s, key);
    provider::outcome(s, key, Op::Create, Outcome::Ok, LifecycleReason::None);
    crate::guest::lease(s, key, IpWait::Run);
}

/// B1: whether the startup reconcile has what it needs of cocoon-macos. When some pod is a
/// managed macOS one, its guests are listed first (once); startup waits for that list.
pub(crate) fn inventory_ready(s: &mut State) -> bool {
    match s.macos_inventory {
        Inventory::Listed(_) => return true,
        Inventory::Listing => return false,
        Inventory::None => {}
    }
    let needed = s
        .pods
        .sorted()
        .into_iter()
        .any(|(_, e)| is_macos(e) && !e.pod.is_terminal());
    if !needed {
        return true;
    }
    s.macos_inventory = Inventory::Listing;
    s.run_cocoon(CocoonOwner::MacosInventory, None, CocoonCmd::MacosList);
    false
}

/// The startup listing came back: startup goes on, or stops when it failed (B1).
pub(crate) fn listed(s: &mut State, result: Result<CocoonOk, CocoonError>) {
    match result {
        Ok(CocoonOk::Vms { vms }) => {
            note_foreign(s, &vms);
            s.macos_inventory = Inventory::Listed(vms);
            crate::startup::try_start(s);
        }
        Ok(other) => {
            s.emit(Action::Abort {
                message: format!(
                    "cocoon-macos vm list answered {other:?}; not registering the node"
                ),
            });
        }
        Err(err) => s.emit(Action::Abort {
            message: format!(
                "cocoon-macos vm list failed at startup, not registering the node: {}",
                err.message
            ),
        }),
    }
}

/// The startup listing, taken by the startup reconcile (it is used once).
pub(crate) fn take_inventory(s: &mut State) -> Vec<VmRecord> {
    match std::mem::take(&mut s.macos_inventory) {
        Inventory::Listed(vms) => vms,
        Inventory::None | Inventory::Listing => Vec::new(),
    }
}

/// B1: a macOS pod at startup. Its listed guest is adopted (a dead one started in place,
/// never run again); without one it is brought up; a pod being deleted removes it (D2).
pub(crate) fn startup_pod(s: &mut State, key: &PodKey, vms: &[VmRecord]) {
    let Some(e) = s.pod(key) else { return };
    let Ok(spec) = e.spec.clone() else { return };
    let deleting = e.pod.deletion_timestamp.is_some();
    let found = vms.iter().find(|v| v.name == spec.vm_name).cloned();
    // T11: a guest goes to a pod only as its holder record allows, as any VM does.
    let found = match found.map(|vm| {
        let may = crate::trust::may_take(s, key, &vm, crate::trust::Moment::Startup);
        (vm, may)
    }) {
        Some((vm, Ok(()))) => Some(vm),
        Some((_, Err(msg))) if !deleting => return create::fail(s, key, msg),
        Some((_, Err(_))) | None => None,
    };
    match (found, deleting) {
        (Some(vm), true) => delete::resume(s, key, vm),
        (None, _) => crate::intake::intake(s, key),
        (Some(vm), false) if alive(&vm) => create::resume(s, key, vm),
        (Some(vm), false) => {
            // Its own display when it is still free, else the lowest free one.
            let vnc = match vm.vnc.filter(|d| !held_displays(s, key).contains(d)) {
                Some(d) if s.config.macos_vnc => Some(d),
                Some(_) | None => match allocate(s, key) {
                    Ok(vnc) => vnc,
                    Err(msg) => return create::fail(s, key, msg),
                },
            };
            log_start(s, key, &vm);
            s.restarts.insert(vm.id.clone(), s.now);
            let cmd = CocoonCmd::MacosStart {
                name: spec.vm_name.clone(),
                vnc,
            };
            let op = s.run_cocoon(Owner::pod(key), Some(key.clone()), cmd);
            let since = s.now;
            if let Some(e) = s.pods.get_mut(key) {
                let step = CreateStep::Macos {
                    macos: MacosStep::Start {
                        vnc,
                        then: Then::Resume,
                    },
                };
                e.phase =
                    Phase::Creating(Creating::first(step, op, since, 0, None, Purpose::Fresh));
            }
        }
    }
}

/// D2: a macOS pod without a tracked guest that is deleted still removes the guest of its
/// name, should a failed bring-up have left one (unless another pod holds that name).
pub(crate) fn leftover(s: &State, key: &PodKey) -> Option<Tracked> {
    let e = s.pod(key)?;
    if !is_macos(e) || !s.started() {
        return None;
    }
    let name = e.vm_name()?;
    if crate::trust::name_holder(s, key, name).is_some() {
        return None;
    }
    // T11: nor a guest recorded for a pod of another namespace.
    let uid = e.pod.uid.as_str();
    let record = s.holders.get(name).map(|h| &h.holder);
    if crate::holders::grant(record, (key, uid), s.tenant(key)) == crate::holders::Grant::Refused {
        return None;
    }
    Some(tracked(named(name)))
}

/// R11: the sweep also lists the cocoon-macos guests, when vk tracks any.
pub(crate) fn sweep(s: &mut State) {
    match s.sweep.macos {
        MacosSweep::Out => return,
        MacosSweep::Idle => {}
    }
    let tracking = s
        .pods
        .sorted()
        .into_iter()
        .any(|(_, e)| is_macos(e) && matches!(e.phase, Phase::Running(_)));
    if !tracking {
        return;
    }
    s.sweep.macos = MacosSweep::Out;
    s.run_cocoon(CocoonOwner::MacosSweep, None, CocoonCmd::MacosList);
}

/// The sweep's listing: every idle Running macOS pod is compared with its guest. A live
/// guest's record is taken (pid, MAC, VNC display: the `vnc-port` annotation follows it); a
/// dead one is started in place, rate-limited (R10); a missing one evicts the pod.
pub(crate) fn swept(s: &mut State, result: Result<CocoonOk, CocoonError>) {
    s.sweep.macos = MacosSweep::Idle;
    let vms = match result {
        Ok(CocoonOk::Vms { vms }) => vms,
        Ok(other) => {
            let what = format!("sweep: cocoon-macos vm list answered {other:?}");
            return outcome::unexpected(s, &what);
        }
        Err(err) => {
            return s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "sweep: cocoon-macos vm list failed, trying again later: {}",
                    err.message
                ),
            })
        }
    };
    note_foreign(s, &vms);
    let idle: Vec<(PodKey, VmRecord)> = s
        .pods
        .sorted()
        .into_iter()
        .filter(|(_, e)| is_macos(e))
        .filter_map(|(k, e)| match &e.phase {
            Phase::Running(r) if r.task.is_none() => Some((k.clone(), r.vm.record.clone())),
            Phase::Running(_)
            | Phase::Waiting
            | Phase::Failed(_)
            | Phase::Creating(_)
            | Phase::Hibernating(_)
            | Phase::Hibernated
            | Phase::Evicting(_)
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => None,
        })
        .collect();
    for (key, had) in idle {
        s.touched.insert(&key);
        match vms.iter().find(|v| v.name == had.name) {
            None => evict::begin(s, &key, EvictReason::VmGone, "macOS guest no longer exists"),
            Some(vm) => {
                if *vm != had {
                    refresh(s, &key, vm.clone());
                }
                if !alive(vm) {
                    restart(s, &key, vm);
                }
            }
        }
    }
}

/// The guest's fresher record replaces the tracked one; the IP stays until re-resolved.
fn refresh(s: &mut State, key: &PodKey, vm: VmRecord) {
    let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: refresh found it not Running"));
    };
    let old = r.vm.clone();
    r.vm.record = vm;
    tracking::unindex(s, key, &old);
    tracking::indexed(s, key);
}

/// R10: a dead guest is started in place, at most once per `RESTART_INTERVAL_MS`.
fn restart(s: &mut State, key: &PodKey, vm: &VmRecord) {
    let now = s.now;
    if let Some(at) = s.restarts.get(&vm.id) {
        if now - at < RESTART_INTERVAL_MS {
            return s.emit(Action::Log {
                level: Level::Warn,
                message: format!(
                    "pod {key}: macOS guest {} is {:?}; last restarted {} s ago, waiting",
                    vm.name,
                    vm.state,
                    (now - at) / 1000
                ),
            });
        }
    }
    s.restarts.insert(vm.id.clone(), now);
    log_start(s, key, vm);
    let cmd = CocoonCmd::MacosStart {
        name: vm.name.clone(),
        vnc: vm.vnc,
    };
    let op = s.run_cocoon(Owner::pod(key), Some(key.clone()), cmd);
    if let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        r.task = Some(VmTask {
            step: VmStep::MacosStart,
            call: Call::Out(op),
            hint_deferred: false,
        });
    }
}

/// The outcome of an in-place restart: the next sweep reads the guest's new record.
pub(crate) fn restarted(s: &mut State, key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    match result {
        Ok(CocoonOk::Done) => {}
        Ok(other) => outcome::unexpected(
            s,
            &format!("pod {key}: cocoon-macos vm start answered {other:?}"),
        ),
        Err(CocoonError {
            kind: CocoonErrorKind::VmNotFound,
            ..
        }) => evict::begin(s, key, EvictReason::VmGone, "macOS guest no longer exists"),
        Err(err) => s.emit(Action::Log {
            level: Level::Warn,
            message: format!(
                "pod {key}: cocoon-macos vm start failed, the sweep tries again: {}",
                err.message
            ),
        }),
    }
}
