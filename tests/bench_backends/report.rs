//! The bench's printout: what was timed by hand, the daemon's cocoon calls, where each pod's
//! time went, and the one table of the run.

use std::collections::BTreeMap;

use e2e::daemon::percentile;

use super::journal_times::{spans, JournalFigures, PodTimes};

pub fn p50_p99(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    format!("{:.0} / {:.0}", percentile(v, 0.5), percentile(v, 0.99))
}

/// The steps timed by hand, then each cocoon verb's calls and the probes.
pub fn calls(by_hand: &[(String, f64)], figures: &JournalFigures) {
    if !by_hand.is_empty() {
        println!("\n  by hand before the daemon started (ms):");
        let mut grouped: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (step, ms) in by_hand {
            grouped.entry(step).or_default().push(*ms);
        }
        for (step, v) in grouped {
            let v: Vec<String> = v.iter().map(|ms| format!("{ms:.0}")).collect();
            println!("    {step}: {}", v.join(", "));
        }
    }
    println!(
        "\n  cocoon calls by the daemon (ms per call): verb, ok calls, p50 / p99, max, failed"
    );
    for (v, ms) in &figures.calls {
        println!(
            "    {v}: {}, {}, {:.0}, {}",
            ms.len(),
            p50_p99(ms),
            ms.last().copied().unwrap_or(f64::NAN),
            figures.failed_calls.get(v).copied().unwrap_or(0)
        );
    }
    for (v, n) in figures
        .failed_calls
        .iter()
        .filter(|(v, _)| !figures.calls.contains_key(*v))
    {
        println!("    {v}: 0 ok, {n} failed");
    }
    let (probes_ok, probes_failed) = &figures.probes;
    println!(
        "    probes answered (due → answer): {}, {}; failed (due → given up): {}, {}",
        probes_ok.len(),
        p50_p99(probes_ok),
        probes_failed.len(),
        p50_p99(probes_failed)
    );
}

/// Per stage of a pod's bring-up, p50 / p99 for the run pods and the clone pods.
pub fn stages(run: &[&PodTimes], clone: &[&PodTimes]) {
    type At = fn(&PodTimes) -> Option<i64>;
    let stages: [(&str, At, At); 7] = [
        (
            "create → seen by the daemon",
            |p| Some(p.created),
            |p| p.seen,
        ),
        (
            "seen → VM call sent (snapshot lookups, image pull)",
            |p| p.seen,
            |p| p.vm_call,
        ),
        (
            "VM call (vm run / vm clone)",
            |p| p.vm_call,
            |p| p.vm_running,
        ),
        ("VM running → Ready", |p| p.vm_running, |p| p.ready),
        (
            "VM running → PostCloneExecExhausted Warning",
            |p| p.vm_running,
            |p| p.warned,
        ),
        (
            "VM running → lifecycle failed written",
            |p| p.vm_running,
            |p| p.failed,
        ),
        (
            "create → lifecycle failed written",
            |p| Some(p.created),
            |p| p.failed,
        ),
    ];
    println!("\n  where the time goes per pod (ms, p50 / p99): stage | run | clone");
    for (stage, from, to) in stages {
        let (r, c) = (spans(run, from, to), spans(clone, from, to));
        if !r.is_empty() || !c.is_empty() {
            println!("    {stage} | {} | {}", p50_p99(&r), p50_p99(&c));
        }
    }
}

/// One row per mode: (name, its pods, whether the backend never makes them Ready).
pub fn table(backend: &str, modes: &[(&str, &[&PodTimes], bool)]) {
    let mut rows = Vec::new();
    for (mode, group, never_ready) in modes.iter().copied() {
        if group.is_empty() {
            continue;
        }
        let created_at = |p: &PodTimes| Some(p.created);
        let running = spans(group, created_at, |p| p.vm_running);
        let ready = spans(group, created_at, |p| p.ready);
        let ready_cell = match (ready.is_empty(), never_ready) {
            (true, true) => "n/a (tier S)".to_string(),
            (true, false) => "none Ready".to_string(),
            (false, _) => format!("{} ({} Ready)", p50_p99(&ready), ready.len()),
        };
        rows.push(format!(
            "| {backend} | {} | {} | {} ({} running) | {ready_cell} |",
            mode,
            group.len(),
            p50_p99(&running),
            running.len()
        ));
    }
    println!("\n| backend | mode | N | create → VM running p50 / p99 (ms) | create → Ready p50 / p99 (ms) |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
