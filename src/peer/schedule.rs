//! The order a restore fetches slices in.

use std::collections::VecDeque;

use super::client::{MAX_STREAMS, STREAMS_PER_FILE};
use super::plan::Slice;

/// Which slice to start next: round-robin over files, at most `MAX_STREAMS` in flight and
/// `STREAMS_PER_FILE` per file, each file's slices in order.
pub(super) struct Schedule {
    pending: Vec<VecDeque<Slice>>,
    in_flight: Vec<usize>,
    total: usize,
    cursor: usize,
}

impl Schedule {
    pub(super) fn new(slices: Vec<Vec<Slice>>) -> Schedule {
        let n = slices.len();
        Schedule {
            pending: slices.into_iter().map(VecDeque::from).collect(),
            in_flight: vec![0; n],
            total: 0,
            cursor: 0,
        }
    }

    pub(super) fn next(&mut self) -> Option<(usize, Slice)> {
        if self.total >= MAX_STREAMS {
            return None;
        }
        let n = self.pending.len();
        let i = (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&i| !self.pending[i].is_empty() && self.in_flight[i] < STREAMS_PER_FILE)?;
        let slice = self.pending[i].pop_front().expect("checked non-empty");
        self.in_flight[i] += 1;
        self.total += 1;
        self.cursor = (i + 1) % n;
        Some((i, slice))
    }

    pub(super) fn done(&mut self, i: usize) {
        self.in_flight[i] -= 1;
        self.total -= 1;
    }
}
