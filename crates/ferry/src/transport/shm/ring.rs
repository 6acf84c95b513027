//! A single-producer, single-consumer ring of variable-length records in
//! shared memory.
//!
//! Layout: `cap` bytes (a power of two) of 64-byte cells. A record starts on a
//! cell with an 8-byte *stamp* `lap << 32 | flags_and_length`, followed by its
//! bytes, and takes whole cells. The producer writes the bytes first and the
//! stamp last (release), so the consumer spins on the very cache line that
//! carries the first bytes of the message. A record never wraps: if it does
//! not fit before the end, the producer writes a padding stamp and starts at
//! cell 0. A record at cell 0 always fits (bodies are at most a quarter of
//! the ring), so padding never starts there: the consumer takes a padding
//! stamp at cell 0 as corruption, and so skips at most one padding per pop.
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
//!
//! The code is generic over [`RingMemory`], where the words and bytes live:
//! [`RingMem`] (the mapped segment) in production, heap memory with loom's
//! atomics in the loom models (`loom_models::ring`), which run this code.

use crate::error::RingFault;
use crate::sync::{AtomicU32Ops, AtomicU64Ops, Ordering};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64};

pub const CELL: usize = 64;
const STAMP: usize = 8;
const PAD_FLAG: u64 = 1 << 31;
const LEN_MASK: u64 = PAD_FLAG - 1;

/// Where one ring's cells, its `head` and its writer-waiting word live: the
/// mapped segment in production ([`RingMem`]), the heap in the loom models.
/// The ring code is generic over it, so a model runs this very code.
pub trait RingMemory: Clone + Send + Sync {
    type Word: AtomicU64Ops;
    type Flag: AtomicU32Ops;

    /// Bytes of cells: a power of two, at least one cell.
    fn cap(&self) -> usize;

    /// The first word of the cell at `pos` (taken modulo `cap`, rounded down to a cell).
    fn stamp(&self, pos: usize) -> &Self::Word;

    /// The consumer's published position (absolute bytes).
    fn head(&self) -> &Self::Word;

    /// The word a writer sets to be woken when the reader frees space (the
    /// transport's, not the ring's: see `ShmEnd::want_space`).
    fn writer_waiting(&self) -> &Self::Flag;

    /// Copies `src` to the ring's bytes at `pos..pos + src.len()`.
    ///
    /// # Safety
    /// `pos + src.len() <= cap()`, and the range is free space the producer
    /// owns: the consumer does not read it until a stamp publishes it.
    unsafe fn copy_in(&self, pos: usize, src: &[u8]);

    /// Copies the ring's bytes at `pos..pos + dst.len()` to `dst`.
    ///
    /// # Safety
    /// `pos + dst.len() <= cap()`. The bytes may be written concurrently by
    /// a misbehaving peer; the copy is the only access, and only it is read.
    unsafe fn copy_out(&self, pos: usize, dst: &mut [MaybeUninit<u8>]);
}

/// A ring in the mapped segment: the production [`RingMemory`].
#[derive(Clone, Copy)]
pub struct RingMem {
    /// `cap` bytes of cells, 64-byte aligned.
    data: *mut u8,
    cap: usize,
    /// The consumer's published position, alone in a cache line.
    head: *const AtomicU64,
    waiting: *const AtomicU32,
}

// SAFETY: RingMem only carries addresses into a mapping that its owner keeps
// alive; all concurrent access is by atomics or by copies of untrusted bytes.
unsafe impl Send for RingMem {}
unsafe impl Sync for RingMem {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    Full,
    Corrupt(RingFault),
}

impl RingMem {
    /// # Safety
    /// `data` points at `cap` bytes (a power of two of at least `CELL`),
    /// 64-byte aligned; `head` and `waiting` at aligned words outside them.
    /// All of it stays mapped while any copy of this `RingMem` is used, and
    /// is only accessed through atomics and the ring's copy discipline.
    pub unsafe fn new(data: *mut u8, cap: usize, head: *const AtomicU64, waiting: *const AtomicU32) -> RingMem {
        debug_assert!(cap.is_power_of_two() && cap >= CELL);
        RingMem { data, cap, head, waiting }
    }

