//! Timers the core armed, coming back. Each re-checks that its pod incarnation still wants it.

use crate::action::Timer;
use crate::state::State;
use crate::{create, delete, stale_create, sweep, vmevents};

pub fn fired(s: &mut State, timer: Timer) {
    match timer {
        Timer::CreateRetry { key, uid } => create::retry(s, &key, &uid),
        Timer::Recheck { key, uid } => vmevents::recheck(s, &key, &uid),
        Timer::LeaseWait { key, uid } => create::lease_wait_expired(s, &key, &uid),
        Timer::KubeRetry { key, uid } => {
            if let Some(e) = s.pods.get_mut(&key) {
                if e.pod.uid == uid {
                    e.kube_backoff = false;
                    s.touched.insert(&key);
                }
            }
        }
        Timer::DeleteRetry { key, uid } => delete::retry(s, &key, &uid),
        Timer::EvictRetry { key, uid } => vmevents::evict_retry(s, &key, &uid),
        Timer::StaleCreate { id, name, attempt } => stale_create::fired(s, &id, &name, attempt),
        Timer::Sweep => sweep::start(s, true),
    }
}
