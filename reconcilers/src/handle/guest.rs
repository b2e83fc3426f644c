//! The guest steps between a running VM and lifecycle `ready` (C13, C15, C16). A clone is a
//! copy of another machine: until it is fixed up it holds its source's hostname, MACs and
//! static addresses, so `ready` waits for the fix-up, then for a Windows guest's static
//! addresses over SAC, then for the lease. Each step's failure names its cause.

use crate::action::{
    Action, CountHistogram, Counter, EventSource, EventType, Level, RegistryCall, SacNic, Timer,
};
use crate::cocoon::CocoonCmd;
use crate::cocoon_caps::{self, Verb};
use crate::entry::FixupEnd;
use crate::event::{CocoonOk, RegistryError, RegistryOk, SacError, SacStage};
use crate::fixup;
use crate::keys;
use crate::labels::{IpWaitResult, Outcome, PostCloneKind};
use crate::phase::{Call, Fixup, FixupKind, IpWait, Phase, Running, Settle};
use crate::pod::PodKey;
use crate::spec::{Backend, Os, VmSpec};
use crate::state::{CocoonOwner, RegistryOwner, State};
use crate::time::Millis;
use crate::vm::{CocoonError, VmRecord};
use crate::{create, lifecycle};

/// C13: one attempt every 3 s, within the node's budget from the first
/// (`Config::fixup_budget_ms`, 180 s unless set).
const FIXUP_INTERVAL_MS: u64 = 3_000;
/// U7: 30 s into the 45 s lease wait.
const RENEW_NUDGE_MS: u64 = 30_000;

/// C13: which fix-up a VM brought up by `wait` needs, if any. A run or an adoption needs none;
/// a cloud-hypervisor Linux clone with DHCP NICs only heals itself; a cloud-hypervisor Windows
/// wake neither (U7): its hibernation dropped the NIC, so the clone's one NIC is new to the
/// guest, which takes a lease on it like any fresh device.
pub(crate) fn needed(spec: &VmSpec, vm: &VmRecord, wait: IpWait) -> Option<FixupKind> {
    match wait {
        IpWait::Run | IpWait::Adopt => return None,
        IpWait::Wake if spec.drops_nic() => return None,
        IpWait::Clone | IpWait::Wake => {}
    }
    match (spec.os, spec.backend) {
        (Os::Windows, _) => Some(FixupKind::Windows),
        (Os::Linux | Os::Android | Os::Macos, Backend::Firecracker) => Some(FixupKind::LinuxFc),
        (Os::Linux | Os::Android | Os::Macos, Backend::CloudHypervisor) => {
            vm.has_static_nic().then_some(FixupKind::LinuxStatic)
        }
    }
}

/// C12.5: the guest steps of a VM that just came up (or was re-attached with work owed).
pub(crate) fn begin(s: &mut State, key: &PodKey, wait: IpWait) {
    let Some(e) = s.pod(key) else { return };
    let (Ok(spec), Some(vm)) = (&e.spec, e.vm()) else {
        return;
    };
    match needed(spec, &vm.record, wait) {
        Some(kind) => start_fixup(s, key, kind, wait),
        None => lease(s, key, wait),
    }
}

/// B9 `classify_drop_nic`: asks the registry for `<vm>:hibernate`.
pub(crate) fn classify(s: &mut State, key: &PodKey) {
    let Some(name) = s.pod(key).and_then(|e| e.vm_name()).map(str::to_string) else {
        return;
    };
    let op = s.call_registry(
        RegistryOwner::Classify { key: key.clone() },
        Some(key.clone()),
        RegistryCall::Inspect {
            name,
            tag: "hibernate".into(),
        },
    );
    if let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) {
        r.settle = Some(Settle::Classify { op });
    }
}

/// The evidence is in: a tag means the VM was restored (a wake, with its metrics, Events and
/// renewal nudge); none means a fresh clone. An answer that cannot be had is a Warning, and
/// the guest steps go on as for a fresh clone: they are the same fix-up either way, only the
/// wake's accounting would differ.
pub(crate) fn classified(
    s: &mut State,
    key: &PodKey,
    op: crate::action::OpId,
    result: Result<RegistryOk, RegistryError>,
) {
    let waiting = matches!(
        s.pod(key).map(|e| &e.phase),
        Some(Phase::Running(Running { settle: Some(Settle::Classify { op: o }), .. })) if *o == op
    );
    if !waiting {
        return s.emit(Action::Log {
            level: Level::Info,
            message: format!("pod {key}: a restart's classification ended after the step did"),
        });
    }
    s.touched.insert(key);
    let wait = match result {
        Ok(RegistryOk::Inspected { snapshot: Some(_) }) => IpWait::Wake,
        Ok(
            RegistryOk::Inspected { snapshot: None }
            | RegistryOk::Pushed { .. }
            | RegistryOk::Pulled
            | RegistryOk::Deleted
            | RegistryOk::Staged { .. },
        ) => IpWait::Clone,
        Err(err) => {
            let msg = format!(
                "reconcile: cannot tell a restored VM from a fresh clone: {}; continuing as a fresh clone",
                err.message
            );
            create::warn_event(s, key, "ResumeClassifyFailed", &msg);
            IpWait::Clone
        }
    };
    begin(s, key, wait);
}