    /// Largest record body (everything after the stamp) a ring of `cap` takes.
    pub fn max_body(cap: usize) -> usize {
        cap / 4 - STAMP
    }
}

impl RingMemory for RingMem {
    type Word = AtomicU64;
    type Flag = AtomicU32;

    #[inline(always)]
    fn cap(&self) -> usize {
        self.cap
    }

    #[inline(always)]
    fn stamp(&self, pos: usize) -> &AtomicU64 {
        debug_assert!(pos.is_multiple_of(CELL) && pos < self.cap);
        // Callers pass masked cell positions; masking again keeps this safe
        // for any `pos` at the cost of one AND.
        let pos = pos & (self.cap - CELL);
        // SAFETY: pos is cell-aligned and < cap, so 8 aligned bytes inside the
        // data area, which outlives `self`'s users (the contract of `new`).
        unsafe { &*(self.data.add(pos) as *const AtomicU64) }
    }

    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        // SAFETY: `head` points at an aligned word in the same live mapping (`new`).
        unsafe { &*self.head }
    }

    #[inline(always)]
    fn writer_waiting(&self) -> &AtomicU32 {
        // SAFETY: as for `head`.
        unsafe { &*self.waiting }
    }

    #[inline(always)]
    unsafe fn copy_in(&self, pos: usize, src: &[u8]) {
        // SAFETY: in bounds by the caller's contract; the range is the
        // producer's until published, so these plain writes race with nobody honest.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(pos), src.len()) }
    }

    #[inline(always)]
    unsafe fn copy_out(&self, pos: usize, dst: &mut [MaybeUninit<u8>]) {
        // SAFETY: in bounds by the caller's contract. The bytes may change
        // under us if the peer misbehaves, so no reference to them is made:
        // they are copied once with raw pointers, and only the copy is looked at.
        unsafe { std::ptr::copy_nonoverlapping(self.data.add(pos), dst.as_mut_ptr() as *mut u8, dst.len()) }
    }
}

/// The lap of absolute position `abs` in a ring of `cap` bytes: a shift,
/// `cap` being a power of two (`RingMemory::cap`). A division here sat on
/// every push's path to its stamp (tens of cycles on some CPUs).
#[inline(always)]
fn lap(cap: usize, abs: u64) -> u64 {
    debug_assert!(cap.is_power_of_two());
    (abs >> cap.trailing_zeros()) & 0xFFFF_FFFF
}

/// Bytes a record of `len` bytes (stamp included) occupies.
fn cells_for(len: usize) -> usize {
    (len + CELL - 1) & !(CELL - 1)
}

/// The producer's private state.
pub struct Producer<M: RingMemory = RingMem> {
    mem: M,
    tail: u64,
    cached_head: u64,
}

impl<M: RingMemory> Producer<M> {
    pub fn new(mem: M) -> Producer<M> {
        Producer { mem, tail: 0, cached_head: 0 }
    }

