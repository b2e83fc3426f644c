//! Kubernetes Events travel in a lane of their own (F4). They explain; status writes and
//! deletes are the contract. When they shared one pool of API slots, an apiserver slow to take
//! Events (they are the first thing it sheds under load) filled the pool and held back the
//! writes that move pods. Here an Event waits at most `deadline` from the moment it is handed
//! over, at most `capacity` wait or fly at once, and any Event beyond that is dropped and
//! counted rather than queued without end.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::sync::Semaphore;

use crate::metrics::DropReason;

/// Events waiting or in flight. Events come from failures and lifecycle changes, a handful per
/// pod in a bad minute; this holds a burst from every pod of a busy node.
pub const CAPACITY: usize = 64;
/// Events being sent at once: enough to keep up with bursts, few enough that a slow apiserver
/// sees little extra load from them.
pub const CONCURRENCY: usize = 4;
/// From hand-over to the apiserver's answer. An Event older than this explains less than the
/// status that has moved on since.
pub const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct EventLane {
    room: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    deadline: Duration,
    dropped: IntCounterVec,
}

impl EventLane {
    pub fn new(dropped: IntCounterVec) -> Self {
        Self::with_limits(CAPACITY, CONCURRENCY, DEADLINE, dropped)
    }

    pub fn with_limits(
        capacity: usize,
        concurrency: usize,
        deadline: Duration,
        dropped: IntCounterVec,
    ) -> Self {
        Self {
            room: Arc::new(Semaphore::new(capacity)),
            slots: Arc::new(Semaphore::new(concurrency)),
            deadline,
            dropped,
        }
    }

    /// Sends one Event through `send`, unless the lane is full: then it is dropped at once
    /// and counted (`reason="lane_full"`). Returns whether it was taken. Never waits, so the
    /// loop that calls it never does either.
    pub fn submit<F>(&self, what: String, send: F) -> bool
    where
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        let Ok(room) = self.room.clone().try_acquire_owned() else {
            self.dropped
                .with_label_values(&[DropReason::LaneFull.as_str()])
                .inc();
            tracing::warn!(event = %what, "Kubernetes Event dropped: the Events lane is full (the apiserver is slow to take them)");
            return false;
        };
        let (slots, deadline, dropped) = (self.slots.clone(), self.deadline, self.dropped.clone());
        tokio::spawn(async move {
            let _room = room;
            let sent = tokio::time::timeout(deadline, async move {
                let _slot = slots.acquire_owned().await;
                send.await
            })
            .await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    dropped
                        .with_label_values(&[DropReason::Rejected.as_str()])
                        .inc();
                    tracing::warn!(event = %what, error = %e, "could not record a Kubernetes Event");
                }
                Err(_) => {
                    dropped
                        .with_label_values(&[DropReason::Timeout.as_str()])
                        .inc();
                    tracing::warn!(event = %what, ?deadline, "Kubernetes Event dropped: not recorded in time");
                }
            }
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn counter() -> IntCounterVec {
        IntCounterVec::new(Opts::new("dropped", "test"), &["reason"]).unwrap()
    }

    fn count(c: &IntCounterVec, reason: &str) -> u64 {
        c.with_label_values(&[reason]).get()
    }

    /// Paused time: the runtime jumps to each deadline instead of waiting it out.
    #[tokio::test(start_paused = true)]
    async fn a_full_lane_drops_at_once_and_a_stuck_event_times_out() {
        let dropped = counter();
        let lane = EventLane::with_limits(3, 1, Duration::from_millis(300), dropped.clone());
        // The apiserver never answers.
        for i in 0..3 {
            assert!(lane.submit(format!("e{i}"), std::future::pending()));
        }
        assert!(!lane.submit("e3".into(), async { Ok(()) }));
        assert_eq!(count(&dropped, "lane_full"), 1);
        // Each waits at most the deadline, counted from hand-over, queued or in flight.
        tokio::time::sleep(Duration::from_millis(299)).await;
        assert_eq!(count(&dropped, "timeout"), 0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(count(&dropped, "timeout"), 3);
        // The room is free again.
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(lane.submit("e4".into(), async move {
            let _ = tx.send(());
            Ok(())
        }));
        rx.await.unwrap();
        assert_eq!(count(&dropped, "lane_full"), 1);
    }

    #[tokio::test]
    async fn a_refused_event_is_counted() {
        let dropped = counter();
        let lane = EventLane::new(dropped.clone());
        assert!(lane.submit("e".into(), async { Err("forbidden".to_string()) }));
        // The lane's task gives its room back after counting, so a full room means it is done.
        while lane.room.available_permits() < CAPACITY {
            tokio::task::yield_now().await;
        }
        assert_eq!(count(&dropped, "rejected"), 1);
    }
}
