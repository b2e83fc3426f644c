//! What a client costs the apiserver, as the apiserver itself counts it.
//!
//! `apiserver_request_total` has no label naming the client, so attribution goes through API
//! Priority and Fairness instead: [`attribute`] gives one client (a user) a FlowSchema per kind
//! of request it is expected to make, plus one for everything else, and the apiserver counts
//! each request it dispatches under its FlowSchema in
//! `apiserver_flowcontrol_dispatched_requests_total`. The schemas send the requests to the
//! priority levels the built-in `system-node-high` and `system-nodes` schemas would, so a node
//! is served as it would be without them. [`Metrics`] is one scrape of `/metrics`, and
//! [`Metrics::since`] the counters' growth between two scrapes. [`count_pods`] is a watch as a
//! node's daemon opens it (JSON, bookmarks, the same field selector), counting the events and
//! bytes it receives, which no apiserver metric gives per watcher.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kube::Client;

mod attribution;
mod watch;

pub use attribution::{attribute, attributed, reads, writes, Kind, NODE_KINDS, OTHER};
pub use watch::{count_pods, CountedWatch, Tally};

/// One series' labels, by name.
pub type Labels = BTreeMap<String, String>;

/// One scrape of a Prometheus text exposition (or the difference of two).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Keyed by the series as printed, so the same series of two scrapes meet.
    series: BTreeMap<String, (String, Labels, f64)>,
}

impl Metrics {
    /// Parses the text format; comments, histograms' `le` and anything unparsable are kept
    /// or skipped as the format allows, never an error.
    pub fn parse(text: &str) -> Metrics {
        let mut series = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((name, labels, value)) = parse_line(line) {
                let key = format!("{name}{labels:?}");
                series.insert(key, (name, labels, value));
            }
        }
        Metrics { series }
    }

    /// `GET /metrics` of the apiserver with `client`'s credentials.
    pub async fn scrape(client: &Client) -> Result<Metrics> {
        let text = crate::kube::get_text(client, "/metrics")
            .await
            .context("scraping the apiserver's /metrics")?;
        Ok(Metrics::parse(&text))
    }

    /// How much every series grew since `before` (a series `before` lacks counts from 0).
    /// Meant for counters and histograms' `_sum`/`_count`/`_bucket`; a gauge's difference is
    /// its change.
    pub fn since(&self, before: &Metrics) -> Metrics {
        let series = self
            .series
            .iter()
            .map(|(k, (name, labels, v))| {
                let was = before.series.get(k).map_or(0.0, |(_, _, b)| *b);
                (k.clone(), (name.clone(), labels.clone(), v - was))
            })
            .collect();
        Metrics { series }
    }

    /// The sum of `name`'s series whose labels `keep` accepts.
    pub fn sum(&self, name: &str, keep: impl Fn(&Labels) -> bool) -> f64 {
        self.series
            .values()
            .filter(|(n, l, _)| n == name && keep(l))
            .map(|(_, _, v)| v)
            .sum()
    }

    /// `name`'s series that `keep` accepts, summed by the values of the labels `by` (a
    /// missing label counts as empty).
    pub fn by(
        &self,
        name: &str,
        by: &[&str],
        keep: impl Fn(&Labels) -> bool,
    ) -> BTreeMap<Vec<String>, f64> {
        let mut out = BTreeMap::new();
        for (_, l, v) in self
            .series
            .values()
            .filter(|(n, l, _)| n == name && keep(l))
        {
            let key = by
                .iter()
                .map(|k| l.get(*k).cloned().unwrap_or_default())
                .collect();
            *out.entry(key).or_insert(0.0) += v;
        }
        out
    }

    /// Whether any series of `name` is present (a metric renamed in another release shows
    /// up as absent rather than as zero).
    pub fn has(&self, name: &str) -> bool {
        self.series.values().any(|(n, _, _)| n == name)
    }

    /// Watch events the apiserver sent for `resource` (to every watcher, bookmarks
    /// included), and their bytes; `None` when this release exports neither metric. Older
    /// releases label them by `kind` instead of `resource`.
    pub fn watch_events(&self, resource: &str, kind: &str) -> Option<(f64, f64)> {
        let ours = |l: &Labels| {
            l.get("resource").map(String::as_str) == Some(resource)
                || l.get("kind").map(String::as_str) == Some(kind)
        };
        let (events, sizes) = (
            "apiserver_watch_events_total",
            "apiserver_watch_events_sizes_sum",
        );
        (self.has(events) || self.has(sizes))
            .then(|| (self.sum(events, ours), self.sum(sizes, ours)))
    }

    /// `apiserver_request_total` of resources (not of paths such as `/healthz`) by
    /// `VERB resource[/subresource]`.
    pub fn requests(&self) -> BTreeMap<String, f64> {
        let by = self.by(
            "apiserver_request_total",
            &["verb", "resource", "subresource"],
            |l| l.get("resource").is_some_and(|r| !r.is_empty()),
        );
        by.into_iter()
            .map(|(k, v)| match k[2].as_str() {
                "" => (format!("{} {}", k[0], k[1]), v),
                sub => (format!("{} {}/{sub}", k[0], k[1]), v),
            })
            .collect()
    }
}

fn parse_line(line: &str) -> Option<(String, Labels, f64)> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Labels::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

/// `k="v",k2="v2"}` → the labels and what follows the closing brace. Values may hold escaped
/// quotes, backslashes and newlines.
fn parse_labels(mut s: &str) -> Option<(Labels, &str)> {
    let mut labels = Labels::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key, value);
        s = &s[eq + 1..][1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_differences_the_text_format() {
        let before = Metrics::parse(
            "# HELP x y\n\
             apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 3\n\
             apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"attribute-n0-1\",priority_level=\"node-high\"} 5\n",
        );
        let after = Metrics::parse(
            "apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 10\n\
             apiserver_request_total{code=\"201\",resource=\"pods\",verb=\"POST\"} 4\n\
             odd{a=\"q\\\"u,o}te\",b=\"\"} 1.5e3\n\
             apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"attribute-n0-1\",priority_level=\"node-high\"} 11\n\
             apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"attribute-n0-other\",priority_level=\"system\"} 2\n",
        );
        let d = after.since(&before);
        assert_eq!(d.sum("apiserver_request_total", |_| true), 11.0);
        let by = d.by("apiserver_request_total", &["verb"], |_| true);
        assert_eq!(by[&vec!["LIST".to_string()]], 7.0);
        assert_eq!(d.sum("odd", |l| l["a"] == "q\"u,o}te"), 1500.0);
        let a = attributed(&d, "n0", NODE_KINDS);
        assert_eq!(a["update leases"], 6.0);
        assert_eq!(a[OTHER], 2.0);
        assert_eq!(a["get leases"], 0.0);
        assert!(!d.has("absent_total"));
    }
}
