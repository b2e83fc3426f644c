//! Random identifiers in cocoon's formats: 26-char base32 IDs and locally administered MACs.

use std::fs::File;
use std::io::Read;

const BASE32: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // /dev/urandom never blocks after boot and needs no extra crate.
    if let Ok(mut f) = File::open("/dev/urandom") {
        if f.read_exact(&mut buf).is_ok() {
            return buf;
        }
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        ^ (std::process::id() as u128) << 64;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seed >> ((i * 8) % 128)) as u8 ^ (i as u8).wrapping_mul(151);
    }
    buf
}

pub fn new_id() -> String {
    random_bytes::<26>()
        .iter()
        .map(|b| BASE32[(*b & 31) as usize] as char)
        .collect()
}

#[cfg(test)]
pub fn is_id(s: &str) -> bool {
    s.len() == 26 && s.bytes().all(|b| BASE32.contains(&b))
}

/// `02:` marks the address locally administered and unicast, as cocoon's CNI MACs are.
pub fn new_mac() -> String {
    let b = random_bytes::<5>();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4]
    )
}

pub fn normalize_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut out = Vec::with_capacity(6);
    for p in parts {
        if p.len() != 2 {
            return None;
        }
        out.push(format!("{:02x}", u8::from_str_radix(p, 16).ok()?));
    }
    Some(out.join(":"))
}

/// A stable fake content digest, so the same image name always maps to the same digest.
pub fn fake_digest(input: &str) -> String {
    let mut hex = String::with_capacity(64);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u64..4 {
        for b in input.bytes().chain(round.to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        hex.push_str(&format!("{h:016x}"));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_base32_of_26() {
        for _ in 0..50 {
            assert!(is_id(&new_id()));
        }
    }

    #[test]
    fn macs_are_lowercase_local() {
        let m = new_mac();
        assert!(m.starts_with("02:"));
        assert_eq!(normalize_mac(&m).unwrap(), m);
        assert_eq!(
            normalize_mac("02-AB-00-00-00-01").unwrap(),
            "02:ab:00:00:00:01"
        );
    }
}
