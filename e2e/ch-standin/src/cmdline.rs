//! What the guest learns from the kernel command line cocoon builds: `cocoon.hostname=NAME`
//! and, per NIC with a static address, the kernel's
//! `ip=<client>::<gateway>:<netmask>:<hostname>:eth<N>:off[:<dns0>[:<dns1>]]`.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cmdline {
    pub hostname: Option<String>,
    /// `(N, config)` for each `ip=` naming `ethN`.
    pub ips: Vec<(usize, IpConfig)>,
}

impl Cmdline {
    pub fn parse(cmdline: &str) -> Cmdline {
        let mut out = Cmdline::default();
        for word in cmdline.split_whitespace() {
            if let Some(name) = word.strip_prefix("cocoon.hostname=") {
                out.hostname = Some(name.to_string());
            } else if let Some(spec) = word.strip_prefix("ip=") {
                if let Some((nic, ip, host)) = parse_ip(spec) {
                    out.ips.push((nic, ip));
                    if out.hostname.is_none() && !host.is_empty() {
                        out.hostname = Some(host);
                    }
                }
            }
        }
        out
    }

    /// The address of `ethN`, if the command line gives one.
    pub fn ip_of(&self, nic: usize) -> Option<IpConfig> {
        self.ips.iter().find(|(n, _)| *n == nic).map(|(_, c)| *c)
    }
}

fn parse_ip(spec: &str) -> Option<(usize, IpConfig, String)> {
    let f: Vec<&str> = spec.split(':').collect();
    if f.len() < 6 {
        return None;
    }
    let address: Ipv4Addr = f[0].parse().ok()?;
    let gateway = f[2].parse().ok();
    let mask: Ipv4Addr = f[3].parse().ok()?;
    let bits = u32::from(mask);
    if bits.leading_ones() + bits.trailing_zeros() != 32 {
        return None;
    }
    let nic = f[5].strip_prefix("eth")?.parse().ok()?;
    let prefix = bits.leading_ones() as u8;
    Some((
        nic,
        IpConfig {
            address,
            prefix,
            gateway,
        },
        f[4].to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What cocoon's buildCmdline writes for a VM with two static NICs and two DNS servers.
    #[test]
    fn cocoon_cmdline() {
        let c = Cmdline::parse(
            "console=hvc0 loglevel=3 boot=cocoon-overlay cocoon.layers=l1,l0 cocoon.cow=cocoon-cow \
             clocksource=kvm-clock rw net.ifnames=0 cocoon.hostname=web-0 \
             ip=10.215.0.2::10.215.0.1:255.255.255.0:web-0:eth0:off:1.1.1.1:8.8.8.8 \
             ip=10.9.0.5::10.9.0.1:255.255.0.0:web-0:eth1:off",
        );
        assert_eq!(c.hostname.as_deref(), Some("web-0"));
        assert_eq!(
            c.ip_of(0),
            Some(IpConfig {
                address: "10.215.0.2".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.215.0.1".parse().unwrap()),
            })
        );
        assert_eq!(c.ip_of(1).unwrap().prefix, 16);
        assert_eq!(c.ip_of(2), None);
    }

    #[test]
    fn dhcp_nic_has_no_ip_and_bad_masks_are_ignored() {
        let c = Cmdline::parse("console=hvc0 net.ifnames=0 cocoon.hostname=a");
        assert_eq!(c.ip_of(0), None);
        let c = Cmdline::parse("ip=10.0.0.2::10.0.0.1:255.0.255.0:a:eth0:off");
        assert_eq!(c.ip_of(0), None);
        let c = Cmdline::parse("ip=10.0.0.2:::255.255.255.252:a:eth0:off");
        assert_eq!(c.ip_of(0).unwrap().gateway, None);
        assert_eq!(c.hostname.as_deref(), Some("a"));
    }
}
