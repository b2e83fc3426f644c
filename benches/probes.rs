//! The ICMP probe path at 1,000 guests pinged once a second: process CPU time per round and
//! reply latency. The guests are 1,000 loopback addresses (127.1.x.y), which the kernel
//! answers itself; nothing leaves the machine. Each probe is a task of its own that sleeps
//! until its turn and pings with the daemon's 3 s deadline, as `Probes::schedule` does.
//!
//! `make bench-probes`; PROBE_BENCH_GUESTS and PROBE_BENCH_ROUNDS change the size.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vk_cocoon::effects::icmp::{Icmp, Kind};

const DEADLINE: Duration = Duration::from_secs(3);
const PERIOD: Duration = Duration::from_secs(1);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User plus system time of the whole process (every thread: the runtime's workers, the
/// receive thread, and the kernel's loopback work done inside our send calls).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn targets(n: usize) -> Vec<Ipv4Addr> {
    let ips: Vec<Ipv4Addr> = (0..n)
        .map(|i| Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250) as u8 + 1))
        .collect();
    assert!(n <= 250 * 256 && ips.iter().all(|ip| ip.is_loopback()));
    ips
}

#[derive(Clone, Copy)]
enum Pace {
    /// Each guest at its own offset within the second, as pods created over time are.
    Spread,
    /// Every guest at the same instant: the worst case for the one receive thread.
    Burst,
}

#[derive(Default)]
struct Tally {
    rounds: u32,
    cpu: Duration,
    wall: Duration,
    rtts: Vec<Duration>,
    failed: usize,
}

/// `None`: the tasks and timers alone, without a ping: what the harness itself costs.
async fn round(icmp: Option<&Arc<Icmp>>, targets: &[Ipv4Addr], pace: Pace, tally: &mut Tally) {
    let started = Instant::now();
    let cpu = cpu_time();
    let n = targets.len() as u32;
    let probes: Vec<_> = targets
        .iter()
        .zip(0u32..)
        .map(|(&ip, i)| {
            let icmp = icmp.cloned();
            let after = match pace {
                Pace::Spread => PERIOD * i / n,
                Pace::Burst => Duration::ZERO,
            };
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                match icmp {
                    Some(icmp) => icmp.ping(ip, DEADLINE).await,
                    None => Ok(Duration::ZERO),
                }
            })
        })
        .collect();
    for p in probes {
        match p.await.expect("probe task") {
            Ok(rtt) => tally.rtts.push(rtt),
            Err(_) => tally.failed += 1,
        }
    }
    tally.cpu += cpu_time() - cpu;
    tally.wall += started.elapsed();
    tally.rounds += 1;
    // The next round starts a period after this one did.
    tokio::time::sleep_until((started + PERIOD).into()).await;
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn label(kind: Option<Kind>) -> &'static str {
    match kind {
        Some(Kind::Raw) => "raw",
        Some(Kind::Datagram) => "datagram",
        None => "none (tasks and timers alone)",
    }
}

async fn bench(kind: Option<Kind>, pace: Pace, targets: &[Ipv4Addr], rounds: u32) {
    let icmp = match kind.map(Icmp::open) {
        None => None,
        Some(Ok(icmp)) => Some(Arc::new(icmp)),
        Some(Err(e)) => {
            println!("| {} | skipped: {e} |", label(kind));
            return;
        }
    };
    let mut warmup = Tally::default();
    round(icmp.as_ref(), targets, pace, &mut warmup).await;
    let mut t = Tally::default();
    for _ in 0..rounds {
        round(icmp.as_ref(), targets, pace, &mut t).await;
    }
    t.rtts.sort();
    let resent = t
        .rtts
        .iter()
        .filter(|r| **r >= Duration::from_secs(1))
        .count();
    let cpu_per_round = t.cpu / t.rounds;
    let share = t.cpu.as_secs_f64() / (f64::from(t.rounds) * PERIOD.as_secs_f64()) * 100.0;
    println!(
        "| {} | {} | {} | {} | {} ms | {share:.1} % | {} ms | {} ms | {} ms | {resent} | {} |",
        label(kind),
        match pace {
            Pace::Spread => "spread over 1 s",
            Pace::Burst => "burst",
        },
        targets.len(),
        t.rounds,
        ms(cpu_per_round),
        ms(quantile(&t.rtts, 0.50)),
        ms(quantile(&t.rtts, 0.99)),
        ms(t.rtts.last().copied().unwrap_or_default()),
        t.failed,
    );
}

fn main() {
    let guests = env_or("PROBE_BENCH_GUESTS", 1000);
    let rounds = env_or("PROBE_BENCH_ROUNDS", 10) as u32;
    let targets = targets(guests);
    // The daemon's runtime: one worker per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        println!("| socket | pace | guests | rounds | CPU per round | CPU per second of probing (one core) | p50 | p99 | max | replies after a resend | failed |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for kind in [None, Some(Kind::Raw), Some(Kind::Datagram)] {
            for pace in [Pace::Spread, Pace::Burst] {
                bench(kind, pace, &targets, rounds).await;
            }
        }
    });
}
