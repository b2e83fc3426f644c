//! The chain link: sha256 as 64 lowercase hex digits. Kept as fixed-size bytes so the hot path
//! (one digest per record) allocates nothing.

use std::fmt;

use sha2::{Digest as _, Sha256};

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 64]);

impl Digest {
    /// What the first record of a journal chains from.
    pub const GENESIS: Digest = Digest([b'0'; 64]);

    /// sha256(prev ‖ body ‖ tail), where `prev` is the previous record's digest in hex. `tail`
    /// lets the reader hash a line's body without copying it (see `record::split_line`).
    pub fn chain(prev: &Digest, body: &[u8], tail: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update(prev.0);
        h.update(body);
        h.update(tail);
        let raw = h.finalize();
        let mut hex = [0u8; 64];
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (i, b) in raw.iter().enumerate() {
            hex[2 * i] = DIGITS[(b >> 4) as usize];
            hex[2 * i + 1] = DIGITS[(b & 15) as usize];
        }
        Digest(hex)
    }

    /// Exactly 64 lowercase hex digits, else `None`.
    pub fn parse(s: &str) -> Option<Digest> {
        let b = s.as_bytes();
        if b.len() != 64 || !b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut hex = [0u8; 64];
        hex.copy_from_slice(b);
        Some(Digest(hex))
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from ASCII hex digits.
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }

    /// The first 12 digits: enough to tell records apart in a message.
    pub fn short(&self) -> &str {
        &self.as_str()[..12]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_sha256_of_prev_hex_then_bytes() {
        // sha256("0"*64 + "{}"), computed independently with sha256sum.
        let d = Digest::chain(&Digest::GENESIS, b"{", b"}");
        assert_eq!(
            d.as_str(),
            "5508d2b710e64bc470079e1b211d9c58e21011e59d0559e422345dc19d659a75"
        );
        let again = Digest::chain(&Digest::GENESIS, b"{}", b"");
        assert_eq!(d, again, "splitting the body must not change the digest");
    }

    #[test]
    fn parse_rejects_anything_but_64_lowercase_hex() {
        assert!(Digest::parse(&"a".repeat(63)).is_none());
        assert!(Digest::parse(&"A".repeat(64)).is_none());
        assert!(Digest::parse(&"g".repeat(64)).is_none());
        assert_eq!(Digest::parse(&"0".repeat(64)), Some(Digest::GENESIS));
    }
}
