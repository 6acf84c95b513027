//! A single-producer, single-consumer ring of variable-length records in
//! shared memory.
//!
//! Layout: `cap` bytes (a power of two) of 64-byte cells. A record starts on a
//! cell with an 8-byte *stamp* `lap << 32 | flags_and_length`, followed by its
//! bytes, and takes whole cells. The producer writes the bytes first and the
//! stamp last (release), so the consumer spins on the very cache line that
//! carries the first bytes of the message. A record never wraps: if it does
//! not fit before the end, the producer writes a padding stamp and starts at
//! cell 0.
//!
//! The consumer zeroes the first word of every cell it consumes before it
//! publishes `head`, so in the free part of the ring every cell starts with 0:
//! a stale stamp or a stale payload word can never be mistaken for a new
//! record. `head` lives in its own cache line and is read by the producer only
//! when its cached copy says the ring is full.
//!
//! Trust: the peer shares this memory and may write anything at any time. The
//! consumer copies a record into private memory, then validates it; the
//! producer validates `head`. A violation makes the ring `Corrupt` for good;
//! it never causes an out-of-bounds access here.

use std::sync::atomic::{AtomicU64, Ordering};

pub const CELL: usize = 64;
const STAMP: usize = 8;
const PAD_FLAG: u64 = 1 << 31;
const LEN_MASK: u64 = PAD_FLAG - 1;

/// The shared part of one ring: where its words live.
#[derive(Clone, Copy)]
pub struct RingMem {
    /// `cap` bytes of cells, 64-byte aligned.
    pub data: *mut u8,
    pub cap: usize,
    /// The consumer's published position (absolute bytes), alone in a cache line.
    pub head: *const AtomicU64,
}

// SAFETY: RingMem only carries addresses into a mapping that its owner keeps
// alive; all concurrent access is by atomics or by copies of untrusted bytes.
unsafe impl Send for RingMem {}
unsafe impl Sync for RingMem {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    Full,
    Corrupt(&'static str),
}

impl RingMem {
    fn stamp_at(&self, pos: usize) -> &AtomicU64 {
        debug_assert!(pos.is_multiple_of(CELL) && pos < self.cap);
        // SAFETY: pos is cell-aligned and < cap, so 8 aligned bytes inside the
        // data area, which outlives `self`'s users (see the owner, `ShmEnd`).
        unsafe { &*(self.data.add(pos) as *const AtomicU64) }
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: `head` points at an aligned word in the same live mapping.
        unsafe { &*self.head }
    }

    fn lap(&self, abs: u64) -> u64 {
        (abs / self.cap as u64) & 0xFFFF_FFFF
    }

    /// Bytes a record of `len` bytes (stamp included) occupies.
    fn cells_for(len: usize) -> usize {
        (len + CELL - 1) & !(CELL - 1)
    }

    /// Largest record body (everything after the stamp) a ring of `cap` takes.
    pub fn max_body(cap: usize) -> usize {
        cap / 4 - STAMP
    }
}

/// The producer's private state.
pub struct Producer {
    mem: RingMem,
    tail: u64,
    cached_head: u64,
}

impl Producer {
    pub fn new(mem: RingMem) -> Producer {
        Producer { mem, tail: 0, cached_head: 0 }
    }

