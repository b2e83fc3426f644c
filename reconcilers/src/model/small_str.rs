//! A string kept inline when it is short: lease rows hold a MAC and an IPv4 address, and the
//! whole lease table arrives on every change. As `String`s each row was two heap allocations
//! for the shell to make and the core to free again; inline they cost neither.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest text kept inline: room for `aa:bb:cc:dd:ee:ff` and `255.255.255.255`, and the
/// whole value stays 24 bytes, like a `String`.
const INLINE: usize = 22;

/// Compares, hashes, prints and serializes exactly like the `String` it stands for.
#[derive(Clone)]
pub struct SmallStr(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl SmallStr {
    pub fn new(s: &str) -> Self {
        if s.len() > INLINE {
            return SmallStr(Repr::Heap(s.into()));
        }
        let mut bytes = [0; INLINE];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        SmallStr(Repr::Inline {
            len: s.len() as u8,
            bytes,
        })
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..*len as usize]).expect("built from a str")
            }
            Repr::Heap(s) => s,
        }
    }

    /// The UTF-8 bytes, without re-validating them: what comparisons use.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Heap(s) => s.as_bytes(),
        }
    }

    pub fn make_ascii_lowercase(&mut self) {
        match &mut self.0 {
            Repr::Inline { len, bytes } => bytes[..*len as usize].make_ascii_lowercase(),
            Repr::Heap(s) => s.make_ascii_lowercase(),
        }
    }
}

impl Default for SmallStr {
    fn default() -> Self {
        SmallStr::new("")
    }
}

impl Deref for SmallStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for SmallStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for SmallStr {
    fn from(s: &str) -> Self {
        SmallStr::new(s)
    }
}

impl From<String> for SmallStr {
    fn from(s: String) -> Self {
        SmallStr::new(&s)
    }
}

impl From<&String> for SmallStr {
    fn from(s: &String) -> Self {
        SmallStr::new(s)
    }
}

impl From<SmallStr> for String {
    fn from(s: SmallStr) -> Self {
        s.as_str().to_string()
    }
}

impl PartialEq for SmallStr {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            // Unused inline bytes are zero, so the whole buffers can be compared.
            (Repr::Inline { len: a, bytes: x }, Repr::Inline { len: b, bytes: y }) => {
                a == b && x == y
            }
            _ => self.as_bytes() == other.as_bytes(),
        }
    }
}

impl Eq for SmallStr {}

impl PartialOrd for SmallStr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Byte order, which is `str`'s order. The lease diff compares every row's MAC with the
/// stored one on every table change, so two inline texts compare as three words instead
/// of through `memcmp`.
impl Ord for SmallStr {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        match (&self.0, &other.0) {
            (Repr::Inline { len: a, bytes: x }, Repr::Inline { len: b, bytes: y }) => {
                // Zero padding sorts a proper prefix first unless the longer text goes on
                // with zero bytes; the lengths settle that case, as `str` would.
                words(x).cmp(&words(y)).then(a.cmp(b))
            }
            _ => self.as_bytes().cmp(other.as_bytes()),
        }
    }
}

/// The inline buffer as big-endian words: comparing them is comparing the bytes.
#[inline]
fn words(b: &[u8; INLINE]) -> (u64, u64, u64) {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        let end = (i + 8).min(INLINE);
        w[..end - i].copy_from_slice(&b[i..end]);
        u64::from_be_bytes(w)
    };
    (word(0), word(8), word(16))
}

impl Hash for SmallStr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialEq<str> for SmallStr {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for SmallStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<String> for SmallStr {
    fn eq(&self, other: &String) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<SmallStr> for String {
    fn eq(&self, other: &SmallStr) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<SmallStr> for str {
    fn eq(&self, other: &SmallStr) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<SmallStr> for &str {
    fn eq(&self, other: &SmallStr) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Display for SmallStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_str().fmt(f)
    }
}

impl fmt::Debug for SmallStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_str().fmt(f)
    }
}

impl Serialize for SmallStr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SmallStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(SmallStr::new(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_the_string_inline_or_not() {
        let texts = [
            "",
            "a",
            "a\0",
            "a\0b",
            "ab",
            "0123456789abcdef0123\0\0",
            "10.88.0.11",
            "02:5e:11:3a:9c:01",
            "0123456789012345678901",
            "01234567890123456789012",
            "a much longer text that lives on the heap",
            "ünïcödé",
        ];
        for a in texts {
            let sa = SmallStr::from(a);
            assert_eq!(sa.as_str(), a);
            assert_eq!(sa.to_string(), a);
            assert_eq!(format!("{sa:?}"), format!("{a:?}"));
            let json = serde_json::to_string(&sa).unwrap();
            assert_eq!(json, serde_json::to_string(a).unwrap());
            assert_eq!(serde_json::from_str::<SmallStr>(&json).unwrap(), a);
            for b in texts {
                assert_eq!(sa.cmp(&SmallStr::from(b)), a.cmp(b), "{a} vs {b}");
                let sb = SmallStr::from(b);
                assert_eq!(sa == sb, a == b);
            }
            let mut upper = SmallStr::from(a.to_uppercase());
            upper.make_ascii_lowercase();
            assert_eq!(upper, a.to_uppercase().to_ascii_lowercase());
        }
        assert_eq!(std::mem::size_of::<SmallStr>(), 24);
    }
}
