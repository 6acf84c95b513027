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
//! The first [`WARM_BYTES`] of an area stay resident once touched. Above
//! that, an area keeps what the last [`COOL_AFTER`] or so needed: its
//! owner's team calls [`Allocator::cool`] about once per `COOL_AFTER`
//! while the area holds pages above the warm part (the team's reactor,
//! woken through a [`Cooler`] when a release leaves such pages), and the
//! free pages above both the warm part and the highest range lent since
//! the previous call go back to the kernel. A large range holds its pages
//! longer, [`HOLD_PER_GIB`] per GiB of it (8 s for 1 GiB): touching them
//! afresh costs about 1 s per GiB, so messages of that size a few seconds
//! apart keep their area warm, and one now and then pays at most an eighth
//! of the time between them to fault it in again. Without that, an area's
//! resident size was the most bytes ever lent at once (up to 64 MiB kept
//! for good): it crept up for as long as a channel lived, each time a few
//! large messages happened to be in flight together.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Ranges are whole pages: copies start aligned, and pages can be punched out.
pub const PAGE: u64 = 4096;
/// Bytes of an area always kept resident once touched (a 1 MiB message
/// now and then stays warm).
pub const WARM_BYTES: u64 = 1 << 20;
/// How long an area keeps pages above `WARM_BYTES` that nothing needed:
/// they go back to the kernel once a whole `COOL_AFTER` went by without a
/// range reaching them (so messages that keep coming stay warm).
pub const COOL_AFTER: Duration = Duration::from_secs(1);
/// How long, at least, the pages a large range reached stay resident after
/// it was lent, per GiB of the range: 8 times what touching fresh shared
/// pages again costs (about 1 s per GiB on the VMs measured), so a program
/// that sends a 1 GiB message every few seconds does not fault its area in
/// anew each time (it did: 2.4 s of a 4.6 s typed echo), and pays at most
/// an eighth of the time between such messages if they come less often.
pub const HOLD_PER_GIB: Duration = Duration::from_secs(8);
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
    /// End of the highest page lent since pages above it last went back to
    /// the kernel: the pages below may be resident, those above are not.
    high_water: u64,
    /// End of the highest page lent since `cooled` (or lent then).
    recent: u64,
    /// When `cool` last looked (`None`: not yet).
    cooled: Option<Instant>,
    /// The largest range lent since `cool` last looked: (end of its last
    /// page, its length).
    largest: (u64, u64),
    /// Pages below this end stay until then (see [`HOLD_PER_GIB`]).
    hold: (u64, Option<Instant>),
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
        Allocator {
            size,
            free,
            lent: HashMap::new(),
            high_water: 0,
            recent: 0,
            cooled: None,
            largest: (0, 0),
            hold: (0, None),
        }
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
        self.recent = self.recent.max(at + need);
        if len > self.largest.1 {
            self.largest = (at + need, len);
        }
        Some(Range { offset: at, len })
    }

    /// Whether pages above `WARM_BYTES` may be resident: then the owner
    /// should call [`Allocator::cool`] about once per `COOL_AFTER`.
    pub fn is_warm_above(&self) -> bool {
        self.high_water > WARM_BYTES
    }

    /// The free pages to give back to the kernel as of `now`: those above
    /// `WARM_BYTES`, above every range lent now, and above every range lent
    /// since the previous call, if that was at least `COOL_AFTER` ago (the
    /// first call only starts the clock). The range returned is free and
    /// stays so until the caller releases this book's lock: punch it out
    /// while holding it, or a concurrent `lend` could hand it out first.
    pub fn cool(&mut self, now: Instant) -> Option<Range> {
        let Some(since) = self.cooled else {
            self.cooled = Some(now);
            return None;
        };
        if now.saturating_duration_since(since) < COOL_AFTER {
            return None;
        }
        let lent_now = self.lent_end();
        // A large range lent since the last look holds its pages for a
        // while proportional to its size (counted from this look).
        let (end, len) = std::mem::take(&mut self.largest);
        let until = now + HOLD_PER_GIB.mul_f64(len as f64 / (1u64 << 30) as f64);
        if len > 0 {
            self.hold = match self.hold {
                (held, Some(t)) if now < t => (held.max(end), Some(t.max(until))),
                _ => (end, Some(until)),
            };
        }
        let held = match self.hold {
            (end, Some(t)) if now < t => end,
            _ => 0,
        };
        let keep = WARM_BYTES.max(self.recent).max(lent_now).max(held);
        self.cooled = Some(now);
        self.recent = lent_now;
        if self.high_water <= keep {
            return None;
        }
        let r = Range { offset: keep, len: self.high_water - keep };
        self.high_water = keep;
        Some(r)
    }

    /// End of the highest page lent now (0 if none): free and lent ranges
    /// cover the area, so everything from the last free range on is free
    /// if it runs to the end.
    fn lent_end(&self) -> u64 {
        match self.free.last_key_value() {
            Some((&at, &len)) if at + len == self.size => at,
            _ => self.size,
        }
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

/// How the ends of a team's shared-memory channels ask its reactor to come
/// and cool their areas ([`Allocator::cool`]): a flag, and an eventfd the
/// reactor waits on. An end arms it after a release leaves pages above
/// `WARM_BYTES` in its area; only arming an unarmed one writes the eventfd.
/// While it stays armed the reactor calls every channel's `cool` once per
/// `COOL_AFTER`, and disarms it once none has pages above the warm part.
pub struct Cooler {
    armed: AtomicBool,
    wake: OwnedFd,
}

impl Cooler {
    pub fn new() -> crate::Result<Cooler> {
        use rustix::event::{eventfd, EventfdFlags};
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| crate::Error::io("eventfd")(e.into()))?;
        Ok(Cooler { armed: AtomicBool::new(false), wake })
    }

    /// Asks the reactor to come (a load when it is coming already).
    pub fn arm(&self) {
        if !self.armed.load(Ordering::Relaxed) && !self.armed.swap(true, Ordering::AcqRel) {
            let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        }
    }

    /// The reactor: whether it will come back (`true`) or wants to be
    /// armed again (`false`: set before it looks at the channels, so that
    /// an end that finds pages to cool after it looked wakes it).
    pub fn set_armed(&self, on: bool) {
        self.armed.store(on, Ordering::SeqCst);
    }

    /// What the reactor waits on: readable once armed.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The reactor, when `fd` was readable: empties the eventfd.
    pub fn take_wake(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large range's pages stay for a while proportional to its size
    /// (8 s per GiB), not just one spell: messages of 1 GiB a few seconds
    /// apart keep their area warm; a small range cools as before.
    #[test]
    fn large_ranges_hold_their_pages_longer() {
        let t0 = Instant::now();
        let mut a = Allocator::new(4 << 30);
        assert_eq!(a.cool(t0), None);
        let r = a.lend(1 << 30).unwrap();
        a.release(r).unwrap();
        assert_eq!(a.cool(t0 + COOL_AFTER), None, "lent in the spell");
        for s in [3, 5, 8] {
            assert_eq!(a.cool(t0 + Duration::from_secs(s)), None, "held at {s} s");
        }
        let cooled = a.cool(t0 + Duration::from_secs(10)).expect("cooled once the hold is over");
        assert_eq!(cooled, Range { offset: WARM_BYTES, len: (1 << 30) - WARM_BYTES });
    }

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
    fn pages_above_the_warm_part_go_back_once_a_whole_spell_went_by_without_them() {
        let mut a = Allocator::new(WARM_BYTES + 64 * PAGE);
        let t0 = Instant::now();
        let at = |n: u32| t0 + COOL_AFTER * n;
        let r = a.lend(WARM_BYTES + 2 * PAGE).unwrap();
        assert!(a.is_warm_above());
        assert_eq!(a.cool(at(0)), None, "the first call starts the clock");
        assert_eq!(a.cool(at(1)), None, "lent");
        a.release(r).unwrap();
        assert_eq!(a.cool(at(1) + COOL_AFTER / 2), None, "too soon after the last look");
        assert_eq!(a.cool(at(2)), None, "lent during the last spell: stays warm for the next one");
        assert_eq!(a.cool(at(3)), Some(Range { offset: WARM_BYTES, len: 2 * PAGE }));
        assert!(!a.is_warm_above());
        assert_eq!(a.cool(at(4)), None, "cooled once");
        // Below the warm part nothing ever goes back.
        let small = a.lend(WARM_BYTES).unwrap();
        a.release(small).unwrap();
        assert!(!a.is_warm_above());
        assert_eq!(a.cool(at(6)), None);
    }

    #[test]
    fn large_messages_that_keep_coming_stay_warm() {
        let mut a = Allocator::new(64 * WARM_BYTES);
        let t0 = Instant::now();
        assert_eq!(a.cool(t0), None);
        // One 16 MiB message per spell, each released before the look.
        for n in 1..=20 {
            let r = a.lend(16 * WARM_BYTES).unwrap();
            a.release(r).unwrap();
            assert_eq!(a.cool(t0 + COOL_AFTER * n), None, "spell {n}");
        }
        // Then none: after one whole spell without, all above the warm part goes.
        assert_eq!(a.cool(t0 + COOL_AFTER * 21), Some(Range { offset: WARM_BYTES, len: 15 * WARM_BYTES }));
    }

    #[test]
    fn what_is_lent_or_was_lately_stays() {
        let mut a = Allocator::new(WARM_BYTES + 64 * PAGE);
        let t0 = Instant::now();
        let x = a.lend(WARM_BYTES).unwrap();
        let y = a.lend(4 * PAGE).unwrap();
        let z = a.lend(4 * PAGE).unwrap();
        assert_eq!((y.offset, z.offset), (WARM_BYTES, WARM_BYTES + 4 * PAGE));
        a.release(z).unwrap();
        a.release(x).unwrap();
        assert_eq!(a.cool(t0), None);
        assert_eq!(a.cool(t0 + COOL_AFTER), None, "z was lent in the spell");
        // y is still lent: only the pages above it go.
        assert_eq!(a.cool(t0 + COOL_AFTER * 2), Some(Range { offset: WARM_BYTES + 4 * PAGE, len: 4 * PAGE }));
        assert!(a.is_warm_above(), "y's pages");
        a.release(y).unwrap();
        assert_eq!(a.cool(t0 + COOL_AFTER * 3), None, "y was lent in the spell");
        assert_eq!(a.cool(t0 + COOL_AFTER * 4), Some(Range { offset: WARM_BYTES, len: 4 * PAGE }));
        assert!(!a.is_warm_above());
        a.check();
    }

    /// Random lends, releases and looks: what `cool` gives back is free
    /// (above every lent range) and above the warm part; once idle, the
    /// area is back to its warm part after two looks a spell apart.
    #[test]
    fn cooled_ranges_are_free_and_memory_follows_recent_use() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let size = 8 * WARM_BYTES;
        let mut a = Allocator::new(size);
        let mut lent: Vec<Range> = Vec::new();
        let t0 = Instant::now();
        for step in 0..20_000u32 {
            let now = t0 + COOL_AFTER * (step / 100);
            match next() % 10 {
                0..=4 => {
                    let len = 1 + next() % (2 * WARM_BYTES);
                    if let Some(r) = a.lend(len) {
                        lent.push(r);
                    }
                }
                5..=8 if !lent.is_empty() => {
                    let r = lent.swap_remove((next() % lent.len() as u64) as usize);
                    a.release(r).unwrap();
                }
                _ => {
                    let before = a.high_water;
                    if let Some(c) = a.cool(now) {
                        assert!(c.offset >= WARM_BYTES && c.offset + c.len == before, "{c:?}");
                        for r in &lent {
                            assert!(r.offset + r.pages() <= c.offset, "gave back {c:?}, {r:?} is lent");
                        }
                    }
                }
            }
            a.check();
        }
        for r in lent.drain(..) {
            a.release(r).unwrap();
        }
        let end = t0 + COOL_AFTER * 400;
        a.cool(end);
        a.cool(end + COOL_AFTER);
        a.cool(end + COOL_AFTER * 2);
        assert!(a.high_water <= WARM_BYTES, "{}", a.high_water);
        assert!(!a.is_warm_above());
    }
}
