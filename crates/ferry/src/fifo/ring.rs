//! One producer's ring of a fifo: a single-producer, single-consumer queue
//! of elements of at most `element_size` bytes, in a segment the producer
//! and the fifo's owner both map (or, for a producer on another machine, in
//! the owner's memory alone, pushed by its runtime).
//!
//! Layout (u64 words little-endian, each on its own cache line):
//!
//! | offset | what | written by |
//! |---|---|---|
//! | 0 | `tail`: elements published so far | the producer |
//! | 64 | `head`: elements taken so far | the owner |
//! | 128 | `closed`: 0, or why the owner closed the ring ([`Closed`]) | the owner |
//! | 4096 | `capacity` slots of `8 + element_size` (rounded up to 8) bytes: a length (u32), 4 bytes unused, the element | the producer |
//!
//! The producer is not trusted: the owner keeps its own `head`, reads
//! `tail` and each slot's length once and checks them (a ring whose tail
//! is behind its head or more than `capacity` ahead, or a length past
//! `element_size`, is corrupt), and only copies an element out. A producer
//! that scribbles on its ring hurts its own elements only.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const TAIL: usize = 0;
const HEAD: usize = 64;
const CLOSED: usize = 128;
/// Bytes before the slots (a page: the slots start page-aligned).
pub(super) const HEADER: usize = 4096;

/// Why the owner closed a ring (its `closed` word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Closed {
    /// The fifo was dropped by its owner.
    Dropped = 1,
    /// The producer wrote what no honest producer writes.
    Corrupt = 2,
}

/// A fifo's shape: how many elements, how large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub capacity: u64,
    pub element_size: usize,
}

impl Shape {
    /// Bytes of one slot.
    pub fn stride(&self) -> usize {
        8 + self.element_size.next_multiple_of(8)
    }

    /// Bytes of a ring's segment.
    pub fn bytes(&self) -> usize {
        HEADER + self.capacity as usize * self.stride()
    }
}

/// A ring at `base`, in memory another process may write at any time.
pub(crate) struct Ring {
    base: *mut u8,
    shape: Shape,
}

// SAFETY: every access through a `Ring` is an atomic instruction or a copy
// of bytes that are checked, or treated as opaque, after it is made.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

/// A producer's own state of its ring.
#[derive(Default)]
pub(crate) struct Producing {
    /// Elements pushed.
    tail: u64,
    /// The owner's head, as last read.
    head: u64,
}

/// The owner's own state of a producer's ring.
#[derive(Default)]
pub(crate) struct Consuming {
    /// Elements taken.
    head: u64,
    /// The producer's tail, as last read (never behind `head`).
    tail: u64,
}

/// What a pop found wrong with a producer's ring.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Corrupt(pub &'static str);

impl Ring {
    /// # Safety
    /// `base..base + shape.bytes()` stays mapped, readable and writable,
    /// page-aligned at `base`, while this ring is used.
    pub unsafe fn new(base: *mut u8, shape: Shape) -> Ring {
        Ring { base, shape }
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the header's aligned words, inside the mapping (`new`).
        unsafe { AtomicU64::from_ptr(self.base.add(at).cast()) }
    }

    /// Slot `seq`'s length word and its element's first byte.
    fn slot(&self, seq: u64) -> (&AtomicU32, *mut u8) {
        let at = HEADER + (seq % self.shape.capacity) as usize * self.shape.stride();
        // SAFETY: slot `seq % capacity` lies inside the mapping, 8-aligned (`new`, `Shape::bytes`).
        unsafe { (AtomicU32::from_ptr(self.base.add(at).cast()), self.base.add(at + 8)) }
    }

    /// Why the owner closed it, if it did.
    pub fn closed(&self) -> Option<u64> {
        Some(self.word(CLOSED).load(Ordering::Acquire)).filter(|&w| w != 0)
    }

    /// The owner closes it (the producer sees it at its next push).
    pub fn close(&self, why: Closed) {
        self.word(CLOSED).store(why as u64, Ordering::Release);
    }

    /// The producer's push of `bytes` (at most `element_size`) as its next
    /// element: `false` if the ring is full. `at` is the producer's own
    /// state (its count, never read back from the ring, and the owner's
    /// head as it last read it: read again only when the ring looks full,
    /// so the owner's line does not move on every push). The tail is
    /// published with a full barrier (a locked exchange): the caller's look
    /// at the owner's "parked" word after it cannot pass it.
    pub fn push(&self, at: &mut Producing, bytes: &[u8]) -> bool {
        debug_assert!(bytes.len() <= self.shape.element_size);
        if at.tail.wrapping_sub(at.head) >= self.shape.capacity {
            at.head = self.word(HEAD).load(Ordering::Acquire);
            if at.tail.wrapping_sub(at.head) >= self.shape.capacity {
                return false;
            }
        }
        let (len, data) = self.slot(at.tail);
        // SAFETY: the slot has room for `element_size >= bytes.len()` bytes;
        // the owner reads it only after the tail below says it is published.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len()) };
        len.store(bytes.len() as u32, Ordering::Relaxed);
        at.tail += 1;
        self.word(TAIL).swap(at.tail, Ordering::SeqCst);
        true
    }