    /// Writes one record whose body is `parts` concatenated; the body must be
    /// at most `max_body(cap)` bytes (checked by the caller).
    pub fn push(&mut self, parts: &[&[u8]]) -> Result<(), RingError> {
        let cap = self.mem.cap;
        let body: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(body <= RingMem::max_body(cap));
        let len = STAMP + body;
        let need = RingMem::cells_for(len);
        let pos = (self.tail as usize) & (cap - 1);
        let pad = if pos + need > cap { cap - pos } else { 0 };
        if self.tail + (pad + need) as u64 - self.cached_head > cap as u64 {
            let head = self.mem.head().load(Ordering::Acquire);
            if head > self.tail || head < self.cached_head {
                return Err(RingError::Corrupt("consumer head moved backwards or past the tail"));
            }
            self.cached_head = head;
            if self.tail + (pad + need) as u64 - head > cap as u64 {
                return Err(RingError::Full);
            }
        }
        if pad != 0 {
            let stamp = (self.mem.lap(self.tail) << 32) | PAD_FLAG | pad as u64;
            self.mem.stamp_at(pos).store(stamp, Ordering::Release);
            self.tail += pad as u64;
        }
        let pos = (self.tail as usize) & (cap - 1);
        // SAFETY: [pos, pos + need) lies in the data area (pos + need <= cap by
        // the padding rule) and is free: the consumer has published a head that
        // puts it behind us. The consumer will not read past the stamp until we
        // publish it below, so these plain writes race with nobody honest.
        unsafe {
            let mut dst = self.mem.data.add(pos + STAMP);
            for p in parts {
                std::ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len());
                dst = dst.add(p.len());
            }
        }
        let stamp = (self.mem.lap(self.tail) << 32) | len as u64;
        self.mem.stamp_at(pos).store(stamp, Ordering::Release);
        self.tail += need as u64;
        Ok(())
    }
}

/// The consumer's private state.
///
/// Releasing a consumed record (zeroing its cells, publishing `head`) is
/// deferred to the next call: those stores go to cache lines the producer
/// owns, and on x86 any locked instruction the consumer runs before they
/// complete (taking a lock, waking a waiter) would wait for those lines to
/// cross over. Released at the next poll instead, they stay off the path
/// from "message seen" to "reply sent".
pub struct Consumer {
    mem: RingMem,
    head: u64,
    /// Bytes consumed past `head` but not yet released.
    unreleased: usize,
    /// Private copy of the record being read (reused; never shared).
    buf: Vec<u8>,
}

impl Consumer {
    pub fn new(mem: RingMem) -> Consumer {
        Consumer { mem, head: 0, unreleased: 0, buf: Vec::new() }
    }

    /// Whether a consumed record still waits to be released.
    pub fn has_unreleased(&self) -> bool {
        self.unreleased != 0
    }

    /// Zeroes the cells of the consumed record and publishes the new head.
    /// Returns whether anything was released.
    pub fn release(&mut self) -> bool {
        if self.unreleased == 0 {
            return false;
        }
        let pos = (self.head as usize) & (self.mem.cap - 1);
        for cell in (pos..pos + self.unreleased).step_by(CELL) {
            self.mem.stamp_at(cell).store(0, Ordering::Relaxed);
        }
        let n = self.unreleased;
        self.unreleased = 0;
        self.advance(n);
        true
    }

    /// Whether the cell at `head` holds a stamp: the lock-free probe.
    pub fn probe(mem: &RingMem, head: u64) -> bool {
        mem.stamp_at((head as usize) & (mem.cap - 1)).load(Ordering::Relaxed) != 0
    }

    /// Position of the next record to read.
    pub fn next(&self) -> u64 {
        self.head + self.unreleased as u64
    }

