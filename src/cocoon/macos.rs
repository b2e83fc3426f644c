//! The cocoon-macos side of the cocoon client (C14): its argv with the VNC password added
//! here (the core's command, and so the journal, never holds it), and its own record shape
//! decoded tolerantly into the core's `VmRecord` (a guest is known by its name, which also
//! serves as its id).

use reconcilers::cocoon::CocoonCmd;
use reconcilers::vm::{CocoonError, CocoonErrorKind, VmRecord};
use serde::Deserialize;

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
