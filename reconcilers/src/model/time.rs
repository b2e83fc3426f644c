//! Wall time as it enters the core: milliseconds since the Unix epoch, captured by the shell
//! and carried inside every event. The core never reads a clock.

/// Milliseconds since 1970-01-01T00:00:00Z.
pub type Millis = i64;

/// RFC 3339 at second precision, UTC (`2026-05-01T08:00:00Z`). Kubernetes stores
/// `metav1.Time` at second precision, so the status we derive must too, or it would never
/// compare equal to what the server echoes back.
pub fn rfc3339_seconds(at: Millis) -> String {
    Rfc3339::seconds(at).as_str().to_string()
}

/// [`rfc3339_seconds`] on the stack. The desired status is compared with the server's on
/// every touched pod, so its timestamps are formatted without `fmt` and without the heap.
#[derive(Clone, Copy)]
pub struct Rfc3339 {
    /// Holds any i64 time: a year has at most 9 digits and a sign.
    buf: [u8; 32],
    len: u8,
}

impl Rfc3339 {
    pub fn seconds(at: Millis) -> Self {
        let secs = at.div_euclid(1000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let mut out = Rfc3339 {
            buf: [0; 32],
            len: 0,
        };
        if (0..=9999).contains(&y) {
            out.digits(y, 4);
        } else {
            // Far outside any real clock; `{:04}` is the definition, so use it.
            let year = format!("{y:04}");
            out.push(year.as_bytes());
        }
        out.push(b"-");
        out.digits(m, 2);
        out.push(b"-");
        out.digits(d, 2);
        out.push(b"T");
        out.digits(rem / 3600, 2);
        out.push(b":");
        out.digits((rem % 3600) / 60, 2);
        out.push(b":");
        out.digits(rem % 60, 2);
        out.push(b"Z");
        out
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len as usize]).expect("ASCII")
    }

    fn push(&mut self, bytes: &[u8]) {
        let at = self.len as usize;
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len() as u8;
    }

    /// `n` (0 ≤ n < 10^width) zero-padded to `width` digits.
    fn digits(&mut self, mut n: i64, width: usize) {
        let at = self.len as usize;
        for i in (0..width).rev() {
            self.buf[at + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        self.len += width as u8;
    }
}

impl std::fmt::Debug for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// Parses RFC 3339 with any offset and optional fraction; `None` when malformed.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = &s[start..i.min(start + 3)];
        frac_ms = digits.parse::<i64>().ok()? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_secs = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let sign = if *c == b'+' { 1 } else { -1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_secs;
    Some(secs * 1000 + frac_ms)
}

// Howard Hinnant's days-from-civil algorithms (public domain).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_round_trip() {
        let t = parse_rfc3339("2026-05-01T09:12:03.481920311+08:00").unwrap();
        assert_eq!(rfc3339_seconds(t), "2026-05-01T01:12:03Z");
        assert_eq!(t % 1000, 481);
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
    }

    /// The stack formatter is exactly `format!` with the definition's widths, far out too.
    #[test]
    fn stack_formatting_matches_format() {
        let reference = |at: Millis| {
            let secs = at.div_euclid(1000);
            let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
            let (y, m, d) = civil_from_days(days);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                rem / 3600,
                (rem % 3600) / 60,
                rem % 60
            )
        };
        let mut at: Millis = 1;
        let mut probes = vec![0, -1, -1000, 999, 1_777_600_000_000, i64::MIN, i64::MAX];
        while at < i64::MAX / 3 {
            probes.extend([at, -at, at + 999, at * 3 / 2]);
            at *= 3;
        }
        // Around the year 0 and 10000 boundaries.
        for y in [-62_167_219_200_000i64, 253_402_300_800_000] {
            probes.extend([y - 1, y, y + 1, y + 86_400_000]);
        }
        for at in probes {
            assert_eq!(rfc3339_seconds(at), reference(at), "{at}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "2026-05-01",
            "2026-13-01T00:00:00Z",
            "2026-05-01T00:00:00",
            "x026-05-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
