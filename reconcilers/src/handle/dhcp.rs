//! DHCP leases: cocoon-net's lease table (LEASE-5), the IP of a DHCP NIC resolved from it on
//! every probe tick (R6), and the release of a destroyed VM's lease (D6).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::action::{Action, Counter, Level, OpId};
use crate::event::DhcpLease;
use crate::labels::LeaseReleaseResult;
use crate::pod::PodKey;
use crate::small_str::SmallStr;
use crate::state::{DhcpFile, State, Tracked};
use crate::vm::VmRecord;

/// How long a clone waits for its lease before lifecycle `failed` (C16).
pub const IP_WAIT_MS: u64 = 45_000;

/// The shell sends the lease table as a diff against the last table it sent: rows that are
/// new or changed (`upsert`) and MACs that disappeared (`remove`); the first event after a
/// start carries the whole table as upserts. Only the MACs in the diff are touched and only
/// their pods refreshed: removed ones first, then upserted ones, each in MAC order.
pub fn changed(s: &mut State, upsert: Vec<DhcpLease>, mut remove: Vec<SmallStr>) {
    let first = std::mem::replace(&mut s.dhcp_file, DhcpFile::Read) == DhcpFile::Unread;
    let upsert = normalize(upsert);
    for mac in remove.iter_mut() {
        mac.make_ascii_lowercase();
    }
    remove.sort_unstable();
    remove.dedup();
    let mut macs: Vec<SmallStr> = Vec::with_capacity(remove.len() + upsert.len());
    for mac in remove {
        if s.dhcp_leases.remove(&mac).is_some() {
            macs.push(mac);
        }
    }
    for l in upsert {
        if s.dhcp_leases.get(&l.mac) == Some(&l) {
            continue;
        }
        macs.push(l.mac.clone());
        s.dhcp_leases.insert(l.mac.clone(), l);
    }
    for mac in macs {
        if let Some(key) = s.dhcp_macs.get(mac.as_str()).cloned() {
            if refresh_ip(s, &key) {
                crate::probe::retarget(s, &key);
            }
        }
    }
    if first {
        crate::unmanaged::leases_read(s);
    }
}

/// The diff the shell sends when the lease file now holds `table` and it last sent `last`
/// (the whole table, normalized): new or changed rows, and the MACs no longer present, both
/// in MAC order. Applying it with [`changed`] turns `last` into `table`.
pub fn diff(
    last: &BTreeMap<SmallStr, DhcpLease>,
    table: Vec<DhcpLease>,
) -> (Vec<DhcpLease>, Vec<SmallStr>) {
    let table = normalize(table);
    let mut remove = Vec::new();
    let mut upsert = Vec::new();
    let mut old = last.iter().peekable();
    for l in table {
        let unchanged = loop {
            match old.peek() {
                Some((mac, have)) => match (*mac).cmp(&l.mac) {
                    Ordering::Less => {
                        remove.push((*mac).clone());
                        old.next();
                    }
                    Ordering::Equal => {
                        let same = **have == l;
                        old.next();
                        break same;
                    }
                    Ordering::Greater => break false,
                },
                None => break false,
            }
        };
        if !unchanged {
            upsert.push(l);
        }
    }
    remove.extend(old.map(|(mac, _)| mac.clone()));
    (upsert, remove)
}

/// Lowercase MACs, sorted, one row per MAC. Duplicate MACs should not happen; if they do,
/// the latest expiry wins (stable: on a tie the first row). An already sorted and unique
/// table, which one pass proves, skips the sort and dedup.
pub fn normalize(mut table: Vec<DhcpLease>) -> Vec<DhcpLease> {
    for l in table.iter_mut() {
        l.mac.make_ascii_lowercase();
    }
    if table.windows(2).all(|w| w[0].mac < w[1].mac) {
        return table;
    }
    table.sort_by(|a, b| a.mac.cmp(&b.mac).then(b.expiry.cmp(&a.expiry)));
    table.dedup_by(|later, first| later.mac == first.mac);
    table
}

/// Static NIC → its IP; DHCP NIC → an unexpired lease for its MAC, else none.
pub fn resolve(s: &State, vm: &Tracked) -> Option<String> {
    resolved(s, vm).map(str::to_string)
}

