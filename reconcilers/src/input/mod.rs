//! What comes into the core: every event, with the outcomes of the actions that have one.

pub mod event;
