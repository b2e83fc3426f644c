//! Every retry schedule of the core is one of these: a first wait that grows by a fixed factor
//! up to a cap. The wait depends only on how many tries failed, so a schedule needs no state
//! beyond that count and replays identically.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Growth {
    /// ×2 per failure.
    Double,
    /// ×1.5 per failure, truncated to the unit at each step (so 100, 150, 225, 337.5 … ms
    /// kept in µs stays exact until the cap).
    ThreeHalves,
}

/// A retry schedule, in whatever unit `first` and `max` are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: u64,
    pub growth: Growth,
    pub max: u64,
}

impl Backoff {
    pub const fn doubling(first: u64, max: u64) -> Self {
        Self {
            first,
            growth: Growth::Double,
            max,
        }
    }

    pub const fn three_halves(first: u64, max: u64) -> Self {
        Self {
            first,
            growth: Growth::ThreeHalves,
            max,
        }
    }

    /// The wait after the `failures`-th consecutive failure (the first failure waits `first`).
    /// `0` is treated as `1`.
    pub fn after(&self, failures: u32) -> u64 {
        let mut wait = self.first.min(self.max);
        for _ in 1..failures.max(1) {
            if wait >= self.max {
                break;
            }
            wait = match self.growth {
                Growth::Double => wait.saturating_mul(2),
                Growth::ThreeHalves => wait.saturating_mul(3) / 2,
            }
            .min(self.max);
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

    #[test]
    fn doubling_grows_to_its_cap_and_stays() {
        let b = Backoff::doubling(500, 15_000);
        let waits: Vec<u64> = (1..=8).map(|n| b.after(n)).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 15_000, 15_000, 15_000]);
        assert_eq!(b.after(0), 500);
        assert_eq!(b.after(u32::MAX), 15_000);
    }

    #[test]
    fn three_halves_keeps_the_probe_series_exact() {
        let b = Backoff::three_halves(100_000, 1_000_000);
        let waits: Vec<u64> = (1..=8).map(|n| b.after(n)).collect();
        assert_eq!(
            waits,
            [100_000, 150_000, 225_000, 337_500, 506_250, 759_375, 1_000_000, 1_000_000]
        );
    }

    #[test]
    fn a_first_wait_above_the_cap_is_capped() {
        assert_eq!(Backoff::doubling(10, 5).after(1), 5);
    }
}
