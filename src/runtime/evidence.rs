//! The journal as evidence, not as a dependency (F3). A journal that cannot be opened or
//! written must not stop the node: pods keep being served, the steps in between are counted as
//! lost, and the journal is tried again with backoff. Journaling again starts with a `resume`
//! header holding the loop's state, so the journal stays replayable across the gap.

use std::time::Duration;

use reconcilers::{Action, Config, Envelope, State};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::journal::{Journal, JournalSettings};
use crate::metrics::JournalMetrics;

/// Backoff between attempts to journal again: quick for a passing fault, then at most one
/// attempt (and one log line) per 30 s for as long as the fault lasts.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
const RETRY: Backoff = Backoff::doubling(RETRY_FIRST, RETRY_MAX);

pub struct Evidence {
    settings: JournalSettings,
    config: Config,
    journal: Option<Journal>,
    /// Set while the journal is down: when to try again.
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// This process has written a header (its `open`, or a `resume`).
    attached_once: bool,
    /// Steps not journaled since the journal went down.
    lost: u64,
    metrics: JournalMetrics,
}

impl Evidence {
    /// Opens the journal for a process whose loop has reduced nothing yet. Failing is logged,
    /// never fatal.
    pub fn start(
        settings: JournalSettings,
        config: &Config,
        state: &State,
        metrics: JournalMetrics,
        now: Instant,
    ) -> Evidence {
        let mut e = Evidence {
            settings,
            config: config.clone(),
            journal: None,
            retry_at: None,
            backoff: RETRY,
            attached_once: false,
            lost: 0,
            metrics,
        };
        e.attach(state, 0, now);
        e
    }

    pub fn is_up(&self) -> bool {
        self.journal.is_some()
    }

    /// When the loop should call [`Evidence::retry`] while no event arrives; `None` while up.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Tries to journal again if the backoff has run out. `state` is the loop's state now and
    /// `seq` the last event it reduced (0: none yet).
    pub fn retry(&mut self, state: &State, seq: u64, now: Instant) {
        if self.retry_at.is_some_and(|at| now >= at) {
            self.attach(state, seq, now);
        }
    }

    /// Journals one reduce step (`state` is the state it left), or counts it lost.
    pub fn record(
        &mut self,
        envelope: &Envelope,
        actions: &[Action],
        reduce_us: u64,
        state: &State,
        now: Instant,
    ) {
        let Some(j) = self.journal.as_mut() else {
            self.lost += 1;
            self.metrics.records_dropped.inc();
            return;
        };
        if let Err(e) = j.record_timed(envelope, actions, reduce_us) {
            self.lost += 1;
            self.metrics.records_dropped.inc();
            self.down(&e, now);
            return;
        }
        // The step is journaled; a rotation that fails after it loses nothing yet.
        if let Err(e) = j.rotate_if_needed(state) {
            self.down(&e, now);
        }
    }

    fn attach(&mut self, state: &State, seq: u64, now: Instant) {
        let s = &self.settings;
        // A process that has lost nothing yet opens as any process does; otherwise the header
        // says that steps are missing before it.
        let attached = if !self.attached_once && seq == 0 {
            Journal::open(s, &self.config, state)
        } else {
            Journal::resume(s, &self.config, state, (seq > 0).then_some(seq))
        };
        match attached {
            Ok(j) => {
                if self.attached_once || self.lost > 0 {
                    tracing::info!(
                        journal = %s.path.display(),
                        not_journaled = self.lost,
                        "journaling again; the steps in between are missing from the journal"
                    );
                }
                self.journal = Some(j);
                self.attached_once = true;
                self.retry_at = None;
                self.backoff.reset();
                self.lost = 0;
                self.metrics.up.set(1);
            }
            Err(e) => {
                self.metrics.write_errors.inc();
                self.metrics.up.set(0);
                tracing::error!(
                    journal = %s.path.display(),
                    error = format!("{e:#}"),
                    retry_in = ?self.backoff.next_wait(),
                    "cannot open the journal; running without it and trying again"
                );
                self.schedule_retry(now);
            }
        }
    }

    fn down(&mut self, e: &anyhow::Error, now: Instant) {
        self.journal = None;
        self.metrics.write_errors.inc();
        self.metrics.up.set(0);
        self.backoff.reset();
        tracing::error!(
            journal = %self.settings.path.display(),
            error = format!("{e:#}"),
            "journal write failed; running without it and trying again"
        );
        self.schedule_retry(now);
    }

