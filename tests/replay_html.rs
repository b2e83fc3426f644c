//! `replay --html`: the page is read back with an HTML parser. The sample gives one row per
//! pod with the argv the timeline prints; journaled text that looks like markup stays text;
//! a journal of 10,000 events renders to a page of one row per pod (100,000 in
//! benches/replay_html.rs).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use reconcilers::Action;
use reconcilers::Event;
use scraper::{ElementRef, Html, Selector};
use vk_cocoon::replay::{self, Options};

use support::{sample_path, vk_cocoon};

fn page(files: &[PathBuf]) -> (String, replay::Summary) {
    let opts = Options {
        files: files.to_vec(),
        html: true,
        ..Default::default()
    };
    let mut out = Vec::new();
    let (summary, _) = replay::run(&opts, &mut out).expect("replay");
    (String::from_utf8(out).expect("utf-8"), summary)
}

fn sel(s: &str) -> Selector {
    Selector::parse(s).unwrap()
}

fn text(e: ElementRef<'_>) -> String {
    e.text().collect()
}

/// Each pod row's `data-pod`, `data-uid` and element.
fn pod_rows(doc: &Html) -> Vec<(String, String, ElementRef<'_>)> {
    doc.select(&sel("details[data-pod]"))
        .map(|d| {
            let a = |n: &str| d.value().attr(n).unwrap().to_string();
            (a("data-pod"), a("data-uid"), d)
        })
        .collect()
}

/// The texts of a row's items of one class (`c`: cocoon calls).
fn items(row: ElementRef<'_>, class: &str) -> Vec<String> {
    row.select(&sel(&format!("p.{class}"))).map(text).collect()
}

#[test]
fn the_sample_page_has_a_row_per_pod_with_the_timeline_argv() {
    let (html, summary) = page(&[sample_path()]);
    let doc = Html::parse_document(&html);
    assert!(doc.errors.is_empty(), "{:?}", doc.errors);
    let rows = pod_rows(&doc);
    let names: Vec<(&str, &str)> = rows
        .iter()
        .map(|(p, u, _)| (p.as_str(), u.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("default/api", "u-api"),
            ("default/web", "u-web"),
            ("default/worker", "u-worker")
        ]
    );
    assert_eq!(doc.select(&sel("details.node")).count(), 1);

    let row = |name: &str| rows.iter().find(|(p, _, _)| p == name).unwrap().2;
    let web = items(row("default/web"), "c");
    assert!(
        web.iter()
            .any(|l| l.contains(" vm run ") && l.contains("vk-web")),
        "{web:?}"
    );
    assert!(
        web.iter().any(|l| l.ends_with("vm rm --force -- V001")),
        "{web:?}"
    );
    let worker = items(row("default/worker"), "c");
    assert!(
        worker
            .iter()
            .any(|l| l.contains("vm clone --output json --name vk-worker")),
        "{worker:?}"
    );
    // The summary counts and phases.
    let summary_text = text(
        row("default/worker")
            .select(&sel("summary"))
            .next()
            .unwrap(),
    );
    assert!(summary_text.contains("5 cocoon"), "{summary_text}");
    assert!(
        summary_text.contains("running → evicting → terminal"),
        "{summary_text}"
    );
    let phases: Vec<String> = row("default/worker").select(&sel("b")).map(text).collect();
    assert!(
        phases.contains(&"phase running → evicting".to_string()),
        "{phases:?}"
    );
    // Statuses pushed, in their rows.
    let statuses = items(row("default/api"), "s2");
    assert!(
        statuses
            .iter()
            .any(|s| s.contains("phase=Running ready=true")),
        "{statuses:?}"
    );

    // Every cocoon call the timeline prints is in the page, exactly as printed, and in no
    // more than one row.
    let out = vk_cocoon()
        .arg("replay")
        .arg(sample_path())
        .output()
        .unwrap();
    let timeline = String::from_utf8(out.stdout).unwrap();
    let printed: Vec<&str> = timeline
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("→ "))
        .filter(|l| l.starts_with("cocoon #"))
        .collect();
    let on_page: Vec<String> = doc.select(&sel("p.c")).map(text).collect();
    assert_eq!(on_page.len(), printed.len());
    assert_eq!(
        on_page.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        printed.into_iter().collect::<BTreeSet<_>>()
    );
    // Every event is on the page once as its row's own: an entry alone, or folded with the
    // same-shaped ones after it into one entry marked ×N.
    let own: u64 = doc
        .select(&sel("li:not(.o):not(.n):not(.d)"))
        .filter(|li| li.select(&sel(":scope > .v")).next().is_some())
        .map(|li| {
            li.select(&sel(":scope > em"))
                .next()
                .map(|em| text(em).trim_start_matches('×').parse::<u64>().unwrap())
                .unwrap_or(1)
        })
        .sum();
    assert_eq!(own, summary.steps);
}

