//! What the core knows of the cocoon-macos backend (C14, R10): the steps of a macOS
//! bring-up, the VNC display range, and the rate limit of in-place restarts.

use serde::{Deserialize, Serialize};

/// C14: VNC host ports are 5900–5999; display D serves port 5900 + D.
pub const VNC_BASE_PORT: u16 = 5900;
pub const VNC_DISPLAYS: u16 = 100;

/// R10: a dead guest is restarted in place at most once per minute.
pub const RESTART_INTERVAL_MS: i64 = 60_000;

/// One step of a macOS bring-up. `vnc` is the display the guest is started with (`None`: no
/// VNC); it is this pod's while the step is out, so no other pod is given it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "macos", rename_all = "snake_case")]
pub enum MacosStep {
    /// `cocoon-macos image pull IMAGE`.
    Pull { vnc: Option<u16> },
    /// `cocoon-macos vm run`.
    Run { vnc: Option<u16> },
    /// `vm start`: a dead guest of this name is relaunched, never run a second time.
    Start { vnc: Option<u16>, then: Then },
    /// `vm inspect`: the guest's record (pid, MAC, display), and what it is for.
    Inspect { vnc: Option<u16>, then: Then },
}

/// What the guest's record is for once it is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Then {
    /// A guest this bring-up launched.
    Boot,
    /// `vm run` found the name taken: the guest of that name is this pod's (C4).
    Adopt,
    /// Startup found the pod's guest dead and started it: re-attach without a flap (B1).
    Resume,
}

impl MacosStep {
    /// The display this step holds.
    pub fn vnc(&self) -> Option<u16> {
        match self {
            MacosStep::Pull { vnc }
            | MacosStep::Run { vnc }
            | MacosStep::Start { vnc, .. }
            | MacosStep::Inspect { vnc, .. } => *vnc,
        }
    }
}

/// The text of a VNC port, without allocating (the annotation is compared on every event).
pub fn port_str(display: u16) -> Option<&'static str> {
    PORTS.get(usize::from(display)).copied()
}

const PORTS: [&str; VNC_DISPLAYS as usize] = [
    "5900", "5901", "5902", "5903", "5904", "5905", "5906", "5907", "5908", "5909", "5910", "5911",
    "5912", "5913", "5914", "5915", "5916", "5917", "5918", "5919", "5920", "5921", "5922", "5923",
    "5924", "5925", "5926", "5927", "5928", "5929", "5930", "5931", "5932", "5933", "5934", "5935",
    "5936", "5937", "5938", "5939", "5940", "5941", "5942", "5943", "5944", "5945", "5946", "5947",
    "5948", "5949", "5950", "5951", "5952", "5953", "5954", "5955", "5956", "5957", "5958", "5959",
    "5960", "5961", "5962", "5963", "5964", "5965", "5966", "5967", "5968", "5969", "5970", "5971",
    "5972", "5973", "5974", "5975", "5976", "5977", "5978", "5979", "5980", "5981", "5982", "5983",
    "5984", "5985", "5986", "5987", "5988", "5989", "5990", "5991", "5992", "5993", "5994", "5995",
    "5996", "5997", "5998", "5999",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_display_has_its_port() {
        for d in 0..VNC_DISPLAYS {
            assert_eq!(port_str(d), Some((VNC_BASE_PORT + d).to_string().as_str()));
        }
        assert_eq!(port_str(VNC_DISPLAYS), None);
    }
}

/// B1: the cocoon-macos guests, listed once at startup when some pod is a managed macOS one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "macos_list", content = "vms", rename_all = "snake_case")]
pub enum Inventory {
    /// Not asked for (no macOS pod), or already used by the startup reconcile.
    #[default]
    None,
    /// `cocoon-macos vm list` is out.
    Listing,
    Listed(Vec<crate::vm::VmRecord>),
}

impl Inventory {
    /// Journal headers written before macOS pods ran have no such key: an unused inventory
    /// is not written, so their bytes stay the same.
    pub fn is_none(&self) -> bool {
        matches!(self, Inventory::None)
    }
}
