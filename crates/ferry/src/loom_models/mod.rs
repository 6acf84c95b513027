//! loom models of the protocols that keep frames and wake-ups from being
//! lost: the ring, the doorbell's park/ring, the wait for ring space, and
//! `Executor::push` against a parking processor.
//!
//! They run the real code: `Producer`/`Consumer`, `ShmEnd`, `Doorbell` and
//! `Executor` are generic over where their shared words live, and here
//! those words are loom's (see `crate::sync`). [`HeapRing`] keeps a ring's
//! stamps, `head` and writer-waiting word in loom atomics and the other
//! bytes of each cell in a `loom::cell::UnsafeCell`, so loom reports a data
//! race on payload bytes; [`HeapBell`] keeps a doorbell's words in loom
//! atomics and models its lines and epoll sleep with a count of wake-ups
//! under a loom mutex and condition variable, with no timeout: a wake-up that never comes leaves the sleeper blocked,
//! which loom reports as a deadlock. What the runtime itself does around
//! these calls (its idle loop in `runtime/idle.rs`, `push_frame` in
//! `runtime/mod.rs`) is repeated in each model, step for step.
//!
//! Only built with `RUSTFLAGS="--cfg loom"`; `scripts/test.sh` runs them
//! (about 40 s, plus 1.5 min for the build, on a shared 2-core machine):
//! `RUSTFLAGS="--cfg loom" cargo test -p ferry --lib --release --target-dir target/loom loom`.
//!
//! | model | checks | exploration |
//! |---|---|---|
//! | `ring` | records (one padded past the end, one reusing released cells, one of a single cell copied whole) arrive whole, in order, once; no payload data race | exhaustive |
//! | `doorbell` | a receiver parking as a frame arrives is rung | exhaustive |
//! | `doorbell` | a sender that skips ringing again (the thread it rang has not looked yet) strands no frame | 3 preemptions |
//! | `doorbell` | the last poller leaving rings for a frame a sender saw it poll for | 3 preemptions |
//! | `wait_space` | a writer waiting for space is woken when the reader frees it | exhaustive |
//! | `wait_space` | with two writers, one's success does not erase the other's wait | 3 preemptions |
//! | `wait_space` | the progress loop sends a frame queued in an outbox once the reader frees space | exhaustive |
//! | `executor` (in `runtime::executor`) | `push` wakes a processor going to sleep | exhaustive |
//! | `executor` | wakes racing the end of a poll queue the task once, never during the poll | exhaustive |
//! | `gate` (`rpc::gate`) | a place freed as the serving task goes to wait for one wakes it | exhaustive |
//! | `gate` | with two places freed at once, the task is woken | 3 preemptions |
//! | `handoff` (`runtime::handoff`) | a processor waking as the hand-off watcher goes to sleep for good pokes it | exhaustive |
//! | `call_slab` (`runtime::call_slab`) | live calls never share an entry, also when a pop races the same entry popped and pushed back (ABA) | 3 preemptions |
//! | `call_slab` | an answer racing its call's end and the entry's reuse never reaches the new call | exhaustive |
//! loom treats SeqCst loads, stores and RMWs as Acquire/Release, so every
//! store → load (Dekker) step of the real code needs its `fence(SeqCst)`:
//! each model fails if that fence, or its flag, is taken out.

mod doorbell;
mod gate;
mod ring;
mod wait_space;
// The executor's model is `executor.rs` here too, but a child of
// `runtime::executor` (declared there), whose types are private to `runtime`.

use crate::id::Addr;
use crate::transport::doorbell::{Bell, Doorbell, DoorbellMemory};
use crate::transport::shm::ring::{RingMemory, CELL};
use crate::transport::shm::ShmEnd;
use crate::wire::{Header, Kind};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::sync::{Condvar, Mutex};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const STAMP: usize = 8;

/// Runs a model: every interleaving, or those with at most `preemptions`
/// preemptions where all of them would take too long (each model here
/// finishes within seconds on one core).
pub(crate) fn check(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemptions;
    builder.check(f);
}