    fn schedule_retry(&mut self, now: Instant) {
        self.retry_at = Some(now + self.backoff.failed());
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use reconcilers::{reduce, Event};

    use super::*;
    use crate::journal::{existing_files, Entry, Reader, Start};
    use crate::metrics::Metrics;

    fn envelope(seq: u64) -> Envelope {
        Envelope {
            seq,
            at: 1_777_600_000_000 + seq as i64,
            event: Event::PodRelistBegin,
        }
    }

    struct Run {
        evidence: Evidence,
        state: State,
        seq: u64,
        metrics: Metrics,
        now: Instant,
    }

    impl Run {
        fn start(settings: JournalSettings) -> Run {
            let config = Config::default();
            let state = State::new(config.clone());
            let metrics = Metrics::new();
            let now = Instant::now();
            let evidence = Evidence::start(settings, &config, &state, metrics.journal.clone(), now);
            Run {
                evidence,
                state,
                seq: 0,
                metrics,
                now,
            }
        }

        fn step(&mut self) {
            self.seq += 1;
            let env = envelope(self.seq);
            let actions = reduce(&mut self.state, env.clone());
            self.evidence
                .record(&env, &actions, 0, &self.state, self.now);
        }

        fn later(&mut self, d: Duration) {
            self.now += d;
            self.evidence.retry(&self.state, self.seq, self.now);
        }

        fn figures(&self) -> (i64, u64, u64) {
            let j = &self.metrics.journal;
            (j.up.get(), j.write_errors.get(), j.records_dropped.get())
        }
    }

    fn settings(path: PathBuf) -> JournalSettings {
        JournalSettings {
            path,
            max_bytes: 1 << 20,
            max_age_ms: i64::MAX,
            files: 4,
        }
    }

    fn headers(files: &[PathBuf]) -> Vec<(Start, Option<u64>)> {
        Reader::open(files)
            .unwrap()
            .filter_map(|e| match e.unwrap() {
                Entry::Header { header, .. } => Some((header.start, header.after_seq)),
                Entry::Step { .. } => None,
            })
            .collect()
    }

    fn verify(files: &[PathBuf]) -> crate::replay::Summary {
        let opts = crate::replay::Options {
            files: files.to_vec(),
            verify: true,
            quiet: true,
            ..Default::default()
        };
        crate::replay::run(&opts, &mut std::io::sink())
            .map(|(s, _)| s)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_journal_that_cannot_be_opened_is_tried_again_with_backoff() {
        let dir = tempfile::tempdir().unwrap();
        // A full disk or a broken mount, reduced to its effect: the directory cannot be made.
        let blocker = dir.path().join("journal");
        fs::write(&blocker, b"").unwrap();
        let s = settings(blocker.join("events.journal"));
        let mut run = Run::start(s.clone());
        assert!(!run.evidence.is_up());
        assert_eq!(run.figures(), (0, 1, 0));
        assert_eq!(run.evidence.retry_at(), Some(run.now + RETRY_FIRST));
        for _ in 0..3 {
            run.step();
        }
        assert_eq!(run.figures(), (0, 1, 3));
        // Still failing: the wait doubles.
        run.later(RETRY_FIRST);
        assert_eq!(run.figures(), (0, 2, 3));
        assert_eq!(run.evidence.retry_at(), Some(run.now + 2 * RETRY_FIRST));
        // Not yet due: no attempt.
        run.later(RETRY_FIRST);
        assert_eq!(run.figures(), (0, 2, 3));
        fs::remove_file(&blocker).unwrap();
        run.later(RETRY_FIRST);
        assert!(run.evidence.is_up());
        assert_eq!(run.figures(), (1, 2, 3));
        run.step();
        run.step();
        // The file starts where journaling did: after seq 3, from the loop's state then.
        let files = existing_files(&s.path, s.files);
        assert_eq!(headers(&files), vec![(Start::Resume, Some(3))]);
        let summary = verify(&files);
        assert_eq!((summary.steps, summary.gaps), (2, 1));
    }

    #[test]
    fn the_backoff_stops_growing_at_thirty_seconds() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("journal");
        fs::write(&blocker, b"").unwrap();
        let mut run = Run::start(settings(blocker.join("events.journal")));
        let mut waits = Vec::new();
        for _ in 0..8 {
            let at = run.evidence.retry_at().unwrap();
            waits.push((at - run.now).as_secs());
            run.later(at - run.now);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn a_failed_write_loses_its_step_only_until_the_journal_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path().join("events.journal"));
        let mut run = Run::start(s.clone());
        assert_eq!(run.figures(), (1, 0, 0));
        run.step();
        run.step();
        // The disk fills up under the open file.
        let full = fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        run.evidence
            .journal
            .as_mut()
            .unwrap()
            .swap_file_for_test(full);
        run.step();
        assert_eq!(run.figures(), (0, 1, 1));
        run.step();
        assert_eq!(run.figures(), (0, 1, 2));
        run.later(RETRY_FIRST);
        assert_eq!(run.figures(), (1, 1, 2));
        run.step();
        run.step();
        // One file: the process's start, its first two steps, then journaling again after
        // seq 4 with the state the loop had reached.
        let files = existing_files(&s.path, s.files);
        assert_eq!(files, vec![s.path.clone()]);
        assert_eq!(
            headers(&files),
            vec![(Start::Open, None), (Start::Resume, Some(4))]
        );
        let summary = verify(&files);
        assert_eq!((summary.steps, summary.gaps), (4, 1));
    }

    #[test]
    fn a_journal_that_never_lost_a_step_opens_as_a_plain_start() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("journal");
        fs::write(&blocker, b"").unwrap();
        let s = settings(blocker.join("events.journal"));
        let mut run = Run::start(s.clone());
        fs::remove_file(&blocker).unwrap();
        // Back before the loop reduced anything: nothing is missing.
        run.later(RETRY_FIRST);
        run.step();
        let files = existing_files(&s.path, s.files);
        assert_eq!(headers(&files), vec![(Start::Open, None)]);
        assert_eq!(verify(&files).gaps, 0);
    }
}
