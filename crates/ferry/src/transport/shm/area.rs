//! Payload areas: where a message too large for a ring record travels.
//!
//! Each direction of a shared-memory channel has, beside its ring, an area
//! of `area` bytes that only the sender of that direction writes. A large
//! payload is copied into a range of it (no channel lock held while the
//! bytes move), and only a 16-byte descriptor `{offset u64, len u64}` goes
//! through the ring. The reader copies the bytes out when its receiver takes
//! the message — into memory the receiver reuses, if it asks — and sends
//! the range back in a `Release` frame; until then the range stays lent.
//!
//! Trust: the writer keeps its allocator in private memory and accepts a
//! release only for a range it lent, exactly; the reader checks every
//! descriptor against the area's bounds and reads the bytes only by raw
//! copy. A peer can write into the area of its own incoming traffic (it
//! maps the segment), which corrupts nothing but the messages it is sent.
//! A reader that never releases holds the writer's sends back (its area
//! fills: the writer waits or gets `WouldBlock`); when it dies, the channel
//! and its areas go with it. The connector sizes both areas; the acceptor
//! lends at most what its own settings say of the one it writes (its own
//! `max_message`), so a peer's word never sizes the memory it makes us fill.
//!
//! Memory: ranges are handed out lowest first, so a steady stream of large
//! messages reuses the same, already touched pages (first-touching fresh
//! shared memory costs more than the copy: 2–3 s per GiB on some VMs).
//! Pages above [`WARM_BYTES`] stay resident while large messages keep
//! coming, and go back to the kernel once the area has been idle for
//! [`COOL_AFTER`] (checked when the next payload is staged, so a channel
//! that falls silent keeps its high-water mark until it is used or closed).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Ranges are whole pages: copies start aligned, and pages can be punched out.
pub const PAGE: u64 = 4096;
/// Bytes of an area always kept resident once touched.
pub const WARM_BYTES: u64 = 64 << 20;
/// Idle time after which an area's pages above `WARM_BYTES` are returned to the kernel.
pub const COOL_AFTER: Duration = Duration::from_secs(1);
/// Bytes of a descriptor (and of a `Release` payload): `{offset u64, len u64}`, little-endian.
pub const DESCRIPTOR_LEN: usize = 16;

/// A range of an area: where a payload is, and its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub offset: u64,
    pub len: u64,
}

impl Range {
    pub fn encode(self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a descriptor and checks it names a non-empty, page-aligned
    /// range inside an area of `area` bytes.
    pub fn decode(b: &[u8], area: u64) -> Option<Range> {
        let b: &[u8; DESCRIPTOR_LEN] = b.try_into().ok()?;
        let offset = u64::from_le_bytes(b[..8].try_into().unwrap());
        let len = u64::from_le_bytes(b[8..].try_into().unwrap());
        let fits = len != 0 && offset.is_multiple_of(PAGE) && offset.checked_add(len).is_some_and(|end| end <= area);
        fits.then_some(Range { offset, len })
    }

    fn pages(self) -> u64 {
        self.len.div_ceil(PAGE) * PAGE
    }
}

/// The writer's book of its area: free ranges and ranges lent to the reader.
/// Private memory: the peer cannot touch it.
#[derive(Debug)]
pub struct Allocator {
    size: u64,
    /// Free ranges by offset, never adjacent (they are merged).
    free: BTreeMap<u64, u64>,
    /// Lent ranges by offset: their length as sent.
    lent: HashMap<u64, u64>,
    /// End of the highest range lent since the area last cooled down.
    high_water: u64,
    /// When a range was last lent.
    last_lent: Option<Instant>,
}

/// Why a release was refused: the peer named a range it was not lent.
#[derive(Debug, PartialEq, Eq)]
pub struct NotLent(pub Range);

impl Allocator {
    pub fn new(size: u64) -> Allocator {
        let size = size / PAGE * PAGE;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Allocator { size, free, lent: HashMap::new(), high_water: 0, last_lent: None }
    }

    /// Lends the lowest free range that holds `len` bytes; `None` if none does now.
    pub fn lend(&mut self, len: u64) -> Option<Range> {
        let need = Range { offset: 0, len }.pages();
        if len == 0 || need > self.size {
            return None;
        }
        let (&at, &have) = self.free.iter().find(|(_, &have)| have >= need)?;
        self.free.remove(&at);
        if have > need {
            self.free.insert(at + need, have - need);
        }
        self.lent.insert(at, len);
        self.high_water = self.high_water.max(at + need);
        self.last_lent = Some(Instant::now());
        Some(Range { offset: at, len })
    }

    /// The pages above `WARM_BYTES` to give back to the kernel, if the area
    /// is idle (nothing lent) and has been for `COOL_AFTER` as of `now`.
    pub fn cool(&mut self, now: Instant) -> Option<Range> {
        let idle_long = self.lent.is_empty() && self.last_lent.is_some_and(|t| now - t >= COOL_AFTER);
        if !idle_long || self.high_water <= WARM_BYTES {
            return None;
        }
        let r = Range { offset: WARM_BYTES, len: self.high_water - WARM_BYTES };
        self.high_water = WARM_BYTES;
        Some(r)
    }

