//! When a hypervisor log line was written, for `sinceSeconds`, `sinceTime` and `timestamps`
//! (K3). `cocoon vm logs` has no such options, so the daemon dates each line itself from what
//! the hypervisors print:
//!
//! - cloud-hypervisor starts each line with `cloud-hypervisor: <elapsed>:`, the time since its
//!   process started as Rust prints a `Duration` (`1.234567s`, `12.345678ms`, `5.000000µs`);
//!   the process's start comes from `/proc/<pid>/stat`;
//! - firecracker starts each line with its UTC wall time, `2026-05-01T09:12:03.123456789`.
//!
//! A line without a stamp of its own (a panic's second line, guest text) takes the time of the
//! last stamped line before it, and before any, the hypervisor's start: the log begins there.
//! With neither known the line is kept and, when asked for, stamped with the time it is sent.

use std::time::Duration;

use k8s_openapi::jiff;

/// Nanoseconds since the Unix epoch.
pub type Nanos = i128;

/// A line longer than this is passed on in pieces, each dated like the line: a hostile guest
/// must not make the daemon buffer without bound.
const MAX_LINE: usize = 64 * 1024;

/// Reads a line's own stamp, if it carries one.
fn stamp(line: &[u8], start: Option<Nanos>) -> Option<Nanos> {
    if let Some(rest) = line.strip_prefix(b"cloud-hypervisor: ") {
        let end = rest.iter().position(|&b| b == b':')?;
        let elapsed = elapsed(std::str::from_utf8(&rest[..end]).ok()?)?;
        return Some(start? + elapsed.as_nanos() as Nanos);
    }
    wall_stamp(line)
}

/// Rust's `{:.6?}` of a `Duration`: a decimal and one of `s`, `ms`, `µs`, `ns`.
fn elapsed(text: &str) -> Option<Duration> {
    let (number, unit_nanos) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = text.strip_suffix("µs") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e9)
    } else {
        return None;
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let v: f64 = number.parse().ok()?;
    // A hypervisor up for more than a century is not a stamp.
    (v * unit_nanos <= 3.2e18).then(|| Duration::from_nanos((v * unit_nanos) as u64))
}

/// firecracker's `YYYY-MM-DDTHH:MM:SS.fffffffff` at the start of the line, UTC.
fn wall_stamp(line: &[u8]) -> Option<Nanos> {
    const LEN: usize = "2026-05-01T09:12:03".len();
    if line.len() < LEN || line[4] != b'-' || line[10] != b'T' {
        return None;
    }
    let mut end = LEN;
    if line.get(LEN) == Some(&b'.') {
        end += 1;
        while line.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
    }
    let text = std::str::from_utf8(&line[..end]).ok()?;
    let civil: jiff::civil::DateTime = text.parse().ok()?;
    let ts = civil.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(ts.as_nanosecond())
}

/// Dates and filters a log's lines as they stream past.
pub struct LineFilter {
    /// The hypervisor process's start.
    start: Option<Nanos>,
    last: Option<Nanos>,
    since: Option<Nanos>,
    timestamps: bool,
    partial: Vec<u8>,
}

impl LineFilter {
    pub fn new(start: Option<Nanos>, since: Option<Nanos>, timestamps: bool) -> Self {
        Self {
            start,
            last: None,
            since,
            timestamps,
            partial: Vec::new(),
        }
    }

    /// Takes a chunk of the log; appends to `out` the complete lines that pass. `now` dates a
    /// line nothing else dates.
    pub fn push(&mut self, chunk: &[u8], now: Nanos, out: &mut Vec<u8>) {
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..=i]);
            rest = &rest[i + 1..];
            let line = std::mem::take(&mut self.partial);
            self.line(&line, now, out);
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() >= MAX_LINE {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, now, out);
        }
    }

    /// The log ended: a last line without its newline is passed on too.
    pub fn finish(&mut self, now: Nanos, out: &mut Vec<u8>) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, now, out);
        }
    }

    fn line(&mut self, line: &[u8], now: Nanos, out: &mut Vec<u8>) {
        if let Some(t) = stamp(line, self.start) {
            self.last = Some(t);
        }
        let at = self.last.or(self.start);
        if let (Some(since), Some(at)) = (self.since, at) {
            if at < since {
                return;
            }
        }
        if self.timestamps {
            let t = jiff::Timestamp::from_nanosecond(at.unwrap_or(now))
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
            out.extend_from_slice(format!("{t} ").as_bytes());
        }
        out.extend_from_slice(line);
    }
}