struct Cell {
    /// The stamp, or payload bytes in the cells after a record's first.
    word: AtomicU64,
    rest: UnsafeCell<[u8; CELL - STAMP]>,
}

/// A ring on the heap, shared by the handles that clone it.
#[derive(Clone)]
pub(crate) struct HeapRing(Arc<RingInner>);

struct RingInner {
    cap: usize,
    cells: Vec<Cell>,
    head: AtomicU64,
    waiting: AtomicU32,
}

// SAFETY: the payload cells are shared like the mapped ring's bytes: the
// ring protocol gives each to one side at a time, which is what the models
// check (loom's UnsafeCell reports any concurrent access).
unsafe impl Sync for RingInner {}

impl HeapRing {
    /// An empty ring of `cap` bytes whose consumer starts at `head`.
    pub(crate) fn new(cap: usize, head: u64) -> HeapRing {
        assert!(cap.is_power_of_two() && cap >= CELL);
        let cells = (0..cap / CELL)
            .map(|_| Cell { word: AtomicU64::new(0), rest: UnsafeCell::new([0; CELL - STAMP]) })
            .collect();
        HeapRing(Arc::new(RingInner { cap, cells, head: AtomicU64::new(head), waiting: AtomicU32::new(0) }))
    }

    /// Visits the byte range `pos..pos + len` cell by cell: `f(cell, offset in cell, range in the buffer)`.
    fn chunks(&self, pos: usize, len: usize, mut f: impl FnMut(&Cell, usize, std::ops::Range<usize>)) {
        assert!(pos + len <= self.0.cap, "copy past the end of the ring");
        let mut done = 0;
        while done < len {
            let at = pos + done;
            let off = at % CELL;
            // The first word of a cell is an atomic; the rest one loom cell.
            let end = if off < STAMP { STAMP } else { CELL };
            let n = (end - off).min(len - done);
            f(&self.0.cells[at / CELL], off, done..done + n);
            done += n;
        }
    }
}

impl RingMemory for HeapRing {
    type Word = AtomicU64;
    type Flag = AtomicU32;

    fn cap(&self) -> usize {
        self.0.cap
    }

    fn stamp(&self, pos: usize) -> &AtomicU64 {
        assert!(pos.is_multiple_of(CELL) && pos < self.0.cap, "stamp at {pos}");
        &self.0.cells[pos / CELL].word
    }

    fn head(&self) -> &AtomicU64 {
        &self.0.head
    }

    fn writer_waiting(&self) -> &AtomicU32 {
        &self.0.waiting
    }

    unsafe fn copy_in(&self, pos: usize, src: &[u8]) {
        self.chunks(pos, src.len(), |cell, off, range| {
            if off < STAMP {
                // Payload in a later cell's first word: the producer owns it
                // (zeroed by the consumer before it published `head`).
                let mut bytes = cell.word.load(Ordering::Relaxed).to_le_bytes();
                bytes[off..off + range.len()].copy_from_slice(&src[range]);
                cell.word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
            } else {
                let o = off - STAMP;
                // SAFETY: loom checks this write has no concurrent access.
                cell.rest.with_mut(|p| unsafe { (&mut *p)[o..o + range.len()].copy_from_slice(&src[range]) });
            }
        });
    }

    unsafe fn copy_out(&self, pos: usize, dst: &mut [MaybeUninit<u8>]) {
        self.chunks(pos, dst.len(), |cell, off, range| {
            let n = range.len();
            if off < STAMP {
                let bytes = cell.word.load(Ordering::Relaxed).to_le_bytes();
                for (d, s) in dst[range].iter_mut().zip(&bytes[off..off + n]) {
                    d.write(*s);
                }
            } else {
                let o = off - STAMP;
                // SAFETY: loom checks this read has no concurrent write.
                let bytes = cell.rest.with(|p| unsafe { (&*p)[o..o + n].to_vec() });
                for (d, s) in dst[range].iter_mut().zip(&bytes) {
                    d.write(*s);
                }
            }
        });
    }
}

