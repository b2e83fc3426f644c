//! MAC addresses as cloud-hypervisor writes them (`12:34:56:78:9a:bc`).

pub type Mac = [u8; 6];

pub fn parse(s: &str) -> Option<Mac> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut out {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

pub fn format(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A locally administered unicast address, as cloud-hypervisor picks when `mac=` is absent.
pub fn random() -> Mac {
    let mut m = [0u8; 6];
    // SAFETY: getrandom writes at most m.len() bytes into m.
    let n = unsafe { libc::getrandom(m.as_mut_ptr().cast(), m.len(), 0) };
    if n != m.len() as isize {
        let seed = std::process::id().to_le_bytes();
        m[2..].copy_from_slice(&seed);
    }
    m[0] = (m[0] | 0x02) & 0xfe;
    m
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let m = super::parse("02:AB:cd:00:01:ff").unwrap();
        assert_eq!(super::format(&m), "02:ab:cd:00:01:ff");
        assert!(super::parse("02:ab:cd:00:01").is_none());
        assert!(super::parse("02:ab:cd:00:01:ff:00").is_none());
        let r = super::random();
        assert_eq!(r[0] & 0x03, 0x02);
    }
}
