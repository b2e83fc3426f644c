//! M6: the intervals a user waits on, observed in the core from the events' own times, so a
//! replay observes the same values. Each handler here records one moment of the pod's
//! `Moments` and observes the interval that moment closes.

use crate::action::{Action, Histogram, StartupStage};
use crate::moments::VmEventMark;
use crate::pod::PodKey;
use crate::state::State;
use crate::status::{self, PodStatus};
use crate::time::Millis;

/// Intake saw a new incarnation.
pub(crate) fn seen(s: &mut State, key: &PodKey) {
    let now = s.now;
    if let Some(e) = s.pods.get_mut(key) {
        e.moments.seen.get_or_insert(now);
    }
}

/// The pod's first VM is up (a wake's VM is not the start-up's).
pub(crate) fn vm_created(s: &mut State, key: &PodKey) {
    let now = s.now;
    let Some(m) = s.pods.get_mut(key).map(|e| &mut e.moments) else {
        return;
    };
    if m.vm_created.is_some() {
        return;
    }
    m.vm_created = Some(now);
    let since = m.seen;
    observe(s, StartupStage::VmCreated, since, now);
}

/// A probe succeeded.
pub(crate) fn probe_ok(s: &mut State, key: &PodKey) {
    let now = s.now;
    let Some(m) = s.pods.get_mut(key).map(|e| &mut e.moments) else {
        return;
    };
    if m.first_probe_ok.is_some() || m.vm_created.is_none() {
        return;
    }
    m.first_probe_ok = Some(now);
    let since = m.vm_created;
    observe(s, StartupStage::FirstProbeOk, since, now);
}

/// A status write came back ok: the end of the start-up if it carried ready=true, the end
/// of a VM event's wait if it carried a status other than the one before the event.
pub(crate) fn status_pushed(s: &mut State, key: &PodKey, pushed: &PodStatus) {
    let now = s.now;
    let Some(m) = s.pods.get_mut(key).map(|e| &mut e.moments) else {
        return;
    };
    let event = m.vm_event.take().filter(|mark| mark.before != *pushed);
    let ready = status::parse_ready_condition(pushed).is_some_and(|(ready, _)| ready);
    let startup = (ready && !m.ready_pushed && m.first_probe_ok.is_some())
        .then_some((m.first_probe_ok, m.seen));
    if ready {
        m.ready_pushed = true;
    }
    if let Some((probe_ok, seen)) = startup {
        observe(s, StartupStage::ReadyPushed, probe_ok, now);
        observe(s, StartupStage::Total, seen, now);
    }
    if let Some(mark) = event {
        s.emit(Action::Observe {
            histogram: Histogram::VmEventToStatus,
            millis: (now - mark.at).max(0) as u64,
        });
    }
}

/// A VM event about the pod is acted on; the earliest one still waiting is kept.
pub(crate) fn vm_event(s: &mut State, key: &PodKey) {
    let now = s.now;
    let Some(e) = s.pods.get(key) else { return };
    if e.moments.vm_event.is_some() {
        return;
    }
    let before = status::derive(&s.config, e);
    if let Some(e) = s.pods.get_mut(key) {
        e.moments.vm_event = Some(VmEventMark { at: now, before });
    }
}

/// The event's checks found the VM fine: if the status it derives is still the one before
/// the event, no write will close the wait.
pub(crate) fn vm_event_settled(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get(key) else { return };
    let Some(mark) = &e.moments.vm_event else {
        return;
    };
    if status::is_desired(&s.config, e, &mark.before) {
        if let Some(e) = s.pods.get_mut(key) {
            e.moments.vm_event = None;
        }
    }
}

fn observe(s: &mut State, stage: StartupStage, since: Option<Millis>, now: Millis) {
    let Some(since) = since else { return };
    s.emit(Action::Observe {
        histogram: Histogram::PodStartup { stage },
        millis: (now - since).max(0) as u64,
    });
}
