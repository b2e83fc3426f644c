//! Tolerant decoding of cocoon's JSON (CLI-4): unknown keys are ignored, keys that
//! may be omitted default, and anything undecodable is an error value, never a panic.

use reconcilers::event::{CocoonOk, SnapshotInfo};
use reconcilers::vm::{CocoonError, CocoonErrorKind, Nic, StaticNet, VmRecord};
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
    #[serde(default)]
    image_type: String,
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
    #[serde(default)]
    prefix: Option<u32>,
    #[serde(default)]
    gateway: String,
}

impl From<RawVm> for VmRecord {
    fn from(r: RawVm) -> Self {
        let nics = r.network_configs.unwrap_or_default();
        let taps = nics
            .iter()
            .map(|n| n.tap.clone())
            .filter(|t| !t.is_empty())
            .collect();
        let disks = r.storage_configs.unwrap_or_default();
        let overlay = disks
            .iter()
            .any(|d| std::path::Path::new(&d.path).file_name() == Some("overlay.qcow2".as_ref()));
        let cloud_image = overlay
            || r.config.image_type == "cloudimg"
            || r.config.image.starts_with("http://")
            || r.config.image.starts_with("https://");
        let cow = disks
            .into_iter()
            .find(|d| d.role == "cow" && !d.path.is_empty())
            .map(|d| d.path);
        let all: Vec<Nic> = nics
            .iter()
            .map(|n| Nic {
                mac: n.mac.to_ascii_lowercase(),
                network: n
                    .network
                    .as_ref()
                    .filter(|s| !s.ip.is_empty())
                    .map(|s| StaticNet {
                        ip: s.ip.clone(),
                        prefix: s.prefix,
                        gateway: Some(s.gateway.clone()).filter(|g| !g.is_empty()),
                    }),
            })
            .collect();
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
            nics: all,
            cloud_image,
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
        #[serde(default)]
        description: String,
    }
    let r: Raw = serde_json::from_str(text).map_err(|e| bad("snapshot record", e, text))?;
    Ok(SnapshotInfo {
        id: r.id,
        name: r.name,
        hypervisor: r.hypervisor,
        image: r.image,
        description: r.description,
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
        assert!(!v.cloud_image);
    }

    #[test]
    fn every_nic_and_the_cloud_image_marks() {
        let text = r#"{"id":"Q3","state":"running","config":{"name":"vk-a","image":"https://x/y.img"},
            "network_configs":[{"mac":"02:00:00:00:00:0A"},
                               {"mac":"02:00:00:00:00:0b","network":{"ip":"10.1.0.5","gateway":"10.1.0.1","prefix":16}},
                               {"mac":"02:00:00:00:00:0c","network":{}}]}"#;
        let v = vm(text).unwrap();
        assert!(v.cloud_image);
        assert_eq!(v.nics.len(), 3);
        assert_eq!(v.nics[0].mac, "02:00:00:00:00:0a");
        assert_eq!(v.nics[0].network, None);
        let net = v.nics[1].network.clone().unwrap();
        assert_eq!(
            (net.ip.as_str(), net.prefix, net.gateway.as_deref()),
            ("10.1.0.5", Some(16), Some("10.1.0.1"))
        );
        assert_eq!(
            v.nics[2].network, None,
            "an empty network object is a DHCP NIC"
        );
        assert!(v.has_static_nic());
        let overlay = r#"{"id":"Q","config":{"name":"a","image":"ubuntu"},"storage_configs":[{"path":"/r/Q/overlay.qcow2","role":"cow"}]}"#;
        assert!(vm(overlay).unwrap().cloud_image);
        let typed = r#"{"id":"Q","config":{"name":"a","image":"ubuntu","image_type":"cloudimg"}}"#;
        assert!(vm(typed).unwrap().cloud_image);
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
