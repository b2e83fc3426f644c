//! The cocoon lane's slots, shared fairly between namespaces (T13). cocoon calls run at most
//! [`SLOTS`] at once; a call waits for a slot. When one frees, it goes to the namespace with
//! the fewest calls running among those waiting (the one waiting longest on a tie), first come
//! first served within a namespace; and no namespace holds more than [`NAMESPACE_SLOTS`] at
//! once, so a namespace whose calls hang (a slow image server, a stuck guest) leaves the other
//! tenants' creates, deletes and hibernates slots to run in. Calls of no pod (the node's own
//! listings and cleanups) are a namespace of their own, `""`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// cocoon calls running at once on the node.
pub const SLOTS: usize = 32;
/// One namespace's most: three quarters of the lane, so a quarter is always left to others.
pub const NAMESPACE_SLOTS: usize = 24;

struct Inner {
    free: usize,
    running: HashMap<String, usize>,
    /// By namespace: the waiting calls, each with its arrival number.
    waiting: BTreeMap<String, VecDeque<(u64, oneshot::Sender<FairPermit>)>>,
    next: u64,
}

pub struct FairSlots {
    inner: Mutex<Inner>,
    per_namespace: usize,
}

/// A running call's slot; dropping it hands the slot on.
pub struct FairPermit {
    slots: Arc<FairSlots>,
    namespace: String,
    /// False for a permit that was never handed over: dropping it gives nothing back.
    counted: bool,
}

impl FairSlots {
    pub fn new(slots: usize, per_namespace: usize) -> Arc<FairSlots> {
        Arc::new(FairSlots {
            inner: Mutex::new(Inner {
                free: slots,
                running: HashMap::new(),
                waiting: BTreeMap::new(),
                next: 0,
            }),
            per_namespace: per_namespace.clamp(1, slots.max(1)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change is whole under the lock; a poisoned table is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot for a call of `namespace`.
    pub async fn acquire(self: &Arc<Self>, namespace: &str) -> FairPermit {
        let rx = {
            let mut inner = self.lock();
            let mine = inner.running.get(namespace).copied().unwrap_or(0);
            let queued = inner.waiting.get(namespace).is_some_and(|q| !q.is_empty());
            if inner.free > 0 && mine < self.per_namespace && !queued {
                inner.free -= 1;
                *inner.running.entry(namespace.to_string()).or_default() += 1;
                return self.permit(namespace);
            }
            let (tx, rx) = oneshot::channel();
            let n = inner.next;
            inner.next += 1;
            inner
                .waiting
                .entry(namespace.to_string())
                .or_default()
                .push_back((n, tx));
            rx
        };
        // The permit travels in the channel, so a caller that stops waiting after it was sent
        // still gives the slot back when the channel drops it. `hand_on` sends to every waiter
        // it takes from the queue, and the queue lives as long as `self`.
        match rx.await {
            Ok(permit) => permit,
            Err(_) => unreachable!("a waiting call is always sent its permit"),
        }
    }

    fn permit(self: &Arc<Self>, namespace: &str) -> FairPermit {
        FairPermit {
            slots: self.clone(),
            namespace: namespace.to_string(),
            counted: true,
        }
    }

    /// Gives free slots to waiting calls, fewest running first.
    fn hand_on(self: &Arc<Self>, inner: &mut Inner) {
        while inner.free > 0 {
            let next = inner
                .waiting
                .iter()
                .filter_map(|(ns, q)| {
                    let running = inner.running.get(ns).copied().unwrap_or(0);
                    let (arrived, _) = q.front()?;
                    (running < self.per_namespace).then_some((running, *arrived, ns.clone()))
                })
                .min();
            let Some((_, _, ns)) = next else { return };
            let Some(queue) = inner.waiting.get_mut(&ns) else {
                return;
            };
            let Some((_, tx)) = queue.pop_front() else {
                return;
            };
            if queue.is_empty() {
                inner.waiting.remove(&ns);
            }
            inner.free -= 1;
            *inner.running.entry(ns.clone()).or_default() += 1;
            // A caller that stopped waiting (its task ended) takes nothing: the count is undone
            // here, under the lock, and the permit dropped without giving back twice.
            if let Err(mut unsent) = tx.send(self.permit(&ns)) {
                unsent.counted = false;
                inner.free += 1;
                if let Some(n) = inner.running.get_mut(&ns) {
                    *n -= 1;
                    if *n == 0 {
                        inner.running.remove(&ns);
                    }
                }
            }
        }
    }

    /// Calls of `namespace` running now.
    pub fn running(&self, namespace: &str) -> usize {
        self.lock().running.get(namespace).copied().unwrap_or(0)
    }
}

impl Drop for FairPermit {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut inner = self.slots.lock();
        inner.free += 1;
        if let Some(n) = inner.running.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.running.remove(&self.namespace);
            }
        }
        self.slots.hand_on(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_namespace_that_holds_its_most_leaves_the_rest_to_others() {
        let slots = FairSlots::new(4, 3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(slots.acquire("flood").await);
        }
        // The flood's fourth call waits although a slot is free; another namespace's runs.
        let s = slots.clone();
        let fourth = tokio::spawn(async move { s.acquire("flood").await });
        settle().await;
        assert!(!fourth.is_finished());
        let other = slots.acquire("quiet").await;
        assert_eq!((slots.running("flood"), slots.running("quiet")), (3, 1));
        drop(other);
        settle().await;
        assert!(!fourth.is_finished(), "the flood went past its most");
        drop(held.pop());
        let _fourth = fourth.await.unwrap();
        assert_eq!(slots.running("flood"), 3);
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_namespace_running_fewest() {
        let slots = FairSlots::new(2, 2);
        let a1 = slots.acquire("a").await;
        let a2 = slots.acquire("a").await;
        // a asks again before b: the slot a frees still goes to b, which runs none.
        let s = slots.clone();
        let a3 = tokio::spawn(async move { s.acquire("a").await });
        settle().await;
        let s = slots.clone();
        let b1 = tokio::spawn(async move { s.acquire("b").await });
        settle().await;
        drop(a1);
        let _b1 = b1.await.unwrap();
        assert!(!a3.is_finished());
        assert_eq!((slots.running("a"), slots.running("b")), (1, 1));
        drop(a2);
        let _a3 = a3.await.unwrap();
        assert_eq!(slots.running("a"), 1);
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_takes_no_slot() {
        let slots = FairSlots::new(1, 1);
        let held = slots.acquire("a").await;
        let s = slots.clone();
        let gone = tokio::spawn(async move { s.acquire("b").await });
        settle().await;
        gone.abort();
        settle().await;
        drop(held);
        let _next = slots.acquire("c").await;
        assert_eq!(slots.running("c"), 1);
        assert_eq!(slots.running("b"), 0);
    }
}
