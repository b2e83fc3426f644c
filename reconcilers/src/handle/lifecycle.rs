//! Lifecycle intent (L1–L4, ANN-4): one per pod incarnation, written as an atomic
//! triple by `annotations::sync`. This module only decides what the intent is.

use crate::keys::MESSAGE_LIMIT;
use crate::pod::PodKey;
use crate::state::{Intent, Lifecycle, State};

pub fn set(s: &mut State, key: &PodKey, state: Lifecycle, message: Option<String>) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let generation = e.pod.generation().max(e.intent.generation);
    // Sticky failure (L3, ANN-4.2.5): at the same generation only a new attempt replaces it.
    if e.intent.state == Some(Lifecycle::Failed)
        && generation == e.intent.generation
        && matches!(state, Lifecycle::Ready | Lifecycle::Hibernated)
    {
        return;
    }
    let message = if state == Lifecycle::Failed {
        message.map(|m| truncate(m, MESSAGE_LIMIT))
    } else {
        None
    };
    e.intent = Intent {
        state: Some(state),
        generation,
        message,
    };
    s.touched.insert(key);
}

/// A higher generation stamp alone re-publishes the current state with it (ANN-4.2.6).
pub fn follow_generation(s: &mut State, key: &PodKey) {
    let Some(e) = s.pods.get_mut(key) else { return };
    let g = e.pod.generation();
    if e.intent.state.is_some() && g > e.intent.generation {
        e.intent.generation = g;
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