/// When process `pid` started, from `/proc`: boot time plus its start in clock ticks.
pub fn process_start(pid: i64) -> Option<Nanos> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    // Field 22 overall; the 20th after the command's closing parenthesis.
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let btime: i128 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    Some(btime * 1_000_000_000 + ticks as i128 * 1_000_000_000 / hz as i128)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const START: Nanos = 1_780_000_000 * S;

    fn run(f: &mut LineFilter, chunks: &[&str], now: Nanos) -> String {
        let mut out = Vec::new();
        for c in chunks {
            f.push(c.as_bytes(), now, &mut out);
        }
        f.finish(now, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn cloud_hypervisor_elapsed_stamps_date_lines_from_the_process_start() {
        assert_eq!(
            stamp(
                b"cloud-hypervisor: 1.500000s: <vmm> INFO:a.rs:1 -- x",
                Some(START)
            ),
            Some(START + 3 * S / 2)
        );
        assert_eq!(
            stamp(
                b"cloud-hypervisor: 12.000000ms: <vmm> INFO:a.rs:1 -- x",
                Some(START)
            ),
            Some(START + 12_000_000)
        );
        assert_eq!(
            stamp(
                "cloud-hypervisor: 7.000000µs: <vmm> x".as_bytes(),
                Some(START)
            ),
            Some(START + 7_000)
        );
        assert_eq!(stamp(b"cloud-hypervisor: 1.5s: x", None), None);
        assert_eq!(stamp(b"cloud-hypervisor: soon: x", Some(START)), None);
        assert_eq!(stamp(b"cloud-hypervisor: 1e9s: x", Some(START)), None);
    }

    #[test]
    fn firecracker_wall_stamps_are_utc() {
        let t = stamp(
            b"2026-05-01T09:12:03.250000000 [anonymous-instance:main] x",
            None,
        );
        let expect: jiff::Timestamp = "2026-05-01T09:12:03.25Z".parse().unwrap();
        assert_eq!(t, Some(expect.as_nanosecond()));
        assert_eq!(stamp(b"2026-05-01 09:12:03 x", None), None);
        assert_eq!(stamp(b"short", None), None);
    }

    #[test]
    fn since_drops_older_lines_and_unstamped_lines_follow_the_last_stamp() {
        let mut f = LineFilter::new(Some(START), Some(START + 10 * S), false);
        let log = [
            "guest text before any stamp\n",
            "cloud-hypervisor: 5.000000s: <vmm> INFO:a.rs:1 -- old\n",
            "continuation of old\n",
            "cloud-hypervisor: 11.0",
            "00000s: <vmm> INFO:a.rs:1 -- new\n",
            "continuation of new\n",
            "last without newline",
        ];
        assert_eq!(
            run(&mut f, &log, START + 20 * S),
            "cloud-hypervisor: 11.000000s: <vmm> INFO:a.rs:1 -- new\n\
             continuation of new\nlast without newline"
        );
    }

    #[test]
    fn timestamps_prefix_each_line_with_its_time() {
        let mut f = LineFilter::new(Some(START), None, true);
        let out = run(
            &mut f,
            &["before\n", "cloud-hypervisor: 2.500000s: x\n", "after\n"],
            0,
        );
        let at = |n: Nanos| jiff::Timestamp::from_nanosecond(n).unwrap().to_string();
        assert_eq!(
            out,
            format!(
                "{} before\n{} cloud-hypervisor: 2.500000s: x\n{} after\n",
                at(START),
                at(START + 5 * S / 2),
                at(START + 5 * S / 2)
            )
        );
    }

    #[test]
    fn without_any_known_time_lines_are_kept_and_stamped_when_sent() {
        let mut f = LineFilter::new(None, Some(START), true);
        let now = START + S;
        let at = jiff::Timestamp::from_nanosecond(now).unwrap();
        assert_eq!(run(&mut f, &["plain\n"], now), format!("{at} plain\n"));
    }

    #[test]
    fn an_endless_line_is_passed_on_in_pieces() {
        let mut f = LineFilter::new(None, None, false);
        let mut out = Vec::new();
        f.push(&vec![b'x'; MAX_LINE + 10], 0, &mut out);
        assert_eq!(out.len(), MAX_LINE + 10);
        assert!(f.partial.is_empty());
    }

    #[test]
    fn this_process_has_a_start_time_in_the_past() {
        let start = process_start(std::process::id() as i64).expect("own start");
        let now = jiff::Timestamp::now().as_nanosecond();
        assert!(start <= now && start > now - 86_400 * 365 * S, "{start}");
        assert_eq!(process_start(0), None);
    }
}
