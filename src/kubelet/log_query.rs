//! The query of `GET /containerLogs/…` (K3). Public so the fuzz target (`e2e/fuzz`) drives the
//! same decoding and validation the route runs on the apiserver's (or anyone's) query string.

use std::collections::HashMap;

use actix_web::web;

/// Decodes a raw query string (`tailLines=5&follow=false`) as the route always has (actix's
/// `web::Query` into a map; a repeated key keeps its last value) and validates it: the lines
/// to tail, or the message of a 400.
pub fn tail_lines(query: &str) -> Result<usize, String> {
    let q = web::Query::<HashMap<String, String>>::from_query(query)
        .map_err(|e| format!("bad query string: {e}"))?;
    validate(&q)
}

/// Only `tailLines` is honoured (absent or 0 → 200 lines); the other documented keys are
/// checked so a malformed request is refused rather than half-served.
fn validate(q: &HashMap<String, String>) -> Result<usize, String> {
    let boolean = |k: &str| match q.get(k).map(String::as_str) {
        None | Some("true") | Some("false") => Ok(()),
        Some(v) => Err(format!("{k}={v:?} is not a boolean")),
    };
    for k in ["follow", "previous", "timestamps"] {
        boolean(k)?;
    }
    let positive = |k: &str, min: i64| match q.get(k) {
        None => Ok(()),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n >= min => Ok(()),
            _ => Err(format!("{k}={v:?} must be an integer >= {min}")),
        },
    };
    positive("limitBytes", 1)?;
    positive("sinceSeconds", 1)?;
    if let Some(t) = q.get("sinceTime") {
        if reconcilers::time::parse_rfc3339(t).is_none() {
            return Err(format!("sinceTime={t:?} is not RFC 3339"));
        }
        if q.contains_key("sinceSeconds") {
            return Err("sinceTime and sinceSeconds are mutually exclusive".into());
        }
    }
    match q.get("tailLines") {
        None => Ok(200),
        Some(v) => match v.parse::<i64>() {
            Ok(0) => Ok(200),
            Ok(n) if n > 0 => Ok(n as usize),
            _ => Err(format!("tailLines={v:?} must be an integer >= 0")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_query_validation() {
        assert_eq!(tail_lines(""), Ok(200));
        assert_eq!(tail_lines("tailLines=0"), Ok(200));
        assert_eq!(tail_lines("tailLines=5&follow=false"), Ok(5));
        for bad in [
            "tailLines=-1",
            "follow=yes",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceTime=yesterday",
            "sinceTime=2026-01-01T00:00:00Z&sinceSeconds=5",
        ] {
            assert!(tail_lines(bad).is_err(), "{bad}");
        }
    }

    /// Percent-escapes decode before validation, as they did through `web::Query`.
    #[test]
    fn escapes_decode_before_validation() {
        assert_eq!(tail_lines("tail%4Cines=7"), Ok(7));
        assert!(tail_lines("sinceTime=2026-05-01T09%3A12%3A03%2B08%3A00").is_ok());
    }
}
