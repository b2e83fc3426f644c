//! Tolerant decoding of cocoon's JSON (CLI-4): unknown keys are ignored, keys that
//! may be omitted default, and anything undecodable is an error value, never a panic.

use reconcilers::event::{CocoonOk, SnapshotInfo};
use reconcilers::vm::{CocoonError, CocoonErrorKind, VmRecord};
use serde::Deserialize;

#[derive(Deserialize, Default)]
struct RawVm {
    #[serde(default)]
    id: String,
    #[serde(default)]
    hypervisor: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    config: RawConfig,
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    network_configs: Option<Vec<RawNic>>,
    #[serde(default)]
    storage_configs: Option<Vec<RawDisk>>,
}

#[derive(Deserialize, Default)]
struct RawDisk {
    #[serde(default)]
    path: String,
    #[serde(default)]
    role: String,
}

#[derive(Deserialize, Default)]
struct RawConfig {
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: String,
}

#[derive(Deserialize, Default)]
struct RawNic {
    #[serde(default)]
    mac: String,
    #[serde(default)]
    tap: String,
    #[serde(default)]
    network: Option<RawStatic>,
}

#[derive(Deserialize, Default)]
struct RawStatic {
    #[serde(default)]
    ip: String,
}

impl From<RawVm> for VmRecord {
    fn from(r: RawVm) -> Self {
        let nics = r.network_configs.unwrap_or_default();
        let taps = nics
            .iter()
            .map(|n| n.tap.clone())
            .filter(|t| !t.is_empty())
            .collect();
        let cow = r
            .storage_configs
            .unwrap_or_default()
            .into_iter()
            .find(|d| d.role == "cow" && !d.path.is_empty())
            .map(|d| d.path);
        let nic = nics.into_iter().next();
        VmRecord {
            id: r.id,
            name: r.config.name,
            state: r.state,
            pid: r.pid.unwrap_or(0),
            hypervisor: r.hypervisor,
            mac: nic
                .as_ref()
                .map(|n| n.mac.to_ascii_lowercase())
                .filter(|m| !m.is_empty()),
            static_ip: nic
                .and_then(|n| n.network)
                .map(|s| s.ip)
                .filter(|ip| !ip.is_empty()),
            image: r.config.image,
            taps,
            cow,
            vnc: None,
        }
    }
}

fn bad(what: &str, err: impl std::fmt::Display, text: &str) -> CocoonError {
    let sample: String = text.chars().take(200).collect();
    CocoonError::new(
        CocoonErrorKind::BadOutput,
        format!("cannot decode {what} from cocoon: {err}; output began {sample:?}"),
    )
}

pub fn vm(text: &str) -> Result<VmRecord, CocoonError> {
    serde_json::from_str::<RawVm>(text)
        .map(VmRecord::from)
        .map_err(|e| bad("VM record", e, text))
}

/// `vm list -o json`: an array, or the literal text `No VMs found.` on an empty host.
pub fn vms(text: &str) -> Result<Vec<VmRecord>, CocoonError> {
    let t = text.trim();
    if t.is_empty() || t.starts_with("No VMs found") {
        return Ok(Vec::new());
    }
    let raw: Option<Vec<RawVm>> = serde_json::from_str(t).map_err(|e| bad("VM list", e, text))?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(VmRecord::from)
        .filter(|v| !v.id.is_empty())
        .collect())
}

pub fn snapshot(text: &str) -> Result<SnapshotInfo, CocoonError> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        hypervisor: String,
        #[serde(default)]
        image: String,
    }
    let r: Raw = serde_json::from_str(text).map_err(|e| bad("snapshot record", e, text))?;
    Ok(SnapshotInfo {
        id: r.id,
        name: r.name,
        hypervisor: r.hypervisor,
        image: r.image,
    })
}

pub fn stale_create(text: &str) -> Result<CocoonOk, CocoonError> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        outcome: String,
    }
    let r: Raw = serde_json::from_str(text).map_err(|e| bad("stale-create outcome", e, text))?;
    let outcome = reconcilers::event::StaleOutcome::parse(&r.outcome).ok_or_else(|| {
        bad(
            "stale-create outcome",
            format!("unknown outcome {:?}", r.outcome),
            text,
        )
    })?;
    Ok(CocoonOk::StaleCreate { outcome })
}

/// One line of `vm status --event --format json`.
pub fn stream_line(line: &str) -> Result<(reconcilers::event::VmEventKind, VmRecord), String> {
    #[derive(Deserialize)]
    struct Raw {
        event: reconcilers::event::VmEventKind,
        vm: RawVm,
    }
    let r: Raw = serde_json::from_str(line).map_err(|e| format!("undecodable event line: {e}"))?;
    Ok((r.event, r.vm.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_documented_record_and_ignores_unknown_keys() {
        let text = r#"{"id":"Q3","hypervisor":"cloud-hypervisor","state":"running","config":{"cpu":2,"name":"vk-a","image":"img"},
            "pid":48213,"network_configs":[{"tap":"t","mac":"02:5E:11:3A:9C:01","network":{"ip":"10.89.0.2","prefix":24}}],"new_key":{"x":1}}"#;
        let v = vm(text).unwrap();
        assert_eq!(v.name, "vk-a");
        assert_eq!(v.pid, 48213);
        assert_eq!(v.mac.as_deref(), Some("02:5e:11:3a:9c:01"));
        assert_eq!(v.static_ip.as_deref(), Some("10.89.0.2"));
    }

    #[test]
    fn empty_list_forms_and_garbage() {
        assert!(vms("No VMs found.\n").unwrap().is_empty());
        assert!(vms("null").unwrap().is_empty());
        assert_eq!(
            vms("[{\"id\":\"\"},{\"id\":\"A\",\"config\":{\"name\":\"a\"}}]")
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            vm("{not json").unwrap_err().kind,
            CocoonErrorKind::BadOutput
        );
        assert!(stream_line("garbage").is_err());
    }
}
