//! `replay --html` on a journal of ≥ 100,000 events: 5,000 pods through create → ready →
//! delete, in waves of 100, made with the testkit World and journaled by the daemon's writer.
//! Prints the journal's and the page's sizes and the render time, then reads the page back
//! with an HTML parser and checks it has one row per pod. Too slow for a debug test run
//! (tests/replay_html.rs renders a tenth of it there); `cargo bench -j2 --bench replay_html`.

#[path = "../tests/support/scenarios.rs"]
#[allow(dead_code)]
mod scenarios;

use std::time::Instant;

use scraper::{Html, Selector};
use vk_cocoon::journal::{write_run, JournalSettings};
use vk_cocoon::replay::{self, Options};

const WAVES: usize = 50;
const PER_WAVE: usize = 100;
const CREATED_AT: i64 = 1_777_600_000_000;

fn main() {
    let t = Instant::now();
    let w = scenarios::churn_waves(WAVES, PER_WAVE);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    let events = w.log.len();
    assert!(events >= 100_000, "{events} events");
    let dir = tempfile::tempdir().unwrap();
    let settings = JournalSettings {
        path: dir.path().join("events.journal"),
        max_bytes: u64::MAX,
        max_age_ms: i64::MAX,
        files: 1,
    };
    write_run(&settings, &w.state.config, CREATED_AT, &w.log).unwrap();
    let journal_bytes = std::fs::metadata(&settings.path).unwrap().len();
    let made = t.elapsed();

    let opts = Options {
        files: vec![settings.path.clone()],
        html: true,
        ..Default::default()
    };
    // Best of three, as the binary does it: read, check the chain, reduce, sort into rows,
    // write the page.
    let mut best = None;
    let mut page = Vec::new();
    for _ in 0..3 {
        page.clear();
        let t = Instant::now();
        let (summary, _) = replay::run(&opts, &mut page).unwrap();
        let took = t.elapsed();
        assert_eq!(summary.steps as usize, events);
        best = Some(best.map_or(took, |b: std::time::Duration| b.min(took)));
    }
    let rendered = best.unwrap();
    // The timeline of the same journal, for scale.
    let text_opts = Options {
        html: false,
        ..opts.clone()
    };
    let mut timeline = Vec::new();
    let t = Instant::now();
    replay::run(&text_opts, &mut timeline).unwrap();
    let timeline_took = t.elapsed();

    let html = String::from_utf8(page).unwrap();
    let t = Instant::now();
    let doc = Html::parse_document(&html);
    let parsed = t.elapsed();
    let rows = doc
        .select(&Selector::parse("details[data-pod]").unwrap())
        .count();
    assert_eq!(rows, WAVES * PER_WAVE);
    let folded = html.matches("<em>×").count();

    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "journal: {events} events, {} pods, {:.1} MiB (made in {made:.1?})",
        WAVES * PER_WAVE,
        mib(journal_bytes as usize)
    );
    println!(
        "replay --html: page {:.1} MiB ({} bytes/event) in {rendered:.2?} ({:.0} events/s); \
         {folded} folded entries",
        mib(html.len()),
        html.len() / events,
        events as f64 / rendered.as_secs_f64()
    );
    println!(
        "replay (text timeline, for scale): {:.1} MiB in {timeline_took:.2?}",
        mib(timeline.len())
    );
    println!("page parsed by html5ever in {parsed:.2?}: {rows} pod rows");
}
