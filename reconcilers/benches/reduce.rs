//! Reduce throughput: a synthetic run of 1,000 pods through create → ready → delete is
//! generated once with the testkit World (so every outcome is a realistic one), then only
//! `reduce` is timed over those envelopes on a fresh State. Goal: ≥ 1,000,000 events/s.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use reconcilers::testkit::{pod, World};
use reconcilers::{reduce, Config, Envelope, State};

fn generate(pods: usize) -> Vec<Envelope> {
    let mut w = World::new(Config::default());
    w.start(vec![], vec![]);
    for i in 0..pods {
        w.apply(
            pod("bench", &format!("p{i}"))
                .managed()
                .run("ubuntu:24.04")
                .build(),
        );
    }
    w.run_for(2_000);
    let ready = w
        .api
        .pods
        .values()
        .filter(|p| {
            p.status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .count();
    assert_eq!(
        ready, pods,
        "every pod reaches Ready before the delete phase"
    );
    let keys: Vec<_> = w.api.pods.keys().cloned().collect();
    for k in &keys {
        w.delete_pod(k);
    }
    w.run_for(2_000);
    assert!(
        w.api.pods.is_empty() && w.state.pods.is_empty(),
        "every pod deleted"
    );
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    w.log.into_iter().map(|(e, _)| e).collect()
}

fn bench(c: &mut Criterion) {
    let envelopes = generate(1_000);
    let mut g = c.benchmark_group("reduce");
    g.throughput(Throughput::Elements(envelopes.len() as u64));
    g.sample_size(20);
    g.bench_function("1000 pods create-ready-delete", |b| {
        b.iter_batched(
            || (State::new(Config::default()), envelopes.clone()),
            |(mut state, envs)| {
                let mut n = 0usize;
                for e in envs {
                    n += reduce(&mut state, e).len();
                }
                n
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