/// C13 loop, step 1: `post-clone-state=running`, then the first attempt.
pub(crate) fn start_fixup(s: &mut State, key: &PodKey, kind: FixupKind, wait: IpWait) {
    let now = s.now;
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Running(r) = &mut e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: start_fixup found it not Running"),
        );
    };
    r.settle = Some(Settle::Fixup(Fixup {
        kind,
        wait,
        since: now,
        attempts: 0,
        errors: Vec::new(),
        call: Call::Timer,
    }));
    // A new fix-up: how an earlier one ended no longer says anything.
    e.post_clone = None;
    s.touched.insert(key);
    attempt(s, key);
}

/// The retry timer: the next attempt, if the fix-up still waits for it.
pub(crate) fn retry(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    if let Phase::Running(Running {
        settle: Some(Settle::Fixup(Fixup {
            call: Call::Timer, ..
        })),
        ..
    }) = &e.phase
    {
        attempt(s, key);
    }
}

fn attempt(s: &mut State, key: &PodKey) {
    let Some(e) = s.pod(key) else { return };
    let (Phase::Running(r), Ok(spec)) = (&e.phase, &e.spec) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: attempt found it not Running"));
    };
    let Some(Settle::Fixup(f)) = &r.settle else {
        return;
    };
    let id = r.vm.record.id.clone();
    let kind = f.kind;
    // CLI-10: without the verb no attempt can succeed, and an older cocoon would answer one
    // with its help text and exit 0.
    if !s.config.cocoon.exec {
        let why = cocoon_caps::unsupported(Verb::Exec);
        if let Some(f) = fixup_mut(s, key) {
            f.errors.push(why.clone());
        }
        return give_up(s, key, Some(why));
    }
    match fixup::argv(kind, &spec.vm_name, &r.vm.record) {
        Ok(argv) => {
            let op = s.run_cocoon(
                CocoonOwner::Fixup { key: key.clone() },
                Some(key.clone()),
                CocoonCmd::VmExec { id, argv },
            );
            if let Some(f) = fixup_mut(s, key) {
                f.attempts += 1;
                f.call = Call::Out(op);
            }
        }
        // A record whose values cannot go into a script will not change by retrying.
        Err(why) => {
            if let Some(f) = fixup_mut(s, key) {
                f.attempts += 1;
                let n = f.attempts;
                f.errors.push(format!("attempt {n}: {why}"));
            }
            exhausted(s, key);
        }
    }
}

fn fixup_mut<'a>(s: &'a mut State, key: &PodKey) -> Option<&'a mut Fixup> {
    match &mut s.pods.get_mut(key)?.phase {
        Phase::Running(Running {
            settle: Some(Settle::Fixup(f)),
            ..
        }) => Some(f),
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
    }
}

/// An attempt's outcome. A pod that moved on (deleted, evicted, hibernating) no longer waits
/// for it: the step ended with the phase.
pub(crate) fn fixup_done(
    s: &mut State,
    key: &PodKey,
    op: crate::action::OpId,
    result: Result<CocoonOk, CocoonError>,
) {
    let (now, budget) = (s.now, s.config.fixup_budget_ms);
    s.touched.insert(key);
    let Some(f) = fixup_mut(s, key).filter(|f| f.call == Call::Out(op)) else {
        return s.emit(Action::Log {
            level: Level::Info,
            message: format!("pod {key}: a guest fix-up attempt ended after the step did"),
        });
    };
    match result {
        Ok(_) => succeeded(s, key),
        Err(err) => {
            let n = f.attempts;
            let line = format!("attempt {n}: {}", err.message);
            f.errors.push(line.clone());
            let next_in_budget = now + FIXUP_INTERVAL_MS as Millis <= f.since + budget;
            f.call = Call::Timer;
            event(
                s,
                key,
                EventType::Warning,
                "PostCloneExecAttemptFailed",
                &line,
            );
            if !next_in_budget {
                return exhausted(s, key);
            }
            let Some(uid) = s.pod(key).map(|e| e.pod.uid.clone()) else {
                return;
            };
            s.emit(Action::ArmTimer {
                timer: Timer::PostCloneRetry {
                    key: key.clone(),
                    uid,
                },
                after_ms: FIXUP_INTERVAL_MS,
            });
        }
    }
}

