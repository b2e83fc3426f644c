//! What the core knows of a cocoon VM and of a failed cocoon call (CLI-3, CLI-4).

use serde::{Deserialize, Serialize};

/// The fields of cocoon's VM record the core uses. The shell decodes cocoon's JSON
/// tolerantly into this; unknown keys never reach the core.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmRecord {
    pub id: String,
    pub name: String,
    pub state: String,
    #[serde(default)]
    pub pid: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    /// `network_configs[0].mac`, lowercase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `network_configs[0].network.ip`: present only for a static NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_ip: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Every NIC's TAP device, for the shell's per-VM network counters (the core only
    /// carries them to the published views).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taps: Vec<String>,
    /// The COW disk's path (`storage_configs[role=cow].path`), for the disk usage series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cow: Option<String>,
    /// cocoon-macos only: the VNC display the guest serves (port − 5900); `None`: no VNC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vnc: Option<u16>,
    /// Every NIC in order (index 0 is the primary), for the guest fix-up (C13, C15).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<Nic>,
    /// The VM boots a cloud image (`image_type` cloudimg, an `http(s)://` image, or an
    /// `overlay.qcow2` disk): its network is rebuilt by cloud-init, not by networkd files.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cloud_image: bool,
}

/// One NIC of a VM record (`network_configs[i]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// Lowercase, colon-separated.
    pub mac: String,
    /// Static addressing from CNI IPAM; `None`: a DHCP NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<StaticNet>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticNet {
    pub ip: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

impl VmRecord {
    /// Only the exact string `running` means alive (CLI-5).
    pub fn is_running(&self) -> bool {
        self.state == "running"
    }

    /// A placeholder of a create that has not committed (or whose creator died) (CLI-5).
    pub fn is_creating(&self) -> bool {
        self.state == "creating"
    }

    /// Some NIC has a static address, which a copied guest still holds from its source.
    pub fn has_static_nic(&self) -> bool {
        self.nics.iter().any(|n| n.network.is_some())
    }
}

/// How a failed cocoon call is classified. Only `VmNotFound` proves a VM is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CocoonErrorKind {
    VmNotFound,
    SnapshotNotFound,
    ImageNotFound,
    SnapshotNameTaken,
    SnapshotBusy,
    VmNameTaken,
    NotRunning,
    InvalidArgs,
    Unsupported,
    /// The call succeeded by exit status but its output could not be decoded.
    BadOutput,
    /// The call did not finish in time; the shell killed it.
    Timeout,
    Transient,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CocoonError {
    pub kind: CocoonErrorKind,
    pub message: String,
}

impl CocoonError {
    pub fn new(kind: CocoonErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Classifies a failed call from its combined stderr+stdout (case-insensitive substring
    /// match; log lines precede the `Error:` line, so the whole text is searched).
    pub fn classify(text: &str) -> Self {
        let lower = text.to_ascii_lowercase();
        let has = |s: &str| lower.contains(s);
        let kind = if has("vm not found") || has("no such vm") {
            CocoonErrorKind::VmNotFound
        } else if has("snapshot not found") || has("no such snapshot") {
            CocoonErrorKind::SnapshotNotFound
        } else if has("not found in any backend") {
            CocoonErrorKind::ImageNotFound
        } else if has("is in use by an active") {
            CocoonErrorKind::SnapshotBusy
        } else if has("vm name") && has("already exists") {
            CocoonErrorKind::VmNameTaken
        } else if has("already exists") || has("already in use by") {
            CocoonErrorKind::SnapshotNameTaken
        } else if has("vm not running") || has("not running") {
            CocoonErrorKind::NotRunning
        } else if has("unknown command") {
            CocoonErrorKind::Unsupported
        } else if has("not supported")
            || has("below snapshot minimum")
            || has("mutually exclusive")
            || has("unknown flag")
        {
            CocoonErrorKind::InvalidArgs
        } else {
            CocoonErrorKind::Transient
        };
        Self {
            kind,
            message: error_line(text),
        }
    }
}

/// The `Error: …` line when there is one, else the last non-empty line: what a person reads.
fn error_line(text: &str) -> String {
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let last_error = lines.clone().rev().find_map(|l| l.strip_prefix("Error: "));
    last_error
        .or_else(|| lines.clone().next_back())
        .unwrap_or("cocoon failed with no output")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use CocoonErrorKind::*;

    #[test]
    fn classification_follows_the_cli_contract() {
        let cases = [
            ("Error: inspect: vm abc: VM not found", VmNotFound),
            ("Error: vm abc: VM not found", VmNotFound),
            ("level=info x\nError: exec: vm Q3: No such VM", VmNotFound),
            ("Error: inspect: snapshot not found", SnapshotNotFound),
            (
                "Error: image \"x\": not found in any backend",
                ImageNotFound,
            ),
            (
                "Error: create VM: reserve VM record: vm name \"a\" already exists (id: X)",
                VmNameTaken,
            ),
            (
                "Error: snapshot name \"n\" already exists",
                SnapshotNameTaken,
            ),
            (
                "Error: save snapshot: snapshot name \"n\" already in use by ABC",
                SnapshotNameTaken,
            ),
            (
                "Error: unknown command \"reconcile-stale-create\" for \"cocoon vm\"",
                Unsupported,
            ),
            // A flag this cocoon does not know will not be known on a retry either.
            ("Error: unknown flag: --restore-mode", InvalidArgs),
            ("Error: exec: executable file not found in $PATH", Transient),
            ("Error: config file not found", Transient),
        ];
        for (text, kind) in cases {
            assert_eq!(CocoonError::classify(text).kind, kind, "{text}");
        }
        assert_eq!(CocoonError::classify("log\nError: boom\n").message, "boom");
    }
}
