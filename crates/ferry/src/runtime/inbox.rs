//! An inbox: the bounded queue of messages `M` behind one endpoint (a
//! port, a service). The progress loop offers messages; receivers pop them.
//! It knows nothing of what a message is or where it came from.

use crate::transport::doorbell::Doorbell;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// Takes an endpoint's messages as they arrive, instead of its queue (see
/// [`Inbox::set_direct`]).
pub(crate) type Direct<M> = Arc<dyn Fn(M) + Send + Sync>;

pub(crate) struct Inbox<M> {
    state: Mutex<State<M>>,
    capacity: usize,
    /// Rung when a pop makes room after an offer was refused, so the
    /// message left waiting in its channel is offered again promptly.
    doorbell: Arc<Doorbell>,
}

struct State<M> {
    queue: VecDeque<M>,
    waiters: Vec<Waker>,
    closed: bool,
    refused: bool,
    direct: Option<Direct<M>>,
}

pub(crate) enum Offer<M> {
    Accepted,
    /// For the endpoint's direct taker: the caller runs it (with no locks held).
    Direct(Direct<M>, M),
    Full,
    Closed,
}

impl<M> Inbox<M> {
    pub fn new(capacity: usize, doorbell: Arc<Doorbell>) -> Inbox<M> {
        let state = State { queue: VecDeque::new(), waiters: Vec::new(), closed: false, refused: false, direct: None };
        Inbox { state: Mutex::new(state), capacity, doorbell }
    }

    /// Queues the message `make` builds, if there is room (or regardless,
    /// with `past_capacity`). With a direct taker, an empty queue and
    /// `direct_ok` (this thread may run it), hands the message back for the
    /// taker instead: queued messages go first.
    pub fn offer(&self, direct_ok: impl FnOnce() -> bool, make: impl FnOnce() -> M, past_capacity: bool) -> Offer<M> {
        let mut s = self.state.lock();
        if s.closed {
            return Offer::Closed;
        }
        if let Some(d) = s.direct.as_ref().filter(|_| s.queue.is_empty() && direct_ok()) {
            return Offer::Direct(d.clone(), make());
        }
        if s.queue.len() >= self.capacity && !past_capacity {
            s.refused = true;
            return Offer::Full;
        }
        s.queue.push_back(make());
        // Woken under the lock, draining in place: the vector keeps its buffer.
        if !s.waiters.is_empty() {
            for w in s.waiters.drain(..) {
                w.wake();
            }
        }
        Offer::Accepted
    }

    pub fn try_pop(&self) -> Option<M> {
        match self.poll_pop_now() {
            Poll::Ready(m) => m,
            Poll::Pending => None,
        }
    }

    /// Pops a message without registering anyone: `Ready(None)` once closed and empty.
    pub fn poll_pop_now(&self) -> Poll<Option<M>> {
        let mut s = self.state.lock();
        if let Some(m) = s.queue.pop_front() {
            self.made_room(&mut s, true);
            return Poll::Ready(Some(m));
        }
        if s.closed {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    fn made_room(&self, s: &mut State<M>, popped: bool) {
        if popped && s.refused {
            s.refused = false;
            self.doorbell.ring_now();
        }
    }

    /// Pops a message, or registers `cx`'s waker; `Ready(None)` once closed and empty.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<M>> {
        let mut s = self.state.lock();
        if let Some(m) = s.queue.pop_front() {
            self.made_room(&mut s, true);
            return Poll::Ready(Some(m));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        if !s.waiters.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }

    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Sets (or with `None` removes) the direct taker: messages that arrive
    /// while the queue is empty go to it, run by the thread that received
    /// them, with no queue, wake-up or task switch in between. The queue
    /// stays for messages received by threads that may not run it.
    pub fn set_direct(&self, direct: Option<Direct<M>>) {
        let old = std::mem::replace(&mut self.state.lock().direct, direct);
        drop(old);
    }

    /// Refuses further messages, wakes every waiter, and returns what was queued.
    pub fn close(&self) -> Vec<M> {
        let mut s = self.state.lock();
        s.closed = true;
        let direct = s.direct.take();
        let waiters = std::mem::take(&mut s.waiters);
        let left = s.queue.drain(..).collect();
        drop(s);
        drop(direct);
        for w in waiters {
            w.wake();
        }
        left
    }
}
