//! Progress lines for the long steps, so a slow or stuck test run shows where it is.

use std::sync::OnceLock;
use std::time::Instant;

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Prints one progress line to stderr (cargo test shows it for failing tests and with
/// `--nocapture`), prefixed with the seconds since the harness was first used.
pub fn step(msg: impl AsRef<str>) {
    let t = start().elapsed().as_secs_f64();
    eprintln!("[e2e {t:7.2}s] {}", msg.as_ref());
}

#[macro_export]
macro_rules! step {
    ($($arg:tt)*) => { $crate::log::step(format!($($arg)*)) };
}
