//! Windows SAC (Special Administration Console) on a VM's serial socket,
//! `<run_dir>/cloudhypervisor/<ID>/console.sock`, as the daemon's static-IP step drives it: a
//! CRLF gets the `SAC>` prompt, `i` lists `Net: N, Ip=…` lines (an IPv4 and an IPv6 line per
//! NIC), `i <net> <ip> <mask> <gw>` sets a NIC's IPv4 address. Like a serial line it echoes
//! what it receives. Net numbers are interface indices, not NIC positions: 7, 12, 17, …, so
//! a caller must enumerate before it sets.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::model::{SacBoot, SacNic, StoredVm};

pub const PROMPT: &str = "SAC>";
const FIRST_NET: u32 = 7;
const NET_STEP: u32 = 5;

pub fn net_number(nic_index: usize) -> u32 {
    FIRST_NET + NET_STEP * nic_index as u32
}

pub fn socket_path(vm: &StoredVm) -> PathBuf {
    Path::new(&vm.sim.run_dir).join("console.sock")
}

pub fn mask(prefix: i64) -> String {
    let p = prefix.clamp(0, 32) as u32;
    let bits = if p == 0 { 0 } else { u32::MAX << (32 - p) };
    Ipv4Addr::from(bits).to_string()
}

/// The address Windows gives itself when nothing configured the adapter.
pub fn apipa(mac: &str) -> String {
    let b: Vec<u8> = mac
        .split(':')
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    let (x, y) = (
        b.get(4).copied().unwrap_or(1),
        b.get(5).copied().unwrap_or(1),
    );
    format!("169.254.{}.{}", x.max(1), y.max(1))
}

/// What a Windows guest's SAC lists at boot, when the console is on: a clone shows its
/// source's addresses (APIPA when the snapshot does not know them) and, with a static NIC 0,
/// waits for SAC to set the pod's address.
pub fn boot(
    env: &crate::config::Env,
    vm: &StoredVm,
    old_ips: &[String],
    old_macs: &[String],
    clone: bool,
) -> Option<SacBoot> {
    if !env.sac || !vm.config.windows || vm.network_configs.is_empty() {
        return None;
    }
    let nics = vm
        .network_configs
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let net = net_number(i);
            match old_ips.get(i).filter(|ip| !ip.is_empty()) {
                Some(ip) => SacNic {
                    net,
                    ip: ip.clone(),
                    mask: mask(16),
                    gateway: crate::vmnet::gateway_of(ip),
                },
                None => SacNic {
                    net,
                    ip: apipa(old_macs.get(i).unwrap_or(&n.mac)),
                    mask: mask(16),
                    gateway: "0.0.0.0".into(),
                },
            }
        })
        .collect();
    Some(SacBoot {
        nics,
        need_set: clone && crate::vmnet::is_static(&vm.config.network),
    })
}

/// What the guest's SAC knows beyond its boot picture: addresses set through it, and NIC 0's
/// live address once the guest's network is up.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Sac {
    pub boot: SacBoot,
    pub set: Vec<Option<SacNic>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live0: Option<SacNic>,
    #[serde(skip)]
    pub refuse_set: bool,
    #[serde(skip)]
    pub no_prompt: bool,
}

impl Sac {
    pub fn new(boot: SacBoot) -> Sac {
        Sac {
            set: vec![None; boot.nics.len()],
            boot,
            ..Default::default()
        }
    }

    /// A restarted guest keeps what SAC set before, as Windows keeps it in its registry.
    pub fn resume(ctl: &crate::guest::SacControl) -> Sac {
        let mut s = Sac::new(ctl.boot.clone());
        let prev = std::fs::read(&ctl.state_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Sac>(&b).ok());
        if let Some(p) = prev.filter(|p| p.set.len() == s.set.len()) {
            s.set = p.set;
        }
        s
    }

    /// What `i` lists: a set address wins; NIC 0 shows its live address unless it is waiting
    /// for SAC; otherwise the address the guest booted (or was cloned) with.
    pub fn shown(&self) -> Vec<SacNic> {
        (0..self.boot.nics.len())
            .map(|i| {
                if let Some(s) = &self.set[i] {
                    return s.clone();
                }
                match (&self.live0, i) {
                    (Some(l), 0) if !self.boot.need_set => l.clone(),
                    _ => self.boot.nics[i].clone(),
                }
            })
            .collect()
    }

