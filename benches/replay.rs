//! Journal costs on a synthetic run: 1,000 pods through create → ready → delete, made with
//! the testkit World and journaled by the daemon's writer.
//!
//! - `journal/write`: what the loop pays per event (serialize + sha256 ×2 + one write(2)).
//! - `journal/read+chain`: parse every line and check every hash and link.
//! - `journal/replay --verify`: the above plus reduce and the action comparison — what
//!   `vk-cocoon replay --verify` does, minus printing.
//! - `journal/reduce only`: the reducer over the same envelopes, for scale.

#[path = "../tests/support/scenarios.rs"]
#[allow(dead_code)]
mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use reconcilers::{reduce, Action, Config, Envelope, State};
use vk_cocoon::journal::{existing_files, write_run, Journal, JournalSettings, Reader};
use vk_cocoon::replay::{self, Options};

const PODS: usize = 1_000;
const CREATED_AT: i64 = 1_777_600_000_000;

fn settings(dir: &std::path::Path) -> JournalSettings {
    // The daemon's defaults: 64 MiB files, 8 kept.
    JournalSettings {
        path: dir.join("events.journal"),
        max_bytes: 64 << 20,
        max_age_ms: i64::MAX,
        files: 8,
    }
}

fn bench(c: &mut Criterion) {
    let w = scenarios::churn(PODS);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert!(
        w.api.pods.is_empty() && w.state.pods.is_empty(),
        "every pod created and deleted"
    );
    let log: Vec<(Envelope, Vec<Action>)> = w.log;
    let events = log.len() as u64;
    let config = Config::default();

    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path());
    write_run(&s, &config, CREATED_AT, &log).unwrap();
    let files: Vec<PathBuf> = existing_files(&s.path, s.files);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    eprintln!(
        "journal of {PODS} pods: {events} events, {} actions, {} files, {:.1} MiB ({} bytes/event)",
        log.iter().map(|(_, a)| a.len()).sum::<usize>(),
        files.len(),
        bytes as f64 / (1 << 20) as f64,
        bytes / events
    );

    let mut g = c.benchmark_group("journal");
    g.throughput(Throughput::Elements(events));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));

    g.bench_function("write", |b| {
        b.iter_batched(
            || {
                let d = tempfile::tempdir().unwrap();
                let st = State::new(config.clone());
                let j = Journal::open_at(&settings(d.path()), &config, &st, CREATED_AT).unwrap();
                (d, j)
            },
            |(d, mut j)| {
                // No rotation inside the timed loop beyond what 64 MiB files need; the
                // states a rotation snapshots are not re-derived here.
                for (env, actions) in &log {
                    j.record(env, actions).unwrap();
                }
                (d, j)
            },
            BatchSize::PerIteration,
        )
    });

    g.bench_function("read+chain", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for entry in Reader::open(&files).unwrap() {
                std::hint::black_box(entry.unwrap());
                n += 1;
            }
            assert!(n as u64 > events);
        })
    });

    g.bench_function("replay --verify", |b| {
        let opts = Options {
            files: files.clone(),
            verify: true,
            quiet: true,
            ..Options::default()
        };
        b.iter(|| {
            let (summary, _) = replay::run(&opts, &mut std::io::sink()).unwrap();
            assert_eq!(summary.steps, events);
        })
    });

    let envelopes: Vec<Envelope> = log.iter().map(|(e, _)| e.clone()).collect();
    g.bench_function("reduce only", |b| {
        b.iter_batched(
            || (State::new(config.clone()), envelopes.clone()),
            |(mut state, envs)| {
                for e in envs {
                    std::hint::black_box(reduce(&mut state, e));
                }
                state
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
