//! RFC 3339 timestamps as Go prints them, in the host's local zone (libc knows the zone rules).

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

struct Civil {
    year: i64,
    mon: u32,
    day: u32,
    hour: u32,
    min: u32,
    sec: u32,
    offset: i64,
}

fn civil(secs: i64) -> Civil {
    // SAFETY: localtime_r only writes into the tm we own.
    unsafe {
        let t: libc::time_t = secs as libc::time_t;
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            libc::gmtime_r(&t, &mut tm);
            tm.tm_gmtoff = 0;
        }
        Civil {
            year: tm.tm_year as i64 + 1900,
            mon: tm.tm_mon as u32 + 1,
            day: tm.tm_mday as u32,
            hour: tm.tm_hour as u32,
            min: tm.tm_min as u32,
            sec: tm.tm_sec as u32,
            offset: tm.tm_gmtoff,
        }
    }
}

fn zone(offset: i64) -> String {
    if offset == 0 {
        return "Z".into();
    }
    let sign = if offset < 0 { '-' } else { '+' };
    let o = offset.abs();
    format!("{sign}{:02}:{:02}", o / 3600, (o % 3600) / 60)
}

/// Go's `time.RFC3339Nano`: fraction with trailing zeros trimmed, none when whole seconds.
pub fn rfc3339_nano(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let frac = ns.rem_euclid(1_000_000_000) as u32;
    let c = civil(secs);
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        c.year, c.mon, c.day, c.hour, c.min, c.sec
    );
    if frac != 0 {
        let f = format!("{frac:09}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s.push_str(&zone(c.offset));
    s
}

/// Second precision, as cocoon-net writes lease expiries.
pub fn rfc3339_secs(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let c = civil(secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}",
        c.year,
        c.mon,
        c.day,
        c.hour,
        c.min,
        c.sec,
        zone(c.offset)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let s = rfc3339_nano(1_777_626_723_481_920_000);
        assert!(s.contains(".48192"), "{s}");
        assert!(!s.contains(".481920"), "{s}");
        let w = rfc3339_nano(1_777_626_723_000_000_000);
        assert!(!w.contains('.'), "{w}");
        assert_eq!(rfc3339_secs(1_777_626_723_999_000_000).len(), w.len());
    }
}