    /// NIC 0 carries `want` (or nothing is asked of SAC).
    pub fn satisfied(&self, want: &str) -> bool {
        !self.boot.need_set || self.shown().first().is_some_and(|n| n.ip == want)
    }

    /// One command line (without its line end) → what SAC prints back, prompt included.
    pub fn command(&mut self, line: &str) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let body = match words.as_slice() {
            [] => String::new(),
            [i] if i.eq_ignore_ascii_case("i") => {
                let mut s = String::from("SAC is retrieving IP Addresses...\r\n\r\n");
                for n in self.shown() {
                    s.push_str(&format!(
                        "Net: {}, Ip={}  Subnet={}  Gateway={}\r\n",
                        n.net, n.ip, n.mask, n.gateway
                    ));
                    s.push_str(&format!(
                        "Net: {}, Ip=fe80::{:x}\r\n",
                        n.net,
                        0x1000 + n.net
                    ));
                }
                s
            }
            [i, net, ip, mask, gw] if i.eq_ignore_ascii_case("i") => {
                self.set_address(net, ip, mask, gw)
            }
            [i, ..] if i.eq_ignore_ascii_case("i") => {
                "Usage: i [<#> <ip> <subnet> <gateway>]\r\n".to_string()
            }
            _ => "Unrecognized command.  Try \"?\" for help.\r\n".to_string(),
        };
        if body.is_empty() {
            format!("\r\n{PROMPT}")
        } else {
            format!("\r\n{body}\r\n{PROMPT}")
        }
    }

    fn set_address(&mut self, net: &str, ip: &str, mask: &str, gw: &str) -> String {
        let Some(idx) = net
            .parse::<u32>()
            .ok()
            .and_then(|n| self.boot.nics.iter().position(|x| x.net == n))
        else {
            return format!("SAC could not find network interface {net}.\r\n");
        };
        let valid = [ip, mask, gw].iter().all(|a| a.parse::<Ipv4Addr>().is_ok());
        if !valid {
            return "SAC could not set the IP Address: the parameters are not valid.\r\n".into();
        }
        if self.refuse_set {
            return "SAC failed to set the IP Address.\r\n".into();
        }
        self.set[idx] = Some(SacNic {
            net: self.boot.nics[idx].net,
            ip: ip.to_string(),
            mask: mask.to_string(),
            gateway: gw.to_string(),
        });
        "SAC successfully set the IP Address.\r\n".into()
    }
}

/// Splits a byte stream into command lines; CR, LF and CRLF each end one line.
#[derive(Default)]
pub struct Lines {
    buf: Vec<u8>,
    after_cr: bool,
}

impl Lines {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            let was_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if was_cr => {}
                b'\r' | b'\n' => {
                    out.push(String::from_utf8_lossy(&self.buf).into_owned());
                    self.buf.clear();
                }
                _ => self.buf.push(b),
            }
        }
        out
    }
}

/// Feeds one read's worth of bytes: the echo, then each completed line's answer.
pub fn feed(sac: &mut Sac, lines: &mut Lines, bytes: &[u8]) -> Vec<u8> {
    let done = lines.push(bytes);
    if sac.no_prompt {
        return Vec::new();
    }
    let mut out = bytes.to_vec();
    for l in done {
        out.extend_from_slice(sac.command(&l).as_bytes());
    }
    out
}

fn handle(mut conn: UnixStream, shared: Arc<Mutex<Sac>>, state_file: PathBuf) {
    let mut lines = Lines::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let (out, snapshot) = {
            let mut sac = shared.lock().unwrap_or_else(|p| p.into_inner());
            let before = sac.set.clone();
            let out = feed(&mut sac, &mut lines, &buf[..n]);
            (out, (sac.set != before).then(|| sac.clone()))
        };
        if let Some(s) = snapshot {
            // Mirrored for `sim info` and tests; the live state is the shared one.
            if let Ok(b) = serde_json::to_vec_pretty(&s) {
                let _ = crate::lock::write_atomic(&state_file, &b);
            }
        }
        if !out.is_empty() && conn.write_all(&out).is_err() {
            return;
        }
    }
}

