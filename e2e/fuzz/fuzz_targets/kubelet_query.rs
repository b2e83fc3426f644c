//! The query string of the kubelet API's `GET /containerLogs/…` (`src/kubelet/log_query.rs`):
//! reachable by anyone who can reach the port, before any pod lookup.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vk_cocoon::kubelet::log_query;

fuzz_target!(|data: &[u8]| {
    // actix hands the route the query as text (`HttpRequest::query_string`).
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let result = log_query::parse(query);
    match &result {
        Ok(q) => assert!(
            (1..=log_query::MAX_TAIL_LINES).contains(&q.tail) && q.limit_bytes != Some(0),
            "{query:?} → {q:?}"
        ),
        Err(e) => assert!(!e.is_empty()),
    }
    let tail = |q: String| log_query::parse(&q).map(|l| l.tail);
    // The last occurrence of a key wins, so appending a valid key=value decides that key.
    if result.is_ok() {
        assert_eq!(tail(format!("{query}&tailLines=7")), Ok(7));
        assert_eq!(tail(format!("{query}&tailLines=0")), Ok(200));
        assert!(log_query::parse(&format!("{query}&follow=maybe")).is_err());
        assert!(log_query::parse(&format!("{query}&follow=true")).is_ok_and(|l| l.follow));
    }
    // Escaping every byte of a well-formed pair list changes nothing.
    if let Some(escaped) = escape_pairs(query) {
        assert_eq!(
            log_query::parse(&escaped),
            result,
            "{query:?} as {escaped:?}"
        );
    }
});

/// `k=v&…` with every byte of every key and value percent-escaped, when the query has no
/// escapes or `+` of its own (those decode first, so escaping them again would differ).
fn escape_pairs(query: &str) -> Option<String> {
    if query.contains(['%', '+']) {
        return None;
    }
    let escape = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => format!("{}={}", escape(k), escape(v)),
            None => escape(pair),
        })
        .collect();
    Some(pairs.join("&"))
}
