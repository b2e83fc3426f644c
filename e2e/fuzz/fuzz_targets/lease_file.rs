//! The cocoon-net lease file (`src/sources/dhcp_leases.rs`), then the difference between two
//! readings as the watcher sends it (`reconcilers::dhcp::{normalize, diff}`). The input is
//! two file contents separated by the first NUL byte (none: the same file read twice).

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use reconcilers::dhcp;
use reconcilers::event::DhcpLease;
use reconcilers::small_str::SmallStr;
use vk_cocoon::sources::dhcp_leases;

fuzz_target!(|data: &[u8]| {
    let (a, b) = match data.iter().position(|&c| c == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    // The watcher reads with `read_to_string`: a file that is not UTF-8 is never parsed.
    let (Ok(a), Ok(b)) = (std::str::from_utf8(a), std::str::from_utf8(b)) else {
        return;
    };
    let (Ok(first), Ok(second)) = (parse(a), parse(b)) else {
        return;
    };
    let first = normalized(first);
    let mut table: BTreeMap<SmallStr, DhcpLease> =
        first.into_iter().map(|l| (l.mac.clone(), l)).collect();
    let want = normalized(second.clone());
    let (upsert, remove) = dhcp::diff(&table, second);
    // The difference is minimal and, applied to the first table, gives the second.
    for l in &upsert {
        assert_ne!(table.get(&l.mac), Some(l), "an unchanged lease was re-sent");
    }
    for mac in &remove {
        assert!(
            table.contains_key(mac),
            "removal of a MAC never sent: {mac}"
        );
        assert!(
            want.iter().all(|l| l.mac != *mac),
            "removal of a live MAC: {mac}"
        );
    }
    for mac in &remove {
        table.remove(mac);
    }
    for l in upsert {
        table.insert(l.mac.clone(), l);
    }
    assert_eq!(table.into_values().collect::<Vec<_>>(), want);
});

fn parse(text: &str) -> Result<Vec<DhcpLease>, String> {
    let rows = dhcp_leases::parse(text)?;
    for l in &rows {
        assert_eq!(
            dhcp_leases::normalise_mac(&l.mac).as_deref(),
            Some(l.mac.as_str()),
            "a lease MAC that is not canonical: {l:?}"
        );
        assert!(l.ip.parse::<std::net::Ipv4Addr>().is_ok(), "{l:?}");
    }
    Ok(rows)
}

/// One row per MAC, sorted, each the one with the latest expiry.
fn normalized(rows: Vec<DhcpLease>) -> Vec<DhcpLease> {
    let out = dhcp::normalize(rows.clone());
    assert!(out.windows(2).all(|w| w[0].mac < w[1].mac), "{out:?}");
    for l in &out {
        let latest = rows
            .iter()
            .filter(|r| r.mac == l.mac)
            .map(|r| r.expiry)
            .max();
        assert_eq!(Some(l.expiry), latest, "{l:?} is not the latest of its MAC");
    }
    out
}
