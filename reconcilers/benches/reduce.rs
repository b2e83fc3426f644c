//! Reduce throughput: a synthetic run of 1,000 pods through create → ready → delete is
//! generated once with the testkit World (so every outcome is a realistic one), then only
//! `reduce` is timed over those envelopes on a fresh State. Goal: ≥ 1,000,000 events/s.
//! `examples/reduce_profile.rs` runs the same workload for callgrind.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use reconcilers::testkit::create_ready_delete;
use reconcilers::{reduce, Config, Envelope, State};

fn bench(c: &mut Criterion) {
    // Decoded from JSON, as the daemon decodes what it receives, not used as the World built
    // them: the World's run leaves its objects scattered through a heap it then frees, and
    // with those inputs freeing the per-iteration clones alone (no reduce at all) takes ~45 ms
    // of a ~125 ms iteration (`DROP_ONLY=1 RAW=1 examples/reduce_profile`). That is the
    // generator's footprint in glibc's heap, not reduce's work; decoded, the same inputs
    // drop in ~16 ms.
    let json = serde_json::to_vec(&create_ready_delete(1_000)).expect("encode");
    let envelopes: Vec<Envelope> = serde_json::from_slice(&json).expect("decode");
    drop(json);
    let mut g = c.benchmark_group("reduce");
    g.throughput(Throughput::Elements(envelopes.len() as u64));
    g.sample_size(20);
    // The envelopes are cloned in the untimed setup. Each one is moved into `reduce`, which
    // owns and drops it (as in the daemon), and the actions are dropped as they come back;
    // the final State is returned so criterion drops it outside the timed region.
    g.bench_function("1000 pods create-ready-delete", |b| {
        b.iter_batched(
            || (State::new(Config::default()), envelopes.clone()),
            |(mut state, envs)| {
                let mut n = 0usize;
                for e in envs {
                    n += reduce(&mut state, e).len();
                }
                (n, state)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