    /// Takes back a lent range.
    pub fn release(&mut self, r: Range) -> Result<(), NotLent> {
        match self.lent.get(&r.offset) {
            Some(&len) if len == r.len => {}
            _ => return Err(NotLent(r)),
        }
        self.lent.remove(&r.offset);
        let (mut at, mut size) = (r.offset, r.pages());
        // Merge with the free neighbours on both sides.
        if let Some((&before, &blen)) = self.free.range(..at).next_back() {
            if before + blen == at {
                self.free.remove(&before);
                (at, size) = (before, blen + size);
            }
        }
        if let Some(after) = self.free.remove(&(at + size)) {
            size += after;
        }
        self.free.insert(at, size);
        Ok(())
    }

    /// Whether nothing is lent.
    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.lent.is_empty()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks the book's invariants (for tests and fuzz harnesses): free
    /// ranges page-aligned, inside the area, apart and never adjacent; lent
    /// ranges page-aligned, inside the area, overlapping nothing; together
    /// they cover the area.
    #[cfg(any(test, feature = "testing"))]
    pub fn check(&self) {
        let mut spans: Vec<(u64, u64, bool)> = self.free.iter().map(|(&at, &len)| (at, len, true)).collect();
        spans.extend(self.lent.iter().map(|(&at, &len)| (at, Range { offset: at, len }.pages(), false)));
        spans.sort_unstable();
        let mut end = 0;
        let mut last_free = false;
        for (at, len, free) in spans {
            assert!(at.is_multiple_of(PAGE) && len.is_multiple_of(PAGE) && len > 0, "{at} {len}");
            assert_eq!(at, end, "a gap or an overlap at {at}: {self:?}");
            assert!(!(free && last_free), "adjacent free ranges at {at}: {self:?}");
            end = at + len;
            last_free = free;
        }
        assert_eq!(end, self.size, "the ranges do not cover the area: {self:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lends_lowest_first_and_merges_on_release() {
        let mut a = Allocator::new(16 * PAGE);
        let x = a.lend(1).unwrap();
        let y = a.lend(PAGE + 1).unwrap();
        let z = a.lend(3 * PAGE).unwrap();
        assert_eq!((x.offset, y.offset, z.offset), (0, PAGE, 3 * PAGE));
        a.release(y).unwrap();
        // The freed hole is reused first (warm pages).
        assert_eq!(a.lend(2 * PAGE).unwrap().offset, PAGE);
        a.release(Range { offset: PAGE, len: 2 * PAGE }).unwrap();
        a.release(x).unwrap();
        a.release(z).unwrap();
        assert!(a.is_idle());
        assert_eq!(a.free.len(), 1, "all merged back: {:?}", a.free);
        assert_eq!(a.lend(16 * PAGE).unwrap().offset, 0);
    }

    #[test]
    fn full_area_refuses_then_accepts_after_release() {
        let mut a = Allocator::new(4 * PAGE);
        let r = a.lend(4 * PAGE).unwrap();
        assert_eq!(a.lend(1), None);
        a.release(r).unwrap();
        assert!(a.lend(1).is_some());
        assert_eq!(a.lend(5 * PAGE), None, "larger than the area");
        assert_eq!(a.lend(0), None);
    }

    #[test]
    fn releases_of_ranges_never_lent_are_refused() {
        let mut a = Allocator::new(8 * PAGE);
        let r = a.lend(100).unwrap();
        for bad in [Range { offset: r.offset, len: 99 }, Range { offset: PAGE, len: 100 }, Range { offset: 1, len: 1 }]
        {
            assert_eq!(a.release(bad), Err(NotLent(bad)));
        }
        a.release(r).unwrap();
        assert_eq!(a.release(r), Err(NotLent(r)), "released twice");
    }

    #[test]
    fn descriptors_are_checked_against_the_area() {
        let area = 8 * PAGE;
        let ok = Range { offset: PAGE, len: 3 };
        assert_eq!(Range::decode(&ok.encode(), area), Some(ok));
        for bad in [
            Range { offset: 1, len: 3 },
            Range { offset: 0, len: 0 },
            Range { offset: 7 * PAGE, len: PAGE + 1 },
            Range { offset: u64::MAX - 4095, len: 8192 },
        ] {
            assert_eq!(Range::decode(&bad.encode(), area), None, "{bad:?}");
        }
        assert_eq!(Range::decode(&[0; 15], area), None);
    }

    #[test]
    fn pages_above_the_warm_part_go_back_only_after_an_idle_spell() {
        let mut a = Allocator::new(WARM_BYTES + 8 * PAGE);
        let r = a.lend(WARM_BYTES + 2 * PAGE).unwrap();
        let later = Instant::now() + COOL_AFTER;
        assert_eq!(a.cool(later), None, "something is lent");
        a.release(r).unwrap();
        assert_eq!(a.cool(Instant::now()), None, "not idle long enough: stays warm for the next one");
        assert_eq!(a.cool(later), Some(Range { offset: WARM_BYTES, len: 2 * PAGE }));
        assert_eq!(a.cool(later), None, "cooled once");
        let small = a.lend(PAGE).unwrap();
        a.release(small).unwrap();
        assert_eq!(a.cool(later + COOL_AFTER), None, "nothing above the warm part was touched");
    }
}
