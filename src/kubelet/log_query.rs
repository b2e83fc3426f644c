//! The query of `GET /containerLogs/…` (K3). Public so the fuzz target (`e2e/fuzz`) drives the
//! same decoding and validation the route runs on the apiserver's (or anyone's) query string.

use std::collections::HashMap;

use actix_web::web;

/// Lines a caller may ask for at once: more is a 400, not a host reading gigabytes.
pub const MAX_TAIL_LINES: u64 = 100_000;
/// Lines when the caller names none (or 0), as before.
const DEFAULT_TAIL_LINES: u64 = 200;

/// A validated `/containerLogs` query. `previous` is checked but not applied: a VM has no
/// previous container to read.
#[derive(Debug, PartialEq, Eq)]
pub struct LogQuery {
    pub tail: u64,
    pub follow: bool,
    pub limit_bytes: Option<u64>,
    pub since: Option<Since>,
    pub timestamps: bool,
}

/// The oldest line a caller wants, as it asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    Seconds(u64),
    /// Milliseconds since the Unix epoch.
    Time(i64),
}

impl Since {
    /// The bound in nanoseconds since the epoch, given the time of the request.
    pub fn nanos(self, now_nanos: i128) -> i128 {
        match self {
            Since::Seconds(s) => now_nanos - s as i128 * 1_000_000_000,
            Since::Time(ms) => ms as i128 * 1_000_000,
        }
    }
}

/// Decodes a raw query string (`tailLines=5&follow=false`) as actix's `web::Query` does (a
/// repeated key keeps its last value) and validates it: the query, or the message of a 400.
pub fn parse(query: &str) -> Result<LogQuery, String> {
    let q = web::Query::<HashMap<String, String>>::from_query(query)
        .map_err(|e| format!("bad query string: {e}"))?;
    validate(&q)
}

fn validate(q: &HashMap<String, String>) -> Result<LogQuery, String> {
    let boolean = |k: &str| match q.get(k).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(format!("{k}={v:?} is not a boolean")),
    };
    let follow = boolean("follow")?;
    boolean("previous")?;
    let timestamps = boolean("timestamps")?;
    let at_least = |k: &str, min: u64| match q.get(k) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= min => Ok(Some(n)),
            _ => Err(format!("{k}={v:?} must be an integer >= {min}")),
        },
    };
    let limit_bytes = at_least("limitBytes", 1)?;
    let mut since = at_least("sinceSeconds", 1)?.map(Since::Seconds);
    if let Some(t) = q.get("sinceTime") {
        let Some(ms) = reconcilers::time::parse_rfc3339(t) else {
            return Err(format!("sinceTime={t:?} is not RFC 3339"));
        };
        if since.is_some() {
            return Err("sinceTime and sinceSeconds are mutually exclusive".into());
        }
        since = Some(Since::Time(ms));
    }
    let tail = match at_least("tailLines", 0)? {
        // "Everything since" reads as far back as a caller may.
        None if since.is_some() => MAX_TAIL_LINES,
        None | Some(0) => DEFAULT_TAIL_LINES,
        Some(n) if n <= MAX_TAIL_LINES => n,
        Some(n) => return Err(format!("tailLines={n} is more than {MAX_TAIL_LINES}")),
    };
    Ok(LogQuery {
        tail,
        follow,
        limit_bytes,
        since,
        timestamps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_query_validation() {
        let tail = |q: &str| parse(q).map(|l| l.tail);
        assert_eq!(tail(""), Ok(200));
        assert_eq!(tail("tailLines=0"), Ok(200));
        assert_eq!(tail("tailLines=5&follow=false"), Ok(5));
        assert_eq!(tail("tailLines=100000"), Ok(100_000));
        assert_eq!(
            parse("follow=true&limitBytes=10"),
            Ok(LogQuery {
                tail: 200,
                follow: true,
                limit_bytes: Some(10),
                since: None,
                timestamps: false,
            })
        );
        let q = parse("sinceSeconds=30&timestamps=true").unwrap();
        assert_eq!(
            (q.since, q.timestamps, q.tail),
            (Some(Since::Seconds(30)), true, 100_000)
        );
        assert_eq!(q.since.unwrap().nanos(100_000_000_000), 70_000_000_000);
        let q = parse("sinceTime=1970-01-01T00:00:02Z&tailLines=5").unwrap();
        assert_eq!((q.since, q.tail), (Some(Since::Time(2000)), 5));
        assert_eq!(q.since.unwrap().nanos(0), 2_000_000_000);
        for bad in [
            "tailLines=-1",
            "tailLines=100001",
            "tailLines=ten",
            "timestamps=1",
            "previous=maybe",
            "limitBytes=-5",
            "follow=yes",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceTime=yesterday",
            "sinceTime=2026-01-01T00:00:00Z&sinceSeconds=5",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// Percent-escapes decode before validation, as they did through `web::Query`.
    #[test]
    fn escapes_decode_before_validation() {
        assert_eq!(parse("tail%4Cines=7").map(|l| l.tail), Ok(7));
        assert!(parse("sinceTime=2026-05-01T09%3A12%3A03%2B08%3A00").is_ok());
    }
}
