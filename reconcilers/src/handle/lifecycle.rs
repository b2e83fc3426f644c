//! What a pod's lifecycle annotation must remember beyond its phase (L1–L4, ANN-4): a failure,
//! and that this process has moved the keys. The triple itself is derived when the pod is
//! published (`PodEntry::lifecycle`, written as one unit by `annotations::sync`).

use crate::keys::MESSAGE_LIMIT;
use crate::model::lifecycle::Failure;
use crate::pod::PodKey;
use crate::state::State;

/// A new attempt (`creating`, `hibernating`): it replaces a failure at any generation (L3,
/// ANN-4.2.5).
pub fn attempt(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.sticky.failure = None;
    e.sticky.inherited = false;
    stamp(s, key);
}

/// A transition the phase shows (a bring-up settled, a hibernate done): the triple is
/// re-stamped with the pod's generation.
pub fn stamp(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    e.sticky.generation = e.lifecycle_generation();
    s.touched.insert(key);
}

/// A failure the pod shows until a new attempt, whatever its phase goes on to be (L3).
pub fn failed(s: &mut State, key: &PodKey, message: String) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let generation = e.lifecycle_generation();
    let generation = e
        .sticky
        .failure
        .as_ref()
        .map_or(generation, |f| f.generation.max(generation));
    e.sticky.failure = Some(Failure {
        message: truncate(message, MESSAGE_LIMIT),
        generation,
    });
    e.sticky.inherited = false;
    e.sticky.generation = generation;
    s.touched.insert(key);
}

/// A higher generation stamp alone re-publishes the current state with it (ANN-4.2.6); a
/// failure follows it, so only a new attempt ends it (ANN-4.2.5).
pub fn follow_generation(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let g = e.pod.generation();
    if e.lifecycle().is_some() && g > e.sticky.generation {
        e.sticky.generation = g;
        if let Some(f) = &mut e.sticky.failure {
            f.generation = f.generation.max(g);
        }
        s.touched.insert(key);
    }
}

pub fn truncate(mut m: String, limit: usize) -> String {
    if m.len() > limit {
        let mut cut = limit;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
    }
    m
}