    /// A producer whose next record goes at `pos` (absolute bytes, cell
    /// aligned), which the consumer's `head` must also hold: lets a test
    /// start next to the end of the ring.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn starting_at(mem: M, pos: u64) -> Producer<M> {
        Producer { mem, tail: pos, cached_head: pos }
    }

    /// Writes one record whose body is `head` then the `rest` one after
    /// the other (a frame's header, then its payload, which may come in
    /// pieces: a primitive's head, then its caller's bytes); the body must
    /// be at most `max_body(cap)` bytes (checked by the caller). `head`'s
    /// size is known here, so it goes into the ring as a few register
    /// moves, not a `memcpy` call: as if the caller had written it in place.
    #[inline(always)]
    pub fn push<const N: usize, const K: usize>(&mut self, head: &[u8; N], rest: [&[u8]; K]) -> Result<(), RingError> {
        let cap = self.mem.cap();
        let body = N + rest.iter().map(|r| r.len()).sum::<usize>();
        debug_assert!(body <= RingMem::max_body(cap));
        let len = STAMP + body;
        let need = cells_for(len);
        let pos = (self.tail as usize) & (cap - 1);
        let pad = if pos + need > cap { cap - pos } else { 0 };
        if self.tail + (pad + need) as u64 - self.cached_head > cap as u64 {
            let head = self.mem.head().load(Ordering::Acquire);
            if head > self.tail || head < self.cached_head {
                return Err(RingError::Corrupt(RingFault::Head));
            }
            self.cached_head = head;
            if self.tail + (pad + need) as u64 - head > cap as u64 {
                return Err(RingError::Full);
            }
        }
        if pad != 0 {
            let stamp = (lap(cap, self.tail) << 32) | PAD_FLAG | pad as u64;
            self.mem.stamp(pos).store(stamp, Ordering::Release);
            self.tail += pad as u64;
        }
        let pos = (self.tail as usize) & (cap - 1);
        // SAFETY: [pos, pos + need) lies in the ring (pos + need <= cap by
        // the padding rule) and is free: the consumer has published a head
        // that puts it behind us, and reads none of it until the stamp
        // below publishes it.
        unsafe {
            self.mem.copy_in(pos + STAMP, head);
            let mut at = pos + STAMP + N;
            for r in rest {
                self.mem.copy_in(at, r);
                at += r.len();
            }
        }
        let stamp = (lap(cap, self.tail) << 32) | len as u64;
        self.mem.stamp(pos).store(stamp, Ordering::Release);
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
pub struct Consumer<M: RingMemory = RingMem> {
    mem: M,
    head: u64,
    /// Bytes consumed past `head` but not yet released.
    unreleased: usize,
    /// Private copy of the record being read (reused; never shared).
    buf: Vec<u8>,
}

impl<M: RingMemory> Consumer<M> {
    pub fn new(mem: M) -> Consumer<M> {
        Consumer { mem, head: 0, unreleased: 0, buf: Vec::new() }
    }

    /// A consumer whose next record is at `pos` (see `Producer::starting_at`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn starting_at(mem: M, pos: u64) -> Consumer<M> {
        Consumer { mem, head: pos, unreleased: 0, buf: Vec::new() }
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
        let pos = (self.head as usize) & (self.mem.cap() - 1);
        for cell in (pos..pos + self.unreleased).step_by(CELL) {
            self.mem.stamp(cell).store(0, Ordering::Relaxed);
        }
        let n = self.unreleased;
        self.unreleased = 0;
        self.advance(n);
        true
    }

    /// Whether the cell at `head` holds a stamp: the lock-free probe.
    pub fn probe(mem: &M, head: u64) -> bool {
        mem.stamp((head as usize) & (mem.cap() - 1)).load(Ordering::Relaxed) != 0
    }

    /// Whether a record (or padding) waits past the ones consumed.
    pub fn has_next(&self) -> bool {
        Self::probe(&self.mem, self.next())
    }

    /// Position of the next record to read.
    pub fn next(&self) -> u64 {
        self.head + self.unreleased as u64
    }

    /// If a record is ready, copies its body out and offers it to `accept`.
    /// Returns `Ok(None)` if none is ready, `Ok(Some(true))` if consumed,
    /// `Ok(Some(false))` if `accept` refused it (it stays).
    pub fn pop(&mut self, accept: &mut dyn FnMut(&[u8]) -> bool) -> Result<Option<bool>, RingError> {
        let cap = self.mem.cap();
        self.release();
        // At most one padding record per pop: it always sends us to cell 0,
        // where a record always fits, so a second one is a corrupt peer (and
        // a peer writing padding as fast as we skip it cannot pin us here).
        let mut padded = false;
        loop {
            let pos = (self.head as usize) & (cap - 1);
            let stamp = self.mem.stamp(pos).load(Ordering::Acquire);
            if stamp == 0 {
                return Ok(None);
            }
            if stamp >> 32 != lap(cap, self.head) {
                return Err(RingError::Corrupt(RingFault::Lap));
            }
            let len = (stamp & LEN_MASK) as usize;
            if stamp & PAD_FLAG != 0 {
                // A record at cell 0 always fits (`max_body`), so the
                // producer never pads there.
                if pos == 0 || padded {
                    return Err(RingError::Corrupt(RingFault::PaddingAtStart));
                }
                if len != cap - pos || !len.is_multiple_of(CELL) {
                    return Err(RingError::Corrupt(RingFault::PaddingLength));
                }
                self.mem.stamp(pos).store(0, Ordering::Relaxed);
                self.advance(len);
                padded = true;
                continue;
            }
            let need = cells_for(len);
            if len < STAMP || len - STAMP > RingMem::max_body(cap) || pos + need > cap {
                return Err(RingError::Corrupt(RingFault::RecordLength));
            }
            let body = len - STAMP;
            // A record of one cell (most messages and answers) is copied
            // whole, past its stamp: a copy of fixed size, a few moves, not
            // a call of `memcpy`.
            self.buf.clear();
            self.buf.reserve(body.max(CELL - STAMP));
            let spare = self.buf.spare_capacity_mut();
            // SAFETY: [pos + STAMP, pos + need) is inside the ring (checked
            // above): a cell past its stamp, or the body; the spare
            // capacity holds either.
            match need == CELL {
                true => unsafe { self.mem.copy_out(pos + STAMP, &mut spare[..CELL - STAMP]) },
                false => unsafe { self.mem.copy_out(pos + STAMP, &mut spare[..body]) },
            }
            // SAFETY: copy_out initialised at least the first `body` bytes.
            unsafe { self.buf.set_len(body) };
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
        data: [u8; 1024],
        head: AtomicU64,
        waiting: AtomicU32,
    }

    fn ring() -> (Box<Mem>, Producer, Consumer) {
        let mut m = Box::new(Mem { data: [0; 1024], head: AtomicU64::new(0), waiting: AtomicU32::new(0) });
        // SAFETY: the box is 64-byte aligned and outlives the producer and
        // consumer (the tests keep it until the end).
        let mem = unsafe { RingMem::new(m.data.as_mut_ptr(), 1024, &m.head, &m.waiting) };
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
            p.push(&i.to_le_bytes(), [&body]).unwrap();
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
            p.push(&[], [&body]).unwrap();
        }
        assert_eq!(p.push(&[], [&body]), Err(RingError::Full));
        assert!(pop(&mut c).is_some());
        assert_eq!(p.push(&[], [&body]), Err(RingError::Full), "room is made only at release");
        assert!(c.release());
        p.push(&[], [&body]).unwrap();
    }

    #[test]
    fn refused_record_stays() {
        let (_m, mut p, mut c) = ring();
        p.push(b"x", []).unwrap();
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
            p.push(&[0u8; 200], []).unwrap();
        }
        m.head.store(1 << 40, Ordering::Relaxed);
        assert!(matches!(p.push(&[0u8; 200], []), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn padding_at_cell_zero_is_corruption() {
        // A record at cell 0 always fits, so an honest producer never pads
        // there; a padding of the whole ring used to be skipped as a lap.
        let (m, _p, mut c) = ring();
        m_stamp(&m, PAD_FLAG | 1024);
        assert_eq!(c.pop(&mut |_| true), Err(RingError::Corrupt(RingFault::PaddingAtStart)));
    }

    #[test]
    fn legitimate_padding_is_skipped() {
        let (_m, mut p, mut c) = ring();
        // 1 cell, then 4-cell records from cell 1: the fourth would cross
        // the end (cell 13 of 16), so it is padded to cell 0.
        for (i, len) in [50usize, 200, 200, 200, 200].into_iter().enumerate() {
            p.push(&[], [&vec![i as u8; len]]).unwrap();
            assert_eq!(pop(&mut c).unwrap(), vec![i as u8; len]);
        }
        assert_eq!(c.next(), 1024 + 4 * 64);
        assert!(pop(&mut c).is_none());
    }

    /// The producer and the consumer on two threads, over one ring in this
    /// process's memory, for many laps: every record arrives once, in
    /// order and intact. Between processes (and between two mappings of
    /// one segment) ThreadSanitizer cannot see that the two ends touch the
    /// same bytes; here it can, so scripts/sanitizers.sh checks with it
    /// that the stamps and `head` order the copies.
    #[test]
    fn a_producer_and_a_consumer_on_two_threads_lose_and_damage_nothing() {
        const N: u32 = 20_000;
        let (_m, mut p, mut c) = ring();
        let body = |i: u32| vec![i as u8 ^ 0x5A; (i as usize * 37) % (RingMem::max_body(1024) - 3)];
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..N {
                    while p.push(&i.to_le_bytes(), [&body(i)]) == Err(RingError::Full) {
                        assert!(std::time::Instant::now() < until, "the ring stayed full at record {i}");
                        std::thread::yield_now();
                    }
                }
            });
            for i in 0..N {
                let got = loop {
                    if let Some(got) = pop(&mut c) {
                        break got;
                    }
                    assert!(std::time::Instant::now() < until, "record {i} never came");
                    std::thread::yield_now();
                };
                assert_eq!(got[..4], i.to_le_bytes(), "record {i} out of order");
                assert!(got[4..] == body(i), "record {i} damaged");
            }
        });
        assert!(pop(&mut c).is_none());
    }

    /// A peer that writes a padding record at the consumer's head whenever
    /// the consumer finds an empty cell there, as fast as it is skipped.
    #[derive(Clone)]
    struct PaddingPeer(std::sync::Arc<PaddingInner>);

    struct PaddingInner {
        cells: Vec<AtomicU64>,
        head: AtomicU64,
        waiting: AtomicU32,
        reads: std::sync::atomic::AtomicUsize,
    }

    const PEER_CAP: usize = 1024;

    impl RingMemory for PaddingPeer {
        type Word = AtomicU64;
        type Flag = AtomicU32;

        fn cap(&self) -> usize {
            PEER_CAP
        }

        fn stamp(&self, pos: usize) -> &AtomicU64 {
            let reads = self.0.reads.fetch_add(1, Ordering::Relaxed);
            assert!(reads < 1000, "the consumer is pinned by padding");
            let head = self.0.head.load(Ordering::Relaxed);
            let cell = &self.0.cells[pos / CELL];
            if pos == head as usize % PEER_CAP && cell.load(Ordering::Relaxed) == 0 {
                let pad = lap(PEER_CAP, head) << 32 | PAD_FLAG | (PEER_CAP - pos) as u64;
                cell.store(pad, Ordering::Relaxed);
            }
            cell
        }

        fn head(&self) -> &AtomicU64 {
            &self.0.head
        }

        fn writer_waiting(&self) -> &AtomicU32 {
            &self.0.waiting
        }

        unsafe fn copy_in(&self, _: usize, _: &[u8]) {
            unreachable!("the peer writes only padding")
        }

        unsafe fn copy_out(&self, _: usize, _: &mut [MaybeUninit<u8>]) {
            unreachable!("the peer writes only padding")
        }
    }

    #[test]
    fn a_peer_writing_padding_nonstop_cannot_pin_the_consumer() {
        let start = (PEER_CAP - CELL) as u64;
        let mem = PaddingPeer(std::sync::Arc::new(PaddingInner {
            cells: (0..PEER_CAP / CELL).map(|_| AtomicU64::new(0)).collect(),
            head: AtomicU64::new(start),
            waiting: AtomicU32::new(0),
            reads: Default::default(),
        }));
        let mut c = Consumer::starting_at(mem, start);
        // The padding of the last cell is legitimate; the next one (at cell 0) is not.
        assert_eq!(c.pop(&mut |_| true), Err(RingError::Corrupt(RingFault::PaddingAtStart)));
        assert_eq!(c.next(), PEER_CAP as u64);
    }
}
