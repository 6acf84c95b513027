//! Timers: a heap of deadlines, fired by whichever thread is idle.

use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

pub(crate) struct Timers {
    epoch: Instant,
    heap: Mutex<BinaryHeap<Reverse<(u64, u64)>>>,
    wakers: Mutex<std::collections::HashMap<u64, Waker>>,
    next_id: AtomicU64,
    /// Earliest deadline in the heap (ns since `epoch`), u64::MAX if none: a lock-free "anything due?" check.
    earliest: AtomicU64,
}

impl Timers {
    pub fn new() -> Timers {
        Timers {
            epoch: Instant::now(),
            heap: Mutex::new(BinaryHeap::new()),
            wakers: Mutex::new(Default::default()),
            next_id: AtomicU64::new(1),
            earliest: AtomicU64::new(u64::MAX),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Registers a wake-up at `at`; returns its id for `cancel`, and whether
    /// it is now the earliest timer (sleepers must then shorten their sleep).
    /// Re-registering an id replaces its waker.
    pub fn register(&self, id: Option<u64>, at: Instant, waker: &Waker) -> (u64, bool) {
        let id = id.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed));
        let fresh = self.wakers.lock().insert(id, waker.clone()).is_none();
        let mut earlier = false;
        if fresh {
            let at = self.ns(at);
            let mut heap = self.heap.lock();
            heap.push(Reverse((at, id)));
            // Drop cancelled entries at the top, so the heap does not grow with traffic.
            let wakers = self.wakers.lock();
            while let Some(Reverse((_, top))) = heap.peek() {
                if wakers.contains_key(top) {
                    break;
                }
                heap.pop();
            }
            earlier = self.earliest.fetch_min(at, Ordering::AcqRel) > at;
        }
        (id, earlier)
    }

    /// Drops every timer (at shutdown): their wakers may hold tasks alive.
    pub fn clear(&self) {
        self.heap.lock().clear();
        self.wakers.lock().clear();
        self.earliest.store(u64::MAX, Ordering::Release);
    }

    pub fn cancel(&self, id: u64) {
        self.wakers.lock().remove(&id);
    }

    /// Wakes every timer that is due; returns whether any was.
    pub fn fire(&self) -> bool {
        if self.earliest.load(Ordering::Acquire) == u64::MAX {
            return false; // no timer: no need to read the clock
        }
        let now = self.ns(Instant::now());
        if self.earliest.load(Ordering::Acquire) > now {
            return false;
        }
        let mut due = Vec::new();
        {
            let mut heap = self.heap.lock();
            while let Some(Reverse((at, id))) = heap.peek().copied() {
                if at > now {
                    break;
                }
                heap.pop();
                due.push(id);
            }
            let next = heap.peek().map_or(u64::MAX, |Reverse((at, _))| *at);
            self.earliest.store(next, Ordering::Release);
        }
        let mut fired = false;
        let mut wakers = self.wakers.lock();
        let ws: Vec<Waker> = due.iter().filter_map(|id| wakers.remove(id)).collect();
        drop(wakers);
        for w in ws {
            fired = true;
            w.wake();
        }
        fired
    }

    /// Time until the earliest timer, capped at `max`.
    pub fn until_next(&self, max: Duration) -> Duration {
        let e = self.earliest.load(Ordering::Acquire);
        if e == u64::MAX {
            return max;
        }
        Duration::from_nanos(e.saturating_sub(self.ns(Instant::now()))).min(max)
    }
}
