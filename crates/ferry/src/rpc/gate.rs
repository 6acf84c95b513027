//! How many calls a served service runs at once
//! ([`TeamBuilder::max_running_calls`](crate::TeamBuilder::max_running_calls)).
//!
//! A call takes a place before it is taken from the endpoint's inbox (the
//! direct taker asks for one under the inbox's lock, the serving task before
//! it pops) and frees it when it has been answered. With no place free,
//! calls stay in the inbox, whose bounds push back on the callers.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

pub(crate) struct Gate {
    running: AtomicUsize,
    max: usize,
    /// The serving task waits for a place (its waker is in `waker`).
    waiting: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// A running call's place; freed when dropped.
pub(crate) struct Place(Arc<Gate>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.leave();
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

    /// Takes a place if one is free, counting it; the caller makes it a
    /// [`Place`] with [`Gate::adopt`].
    pub fn reserve(&self) -> bool {
        let mut n = self.running.load(SeqCst);
        while n < self.max {
            match self.running.compare_exchange_weak(n, n + 1, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
        false
    }

    /// The place a successful [`Gate::reserve`] counted.
    pub fn adopt(self: &Arc<Self>) -> Place {
        Place(self.clone())
    }

    /// Takes a place, or registers `cx` to be woken when one is freed.
    pub fn poll_enter(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<Place> {
        if self.reserve() {
            return Poll::Ready(self.adopt());
        }
        *self.waker.lock() = Some(cx.waker().clone());
        self.waiting.store(true, SeqCst);
        // A place freed before `waiting` was seen set: take it now.
        if self.reserve() {
            self.waiting.store(false, SeqCst);
            return Poll::Ready(self.adopt());
        }
        Poll::Pending
    }

    fn leave(&self) {
        self.running.fetch_sub(1, SeqCst);
        if self.waiting.load(SeqCst) && self.waiting.swap(false, SeqCst) {
            let w = self.waker.lock().take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
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
        assert!(gate.reserve());
        let b = gate.adopt();
        assert_eq!(gate.running(), 2);
        assert!(!gate.reserve());
        assert!(gate.poll_enter(&mut cx).is_pending());
        drop(a);
        assert_eq!(woken.0.load(SeqCst), 1);
        assert_eq!(gate.running(), 1);
        assert!(gate.poll_enter(&mut cx).is_ready(), "the freed place");
        assert_eq!(gate.running(), 1, "and it was freed again when dropped");
        drop(b);
        assert_eq!(gate.running(), 0);
    }
}
