//! The chain link: a sha256, written as 64 lowercase hex digits. Kept as raw bytes so the
//! hot path (one digest per record) allocates nothing and errors that carry two stay small.

use std::fmt;

use sha2::{Digest as _, Sha256};

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

/// A digest's hex form.
pub struct Hex([u8; 64]);

impl Hex {
    pub fn as_str(&self) -> &str {
        // Only ever built from ASCII hex digits.
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl Digest {
    /// What the first record of a journal chains from: its hex form is 64 zeros.
    pub const GENESIS: Digest = Digest([0; 32]);

    /// sha256(prev ‖ body ‖ tail), where `prev` enters as its 64 hex digits. `tail` lets the
    /// reader hash a line's body without copying it (see `record::split_line`).
    pub fn chain(prev: &Digest, body: &[u8], tail: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update(prev.hex().0);
        h.update(body);
        h.update(tail);
        Digest(h.finalize().into())
    }

    /// Exactly 64 lowercase hex digits, else `None`.
    pub fn parse(s: &str) -> Option<Digest> {
        fn nibble(c: u8) -> Option<u8> {
            match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            }
        }
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut raw = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            raw[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(Digest(raw))
    }

    pub fn hex(&self) -> Hex {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 64];
        for (i, b) in self.0.iter().enumerate() {
            hex[2 * i] = DIGITS[(b >> 4) as usize];
            hex[2 * i + 1] = DIGITS[(b & 15) as usize];
        }
        Hex(hex)
    }

    /// The first 12 digits: enough to tell records apart in a message.
    pub fn short(&self) -> String {
        self.hex().as_str()[..12].to_string()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex().as_str())
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
            d.hex().as_str(),
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
