//! The cocoon-net lease table (spec/cocoon-net-leases.md §5) and IP resolution for DHCP NICs.

use std::cmp::Ordering;

use crate::create;
use crate::event::Lease;
use crate::pod::PodKey;
use crate::small_str::SmallStr;
use crate::state::{State, Tracked};

/// The shell re-reads the whole lease file, so every change arrives as the full table. With
/// one VM per lease that is O(n) per event; the diff below is one merge walk over two sorted
/// sequences without allocating, and only changed MACs are cloned and routed.
pub fn changed(s: &mut State, mut table: Vec<Lease>) {
    normalize(&mut table);
    s.leases_seen = true;
    let mut gone: Vec<SmallStr> = Vec::new();
    let mut upsert: Vec<usize> = Vec::new();
    let mut old = s.leases.iter().peekable();
    for (i, l) in table.iter().enumerate() {
        // Each MAC is compared once: the stored ones before it are gone, an equal one is
        // kept if the row is unchanged.
        let unchanged = loop {
            match old.peek() {
                Some((mac, have)) => match (*mac).cmp(&l.mac) {
                    Ordering::Less => {
                        gone.push((*mac).clone());
                        old.next();
                    }
                    Ordering::Equal => {
                        let same = *have == l;
                        old.next();
                        break same;
                    }
                    Ordering::Greater => break false,
                },
                None => break false,
            }
        };
        if !unchanged {
            upsert.push(i);
        }
    }
    gone.extend(old.map(|(mac, _)| mac.clone()));
    if gone.is_empty() && upsert.is_empty() {
        return;
    }
    let mut macs: Vec<SmallStr> = Vec::with_capacity(gone.len() + upsert.len());
    for mac in gone {
        s.leases.remove(&mac);
        macs.push(mac);
    }
    for i in upsert {
        let l = table[i].clone();
        macs.push(l.mac.clone());
        s.leases.insert(l.mac.clone(), l);
    }
    for mac in macs {
        if let Some(key) = s.macs.get(mac.as_str()).cloned() {
            refresh_ip(s, &key);
        }
    }
}

/// Lowercase MACs, sorted, one row per MAC. Duplicate MACs should not happen; if they do,
/// the latest expiry wins (stable: on a tie the first row). The shell's table is already
/// sorted and unique, which one pass proves, so the sort and dedup are skipped then.
fn normalize(table: &mut Vec<Lease>) {
    for l in table.iter_mut() {
        l.mac.make_ascii_lowercase();
    }
    if table.windows(2).all(|w| w[0].mac < w[1].mac) {
        return;
    }
    table.sort_by(|a, b| a.mac.cmp(&b.mac).then(b.expiry.cmp(&a.expiry)));
    table.dedup_by(|later, first| later.mac == first.mac);
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
    if vm.unmanaged {
        return vm.ip.as_deref();
    }
    // Before the lease file was read (a restart), the IP the pod already shows stands.
    if !s.leases_seen {
        return vm.ip.as_deref();
    }
    let mut mac = SmallStr::new(vm.record.mac.as_ref()?);
    mac.make_ascii_lowercase();
    let lease = s.leases.get(&mac)?;
    (lease.expiry > s.now).then_some(lease.ip.as_str())
}

pub fn refresh_ip(s: &mut State, key: &PodKey) {
    let Some(vm) = s.pods.get(key).and_then(|e| e.vm.as_ref()) else {
        return;
    };
    let ip = resolved(s, vm);
    if vm.ip.as_deref() == ip {
        return;
    }
    let ip = ip.map(str::to_string);
    let e = s.pods.get_mut(key).expect("present");
    e.vm.as_mut().expect("present").ip = ip.clone();
    s.touched.insert(key);
    if ip.is_some() && s.pods[key].ip_wait.is_some() {
        create::ip_arrived(s, key);
    }
}
