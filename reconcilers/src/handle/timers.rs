//! Timers the core armed, coming back. Each goes to the incarnation it was armed for.

use crate::action::Timer;
use crate::state::State;
use crate::{create, delete, evict, guest, hibernate, publish, stale_create, sweep, vm_events};

pub fn fired(s: &mut State, timer: Timer) {
    match timer {
        Timer::CreateRetry { key, uid } => create::retry(s, &key, &uid),
        Timer::Recheck { key, uid } => vm_events::recheck(s, &key, &uid),
        Timer::IpWait { key, uid } => guest::ip_wait_expired(s, &key, &uid),
        Timer::RenewNudge { key, uid } => guest::renew_nudge(s, &key, &uid),
        Timer::PostCloneRetry { key, uid } => guest::retry(s, &key, &uid),
        Timer::KubeRetry { key, uid } => publish::retry(s, &key, &uid),
        Timer::DeleteRetry { key, uid } => delete::retry(s, &key, &uid),
        Timer::EvictRetry { key, uid } => evict::retry(s, &key, &uid),
        Timer::HibernateRetry { key, uid, attempt } => hibernate::retry(s, &key, &uid, attempt),
        Timer::StaleCreate { id, name, attempt } => stale_create::fired(s, &id, &name, attempt),
        Timer::Sweep => sweep::start(s, true),
    }
}