/// Serves the console until the process ends; every connection shares one SAC.
pub fn serve(socket: &Path, shared: Arc<Mutex<Sac>>, state_file: PathBuf) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(socket)?;
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (s, f) = (shared.clone(), state_file.clone());
            std::thread::spawn(move || handle(conn, s, f));
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(need_set: bool) -> SacBoot {
        SacBoot {
            nics: vec![
                SacNic {
                    net: net_number(0),
                    ip: "10.213.0.9".into(),
                    mask: mask(16),
                    gateway: "10.213.0.1".into(),
                },
                SacNic {
                    net: net_number(1),
                    ip: apipa("02:00:00:00:0a:0b"),
                    mask: mask(16),
                    gateway: "0.0.0.0".into(),
                },
            ],
            need_set,
        }
    }

    fn ipv4_lines(out: &str) -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("Net: ") && !l.contains("fe80"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn crlf_gets_the_prompt_and_is_echoed() {
        let mut sac = Sac::new(boot(true));
        let mut lines = Lines::default();
        let out = String::from_utf8(feed(&mut sac, &mut lines, b"\r\n")).unwrap();
        assert_eq!(out, "\r\n\r\nSAC>");
        // A CR alone and an LF alone each end a line too, but CRLF is one line.
        assert_eq!(lines.push(b"i\ri\n\r\n"), vec!["i", "i", ""]);
    }

    #[test]
    fn i_lists_every_nic_with_ipv4_and_ipv6_lines() {
        let mut sac = Sac::new(boot(true));
        let out = sac.command("i");
        assert!(out.ends_with("SAC>"));
        assert_eq!(
            ipv4_lines(&out),
            vec![
                "Net: 7, Ip=10.213.0.9  Subnet=255.255.0.0  Gateway=10.213.0.1",
                "Net: 12, Ip=169.254.10.11  Subnet=255.255.0.0  Gateway=0.0.0.0",
            ]
        );
        assert_eq!(out.matches("Ip=fe80::").count(), 2);
        assert!(
            out.contains("Gateway=10.213.0.1\r\nNet: 7, Ip=fe80::"),
            "{out:?}"
        );
    }

    #[test]
    fn set_then_verify() {
        let mut sac = Sac::new(boot(true));
        assert!(!sac.satisfied("10.213.0.44"));
        let out = sac.command("i 7 10.213.0.44 255.255.0.0 10.213.0.1");
        assert!(
            out.contains("SAC successfully set the IP Address."),
            "{out}"
        );
        assert!(sac
            .command("i")
            .contains("Net: 7, Ip=10.213.0.44  Subnet=255.255.0.0  Gateway=10.213.0.1"));
        assert!(sac.satisfied("10.213.0.44"));
    }

    #[test]
    fn set_errors_leave_the_address_alone() {
        let mut sac = Sac::new(boot(true));
        assert!(sac
            .command("i 0 10.213.0.44 255.255.0.0 10.213.0.1")
            .contains("could not find network interface 0"));
        assert!(sac
            .command("i 7 10.213.0.444 255.255.0.0 10.213.0.1")
            .contains("not valid"));
        sac.refuse_set = true;
        assert!(sac
            .command("i 7 10.213.0.44 255.255.0.0 10.213.0.1")
            .contains("SAC failed to set the IP Address."));
        assert!(sac.command("i").contains("Net: 7, Ip=10.213.0.9 "));
    }

    #[test]
    fn live_address_shows_unless_sac_must_set_it() {
        let mut sac = Sac::new(boot(false));
        sac.live0 = Some(SacNic {
            net: 7,
            ip: "10.213.0.50".into(),
            mask: mask(16),
            gateway: "10.213.0.1".into(),
        });
        assert!(sac.command("i").contains("Net: 7, Ip=10.213.0.50 "));
        sac.boot.need_set = true;
        assert!(sac.command("i").contains("Net: 7, Ip=10.213.0.9 "));
    }

    #[test]
    fn never_prompting_console_is_silent() {
        let mut sac = Sac::new(boot(true));
        sac.no_prompt = true;
        assert!(feed(&mut sac, &mut Lines::default(), b"\r\ni\r\n").is_empty());
    }

    #[test]
    fn masks_and_apipa() {
        assert_eq!(mask(24), "255.255.255.0");
        assert_eq!(mask(16), "255.255.0.0");
        assert_eq!(mask(0), "0.0.0.0");
        assert_eq!(apipa("02:5e:11:3a:00:01"), "169.254.1.1");
    }
}
