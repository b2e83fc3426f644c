//! K10: the connections of the kubelet API still in their TLS handshake, or past it and not
//! yet done sending their first request head (a "handshake" below). A connection that never
//! starts or never finishes its handshake holds a socket and a task for nothing; one
//! caller opening them faster than they expire would otherwise hold every slot, and the
//! apiserver's own connections would wait behind them. So each handshake has a deadline,
//! at most [`PER_ADDRESS`] wait from one address and at most [`PENDING`] in all, and a
//! newcomer over either bound takes the place of the longest-waiting one (of its own address,
//! or, over the node's bound, of the address holding the most): a handshake that is going to finish does so in a few round trips, so the
//! oldest is the one least likely to be a real client, and a newcomer is never made to wait
//! behind idle connections. Every handshake cut short (evicted or past its deadline) counts
//! `cocoon_vk_cap_refusals_total{cap="tls_handshake"}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::metrics::{Cap, Metrics};

/// A TLS handshake and a request head take a few round trips; ten seconds covers a slow
/// network many times over, and bounds how long an idle connection holds its slot.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// The apiserver, metrics-server and Prometheus together open a few connections at a time,
/// each done with its handshake in milliseconds; 256 waiting at once is far past that, and
/// keeps the sockets such connections can hold well below any descriptor limit.
pub const PENDING: usize = 256;
/// One address (a pod, a host) may hold this many of them: enough for the apiserver's burst
/// of calls at once, while one tenant's connections cannot take the slots of the others.
pub const PER_ADDRESS: usize = 32;

/// Why a handshake did not finish.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    /// Past [`DEADLINE`].
    Deadline,
    /// A newcomer took its place.
    Evicted,
}

struct Waiting {
    next: u64,
    /// By arrival: the address and the handle that ends the wait.
    order: BTreeMap<u64, (IpAddr, oneshot::Sender<()>)>,
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

impl Waiting {
    fn remove(&mut self, id: u64) -> bool {
        let Some((ip, _cancel)) = self.order.remove(&id) else {
            return false;
        };
        if let Some(ids) = self.by_address.get_mut(&ip) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_address.remove(&ip);
            }
        }
        true
    }
}

/// The handshakes in progress, shared by every worker of the kubelet API.
#[derive(Clone)]
pub struct Handshakes {
    waiting: Arc<Mutex<Waiting>>,
    metrics: Metrics,
    pending: usize,
    per_address: usize,
    deadline: Duration,
}

/// A handshake's place; dropping it frees the place.
struct Slot {
    id: u64,
    waiting: Arc<Mutex<Waiting>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.waiting).remove(self.id);
    }
}