fn succeeded(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Running(r) = &mut e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: succeeded found it not Running"),
        );
    };
    let Some(Settle::Fixup(f)) = r.settle.take() else {
        return;
    };
    e.post_clone = Some(FixupEnd::Done);
    count(s, f.kind.into(), Outcome::Ok, Some(f.attempts));
    if s.pod(key).is_some_and(owes_sac) {
        // C13 success, step 3: SAC before the success is announced.
        return start_sac(s, key, f.wait, f.attempts);
    }
    announce(s, key, f.kind, f.attempts);
    lease(s, key, f.wait);
}

fn announce(s: &mut State, key: &PodKey, kind: FixupKind, attempts: u32) {
    let message = format!("kind={} attempts={attempts}", kind.as_str());
    event(s, key, EventType::Normal, "PostCloneSucceeded", &message);
}

/// C13 exhaustion: the state goes `failed` for good, with the hint and the attempts' errors.
fn exhausted(s: &mut State, key: &PodKey) {
    give_up(s, key, None)
}

/// C13 on exhaustion, or at once (`unattempted`: why no attempt could be made). The Event's
/// reason is the exhaustion's either way, so whoever watches for a failed fix-up sees both.
fn give_up(s: &mut State, key: &PodKey, unattempted: Option<String>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let name = e.vm_name().unwrap_or_default().to_string();
    let Phase::Running(r) = &mut e.phase else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: exhausted found it not Running"),
        );
    };
    let Some(Settle::Fixup(f)) = r.settle.take() else {
        return;
    };
    let hint = fixup::hint(f.kind, &name, &r.vm.record);
    let errors = lifecycle::truncate(f.errors.join("; "), keys::MESSAGE_LIMIT);
    e.post_clone = Some(FixupEnd::Failed {
        hint: Some(hint),
        errors: errors.clone(),
    });
    count(s, f.kind.into(), Outcome::Failed, Some(f.attempts));
    let op = op_word(f.wait);
    if f.wait == IpWait::Wake {
        s.emit(Action::Count {
            counter: Counter::Wake {
                result: Outcome::Failed,
            },
        });
    }
    let last = f.errors.last().map_or("", |e| e.as_str());
    let msg = match unattempted {
        None => format!(
            "post-clone {} fix-up of {name} gave up after {} attempts in {}s; last: {last} \
             (all errors in post-clone-errors, the command in post-clone-hint)",
            f.kind.as_str(),
            f.attempts,
            s.config.fixup_budget_ms / 1000
        ),
        Some(why) => format!(
            "post-clone {} fix-up of {name} cannot run: {why}; until it runs the guest keeps \
             its source's hostname and addresses (the command is in post-clone-hint)",
            f.kind.as_str()
        ),
    };
    event(
        s,
        key,
        EventType::Warning,
        "PostCloneExecExhausted",
        &format!("{op}: {msg}"),
    );
    lifecycle::failed(s, key, msg);
}

/// C15: the static addresses of a Windows guest, set over its serial console.
fn start_sac(s: &mut State, key: &PodKey, wait: IpWait, attempts: u32) {
    let Some(vm) = s.pod(key).and_then(|e| e.vm()) else {
        return crate::outcome::unexpected(s, &format!("pod {key}: SAC owed without a VM"));
    };
    let nics: Vec<SacNic> = vm
        .record
        .nics
        .iter()
        .enumerate()
        .filter_map(|(i, nic)| {
            let net = nic.network.as_ref()?;
            Some(SacNic {
                position: i as u32,
                ip: net.ip.clone(),
                mask: fixup::dotted_mask(net.prefix),
                gateway: net.gateway.clone().unwrap_or_else(|| "0.0.0.0".into()),
            })
        })
        .collect();
    let (vm_id, nic_count) = (vm.record.id.clone(), vm.record.nics.len() as u32);
    let op = s.next_op();
    s.sac_ops.insert(op, key.clone());
    s.emit(Action::RunSac {
        op,
        key: key.clone(),
        vm_id,
        nic_count,
        nics,
    });
    let Some(e) = s.pods.get_mut(key) else { return };
    if let Phase::Running(r) = &mut e.phase {
        r.settle = Some(Settle::Sac { op, wait, attempts });
    }
}