/// [`resolve`], borrowed: probes re-resolve on every tick and the answer rarely changes.
fn resolved<'a>(s: &'a State, vm: &'a Tracked) -> Option<&'a str> {
    if let Some(ip) = &vm.record.static_ip {
        return Some(ip);
    }
    if !vm.managed() {
        return vm.ip.as_deref();
    }
    // Before the lease file was read (a restart), the IP the pod already shows stands.
    if s.dhcp_file == DhcpFile::Unread {
        return vm.ip.as_deref();
    }
    let mut mac = SmallStr::new(vm.record.mac.as_ref()?);
    mac.make_ascii_lowercase();
    let lease = s.dhcp_leases.get(&mac)?;
    (lease.expiry > s.now).then_some(lease.ip.as_str())
}

/// Re-resolves the pod's IP from the lease table; true when it changed.
pub fn refresh_ip(s: &mut State, key: &PodKey) -> bool {
    let Some(vm) = s.pod(key).and_then(|e| e.vm()) else {
        return false;
    };
    let ip = resolved(s, vm);
    if vm.ip.as_deref() == ip {
        return false;
    }
    let ip = ip.map(str::to_string);
    let Some(e) = s.pods.get_mut(key) else {
        return false;
    };
    let arrived = ip.is_some();
    if let Some(vm) = e.phase.vm_mut() {
        vm.ip = ip;
    }
    let waiting = crate::guest::awaiting_lease(&e.phase).is_some();
    s.touched.insert(key);
    if arrived && waiting {
        crate::guest::ip_arrived(s, key);
    }
    true
}

/// The MAC whose lease a destroyed VM leaves behind: its first NIC's, when that NIC is DHCP.
pub(crate) fn release_mac(vm: &VmRecord) -> Option<String> {
    vm.mac.clone().filter(|_| vm.static_ip.is_none())
}

/// D6 (and B8 `destroy`): hands a destroyed VM's lease back to cocoon-net so its address
/// returns to the pool instead of waiting out the lease. Best effort: the release is
/// idempotent on cocoon-net's side, a failure is logged and counted, never retried.
pub(crate) fn release(s: &mut State, mac: &str) {
    if !s.config.release_dhcp_leases {
        return;
    }
    let op = s.next_op();
    s.dhcp_release_ops.insert(op, mac.to_string());
    s.emit(Action::ReleaseDhcpLease {
        op,
        mac: mac.to_string(),
    });
}

pub(crate) fn released(s: &mut State, op: OpId, result: Result<(), String>) {
    let Some(mac) = s.dhcp_release_ops.remove(&op) else {
        return crate::outcome::unexpected(
            s,
            &format!("a lease release outcome for unknown operation #{op}"),
        );
    };
    let outcome = match result {
        Ok(()) => LeaseReleaseResult::Ok,
        Err(why) => {
            s.emit(Action::Log {
                level: Level::Warn,
                message: format!("lease release of {mac} failed (it expires on its own): {why}"),
            });
            LeaseReleaseResult::Error
        }
    };
    s.emit(Action::Count {
        counter: Counter::LeaseRelease { result: outcome },
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn lease(mac: &str, ip: &str, expiry: i64) -> DhcpLease {
        DhcpLease {
            mac: mac.into(),
            ip: ip.into(),
            expiry,
        }
    }

    #[test]
    fn a_diff_applied_turns_the_last_table_into_the_new_one() {
        let mut s = State::new(Config::default());
        let first = vec![
            lease("02:00:00:00:00:0B", "10.0.0.2", 5),
            lease("02:00:00:00:00:0a", "10.0.0.1", 5),
            lease("02:00:00:00:00:0a", "10.0.0.9", 9),
        ];
        changed(&mut s, first, Vec::new());
        assert_eq!(s.dhcp_file, DhcpFile::Read);
        let want = |rows: &[DhcpLease]| -> BTreeMap<SmallStr, DhcpLease> {
            rows.iter().map(|l| (l.mac.clone(), l.clone())).collect()
        };
        let a9 = lease("02:00:00:00:00:0a", "10.0.0.9", 9);
        let b = lease("02:00:00:00:00:0b", "10.0.0.2", 5);
        assert_eq!(s.dhcp_leases, want(&[a9.clone(), b.clone()]));
        let c = lease("02:00:00:00:00:0c", "10.0.0.3", 5);
        let b2 = lease("02:00:00:00:00:0b", "10.0.0.2", 7);
        let (upsert, remove) = diff(&s.dhcp_leases, vec![c.clone(), b2.clone()]);
        assert_eq!(upsert, vec![b2.clone(), c.clone()]);
        assert_eq!(remove, vec![SmallStr::from("02:00:00:00:00:0a")]);
        changed(&mut s, upsert, remove);
        assert_eq!(s.dhcp_leases, want(&[b2, c]));
        assert_eq!(
            diff(&s.dhcp_leases, s.dhcp_leases.values().cloned().collect()),
            (vec![], vec![])
        );
    }
}