fn lock(m: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    // Entries go in and out whole; a poisoned table is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Handshakes {
    pub fn new(metrics: Metrics) -> Self {
        Self::with_limits(metrics, PENDING, PER_ADDRESS, DEADLINE)
    }

    fn with_limits(
        metrics: Metrics,
        pending: usize,
        per_address: usize,
        deadline: Duration,
    ) -> Self {
        Self {
            waiting: Arc::new(Mutex::new(Waiting {
                next: 0,
                order: BTreeMap::new(),
                by_address: HashMap::new(),
            })),
            metrics,
            pending,
            per_address,
            deadline,
        }
    }

    /// Takes a place for a handshake from `ip`, evicting the oldest of its address or of all
    /// when either is full.
    fn admit(&self, ip: IpAddr) -> (Slot, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut w = lock(&self.waiting);
        let mut evicted = 0;
        let own = w
            .by_address
            .get(&ip)
            .filter(|ids| ids.len() >= self.per_address);
        if let Some(&oldest) = own.and_then(|ids| ids.first()) {
            evicted += usize::from(w.remove(oldest));
        }
        // Over the node's bound, the place comes from the address holding the most (of those,
        // the one waiting longest), so a flood from a few addresses evicts its own connections
        // and not another caller's.
        while w.order.len() >= self.pending {
            let Some(oldest) = w
                .by_address
                .values()
                .filter_map(|ids| Some((ids.len(), *ids.first()?)))
                .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                .map(|(_, id)| id)
            else {
                break;
            };
            evicted += usize::from(w.remove(oldest));
        }
        let id = w.next;
        w.next += 1;
        w.order.insert(id, (ip, tx));
        w.by_address.entry(ip).or_default().insert(id);
        drop(w);
        for _ in 0..evicted {
            self.metrics.cap_refused(Cap::TlsHandshake);
        }
        let slot = Slot {
            id,
            waiting: self.waiting.clone(),
        };
        (slot, rx)
    }

    /// Runs `handshake` for a connection from `ip` within the bounds: its output, or why it
    /// was cut short (the connection is then dropped with the future).
    pub async fn run<T>(&self, ip: IpAddr, handshake: impl Future<Output = T>) -> Result<T, Cut> {
        let (_slot, evicted) = self.admit(ip);
        tokio::select! {
            // An eviction is counted where it happens, so it is seen first: a handshake
            // evicted and then past its deadline is cut once.
            biased;
            _ = evicted => Err(Cut::Evicted),
            done = tokio::time::timeout(self.deadline, handshake) => match done {
                Ok(out) => Ok(out),
                Err(_) => {
                    self.metrics.cap_refused(Cap::TlsHandshake);
                    Err(Cut::Deadline)
                }
            },
        }
    }

    /// Handshakes waiting now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        lock(&self.waiting).order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusals(m: &Metrics) -> u64 {
        m.cap_refusals.with_label_values(&["tls_handshake"]).get()
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// Lets every spawned task run until it waits.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_handshake_is_cut_at_its_deadline() {
        let m = Metrics::new();
        let h = Handshakes::new(m.clone());
        let idle = tokio::spawn({
            let h = h.clone();
            async move { h.run(ip(1), std::future::pending::<()>()).await }
        });
        settle().await;
        assert_eq!(h.waiting(), 1);
        tokio::time::advance(DEADLINE - Duration::from_millis(1)).await;
        settle().await;
        assert!(!idle.is_finished());
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(idle.await.unwrap(), Err(Cut::Deadline));
        assert_eq!(h.waiting(), 0);
        assert_eq!(refusals(&m), 1);
        // One that finishes is not counted.
        assert_eq!(h.run(ip(1), async { 7 }).await, Ok(7));
        assert_eq!(refusals(&m), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_takes_the_place_of_the_oldest_of_its_address_and_of_all() {
        let m = Metrics::new();
        let h = Handshakes::with_limits(m.clone(), 6, 3, DEADLINE);
        let mut idle = Vec::new();
        // Four from one address: the first is evicted by the fourth.
        for _ in 0..4 {
            let h = h.clone();
            idle.push(tokio::spawn(async move {
                h.run(ip(1), std::future::pending::<()>()).await
            }));
            settle().await;
        }
        assert_eq!(h.waiting(), 3);
        assert_eq!(refusals(&m), 1);
        assert!(idle[0].is_finished());
        // Three more from others fill the six places; a seventh evicts the oldest of all,
        // the second from the first address.
        for last in 2..=5 {
            let h = h.clone();
            idle.push(tokio::spawn(async move {
                h.run(ip(last), std::future::pending::<()>()).await
            }));
            settle().await;
        }
        assert_eq!(h.waiting(), 6);
        assert_eq!(refusals(&m), 2);
        assert!(idle[1].is_finished() && !idle[2].is_finished());
        for (i, t) in idle.iter().enumerate().skip(2) {
            assert!(!t.is_finished(), "handshake {i} still waits");
        }
        // A real client arriving now still gets its handshake done.
        assert_eq!(h.run(ip(9), async { "done" }).await, Ok("done"));
        assert_eq!(refusals(&m), 3);
        let first = idle.remove(0).await.unwrap();
        assert_eq!(first, Err(Cut::Evicted));
        for t in &idle {
            t.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_node_bound_the_address_holding_most_gives_up_its_place() {
        let m = Metrics::new();
        let h = Handshakes::with_limits(m.clone(), 6, 3, DEADLINE);
        let spawn = |last: u8| {
            let h = h.clone();
            tokio::spawn(async move { h.run(ip(last), std::future::pending::<()>()).await })
        };
        // A slow caller waits longest; two others fill the node's places.
        let slow = spawn(2);
        settle().await;
        let mut flood = Vec::new();
        for last in [1, 1, 1, 3, 3] {
            flood.push(spawn(last));
            settle().await;
        }
        assert_eq!(h.waiting(), 6);
        // A newcomer takes the place of the first address's oldest, not the slow caller's.
        let newcomer = spawn(4);
        settle().await;
        assert_eq!(h.waiting(), 6);
        assert_eq!(refusals(&m), 1);
        assert!(!slow.is_finished(), "the slow caller was evicted");
        assert!(flood[0].is_finished());
        for t in flood.iter().skip(1).chain([&slow, &newcomer]) {
            t.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_from_one_address_never_holds_more_than_its_share() {
        let m = Metrics::new();
        let h = Handshakes::new(m.clone());
        let mut idle = Vec::new();
        for _ in 0..1000 {
            let h = h.clone();
            idle.push(tokio::spawn(async move {
                h.run(ip(1), std::future::pending::<()>()).await
            }));
        }
        let evictions = (1000 - PER_ADDRESS) as u64;
        for _ in 0..100_000 {
            if refusals(&m) >= evictions {
                break;
            }
            tokio::task::yield_now().await;
        }
        settle().await;
        assert_eq!(h.waiting(), PER_ADDRESS);
        assert_eq!(refusals(&m), evictions);
        // Others still find room.
        assert_eq!(h.run(ip(2), async { 1 }).await, Ok(1));
        tokio::time::advance(DEADLINE + Duration::from_secs(1)).await;
        for t in idle {
            assert!(t.await.unwrap().is_err());
        }
        assert_eq!(h.waiting(), 0);
        assert_eq!(refusals(&m), 1000);
    }
}
