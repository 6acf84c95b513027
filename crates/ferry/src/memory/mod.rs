//! Remote memory (DESIGN §5; MBCF's remote write and read, StarMod's remote
//! variables): a team *exports* a region — a named byte range — under an
//! access key; holders of the key open it and `put`, `get` and run atomics
//! on it (`swap`, `fetch_add`, `compare_and_swap` on aligned `u64` words)
//! without any task of the owner running.
//!
//! On one machine a region is a shared mapping of its own (a memfd, not a
//! channel's ring): the owner maps it, and an importer in another process
//! maps it too, after the owner checked its key and handed the memfd over
//! its channel ([`crate::extend`]'s descriptors after the bind); an
//! importer in the owner's process shares the owner's mapping. Every
//! operation is then the importer's own loads, stores and atomic
//! instructions, checked against the region's bounds first: no message,
//! no system call, no task of the owner. Across machines the owner's
//! runtime will serve them (the next step of issue 18); opening a region
//! of another node is refused for now.
//!
//! **Names.** A region has an endpoint id of its owner's team, and its name
//! is bound to it in the team's name plane: regions and ports share one
//! name space (a region cannot take a port's name, nor the reverse).
//!
//! **Ordering.** Per importer and region, operations take effect in the
//! order they are made, and each is done when its call returns: a `get`
//! after a `put` (from any process of the machine) sees the `put`'s bytes,
//! unless someone wrote them since. Atomics are sequentially consistent.
//! A `put` or `get` of more than 8 bytes is not atomic: concurrent writers
//! of the same bytes leave some bytes of each.
//!
//! **Checks.** A wrong key is `AccessDenied` when the region is opened;
//! any access outside the region (an overflowing offset included) is
//! `OutOfBounds`, an atomic operation on an offset that is not a multiple
//! of 8 is `Misaligned`: no access is ever made outside the region. The
//! memory past `len` up to the page's end is zero and unreachable.
//!
//! **Limits.** A team exports at most [`MAX_REGIONS`] regions of at most
//! [`MAX_REGION_BYTES`] each; an importer maps what it opens until it
//! drops the handle.
//!
//! ```
//! # let dir = tempfile::tempdir().unwrap();
//! use ferry::Team;
//! let owner = Team::builder().runtime_dir(dir.path()).start()?;
//! let region = owner.export("counters", 4096)?;
//! let user = Team::builder().runtime_dir(dir.path()).start()?;
//! let counters = user.open_region("counters", region.key())?;
//! counters.fetch_add(8, 5)?;
//! counters.put(100, b"hello")?;
//! assert_eq!(region.fetch_add(8, 1)?, 5);
//! assert_eq!(&region.get_vec(100, 5)?, b"hello");
//! assert!(matches!(counters.put(4095, b"xy"), Err(ferry::Error::OutOfBounds { .. })));
//! # Ok::<(), ferry::Error>(())
//! ```

pub(crate) mod import;
mod regions;
mod view;

pub use import::{RegionRef, OPEN_TIMEOUT};
pub use regions::Region;

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Regions a team exports at once.
pub const MAX_REGIONS: usize = 1024;
/// Bytes of one region (1 TiB).
pub const MAX_REGION_BYTES: usize = 1 << 40;

/// The served frame kinds of remote memory (`crate::extend`).
const KINDS: std::ops::RangeInclusive<u8> = 64..=71;
/// Opens a region: payload its key; the answer a status byte, then (if
/// opened) its length and epoch (u64 LE each), with the region's memfds
/// handed over on shared memory.
const OPEN: u8 = 64;

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
    fn matches(&self, other: &[u8]) -> bool {
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