pub(crate) fn sac_done(s: &mut State, op: crate::action::OpId, result: Result<(), SacError>) {
    let Some(key) = s.sac_ops.remove(&op) else {
        return crate::outcome::unexpected(s, &format!("SAC dialog #{op} is not out"));
    };
    let waiting = match s.pod(&key).map(|e| &e.phase) {
        Some(Phase::Running(Running {
            settle:
                Some(Settle::Sac {
                    op: o,
                    wait,
                    attempts,
                }),
            ..
        })) if *o == op => Some((*wait, *attempts)),
        Some(_) | None => None,
    };
    let Some((wait, attempts)) = waiting else {
        return s.emit(Action::Log {
            level: Level::Info,
            message: format!("pod {key}: a SAC dialog ended after the step did"),
        });
    };
    s.touched.insert(&key);
    if let Some(Phase::Running(r)) = s.pods.get_mut(&key).map(|e| &mut e.phase) {
        r.settle = None;
    }
    match result {
        Ok(()) => {
            count(s, PostCloneKind::Sac, Outcome::Ok, None);
            announce(s, &key, FixupKind::Windows, attempts);
            lease(s, &key, wait);
        }
        Err(err) => {
            let reason = match err.stage {
                SacStage::Dial => "PostCloneSACDialFailed",
                SacStage::Enum => "PostCloneSACEnumFailed",
                SacStage::Set => "PostCloneSACSetFailed",
                SacStage::Verify => "PostCloneSACVerifyFailed",
            };
            let op = op_word(wait);
            event(
                s,
                &key,
                EventType::Warning,
                reason,
                &format!("{op}: {}", err.message),
            );
            count(s, PostCloneKind::Sac, Outcome::Failed, None);
            if wait == IpWait::Wake {
                s.emit(Action::Count {
                    counter: Counter::Wake {
                        result: Outcome::Failed,
                    },
                });
            }
            let msg = format!("windows static IP over SAC failed: {}", err.message);
            event(
                s,
                &key,
                EventType::Warning,
                "WindowsStaticIPFailed",
                &format!("{op}: {msg}"),
            );
            if let Some(e) = s.pods.get_mut(&key) {
                e.post_clone = Some(FixupEnd::Failed {
                    hint: None,
                    errors: lifecycle::truncate(err.message, keys::MESSAGE_LIMIT),
                });
            }
            lifecycle::failed(s, &key, msg);
        }
    }
}

/// B9: a restart found the fix-up `done` (its state says so): SAC again if it is owed, else
/// the lease wait.
pub(crate) fn resume_after_fixup(s: &mut State, key: &PodKey, wait: IpWait) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.post_clone = Some(FixupEnd::Done);
    match owes_sac(e) {
        true => start_sac(s, key, wait, 0),
        false => lease(s, key, wait),
    }
}

/// C15: a Windows guest with a static NIC gets its addresses over SAC.
fn owes_sac(e: &crate::entry::PodEntry) -> bool {
    matches!((&e.spec, e.vm()), (Ok(spec), Some(vm)) if spec.os == Os::Windows && vm.record.has_static_nic())
}

fn op_word(wait: IpWait) -> &'static str {
    match wait {
        IpWait::Wake => "wake",
        IpWait::Clone | IpWait::Run | IpWait::Adopt => "create",
    }
}

fn count(s: &mut State, kind: PostCloneKind, result: Outcome, attempts: Option<u32>) {
    s.emit(Action::Count {
        counter: Counter::PostClone { kind, result },
    });
    if let Some(n) = attempts {
        s.emit(Action::ObserveCount {
            histogram: CountHistogram::PostCloneRetryAttempts { result },
            count: n as u64,
        });
    }
}

fn event(s: &mut State, key: &PodKey, kind: EventType, reason: &str, message: &str) {
    let Some(e) = s.pod(key) else { return };
    let uid = e.pod.uid.clone();
    s.emit(Action::RecordEvent {
        source: EventSource::Vk,
        key: key.clone(),
        uid,
        kind,
        reason: reason.into(),
        message: lifecycle::truncate(message.to_string(), 512),
    });
}

