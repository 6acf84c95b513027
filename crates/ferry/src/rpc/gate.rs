//! How many calls a served service runs at once
//! ([`TeamBuilder::max_running_calls`](crate::TeamBuilder::max_running_calls)).
//!
//! A call takes a place before it is taken from the endpoint's inbox (the
//! direct taker asks for its places under the inbox's lock, the serving
//! task before it pops) and frees it when it has been answered. A batch of
//! n calls takes min(n, max) places: what every running call holds
//! together stays within max(max, one batch) calls however the calls are
//! grouped. With no place free, calls stay in the inbox, whose bounds push
//! back on the callers.
//!
//! Waking the serving task (a Dekker pair, checked by the loom model in
//! `loom_models/gate.rs`): it stores its waker, sets `waiting`, then looks
//! for a free place again; `leave` frees places, then looks at `waiting`.
//! One of the two sees the other's write, so a place freed while the task
//! goes to sleep is never missed.

use crate::sync::{fence, AtomicBool, AtomicUsize, Mutex, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

pub(crate) struct Gate {
    running: AtomicUsize,
    max: usize,
    /// The serving task waits for a place (its waker is in `waker`).
    waiting: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// Places taken in a [`Gate`] (one for a call, more for a batch); freed
/// when dropped. Owned from the moment they are counted, so no path that
/// drops a call unrun can keep them.
pub(crate) struct Place {
    gate: Arc<Gate>,
    n: usize,
}

impl Place {
    /// How many places this holds.
    pub fn count(&self) -> usize {
        self.n
    }

    /// Adds `other`'s places to these.
    pub fn join(&mut self, mut other: Place) {
        self.n += std::mem::take(&mut other.n);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.n > 0 {
            self.gate.leave(self.n);
        }
    }
}

impl Gate {
    pub fn new(max: usize) -> Arc<Gate> {
        Arc::new(Gate { running: AtomicUsize::new(0), max, waiting: AtomicBool::new(false), waker: Mutex::new(None) })
    }

    /// Calls running now.
    pub fn running(&self) -> usize {
        self.running.load(SeqCst)
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes `k` places (1 ≤ `k` ≤ max) if that many are free.
    fn reserve(&self, k: usize) -> bool {
        let mut n = self.running.load(SeqCst);
        // `n` ≤ max and `k` ≤ max (`MAX_RUNNING_CALLS`): no overflow.
        while n + k <= self.max {
            match self.running.compare_exchange_weak(n, n + k, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
        false
    }

    /// Takes `k` places at once (at least 1, at most the bound), if that many are free.
    pub fn try_enter(self: &Arc<Self>, k: usize) -> Option<Place> {
        let k = k.clamp(1, self.max);
        self.reserve(k).then(|| Place { gate: self.clone(), n: k })
    }

    /// Takes a place, or registers `cx` to be woken when one is freed (one
    /// waiter: the serving task).
    pub fn poll_enter(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<Place> {
        if let Some(p) = self.try_enter(1) {
            return Poll::Ready(p);
        }
        *self.waker.lock() = Some(cx.waker().clone());
        self.waiting.store(true, SeqCst);
        // A place freed before `waiting` was seen set: take it now. (The
        // fence orders the store before the load, as `leave`'s does the
        // decrement before its load: loom needs it, x86 has it anyway.)
        fence(SeqCst);
        if let Some(p) = self.try_enter(1) {
            self.waiting.store(false, SeqCst);
            return Poll::Ready(p);
        }
        Poll::Pending
    }

    fn leave(&self, k: usize) {
        self.running.fetch_sub(k, SeqCst);
        fence(SeqCst);
        if self.waiting.load(SeqCst) && self.waiting.swap(false, SeqCst) {
            let w = self.waker.lock().take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::testing::counting_waker;

    #[test]
    fn places_are_bounded_and_a_freed_one_wakes_the_waiter() {
        let gate = Gate::new(2);
        let (woken, w) = counting_waker();
        let mut cx = Context::from_waker(&w);
        let a = match gate.poll_enter(&mut cx) {
            Poll::Ready(p) => p,
            Poll::Pending => panic!("a free place"),
        };
        let b = gate.try_enter(1).expect("a second place");
        assert_eq!(gate.running(), 2);
        assert!(gate.try_enter(1).is_none());
        assert!(gate.poll_enter(&mut cx).is_pending());
        drop(a);
        assert_eq!(woken.0.load(SeqCst), 1);
        assert_eq!(gate.running(), 1);
        assert!(gate.poll_enter(&mut cx).is_ready(), "the freed place");
        assert_eq!(gate.running(), 1, "and it was freed again when dropped");
        drop(b);
        assert_eq!(gate.running(), 0);
    }

    /// A batch's places are taken all at once or not at all, at most the
    /// bound, and joined places are freed together.
    #[test]
    fn a_batch_takes_its_places_at_once() {
        let gate = Gate::new(4);
        let one = gate.try_enter(1).unwrap();
        assert!(gate.try_enter(4).is_none(), "4 places with 3 free");
        assert_eq!(gate.running(), 1);
        let mut three = gate.try_enter(3).unwrap();
        drop(one);
        three.join(gate.try_enter(1).unwrap());
        assert_eq!((three.count(), gate.running()), (4, 4));
        drop(three);
        assert_eq!(gate.try_enter(1000).map(|p| p.count()), Some(4), "clamped to the bound");
        assert_eq!(gate.running(), 0);
    }
}
