//! The cocoon-net lease file (LEASE-2, LEASE-4): a pretty JSON array, literal `null` when
//! empty, no trailing newline, replaced atomically, at most one row per MAC and per IP.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::lock;
use crate::timefmt::{now_ns, rfc3339_secs};

pub const LEASE_NS: i128 = 24 * 3600 * 1_000_000_000;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Lease {
    pub mac: String,
    pub ip: String,
    pub expiry: String,
}

fn lock_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("leases");
    path.with_file_name(format!(".{name}.lock"))
}

/// Unreadable or corrupt content counts as empty, as cocoon-net starts empty in that case.
pub fn read(path: &Path) -> Vec<Lease> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Option<Vec<Lease>>>(&b).ok())
        .flatten()
        .unwrap_or_default()
}

fn write(path: &Path, rows: &[Lease]) -> Result<()> {
    let body = if rows.is_empty() {
        "null".to_string()
    } else {
        serde_json::to_string_pretty(rows)?
    };
    lock::write_atomic(path, body.as_bytes())?;
    Ok(())
}

pub fn modify(path: &Path, f: impl FnOnce(&mut Vec<Lease>)) -> Result<()> {
    let _l = lock::exclusive(&lock_path(path))?;
    let mut rows = read(path);
    f(&mut rows);
    write(path, &rows)
}

/// An ACK: the MAC's row is replaced and any other MAC holding the same IP is evicted.
pub fn grant(path: &Path, mac: &str, ip: &str) -> Result<()> {
    grant_until(path, mac, ip, &rfc3339_secs(now_ns() + LEASE_NS))
}

pub fn grant_until(path: &Path, mac: &str, ip: &str, expiry: &str) -> Result<()> {
    modify(path, |rows| {
        rows.retain(|r| !r.mac.eq_ignore_ascii_case(mac) && r.ip != ip);
        rows.push(Lease {
            mac: mac.to_string(),
            ip: ip.to_string(),
            expiry: expiry.to_string(),
        });
    })
}

pub fn release(path: &Path, mac: &str) -> Result<()> {
    modify(path, |rows| {
        rows.retain(|r| !r.mac.eq_ignore_ascii_case(mac))
    })
}
