//! Profiling aid for the reduce benchmark: the same 1,000-pod workload, reduced on a fresh
//! State `N` times (argument, default 1); prints the best time and the event mix.
//!
//! ```text
//! cargo build --release -p reconcilers --features testkit --example reduce_profile
//! valgrind --tool=callgrind --toggle-collect='reduce_profile::run' \
//!     target/release/examples/reduce_profile
//! ```
//!
//! `ENVELOPES=file` reads the workload from that JSON file, writing it first if it is
//! missing (generating it under valgrind takes minutes). `FINGERPRINT=1` prints a hash of
//! every envelope and the actions reduce returns for it: a refactor that is meant to keep
//! behaviour must keep the hash. `DROP_ONLY=1` also times consuming the inputs without
//! reducing them (the floor any reduce pays); `BREAKDOWN=1` times each event kind alone.

use std::collections::BTreeMap;
use std::time::Instant;

use reconcilers::testkit::{create_ready_delete, render};
use reconcilers::{reduce, Config, Envelope, State};
use sha2::{Digest, Sha256};

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let envelopes = workload();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in &envelopes {
        let r = render::event(&e.event);
        let k = r.split([' ', '(', '{']).next().unwrap_or("").to_string();
        *kinds.entry(k).or_default() += 1;
    }
    eprintln!("{} envelopes: {kinds:?}", envelopes.len());
    if std::env::var_os("FINGERPRINT").is_some() {
        eprintln!("fingerprint {}", fingerprint(&envelopes));
    }
    if std::env::var_os("DROP_ONLY").is_some() {
        // The floor: only consuming (dropping) the cold input, in reduce's order.
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let input = envelopes.clone();
            let t = Instant::now();
            for e in input {
                drop(std::hint::black_box(e));
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        eprintln!("drop only: best {:.2} ms", best * 1e3);
    }
    if std::env::var_os("BREAKDOWN").is_some() {
        breakdown(&envelopes, rounds);
    }
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let input = envelopes.clone();
        let mut state = State::new(Config::default());
        let t = Instant::now();
        let n = run(&mut state, input);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(n);
    }
    eprintln!(
        "best {:.2} ms, {:.3} M events/s",
        best * 1e3,
        envelopes.len() as f64 / best / 1e6
    );
}

/// The benchmark's workload, decoded from JSON as the benchmark does (`RAW=1`: as the World
/// built it). `ENVELOPES=file`: read from that file, written first if it is missing.
fn workload() -> Vec<Envelope> {
    let path = std::env::var("ENVELOPES").ok();
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return serde_json::from_slice(&bytes).expect("envelopes");
    }
    let envelopes = create_ready_delete(1_000);
    if std::env::var_os("RAW").is_some() {
        return envelopes;
    }
    let json = serde_json::to_vec(&envelopes).unwrap();
    drop(envelopes);
    if let Some(p) = path {
        std::fs::write(p, &json).expect("write");
    }
    serde_json::from_slice(&json).unwrap()
}

/// The timed region, kept out of line so callgrind can collect it alone.
#[inline(never)]
fn run(state: &mut State, input: Vec<Envelope>) -> usize {
    let mut n = 0usize;
    for e in input {
        n += reduce(state, e).len();
    }
    n
}

fn fingerprint(envelopes: &[Envelope]) -> String {
    let mut h = Sha256::new();
    let mut state = State::new(Config::default());
    for e in envelopes {
        h.update(serde_json::to_string(e).unwrap());
        h.update(serde_json::to_string(&reduce(&mut state, e.clone())).unwrap());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Best time per event kind over `rounds` runs (each event timed alone).
fn breakdown(envelopes: &[Envelope], rounds: usize) {
    let kinds: Vec<String> = envelopes
        .iter()
        .map(|e| {
            let r = render::event(&e.event);
            r.split([' ', '(', '{']).next().unwrap_or("").to_string()
        })
        .collect();
    let mut best: BTreeMap<&str, f64> = BTreeMap::new();
    for _ in 0..rounds {
        let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
        let mut state = State::new(Config::default());
        for (e, k) in envelopes.iter().cloned().zip(&kinds) {
            let t = Instant::now();
            std::hint::black_box(reduce(&mut state, e));
            *sums.entry(k).or_default() += t.elapsed().as_secs_f64();
        }
        for (k, v) in sums {
            let b = best.entry(k).or_insert(f64::MAX);
            *b = b.min(v);
        }
    }
    for (k, v) in best {
        eprintln!("  {k:>16} {:8.2} ms", v * 1e3);
    }
}
