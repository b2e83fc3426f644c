//! Guest addresses, unique across every simulator root on the host: parallel tests share one
//! bridge and one 127.213/16 range, so each address is claimed by an O_EXCL file naming its
//! owner (root + VM ID). A claim whose owner's VM dir is gone may be taken over.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::Env;
use crate::error::{fail, Result};

pub struct Addr {
    pub ip: String,
    pub gateway: String,
    pub prefix: i64,
}

pub const NETNS_NET: [u8; 2] = [10, 213];
pub const LOOP_NET: [u8; 2] = [127, 213];

pub fn net_lock(env: &Env) -> PathBuf {
    env.ipam_dir.join("net.lock")
}

fn claims_dir(env: &Env) -> PathBuf {
    env.ipam_dir.join("ips")
}

pub struct Claim {
    pub ip: String,
    pub root: PathBuf,
    pub id: String,
}

impl Claim {
    pub fn owner_alive(&self) -> bool {
        self.root.join("vms").join(&self.id).is_dir()
    }
}

pub fn claims(env: &Env) -> Vec<Claim> {
    claims_where(env, |_| true)
}

/// The claims of addresses in the /16 `net`: only their files are read.
pub fn claims_in(env: &Env, net: [u8; 2]) -> Vec<Claim> {
    let prefix = format!("{}.{}.", net[0], net[1]);
    claims_where(env, |ip| ip.starts_with(&prefix))
}

fn claims_where(env: &Env, wanted: impl Fn(&str) -> bool) -> Vec<Claim> {
    let Ok(rd) = fs::read_dir(claims_dir(env)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let ip = e.file_name().to_str()?.to_string();
            wanted(&ip).then(|| read_claim(&e.path(), ip)).flatten()
        })
        .collect()
}

fn read_claim(path: &Path, ip: String) -> Option<Claim> {
    let text = fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    Some(Claim {
        ip,
        root: PathBuf::from(lines.next()?),
        id: lines.next()?.to_string(),
    })
}

fn claim(path: &Path, owner: &str) -> std::io::Result<bool> {
    match OpenOptions::new().create_new(true).write(true).open(path) {
        Ok(mut f) => {
            f.write_all(owner.as_bytes())?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// `net` is the /16 to pick from; .0.x is reserved for the gateway.
pub fn allocate(env: &Env, net: [u8; 2], id: &str) -> Result<Addr> {
    let dir = claims_dir(env);
    fs::create_dir_all(&dir)?;
    let owner = format!("{}\n{id}\n", env.root.display());
    let r = crate::ids::random_bytes::<2>();
    let start = u16::from_le_bytes(r) as u32;
    for i in 0..65536u32 {
        let n = (start + i) % 65536;
        let (hi, lo) = ((n >> 8) as u8, (n & 0xff) as u8);
        if hi == 0 || lo == 0 || lo == 255 || hi == 255 {
            continue;
        }
        let ip = format!("{}.{}.{hi}.{lo}", net[0], net[1]);
        let path = dir.join(&ip);
        if claim(&path, &owner)? {
            return Ok(Addr {
                gateway: format!("{}.{}.0.1", net[0], net[1]),
                ip,
                prefix: 16,
            });
        }
        let stale = read_claim(&path, ip.clone()).is_some_and(|c| !c.owner_alive());
        if stale {
            let _ = fs::remove_file(&path);
            if claim(&path, &owner)? {
                return Ok(Addr {
                    gateway: format!("{}.{}.0.1", net[0], net[1]),
                    ip,
                    prefix: 16,
                });
            }
        }
    }
    fail("ipam: address range exhausted")
}

pub fn release(env: &Env, ip: &str, id: &str) {
    if ip.is_empty() {
        return;
    }
    let path = claims_dir(env).join(ip);
    let mine = fs::read_to_string(&path)
        .map(|t| t.lines().nth(1) == Some(id))
        .unwrap_or(false);
    if mine {
        let _ = fs::remove_file(path);
    }
}