/// A doorbell's words on the heap, and its lines and sleep made of a count
/// of wake-ups under a loom mutex and a condition variable: a ring adds
/// wake-ups and notifies under the lock, a sleep waits (under it) until
/// one is there and takes it, as a team's eventfd lines and epoll set do.
/// The model's lines share one count: each wake takes one wake-up, as each
/// return from the real epoll wait takes one from one line.
#[derive(Clone)]
pub(crate) struct HeapBell(Arc<BellInner>);

struct BellInner {
    pollers: AtomicU32,
    sleepers: AtomicU32,
    wakes: AtomicU32,
    wakeups: Mutex<u32>,
    sleeping: Condvar,
}

impl HeapBell {
    pub(crate) fn new() -> HeapBell {
        HeapBell(Arc::new(BellInner {
            pollers: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            wakes: AtomicU32::new(0),
            wakeups: Mutex::new(0),
            sleeping: Condvar::new(),
        }))
    }

    /// The team's own doorbell on these words.
    pub(crate) fn doorbell(&self) -> Doorbell<HeapBell> {
        Doorbell::on(self.clone(), self.clone(), self.clone())
    }

    /// A peer's bell on these words (a line of its own to the team).
    pub(crate) fn bell(&self) -> Bell<HeapBell> {
        Bell::on(self.clone(), self.clone())
    }
}

impl DoorbellMemory for HeapBell {
    type Word = AtomicU32;
    type Line = HeapBell;
    type Sleep = HeapBell;

    fn pollers(&self) -> &AtomicU32 {
        &self.0.pollers
    }

    fn sleepers(&self) -> &AtomicU32 {
        &self.0.sleepers
    }

    fn wakes(&self) -> Option<&AtomicU32> {
        Some(&self.0.wakes)
    }

    fn ring_one(line: &HeapBell) {
        *line.0.wakeups.lock().unwrap() += 1;
        line.0.sleeping.notify_all();
    }

    /// A wake-up for each thread the ringer saw asleep, and one for a
    /// thread about to sleep (the real `all` line gives each thread its
    /// own; a shared count is the harder case).
    fn ring_all(line: &HeapBell, sleepers: u32) {
        *line.0.wakeups.lock().unwrap() += sleepers + 1;
        line.0.sleeping.notify_all();
    }

    /// No timeout and no spurious return: a lost wake-up is a deadlock.
    fn wait(sleep: &HeapBell, _timeout: Duration) -> bool {
        let mut wakeups = sleep.0.wakeups.lock().unwrap();
        while *wakeups == 0 {
            wakeups = sleep.0.sleeping.wait(wakeups).unwrap();
        }
        *wakeups -= 1;
        true
    }
}

type End = ShmEnd<HeapRing, HeapBell>;

/// A connected pair of shared-memory ends on heap rings of `cap` bytes:
/// `a` belongs to the team of `bell_a`, `b` to that of `bell_b`.
struct Pair {
    a: Arc<End>,
    b: Arc<End>,
    bell_a: Arc<Doorbell<HeapBell>>,
    bell_b: Arc<Doorbell<HeapBell>>,
}

fn pair(cap: usize) -> Pair {
    let (a_to_b, b_to_a) = (HeapRing::new(cap, 0), HeapRing::new(cap, 0));
    let (bell_a, bell_b) = (HeapBell::new(), HeapBell::new());
    Pair {
        a: Arc::new(ShmEnd::from_parts(a_to_b.clone(), b_to_a.clone(), bell_b.bell(), None)),
        b: Arc::new(ShmEnd::from_parts(b_to_a, a_to_b, bell_a.bell(), None)),
        bell_a: Arc::new(bell_a.doorbell()),
        bell_b: Arc::new(bell_b.doorbell()),
    }
}

fn frame(call_id: u64) -> Header {
    let ep = |team| Addr::new(1, team, 1).unwrap();
    Header::new(Kind::Data, ep(1), ep(2), call_id)
}