    /// Free slots for the producer whose state is `at` (its pushes, the
    /// owner's head as the ring says it now).
    pub fn free(&self, at: &Producing) -> u64 {
        let head = self.word(HEAD).load(Ordering::Acquire);
        self.shape.capacity.saturating_sub(at.tail.wrapping_sub(head))
    }

    /// The owner's pop of its next element into `buf` (copied out of the
    /// ring): `false` if the ring is empty, `Corrupt` if the producer wrote
    /// nonsense. `at` is the owner's own state: its head, and the tail as it
    /// last read it (read again only once the elements it promised are
    /// taken, so the producer's line moves once per batch).
    pub fn pop(&self, at: &mut Consuming, buf: &mut Vec<u8>) -> Result<bool, Corrupt> {
        if at.tail == at.head {
            at.tail = self.word(TAIL).load(Ordering::Acquire);
            match at.tail.wrapping_sub(at.head) {
                0 => return Ok(false),
                n if n > self.shape.capacity => {
                    return Err(Corrupt("its tail is behind its head or past its capacity"))
                }
                _ => {}
            }
        }
        let (len, data) = self.slot(at.head);
        let len = len.load(Ordering::Relaxed) as usize;
        if len > self.shape.element_size {
            return Err(Corrupt("an element longer than the fifo's element size"));
        }
        buf.clear();
        buf.reserve(len);
        // SAFETY: `len <= element_size` bytes lie inside the slot; the
        // producer may write them meanwhile (then the element is garbage,
        // its own): they are copied, and only the copy is read.
        unsafe {
            std::ptr::copy_nonoverlapping(data, buf.as_mut_ptr(), len);
            buf.set_len(len);
        }
        at.head += 1;
        self.word(HEAD).store(at.head, Ordering::Release);
        Ok(true)
    }

    /// Whether it holds no element (the owner's look).
    pub fn is_empty(&self, at: &Consuming) -> bool {
        at.tail == at.head && self.word(TAIL).load(Ordering::Acquire) == at.head
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn scribble_tail(&self, tail: u64) {
        self.word(TAIL).store(tail, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(mem: &mut [u64], shape: Shape) -> Ring {
        assert!(mem.len() * 8 >= shape.bytes());
        // SAFETY: an aligned vector at least as large as the ring, alive for the test.
        unsafe { Ring::new(mem.as_mut_ptr().cast(), shape) }
    }

    #[test]
    fn elements_go_through_in_order_and_a_full_ring_says_so() {
        let shape = Shape { capacity: 3, element_size: 10 };
        let mut mem = vec![0u64; shape.bytes() / 8];
        let r = ring(&mut mem, shape);
        let (mut tail, mut head, mut buf) = (Producing::default(), Consuming::default(), Vec::new());
        for round in 0..5u8 {
            for i in 0..3 {
                assert!(r.push(&mut tail, &[round, i]));
            }
            assert!(!r.push(&mut tail, b"x"), "full");
            for i in 0..3 {
                assert_eq!(r.pop(&mut head, &mut buf), Ok(true));
                assert_eq!(buf, [round, i]);
            }
            assert_eq!(r.pop(&mut head, &mut buf), Ok(false));
        }
    }

    #[test]
    fn a_scribbling_producer_is_found_out() {
        let shape = Shape { capacity: 4, element_size: 8 };
        let mut mem = vec![0u64; shape.bytes() / 8];
        let mut buf = Vec::new();
        let fresh = Consuming::default;
        {
            let r = ring(&mut mem, shape);
            r.word(TAIL).store(9, Ordering::Relaxed);
            assert!(r.pop(&mut fresh(), &mut buf).is_err(), "a tail past the capacity");
            r.word(TAIL).store(u64::MAX, Ordering::Relaxed);
            assert!(r.pop(&mut fresh(), &mut buf).is_err(), "a tail behind the head");
            r.word(TAIL).store(1, Ordering::Relaxed);
            r.slot(0).0.store(9, Ordering::Relaxed);
            assert!(r.pop(&mut fresh(), &mut buf).is_err(), "a length past the element size");
            r.slot(0).0.store(8, Ordering::Relaxed);
            assert_eq!(r.pop(&mut fresh(), &mut buf), Ok(true));
            r.close(Closed::Corrupt);
            assert_eq!(r.closed(), Some(Closed::Corrupt as u64));
        }
    }
}
