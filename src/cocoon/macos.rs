//! The cocoon-macos side of the cocoon client (C14): its argv with the VNC password added
//! here (the core's command, and so the journal, never holds it), and its own record shape
//! decoded tolerantly into the core's `VmRecord` (a guest is known by its name, which also
//! serves as its id).

use reconcilers::cocoon::CocoonCmd;
use reconcilers::vm::{CocoonError, CocoonErrorKind, VmRecord};
use serde::Deserialize;

/// C14: a guest's own VNC password: eight characters derived from the node's password
/// (`COCOON_MACOS_VNC_PASSWORD`), the pod's namespace and the guest's name. Every guest's VNC
/// port is reachable from the node's network, so one password for all would let any tenant
/// told its own into every other tenant's display; a derived one tells nothing of another
/// guest's, and the operator, who holds the node's password, computes it for a tenant with
/// `vk-cocoon vnc-password <namespace> <guest>`.
pub fn guest_password(node: &str, namespace: &str, guest: &str) -> String {
    use base64::Engine as _;
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    for part in ["vk-cocoon vnc", node, namespace, guest] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..6])
}

/// The argv of a cocoon-macos command: `--vnc-password P` follows `--vnc D` when a password
/// is configured (the core asks for a display only then).
pub fn argv(cmd: &CocoonCmd, password: Option<&str>) -> Vec<String> {
    let mut argv = cmd.argv();
    let (Some(password), Some(at)) = (password, argv.iter().position(|a| a == "--vnc")) else {
        return argv;
    };
    let dash = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    if at + 1 < dash {
        argv.insert(at + 2, "--vnc-password".into());
        argv.insert(at + 3, password.into());
    }
    argv
}

/// An error text never carries the password, whatever the child echoed.
pub fn redact(mut err: CocoonError, password: Option<&str>) -> CocoonError {
    if let Some(p) = password.filter(|p| !p.is_empty()) {
        err.message = err.message.replace(p, "***");
    }
    err
}

#[derive(Deserialize, Default)]
struct RawGuest {
    #[serde(default)]
    name: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    mac: String,
    #[serde(default)]
    tap: String,
    #[serde(default)]
    disk: String,
    #[serde(default)]
    vnc: Option<i64>,
    #[serde(default)]
    image: String,
}

impl From<RawGuest> for VmRecord {
    fn from(r: RawGuest) -> Self {
        VmRecord {
            id: r.name.clone(),
            name: r.name,
            state: r.state,
            pid: r.pid.unwrap_or(0),
            hypervisor: "cocoon-macos".into(),
            mac: Some(r.mac.to_ascii_lowercase()).filter(|m| !m.is_empty()),
            static_ip: None,
            image: r.image,
            taps: Some(r.tap).into_iter().filter(|t| !t.is_empty()).collect(),
            cow: Some(r.disk).filter(|d| !d.is_empty()),
            // -1 (or anything out of 0–99): no VNC.
            vnc: r
                .vnc
                .and_then(|d| u16::try_from(d).ok())
                .filter(|d| *d < reconcilers::macos_model::VNC_DISPLAYS),
            // One DHCP NIC on the CNI network; macOS guests are never fixed up (no clones).
            ..VmRecord::default()
        }
    }
}

fn bad(what: &str, err: impl std::fmt::Display, text: &str) -> CocoonError {
    let sample: String = text.chars().take(200).collect();
    CocoonError::new(
        CocoonErrorKind::BadOutput,
        format!("cannot decode {what} from cocoon-macos: {err}; output began {sample:?}"),
    )
}

/// `vm inspect`: one record, which must name its guest.
pub fn vm(text: &str) -> Result<VmRecord, CocoonError> {
    let raw: RawGuest = serde_json::from_str(text).map_err(|e| bad("vm inspect", e, text))?;
    if raw.name.is_empty() {
        return Err(bad("vm inspect", "a record without a name", text));
    }
    Ok(raw.into())
}

/// `vm list`: an array; records without a name are skipped, an empty output is no guests.
pub fn vms(text: &str) -> Result<Vec<VmRecord>, CocoonError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let raw: Vec<RawGuest> = serde_json::from_str(text).map_err(|e| bad("vm list", e, text))?;
    Ok(raw
        .into_iter()
        .filter(|r| !r.name.is_empty())
        .map(VmRecord::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_has_its_own_password_of_eight_characters() {
        let a = guest_password("node-secret", "team-a", "mac-1");
        assert_eq!(a.len(), 8);
        assert_eq!(a, guest_password("node-secret", "team-a", "mac-1"));
        for other in [
            guest_password("node-secret", "team-b", "mac-1"),
            guest_password("node-secret", "team-a", "mac-2"),
            guest_password("another-node", "team-a", "mac-1"),
            // The parts are length-prefixed: moving a character across them changes it.
            guest_password("node-secret", "team-am", "ac-1"),
        ] {
            assert_ne!(a, other);
        }
        let cmd = CocoonCmd::MacosStart {
            name: "mac-1".into(),
            vnc: Some(3),
        };
        let argv = argv(&cmd, Some(&a));
        let at = argv.iter().position(|x| x == "--vnc-password").unwrap();
        assert_eq!(argv[at + 1], a);
        assert!(!argv.iter().any(|x| x == "node-secret"));
    }

    #[test]
    fn the_password_follows_the_display_and_stays_before_the_dash() {
        let cmd = CocoonCmd::MacosStart {
            name: "vk-m".into(),
            vnc: Some(2),
        };
        assert_eq!(
            argv(&cmd, Some("pw")).join(" "),
            "vm start --vnc 2 --vnc-password pw -- vk-m"
        );
        let plain = CocoonCmd::MacosStart {
            name: "vk-m".into(),
            vnc: None,
        };
        assert_eq!(argv(&plain, Some("pw")).join(" "), "vm start -- vk-m");
    }

    #[test]
    fn records_decode_tolerantly() {
        let text = r#"[{"name":"vk-m","state":"running","pid":42,"mac":"02:AA:00:00:00:01",
            "tap":"t0","disk":"/d","vnc":3,"cpus":4,"memory_mb":8192,"image":"i","new":1},
            {"name":"vk-n","state":"stopped","pid":0,"vnc":-1}, {"state":"x"}]"#;
        let listed = vms(text).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].id, "vk-m");
        assert_eq!(listed[0].mac.as_deref(), Some("02:aa:00:00:00:01"));
        assert_eq!(listed[0].vnc, Some(3));
        assert_eq!(listed[1].vnc, None);
        assert!(vm("{}").is_err());
        assert!(vms("not json").is_err());
    }
}
