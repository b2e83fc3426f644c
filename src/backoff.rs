//! The shell's retry waits: the core's schedule (`reconcilers::backoff`, a first wait growing by
//! a fixed factor up to a cap) counted in milliseconds, plus the count of failures in a row that
//! the shell's loops keep for themselves. One schedule for both sides, so a wait means the same
//! thing wherever it is read.

use std::time::Duration;

use reconcilers::backoff::Backoff as Schedule;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    schedule: Schedule,
    failures: u32,
}

impl Backoff {
    /// Waits `first`, then twice as long after each further failure, never more than `max`.
    pub const fn doubling(first: Duration, max: Duration) -> Self {
        Self {
            schedule: Schedule::doubling(first.as_millis() as u64, max.as_millis() as u64),
            failures: 0,
        }
    }

    /// The wait the next failure will take.
    pub fn next_wait(&self) -> Duration {
        Duration::from_millis(self.schedule.after(self.failures.saturating_add(1)))
    }

    /// Counts a failure and returns its wait.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next_wait();
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// A success: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_a_reset_starts_over() {
        let mut b = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(7));
        let waits: Vec<u64> = (0..8).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
        assert_eq!(b.next_wait(), Duration::from_secs(7));
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(200));
        assert_eq!(b.failed(), Duration::from_millis(200));
    }
}
