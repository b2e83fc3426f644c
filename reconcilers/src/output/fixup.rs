//! The guest fix-up of a copied VM (C13): the command run in the guest through `vm exec`, and
//! the hint a person gets when it gives up. A clone carries its source's hostname, MACs and
//! static addresses; the command makes the guest take the clone's own.
//!
//! Everything interpolated into a script comes from cocoon's VM record or the pod's VM name
//! and is checked here first (MACs as hex pairs, addresses as dotted quads, the name by the
//! VM-name rule), so nothing a pod writes can change what the script does.

use core::net::Ipv4Addr;

use base64::Engine;

use crate::names::valid_vm_name;
use crate::phase::FixupKind;
use crate::vm::{Nic, VmRecord};

/// Disables and re-enables every present network device, so Windows drops the source's
/// addresses and asks DHCP (or takes SAC's static address) for the clone's NICs.
const WINDOWS_SCRIPT: &str = "Get-PnpDevice -Class Net -PresentOnly | ForEach-Object { \
     Disable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false; \
     Enable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false }";

const NETWORKD: &str = "/etc/systemd/network";

/// The argv run in the guest, after `vm exec <id> --`.
pub fn argv(kind: FixupKind, vm_name: &str, vm: &VmRecord) -> Result<Vec<String>, String> {
    Ok(match kind {
        FixupKind::Windows => vec![
            "powershell".into(),
            "-nop".into(),
            "-c".into(),
            WINDOWS_SCRIPT.into(),
        ],
        FixupKind::LinuxFc | FixupKind::LinuxStatic => {
            // The guest's own shell runs the script, inside the VM; nothing runs on the host.
            vec!["sh".into(), "-c".into(), linux_script(kind, vm_name, vm)?]
        }
    })
}

