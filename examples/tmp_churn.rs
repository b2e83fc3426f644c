#[path = "../tests/support/scenarios.rs"]
#[allow(dead_code)]
mod scenarios;
use vk_cocoon::journal::{write_run, JournalSettings};
fn main() {
    let w = scenarios::churn(1000);
    let s = JournalSettings {
        path: "/tmp/churn/events.journal".into(),
        max_bytes: 64 << 20,
        max_age_ms: i64::MAX,
        files: 8,
    };
    let _ = std::fs::remove_dir_all("/tmp/churn");
    write_run(&s, &w.state.config, 1_777_600_000_000, &w.log).unwrap();
}
