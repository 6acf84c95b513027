// The module's documentation is docs/MEMORY.md: its example runs as a doc test.
#![doc = include_str!("../../../../docs/MEMORY.md")]

pub(crate) mod import;
pub(crate) mod ops;
mod path;
pub(crate) mod regions;
mod view;

pub use import::{PutDone, RegionRef, FLAG_FAILED, OPEN_TIMEOUT, OPERATION_TIMEOUT};
pub use path::{Step, MAX_PATH_STEPS};
pub use regions::Region;

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Bytes of one region (1 TiB).
pub const MAX_REGION_BYTES: usize = 1 << 40;

/// The served frame kinds of remote memory (`crate::extend`).
const KINDS: std::ops::RangeInclusive<u8> = 64..=71;
/// Opens a region: payload its key; the answer a status byte, then (if
/// opened) its length and epoch (u64 LE each), with the region's memfds
/// handed over if the importer asked (shared memory).
const OPEN: u8 = 64;
/// An operation served by the owner (across machines): see [`ops`].
const OP: u8 = 65;
/// Most bytes one served operation moves (larger gets and puts are split).
const MAX_SERVED_BYTES: usize = 1 << 20;

/// A region's access key: 128 bits, random unless given. Printed and
/// parsed as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key([u8; 16]);

impl Key {
    /// A key from the operating system's random source.
    pub fn random() -> Key {
        let mut k = [0u8; 16];
        let mut got = 0;
        while got < k.len() {
            match rustix::rand::getrandom(&mut k[got..], rustix::rand::GetRandomFlags::empty()) {
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => panic!("the OS's random source failed: {e}"),
            }
        }
        Key(k)
    }

    /// The key of these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Key {
        Key(bytes)
    }

    /// Its bytes.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// Compares in time independent of where the keys differ.
    pub(crate) fn matches(&self, other: &[u8]) -> bool {
        other.len() == 16 && self.0.iter().zip(other).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the key itself: debug output ends up in logs.
        f.write_str("Key(..)")
    }
}

impl FromStr for Key {
    type Err = Error;
    fn from_str(s: &str) -> Result<Key> {
        let bad = || Error::InvalidArgument(format!("a region key is 32 hex digits, not {s:?}"));
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut k = [0u8; 16];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Key(k))
    }
}

/// Bytes of a page.
const PAGE: usize = crate::transport::shm::area::PAGE as usize;

/// The bytes a region of `len` bytes maps: whole pages.
fn mapped_len(len: usize) -> usize {
    len.div_ceil(PAGE).max(1) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_parse_and_compare() {
        let k = Key::random();
        assert_ne!(k, Key::random());
        assert_eq!(k.to_string().parse::<Key>().unwrap(), k);
        assert!(k.matches(&k.to_bytes()));
        assert!(!k.matches(&k.to_bytes()[..15]));
        assert!(!k.matches(&Key::from_bytes([0; 16]).to_bytes()) || k == Key::from_bytes([0; 16]));
        assert!("xyz".parse::<Key>().is_err());
        assert!("0g".repeat(16).parse::<Key>().is_err());
        assert_eq!(format!("{k:?}"), "Key(..)");
    }
}