/// C16: `ready` needs a resolvable IP. Clones and wakes wait 45 s for the lease; a run or an
/// adoption has no deadline (`ready` requires an IP on every managed path).
pub(crate) fn lease(s: &mut State, key: &PodKey, wait: IpWait) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let Phase::Running(r) = &mut e.phase else {
        return crate::outcome::unexpected(s, &format!("pod {key}: lease found it not Running"));
    };
    r.settle = Some(Settle::Lease { wait });
    if r.vm.ip.is_some() {
        ip_arrived(s, key);
    } else if wait.has_deadline() {
        let uid = e.pod.uid.clone();
        let nudge = wait == IpWait::Wake && e.spec.as_ref().is_ok_and(|sp| sp.drops_nic());
        if nudge {
            s.emit(Action::ArmTimer {
                timer: Timer::RenewNudge {
                    key: key.clone(),
                    uid: uid.clone(),
                },
                after_ms: RENEW_NUDGE_MS,
            });
        }
        s.emit(Action::ArmTimer {
            timer: Timer::IpWait {
                key: key.clone(),
                uid,
            },
            after_ms: crate::dhcp::IP_WAIT_MS,
        });
    }
}

/// The lease wait this pod is in, if any.
pub(crate) fn awaiting_lease(phase: &Phase) -> Option<IpWait> {
    match phase {
        Phase::Running(Running {
            settle: Some(Settle::Lease { wait }),
            ..
        }) => Some(*wait),
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
    }
}

/// U7: a woken Windows guest still without a lease is asked once to renew it.
pub(crate) fn renew_nudge(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    if awaiting_lease(&e.phase) != Some(IpWait::Wake) {
        return;
    }
    let Some(vm) = e.vm().filter(|vm| vm.ip.is_none()) else {
        return;
    };
    let cmd = CocoonCmd::VmExec {
        id: vm.record.id.clone(),
        argv: vec!["ipconfig".into(), "/renew".into()],
    };
    s.run_cocoon(
        CocoonOwner::RenewNudge { key: key.clone() },
        Some(key.clone()),
        cmd,
    );
}

/// The nudge's outcome: counted only; the lease wait decides (a failed exec may still have
/// renewed the lease in the guest).
pub(crate) fn nudged(s: &mut State, _key: &PodKey, result: Result<CocoonOk, CocoonError>) {
    s.emit(Action::Count {
        counter: Counter::WakeRenewNudge {
            result: Outcome::from(result.is_ok()),
        },
    });
}

/// C16: the IP is there: lifecycle `ready` (the status with it is published first, by the
/// publisher's order of writes).
pub(crate) fn ip_arrived(s: &mut State, key: &PodKey) {
    let Some(Phase::Running(r)) = s.pods.get_mut(key).map(|e| &mut e.phase) else {
        return crate::outcome::unexpected(
            s,
            &format!("pod {key}: ip_arrived found it not Running"),
        );
    };
    let Some(Settle::Lease { wait }) = r.settle else {
        return;
    };
    r.settle = None;
    if wait.has_deadline() {
        s.emit(Action::Count {
            counter: Counter::WakeIpWait {
                result: IpWaitResult::Ok,
            },
        });
    }
    if wait == IpWait::Wake {
        s.emit(Action::Count {
            counter: Counter::Wake {
                result: Outcome::Ok,
            },
        });
        event(
            s,
            key,
            EventType::Normal,
            "Woken",
            "wake: the VM is back from its hibernate snapshot",
        );
    }
    lifecycle::stamp(s, key);
}

/// C16: no lease within 45 s.
pub(crate) fn ip_wait_expired(s: &mut State, key: &PodKey, uid: &str) {
    let Some(e) = s.pods.incarnation(key, uid) else {
        return;
    };
    let name = e.vm_name().unwrap_or_default().to_string();
    let r = match &mut e.phase {
        Phase::Running(r) => r,
        // The pod left Running (deleted, evicted, hibernating) while the timer ran: the wait
        // ended with it.
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Creating(_)
        | Phase::Hibernating(_)
        | Phase::Hibernated
        | Phase::Evicting(_)
        | Phase::Deleting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => return,
    };
    if r.vm.ip.is_some() {
        return;
    }
    let Some(Settle::Lease { wait }) = r.settle else {
        return;
    };
    r.settle = None;
    let msg = format!(
        "{} {name}: dhcp lease not observed within 45s",
        wait.as_str()
    );
    s.emit(Action::Count {
        counter: Counter::WakeIpWait {
            result: IpWaitResult::Timeout,
        },
    });
    let reason = match wait {
        IpWait::Wake => "WakeIPWaitTimeout",
        IpWait::Clone | IpWait::Run | IpWait::Adopt => "PostCloneIPWaitTimeout",
    };
    if wait == IpWait::Wake {
        s.emit(Action::Count {
            counter: Counter::Wake {
                result: Outcome::Failed,
            },
        });
    }
    create::warn_event(s, key, reason, &format!("{}: {msg}", op_word(wait)));
    lifecycle::failed(s, key, msg);
}