/// `post-clone-hint`: base64 of the script (Linux) or of the whole PowerShell command line.
pub fn hint(kind: FixupKind, vm_name: &str, vm: &VmRecord) -> String {
    let text = match argv(kind, vm_name, vm) {
        Ok(argv) => match kind {
            FixupKind::Windows => format!("powershell -nop -c \"{WINDOWS_SCRIPT}\""),
            FixupKind::LinuxFc | FixupKind::LinuxStatic => argv[2].clone(),
        },
        Err(e) => format!("# no fix-up script could be built: {e}"),
    };
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn linux_script(kind: FixupKind, vm_name: &str, vm: &VmRecord) -> Result<String, String> {
    if !valid_vm_name(vm_name) {
        return Err(format!("VM name {vm_name:?} is not a valid host name"));
    }
    for nic in &vm.nics {
        check_nic(nic)?;
    }
    let mut lines = vec![
        "sync; echo 3 > /proc/sys/vm/drop_caches".to_string(),
        format!("printf '%s\\n' '{vm_name}' > /etc/hostname"),
    ];
    if kind == FixupKind::LinuxFc {
        // firecracker gives the clone new MACs but the guest kernel keeps the source's.
        for (i, nic) in vm.nics.iter().enumerate() {
            lines.push(format!(
                "ip link set eth{i} down && ip link set eth{i} address {} && ip link set eth{i} up",
                nic.mac
            ));
        }
    }
    lines.push(format!("rm -f {NETWORKD}/10-*.network"));
    if vm.cloud_image {
        lines.push(
            "cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init"
                .into(),
        );
        lines.push("cloud-init modules --mode=config && systemctl restart systemd-networkd".into());
        return Ok(lines.join("\n"));
    }
    for nic in &vm.nics {
        let file = format!("{NETWORKD}/10-{}.network", nic.mac.replace(':', ""));
        let network = match &nic.network {
            Some(net) => {
                let mut n = format!("Address={}/{}", net.ip, net.prefix.unwrap_or(24));
                if let Some(gw) = &net.gateway {
                    n.push_str(&format!("\\nGateway={gw}"));
                }
                n
            }
            None => "DHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac".to_string(),
        };
        lines.push(format!(
            "printf '[Match]\\nMACAddress={}\\n\\n[Network]\\n{network}\\n' > {file}",
            nic.mac
        ));
    }
    lines.push("systemctl restart systemd-networkd".into());
    Ok(lines.join("\n"))
}

fn check_nic(nic: &Nic) -> Result<(), String> {
    let hex_pairs = nic.mac.split(':').collect::<Vec<_>>();
    let mac_ok = hex_pairs.len() == 6
        && hex_pairs.iter().all(|p| {
            p.len() == 2
                && p.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
    if !mac_ok {
        return Err(format!(
            "NIC MAC {:?} is not a lowercase MAC address",
            nic.mac
        ));
    }
    if let Some(net) = &nic.network {
        net.ip
            .parse::<Ipv4Addr>()
            .map_err(|_| format!("static address {:?} is not an IPv4 address", net.ip))?;
        if let Some(gw) = &net.gateway {
            gw.parse::<Ipv4Addr>()
                .map_err(|_| format!("gateway {gw:?} is not an IPv4 address"))?;
        }
        if net.prefix.is_some_and(|p| p > 32) {
            return Err(format!("prefix {:?} is not 0-32", net.prefix));
        }
    }
    Ok(())
}

/// C15: the dotted mask of a prefix; a missing or impossible prefix gives `255.255.255.0`.
pub fn dotted_mask(prefix: Option<u32>) -> String {
    let bits = match prefix {
        Some(p) if p <= 32 => p,
        Some(_) | None => 24,
    };
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    Ipv4Addr::from(mask).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::StaticNet;

    fn record(nics: Vec<Nic>, cloud_image: bool) -> VmRecord {
        VmRecord {
            id: "ID".into(),
            name: "vk-a".into(),
            nics,
            cloud_image,
            ..VmRecord::default()
        }
    }

    fn dhcp(mac: &str) -> Nic {
        Nic {
            mac: mac.into(),
            network: None,
        }
    }

    fn fixed(mac: &str, ip: &str, prefix: Option<u32>, gw: Option<&str>) -> Nic {
        Nic {
            mac: mac.into(),
            network: Some(StaticNet {
                ip: ip.into(),
                prefix,
                gateway: gw.map(str::to_string),
            }),
        }
    }

    #[test]
    fn static_nic_script_writes_one_networkd_file_per_nic() {
        let vm = record(
            vec![
                fixed("02:00:00:00:00:01", "10.1.0.5", Some(16), Some("10.1.0.1")),
                dhcp("02:00:00:00:00:02"),
            ],
            false,
        );
        let argv = argv(FixupKind::LinuxStatic, "vk-a", &vm).unwrap();
        assert_eq!(&argv[..2], ["sh", "-c"]);
        let lines: Vec<&str> = argv[2].lines().collect();
        assert_eq!(
            lines,
            [
                "sync; echo 3 > /proc/sys/vm/drop_caches",
                "printf '%s\\n' 'vk-a' > /etc/hostname",
                "rm -f /etc/systemd/network/10-*.network",
                "printf '[Match]\\nMACAddress=02:00:00:00:00:01\\n\\n[Network]\\nAddress=10.1.0.5/16\\nGateway=10.1.0.1\\n' > /etc/systemd/network/10-020000000001.network",
                "printf '[Match]\\nMACAddress=02:00:00:00:00:02\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n' > /etc/systemd/network/10-020000000002.network",
                "systemctl restart systemd-networkd",
            ]
        );
    }

    #[test]
    fn firecracker_sets_every_mac_and_cloud_images_rerun_cloud_init() {
        let vm = record(
            vec![dhcp("02:00:00:00:00:0a"), dhcp("02:00:00:00:00:0b")],
            true,
        );
        let script = argv(FixupKind::LinuxFc, "vk-a", &vm).unwrap().remove(2);
        assert!(script.contains(
            "ip link set eth1 down && ip link set eth1 address 02:00:00:00:00:0b && ip link set eth1 up"
        ));
        assert!(script.contains("cloud-init clean --logs --seed --configs network"));
        assert!(
            !script.contains("MACAddress="),
            "cloud-init writes the network"
        );
        assert!(script.ends_with("systemctl restart systemd-networkd"));
    }

    #[test]
    fn record_values_that_could_change_the_script_are_refused() {
        let bad_mac = record(vec![dhcp("02:00:00:00:00:0a' ; reboot '")], false);
        assert!(argv(FixupKind::LinuxStatic, "vk-a", &bad_mac).is_err());
        let bad_ip = record(
            vec![fixed("02:00:00:00:00:01", "1.2.3.4/8 x", None, None)],
            false,
        );
        assert!(argv(FixupKind::LinuxStatic, "vk-a", &bad_ip).is_err());
        assert!(argv(FixupKind::LinuxStatic, "a'b", &record(vec![], false)).is_err());
        // Windows runs a fixed script: nothing from the record enters it.
        assert!(argv(FixupKind::Windows, "vk-a", &bad_mac).is_ok());
    }

    #[test]
    fn hint_is_base64_of_what_a_person_runs() {
        let vm = record(vec![dhcp("02:00:00:00:00:01")], false);
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(hint(FixupKind::Windows, "vk-a", &vm))
            .unwrap();
        let text = String::from_utf8(decoded).unwrap();
        assert!(text.starts_with("powershell -nop -c \"Get-PnpDevice -Class Net"));
        let linux = base64::engine::general_purpose::STANDARD
            .decode(hint(FixupKind::LinuxStatic, "vk-a", &vm))
            .unwrap();
        assert!(String::from_utf8(linux).unwrap().starts_with("sync;"));
    }

    #[test]
    fn masks() {
        assert_eq!(dotted_mask(Some(24)), "255.255.255.0");
        assert_eq!(dotted_mask(Some(16)), "255.255.0.0");
        assert_eq!(dotted_mask(Some(0)), "0.0.0.0");
        assert_eq!(dotted_mask(Some(32)), "255.255.255.255");
        assert_eq!(dotted_mask(Some(33)), "255.255.255.0");
        assert_eq!(dotted_mask(None), "255.255.255.0");
    }
}
