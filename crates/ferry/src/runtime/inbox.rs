//! An inbox: the bounded queue of messages behind one endpoint (a port, a
//! service). The progress loop offers messages; receivers pop them.

use super::channel::Channel;
use crate::transport::doorbell::Doorbell;
use crate::wire::Header;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// A message as it arrived: its header (source, call id, checkpoint,
/// deadline), its payload, and the channel it came on when the sender
/// waits for an answer (an ack, a reply or a nack goes back on it).
pub(crate) struct Incoming {
    pub header: Header,
    pub payload: super::payload::Payload,
    pub channel: Option<Arc<Channel>>,
    /// Cost accounting: when it was queued (only while recording).
    pub arrived: Option<std::time::Instant>,
}

/// Takes an endpoint's messages as they arrive, instead of its queue (see
/// [`Inbox::set_direct`]).
pub(crate) type Direct = Arc<dyn Fn(Incoming) + Send + Sync>;

pub(crate) struct Inbox {
    state: Mutex<State>,
    capacity: usize,
    /// Rung when a pop makes room after an offer was refused, so the
    /// message left waiting in its channel is offered again promptly.
    doorbell: Arc<Doorbell>,
}

struct State {
    queue: VecDeque<Incoming>,
    waiters: Vec<Waker>,
    closed: bool,
    refused: bool,
    direct: Option<Direct>,
}

pub(crate) enum Offer {
    Accepted,
    /// For the endpoint's direct taker: the caller runs it (with no locks held).
    Direct(Direct, Incoming),
    Full,
    Closed,
}

impl Inbox {
    pub fn new(capacity: usize, doorbell: Arc<Doorbell>) -> Inbox {
        let state = State { queue: VecDeque::new(), waiters: Vec::new(), closed: false, refused: false, direct: None };
        Inbox { state: Mutex::new(state), capacity, doorbell }
    }

    /// Queues the message `make` builds, if there is room. With a direct
    /// taker, an empty queue and `direct_ok` (this thread may run it), hands
    /// the message back for the taker instead: queued messages go first.
    pub fn offer(&self, direct_ok: impl FnOnce() -> bool, make: impl FnOnce() -> Incoming) -> Offer {
        let mut s = self.state.lock();
        if s.closed {
            return Offer::Closed;
        }
        if let Some(d) = s.direct.as_ref().filter(|_| s.queue.is_empty() && direct_ok()) {
            return Offer::Direct(d.clone(), make());
        }
        if s.queue.len() >= self.capacity {
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

    pub fn try_pop(&self) -> Option<Incoming> {
        match self.poll_pop_now() {
            Poll::Ready(m) => m,
            Poll::Pending => None,
        }
    }

    /// Pops a message without registering anyone: `Ready(None)` once closed and empty.
    pub fn poll_pop_now(&self) -> Poll<Option<Incoming>> {
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

    fn made_room(&self, s: &mut State, popped: bool) {
        if popped && s.refused {
            s.refused = false;
            self.doorbell.ring_now();
        }
    }

    /// Pops a message, or registers `cx`'s waker; `Ready(None)` once closed and empty.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
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
    pub fn set_direct(&self, direct: Option<Direct>) {
        let old = std::mem::replace(&mut self.state.lock().direct, direct);
        drop(old);
    }

    /// Refuses further messages, wakes every waiter, and returns what was queued.
    pub fn close(&self) -> Vec<Incoming> {
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
