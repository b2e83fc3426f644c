//! The pod table. Every event looks pods up by key several times, and on a 1,000-pod node a
//! B-tree search would spend a fifth of `reduce`'s work in key comparisons; a hash lookup is one
//! hash of a short key. The hasher is fixed (FxHash, no per-process seed), and the table is
//! only ever walked in key order (`sorted`), so neither randomness nor insertion history can
//! reach an action, a snapshot or a replay.

use std::collections::HashMap;
use std::fmt;
use std::ops::Index;

use rustc_hash::FxBuildHasher;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::pod::PodKey;
use crate::state::PodEntry;

/// Boxed entries: an entry is about 2 KiB, and growing the table moves only pointers.
#[derive(Clone, Default, PartialEq)]
pub struct PodTable(HashMap<PodKey, Box<PodEntry>, FxBuildHasher>);

impl PodTable {
    #[inline]
    pub fn get(&self, key: &PodKey) -> Option<&PodEntry> {
        self.0.get(key).map(|e| &**e)
    }

    #[inline]
    pub fn get_mut(&mut self, key: &PodKey) -> Option<&mut PodEntry> {
        self.0.get_mut(key).map(|e| &mut **e)
    }

    /// The incarnation a timer or a late outcome was meant for: the pod under `key`, if it
    /// still has `uid` (a successor under the same name is another pod).
    #[inline]
    pub fn incarnation(&mut self, key: &PodKey, uid: &str) -> Option<&mut PodEntry> {
        self.get_mut(key).filter(|e| e.pod.uid == uid)
    }

    #[inline]
    pub fn contains_key(&self, key: &PodKey) -> bool {
        self.0.contains_key(key)
    }

    pub fn insert(&mut self, key: PodKey, entry: Box<PodEntry>) -> Option<Box<PodEntry>> {
        self.0.insert(key, entry)
    }

    pub fn remove(&mut self, key: &PodKey) -> Option<Box<PodEntry>> {
        self.0.remove(key)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every pod in key order: the only way to walk the table.
    pub fn sorted(&self) -> Vec<(&PodKey, &PodEntry)> {
        let mut all: Vec<(&PodKey, &PodEntry)> = self.0.iter().map(|(k, e)| (k, &**e)).collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all
    }

    /// The smallest key whose entry satisfies `f`: an answer that does not depend on the
    /// table's layout, without sorting it.
    pub fn first_where(&self, f: impl Fn(&PodKey, &PodEntry) -> bool) -> Option<&PodKey> {
        self.0.iter().filter(|(k, e)| f(k, e)).map(|(k, _)| k).min()
    }

    /// Every key in order.
    pub fn keys(&self) -> Vec<PodKey> {
        self.sorted().into_iter().map(|(k, _)| k.clone()).collect()
    }
}

impl Index<&PodKey> for PodTable {
    type Output = PodEntry;

    fn index(&self, key: &PodKey) -> &PodEntry {
        self.get(key).expect("pod in table")
    }
}

impl fmt::Debug for PodTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

/// A JSON object in key order, exactly as the `BTreeMap` it replaces wrote it.
impl Serialize for PodTable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.sorted())
    }
}

impl<'de> Deserialize<'de> for PodTable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let all = std::collections::BTreeMap::<PodKey, Box<PodEntry>>::deserialize(d)?;
        Ok(PodTable(all.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodView;

    fn entry(ns: &str, name: &str) -> Box<PodEntry> {
        Box::new(PodEntry::new(PodView {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("{ns}-{name}"),
            ..PodView::default()
        }))
    }

    #[test]
    fn walks_and_writes_in_key_order_whatever_the_insertion_order() {
        let names: Vec<String> = (0..300)
            .map(|i| format!("p{:03}", (i * 7919) % 300))
            .collect();
        let (mut forward, mut backward) = (PodTable::default(), PodTable::default());
        for n in &names {
            forward.insert(PodKey::new("ns", n), entry("ns", n));
        }
        for n in names.iter().rev() {
            backward.insert(PodKey::new("ns", n), entry("ns", n));
        }
        forward.insert(PodKey::new("a", "z"), entry("a", "z"));
        backward.insert(PodKey::new("a", "z"), entry("a", "z"));
        let keys = forward.keys();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(keys, backward.keys());
        assert_eq!(keys[0], PodKey::new("a", "z"));
        let json = serde_json::to_string(&forward).unwrap();
        assert_eq!(json, serde_json::to_string(&backward).unwrap());
        let back: PodTable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, forward);
    }
}