#[test]
fn the_binary_writes_the_page_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("demo.html");
    let out = vk_cocoon()
        .args(["replay", "--verify", "--html"])
        .arg(&out_path)
        .arg(sample_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "the page replaces the timeline");
    let html = std::fs::read_to_string(&out_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // Self-contained: no link, no src, no address.
    for needle in ["<link", " src=", "http://", "https://", "<img"] {
        assert!(!html.contains(needle), "{needle}");
    }

    // --pod keeps one row.
    let out = vk_cocoon()
        .args(["replay", "--pod", "default/web", "--html"])
        .arg(&out_path)
        .arg(sample_path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc = Html::parse_document(&std::fs::read_to_string(&out_path).unwrap());
    let rows: Vec<String> = pod_rows(&doc).into_iter().map(|(p, _, _)| p).collect();
    assert_eq!(rows, ["default/web"]);
}

const HOSTILE: &str = "<script>alert(\"x&y\")</script>'</details>";

#[test]
fn journaled_text_that_looks_like_markup_stays_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.journal");
    // A pod name and an Event message as hostile as a journal can hold: the chain stays
    // intact, so only the page's escaping stands between them and the browser.
    let name = format!("w{HOSTILE}");
    support::rewrite(&sample_path(), &path, |env, actions| {
        if let Event::PodApplied { pod } = &mut env.event {
            if pod.name == "web" {
                pod.name = name.clone();
            }
        }
        for a in actions.iter_mut() {
            if let Action::RecordEvent { message, .. } = a {
                *message = HOSTILE.into();
            }
        }
    });
    let (html, _) = page(&[path]);
    let doc = Html::parse_document(&html);
    // Ours is the only script; no element came out of the journal.
    assert_eq!(doc.select(&sel("script")).count(), 1);
    let rows = pod_rows(&doc);
    let hostile_row = rows
        .iter()
        .find(|(p, _, _)| *p == format!("default/{name}"))
        .expect("the hostile pod has its row");
    let summary_text = text(hostile_row.2.select(&sel("summary")).next().unwrap());
    assert!(summary_text.contains(&name), "{summary_text}");
    let events: Vec<String> = doc.select(&sel("p.e")).map(text).collect();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e.contains(&format!("{HOSTILE:?}"))),
        "{events:?}"
    );
    // Every row is still a row: nothing closed a <details> early.
    assert_eq!(
        doc.select(&sel("details")).count(),
        html.matches("<details").count()
    );
}

fn bench_journal(dir: &Path, pods: usize) -> (PathBuf, usize) {
    let w = support::scenarios::churn_waves(pods / 100, 100);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    let path = dir.join("events.journal");
    support::journal_world(&w, &path, u64::MAX, 1);
    (path, w.log.len())
}

/// Pods for 10,000 events of create → ready → delete: a debug build renders about 5,000
/// events a second, so the 100,000 of `benches/replay_html.rs` are left to an optimized one.
const BENCH_PODS: usize = 500;

#[test]
fn a_journal_of_10k_events_renders_a_row_per_pod() {
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let (path, events) = bench_journal(dir.path(), BENCH_PODS);
    let made = t.elapsed();
    assert!(events >= 10_000, "{events} events");
    // The records as text: the file holds them compressed.
    let journal_bytes = support::read_lines(&path).len() as u64;

    let t = Instant::now();
    let (html, summary) = page(std::slice::from_ref(&path));
    let rendered = t.elapsed();
    assert_eq!(summary.steps as usize, events);
    assert_eq!(summary.differing, 0);

    let t = Instant::now();
    let doc = Html::parse_document(&html);
    let parsed = t.elapsed();
    let rows = pod_rows(&doc);
    assert_eq!(rows.len(), BENCH_PODS);
    let names: BTreeSet<&str> = rows.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(names.len(), BENCH_PODS);
    assert!(names.contains("bench/p0") && names.contains(&*format!("bench/p{}", BENCH_PODS - 1)));
    // Every pod went through a VM run and was deleted.
    let first = rows.iter().find(|(p, _, _)| p == "bench/p0").unwrap().2;
    assert!(items(first, "c").iter().any(|l| l.contains(" vm run ")));
    // Light: about the size of the journal's records it shows, which are the same text as JSON.
    assert!(
        (html.len() as u64) < journal_bytes,
        "page {} bytes, journal {journal_bytes} bytes",
        html.len()
    );
    eprintln!(
        "{events} events, {BENCH_PODS} pods: journal {:.1} MiB made in {made:.1?}; page {:.1} MiB \
         rendered in {rendered:.1?} (debug build), parsed in {parsed:.1?}",
        journal_bytes as f64 / (1 << 20) as f64,
        html.len() as f64 / (1 << 20) as f64,
    );
}
