//! The guest's memory: what a real guest would keep in RAM and a snapshot would carry in its
//! memory file — the value, and the address the guest configured at boot.

use serde::{Deserialize, Serialize};

use crate::cmdline::IpConfig;
use crate::program::Program;

const MAGIC: &[u8] = b"CH-STANDIN-GUEST-MEMORY v1\n";
pub const PAGE: u64 = 4096;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemory {
    pub hostname: String,
    /// NIC 0's address as the guest set it at boot; a restored guest keeps it.
    pub address: Option<IpConfig>,
    pub value: String,
    /// The services the guest runs, loaded from the initramfs at boot.
    pub program: Program,
}

impl GuestMemory {
    /// The memory image: the state at offset 0, then zeros up to `len` (at least one page).
    /// Only the first page is written, so a large `len` stays a hole on disk.
    pub fn write_image(&self, file: &std::fs::File, len: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut page = MAGIC.to_vec();
        page.extend(serde_json::to_vec(self).map_err(std::io::Error::other)?);
        page.push(0);
        if page.len() as u64 > PAGE {
            return Err(std::io::Error::other("guest state larger than a page"));
        }
        file.set_len(len.max(PAGE))?;
        file.write_all_at(&page, 0)
    }

    pub fn read_image(file: &std::fs::File) -> Result<GuestMemory, String> {
        use std::os::unix::fs::FileExt;
        let mut page = vec![0u8; PAGE as usize];
        let n = file.read_at(&mut page, 0).map_err(|e| e.to_string())?;
        let page = &page[..n];
        let body = page
            .strip_prefix(MAGIC)
            .ok_or("memory file holds no stand-in guest")?;
        let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
        serde_json::from_slice(&body[..end]).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_round_trip_keeps_a_hole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory-ranges");
        let m = GuestMemory {
            hostname: "web-0".into(),
            address: Some(IpConfig {
                address: "10.215.0.2".parse().unwrap(),
                prefix: 24,
                gateway: None,
            }),
            value: "hello world".into(),
            program: Program::default(),
        };
        let f = std::fs::File::options()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        m.write_image(&f, 1 << 30).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 1 << 20, "sparse");
        assert_eq!(GuestMemory::read_image(&f).unwrap(), m);
    }
}
