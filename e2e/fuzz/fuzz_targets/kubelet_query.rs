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
    let result = log_query::tail_lines(query);
    match &result {
        Ok(n) => assert!(*n >= 1, "{query:?} → tail of {n} lines"),
        Err(e) => assert!(!e.is_empty()),
    }
    // The last occurrence of a key wins, so appending a valid key=value decides that key.
    if result.is_ok() {
        assert_eq!(
            log_query::tail_lines(&format!("{query}&tailLines=7")),
            Ok(7)
        );
        assert_eq!(
            log_query::tail_lines(&format!("{query}&tailLines=0")),
            Ok(200)
        );
        assert!(log_query::tail_lines(&format!("{query}&follow=maybe")).is_err());
    }
    // Escaping every byte of a well-formed pair list changes nothing.
    if let Some(escaped) = escape_pairs(query) {
        assert_eq!(
            log_query::tail_lines(&escaped),
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
