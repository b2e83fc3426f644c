//! What goes out of the core: actions, the cocoon argv they carry, and the one-line forms
//! that replay timelines and scenario files print.

pub mod action;
pub mod cocoon;
pub mod fixup;
pub mod labels;
pub(crate) mod macos_cmd;
pub mod render;
