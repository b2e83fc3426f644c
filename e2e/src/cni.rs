//! The CNI network the real cocoon puts its VMs on: a conflist of the testbed's own, Debian's
//! `bridge` and `host-local` plugins, a bridge and a /24 of the run's own.
//!
//! Each run claims `10.216.<n>.0/24` on bridge `vkreal<n>` by creating the bridge itself:
//! creating a link is atomic, so two runs never share a subnet, and a bridge that exists
//! (another run's, or a leftover) just moves the claim to the next `n`. The simulator uses
//! 10.213.0.0/16 and the stand-in's own tests 10.215.0.0/24, so neither collides. The
//! host-local plugin keeps its allocations under the run directory, and the bridge plugin finds
//! the claimed bridge and gives it the gateway address, so the host reaches every VM on it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::step;

/// Where Debian's containernetworking-plugins package puts the plugins.
pub const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/cni";

/// The subnets runs may claim: `10.216.<n>.0/24`.
const SUBNET_PREFIX: &str = "10.216";

/// The CNI network's name, the same on every host of a run as it is on every node of a
/// cluster: cocoon records it in a VM, and a clone made on another host from that VM's
/// snapshot joins the network of that name there (`vm clone` without `--network`).
pub const NETWORK: &str = "vk-testbed";

pub struct CniNetwork {
    /// The bridge's name, `vkreal<n>`, one per host.
    pub name: String,
    /// `10.216.<n>.0/24`.
    pub subnet: String,
    /// `10.216.<n>.1`, the bridge's address.
    pub gateway: String,
    /// What `COCOON_CNI_CONF_DIR` names: holds only this network's conflist.
    pub conf_dir: PathBuf,
    /// What `COCOON_CNI_BIN_DIR` names.
    pub bin_dir: PathBuf,
    /// host-local's `dataDir`: one file per allocated address, under `<dataDir>/<NETWORK>/`.
    pub ipam_dir: PathBuf,
}

impl CniNetwork {
    /// Claims a bridge and subnet and writes the conflist under `dir`.
    pub fn create(dir: &Path) -> Result<CniNetwork> {
        let bin_dir = PathBuf::from(DEBIAN_PLUGIN_DIR);
        for plugin in ["bridge", "host-local"] {
            if !bin_dir.join(plugin).exists() {
                bail!(
                    "{} is missing: install Debian's containernetworking-plugins \
                     (e2e/scripts/ci-setup.sh)",
                    bin_dir.join(plugin).display()
                );
            }
        }
        let n = claim_bridge()?;
        let name = bridge_name(n);
        let conf_dir = dir.join("cni-conf");
        let ipam_dir = dir.join("cni-ipam");
        std::fs::create_dir_all(&conf_dir)?;
        std::fs::create_dir_all(&ipam_dir)?;
        let net = CniNetwork {
            subnet: format!("{SUBNET_PREFIX}.{n}.0/24"),
            gateway: format!("{SUBNET_PREFIX}.{n}.1"),
            name,
            conf_dir,
            bin_dir,
            ipam_dir,
        };
        let conflist = net.conflist();
        let path = net.conf_dir.join(format!("10-{NETWORK}.conflist"));
        std::fs::write(&path, serde_json::to_vec_pretty(&conflist)?)
            .with_context(|| format!("writing {}", path.display()))?;
        step!(
            "CNI network {NETWORK} on bridge {} ({})",
            net.name,
            net.subnet
        );
        Ok(net)
    }

    fn conflist(&self) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [{
                "type": "bridge",
                "bridge": self.name,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": self.subnet, "gateway": self.gateway }]],
                    "dataDir": self.ipam_dir,
                },
            }],
        })
    }

    /// Addresses host-local holds for a VM: its files named after an address.
    pub fn allocations(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.ipam_dir.join(NETWORK)) else {
            return Vec::new();
        };
        rd.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.parse::<std::net::Ipv4Addr>().is_ok())
            .collect()
    }
}

fn bridge_name(n: u8) -> String {
    format!("vkreal{n}")
}

/// Creates `vkreal<n>` for the first `n` whose bridge does not exist yet, starting at a random
/// one so parallel runs rarely race for the same name.
fn claim_bridge() -> Result<u8> {
    let start =
        std::process::id() as usize + std::time::UNIX_EPOCH.elapsed()?.subsec_nanos() as usize;
    for i in 0..256 {
        let n = ((start + i) % 256) as u8;
        let name = bridge_name(n);
        let out = ip(&["link", "add", &name, "type", "bridge"])?;
        if out.status.success() {
            let up = ip(&["link", "set", &name, "up"])?;
            if !up.status.success() {
                delete_bridge(&name);
                bail!(
                    "ip link set {name} up: {}",
                    String::from_utf8_lossy(&up.stderr).trim()
                );
            }
            return Ok(n);
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("File exists") {
            bail!("ip link add {name} type bridge: {}", err.trim());
        }
    }
    bail!("every bridge vkreal0..vkreal255 exists: leftovers of dead runs? (ip link)")
}

fn ip(args: &[&str]) -> Result<std::process::Output> {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))
}

/// Removes the bridge; a bridge already gone is fine.
pub fn delete_bridge(name: &str) {
    if let Ok(out) = ip(&["link", "del", name]) {
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !err.contains("Cannot find device") {
            step!("ip link del {name}: {}", err.trim());
        }
    }
}

/// Whether a network interface of this name exists in the host's namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Removes a named network namespace (`ip netns del`); one already gone is fine.
pub fn delete_netns(name: &str) {
    if let Ok(out) = ip(&["netns", "del", name]) {
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !err.contains("No such file") {
            step!("ip netns del {name}: {}", err.trim());
        }
    }
}
