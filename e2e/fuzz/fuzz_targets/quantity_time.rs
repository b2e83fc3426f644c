//! Kubernetes quantities (`reconcilers::quantity`) and RFC 3339 times (`reconcilers::time`):
//! both read text a pod or a lease file supplies. The input is tried as each.

#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcilers::quantity::{parse_ceil_units, parse_milli, MAX_MILLI};
use reconcilers::time::{parse_rfc3339, rfc3339_seconds, Millis};

fuzz_target!(|data: &[u8]| {
    if let Some(head) = data.get(..8) {
        formatted_time_reads_back(Millis::from_le_bytes(head.try_into().expect("8 bytes")));
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    quantity(text);
    time(text);
});

fn quantity(q: &str) {
    let milli = parse_milli(q);
    assert_eq!(
        parse_ceil_units(q),
        milli.map(|m| ceil_div_1000(m)),
        "{q:?}"
    );
    // Surrounding blanks never change the value.
    assert_eq!(parse_milli(&format!(" {q}\t")), milli, "{q:?}");
    if q.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        assert_eq!(parse_milli(&format!("-{q}")), milli.map(|m| -m), "{q:?}");
    }
    let Some(m) = milli else { return };
    assert!(m.abs() <= MAX_MILLI, "{q:?} → {m} milli does not fit");
    // Re-rendered in the finest unit, and in whole units where exact, it reads back equal.
    assert_eq!(parse_milli(&format!("{m}m")), Some(m), "{q:?}");
    if m % 1000 == 0 {
        assert_eq!(parse_milli(&(m / 1000).to_string()), Some(m), "{q:?}");
    }
    if m % 1_000_000 == 0 {
        assert_eq!(
            parse_milli(&format!("{}k", m / 1_000_000)),
            Some(m),
            "{q:?}"
        );
        assert_eq!(
            parse_milli(&format!("{}e3", m / 1_000_000)),
            Some(m),
            "{q:?}"
        );
    }
}

fn ceil_div_1000(m: i128) -> i128 {
    m.div_euclid(1000) + i128::from(m.rem_euclid(1000) != 0)
}

fn time(s: &str) {
    let Some(t) = parse_rfc3339(s) else { return };
    // A valid timestamp has no letters but `T` and `Z`, so case does not matter.
    assert_eq!(parse_rfc3339(&s.to_ascii_uppercase()), Some(t), "{s:?}");
    formatted_time_reads_back(t);
}

/// What `rfc3339_seconds` writes (a pod status, an Event) parses back to the same second,
/// for every time whose year has four digits (RFC 3339 has no other years).
fn formatted_time_reads_back(t: Millis) {
    let text = rfc3339_seconds(t);
    let four_digit_year = text.len() == 20 && text.as_bytes()[0].is_ascii_digit();
    if four_digit_year {
        assert_eq!(
            parse_rfc3339(&text),
            Some(t.div_euclid(1000) * 1000),
            "{t} → {text}"
        );
    }
}