    /// If a record is ready, copies its body out and offers it to `accept`.
    /// Returns `Ok(None)` if none is ready, `Ok(Some(true))` if consumed,
    /// `Ok(Some(false))` if `accept` refused it (it stays).
    pub fn pop(&mut self, accept: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>, RingError> {
        let cap = self.mem.cap;
        self.release();
        loop {
            let pos = (self.head as usize) & (cap - 1);
            let stamp = self.mem.stamp_at(pos).load(Ordering::Acquire);
            if stamp == 0 {
                return Ok(None);
            }
            if stamp >> 32 != self.mem.lap(self.head) {
                return Err(RingError::Corrupt("record stamp has the wrong lap"));
            }
            let len = (stamp & LEN_MASK) as usize;
            if stamp & PAD_FLAG != 0 {
                if len != cap - pos || !len.is_multiple_of(CELL) {
                    return Err(RingError::Corrupt("bad padding length"));
                }
                self.mem.stamp_at(pos).store(0, Ordering::Relaxed);
                self.advance(len);
                continue;
            }
            let need = RingMem::cells_for(len);
            if len < STAMP || len - STAMP > RingMem::max_body(cap) || pos + need > cap {
                return Err(RingError::Corrupt("bad record length"));
            }
            let body = len - STAMP;
            self.buf.clear();
            self.buf.reserve(body);
            // SAFETY: [pos + STAMP, pos + len) is inside the data area (checked
            // above) and `buf` has room for `body` bytes. The bytes may change
            // under us if the peer misbehaves, so no reference to them is ever
            // made: they are copied once with raw pointers, and only the copy
            // is looked at.
            unsafe {
                std::ptr::copy_nonoverlapping(self.mem.data.add(pos + STAMP), self.buf.as_mut_ptr(), body);
                self.buf.set_len(body);
            }
            if !accept(&self.buf) {
                return Ok(Some(false));
            }
            self.unreleased = need;
            return Ok(Some(true));
        }
    }

    fn advance(&mut self, bytes: usize) {
        self.head += bytes as u64;
        // Release: our zeroing of the cells is visible before the producer reuses them.
        self.mem.head().store(self.head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Mem {
        head: AtomicU64,
        data: [u8; 1024],
    }

    fn ring() -> (Box<Mem>, Producer, Consumer) {
        let mut m = Box::new(Mem { head: AtomicU64::new(0), data: [0; 1024] });
        let mem = RingMem { data: m.data.as_mut_ptr(), cap: 1024, head: &m.head };
        (m, Producer::new(mem), Consumer::new(mem))
    }

    fn pop(c: &mut Consumer) -> Option<Vec<u8>> {
        let mut got = None;
        c.pop(&mut |b| {
            got = Some(b.to_vec());
            true
        })
        .unwrap();
        got
    }

    #[test]
    fn records_come_out_in_order_across_many_laps() {
        let (_m, mut p, mut c) = ring();
        for i in 0..1000u32 {
            let body = vec![i as u8; (i % 200) as usize];
            p.push(&[&i.to_le_bytes(), &body]).unwrap();
            let got = pop(&mut c).unwrap();
            assert_eq!(&got[..4], &i.to_le_bytes());
            assert_eq!(&got[4..], &body[..]);
        }
        assert!(pop(&mut c).is_none());
    }

    #[test]
    fn full_ring_refuses_then_accepts_after_consume() {
        let (_m, mut p, mut c) = ring();
        let body = [7u8; 200]; // 256-byte records: 4 fit in 1024
        for _ in 0..4 {
            p.push(&[&body]).unwrap();
        }
        assert_eq!(p.push(&[&body]), Err(RingError::Full));
        assert!(pop(&mut c).is_some());
        assert_eq!(p.push(&[&body]), Err(RingError::Full), "room is made only at release");
        assert!(c.release());
        p.push(&[&body]).unwrap();
    }

    #[test]
    fn refused_record_stays() {
        let (_m, mut p, mut c) = ring();
        p.push(&[b"x"]).unwrap();
        assert_eq!(c.pop(&mut |_| false), Ok(Some(false)));
        assert_eq!(pop(&mut c).unwrap(), b"x");
    }

    #[test]
    fn garbage_stamps_are_corruption_not_crashes() {
        let (m, _p, mut c) = ring();
        for bad in [u64::MAX, 1 << 32 | 64, 0x7FFF_FFFF, PAD_FLAG | 64, 3] {
            let mut c2 = Consumer::new(c.mem);
            m_stamp(&m, bad);
            assert!(matches!(c2.pop(&mut |_| true), Err(RingError::Corrupt(_))), "{bad:#x}");
        }
        m_stamp(&m, 0);
        assert_eq!(c.pop(&mut |_| true), Ok(None));
    }

    fn m_stamp(m: &Mem, v: u64) {
        // SAFETY: test-only; first 8 bytes of the aligned data array.
        unsafe { (*(m.data.as_ptr() as *const AtomicU64)).store(v, Ordering::Relaxed) }
    }

    #[test]
    fn producer_rejects_a_head_past_its_tail() {
        let (m, mut p, _c) = ring();
        for _ in 0..4 {
            p.push(&[&[0u8; 200]]).unwrap();
        }
        m.head.store(1 << 40, Ordering::Relaxed);
        assert!(matches!(p.push(&[&[0u8; 200]]), Err(RingError::Corrupt(_))));
    }
}
