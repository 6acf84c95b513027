//! An inbox: the bounded queue of messages `M` behind one endpoint (a
//! port, a service). The progress loop offers messages; receivers pop them.
//! It knows nothing of what a message is or where it came from, only what
//! each costs against its byte bound.

use crate::rpc::Place;
use crate::transport::doorbell::Doorbell;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// `Inbox::shadow`'s bit for a closed inbox.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// What a message costs against an inbox's byte bound.
pub(crate) trait Cost {
    fn cost(&self) -> usize;
}

/// Takes an endpoint's messages as they arrive, instead of its queue (see
/// [`Inbox::set_direct`]).
pub(crate) trait Taker<M>: Send + Sync {
    /// Whether it takes message `m` now: the places it runs in, taken from
    /// its gate, or `None` (`m` is queued). Asked under the inbox's lock.
    /// The places travel with the message and are freed if it is dropped
    /// on the way, so a message lost before `take` cannot keep them.
    fn admit(&self, m: &M) -> Option<Place>;
    /// Takes a message it admitted, with its places (run with no locks held).
    fn take(&self, m: M, place: Place);
}

pub(crate) type Direct<M> = Arc<dyn Taker<M>>;

pub(crate) struct Inbox<M> {
    state: Mutex<State<M>>,
    /// The queue's length, and `CLOSED`, as of the state's last change
    /// (stored under its lock): what a look without the lock reads — a
    /// spinning receiver's at each turn, a direct receive's (the lock is
    /// two locked instructions, each a full barrier, per message). A look
    /// may be stale; a wait registers its waker under the lock, so it
    /// never misses a message for good.
    shadow: AtomicUsize,
    /// Most messages queued.
    capacity: usize,
    /// Most bytes queued (the sum of the costs the offers named).
    byte_capacity: usize,
    /// Rung when a pop makes room after an offer was refused, so the
    /// message left waiting in its channel is offered again promptly.
    doorbell: Arc<Doorbell>,
}

struct State<M> {
    /// The messages (their costs are recomputed when they leave: storing
    /// them would make every element bigger, and moving it dearer).
    queue: VecDeque<M>,
    /// The sum of the queued messages' costs.
    bytes: usize,
    waiters: Vec<Waker>,
    closed: bool,
    refused: bool,
    direct: Option<Direct<M>>,
}

pub(crate) enum Offer<M> {
    Accepted,
    /// For the endpoint's direct taker, with the places it admitted it to:
    /// the caller runs it (with no locks held).
    Direct(Direct<M>, M, Place),
    Full,
    Closed,
}

impl<M: Cost> Inbox<M> {
    pub fn new(capacity: usize, byte_capacity: usize, doorbell: Arc<Doorbell>) -> Inbox<M> {
        let state = State {
            queue: VecDeque::new(),
            bytes: 0,
            waiters: Vec::new(),
            closed: false,
            refused: false,
            direct: None,
        };
        Inbox { state: Mutex::new(state), shadow: AtomicUsize::new(0), capacity, byte_capacity, doorbell }
    }

    /// Publishes `s`'s length and closedness for looks without the lock
    /// (called under it, after every change of either).
    fn publish(&self, s: &State<M>) {
        let closed = if s.closed { CLOSED } else { 0 };
        self.shadow.store(s.queue.len() | closed, Ordering::Release);
    }

    /// Queues the message `make` builds, which costs `cost` bytes, if there
    /// is room (or regardless, with `past_capacity`). An empty inbox always
    /// has room: a message larger than the byte bound gets in alone. With a
    /// direct taker, an empty queue, `direct_ok` (this thread may run it)
    /// and the taker's admission, hands the message back for the taker
    /// instead: queued messages go first.
    // Inlined into the progress loop's delivery (its one hot caller): the
    // message is then built in place rather than returned and moved.
    #[inline]
    pub fn offer(
        &self,
        direct_ok: impl FnOnce() -> bool,
        cost: usize,
        make: impl FnOnce() -> M,
        past_capacity: bool,
    ) -> Offer<M> {
        let mut s = self.state.lock();
        if s.closed {
            return Offer::Closed;
        }
        let direct = match s.direct.as_ref() {
            Some(d) if s.queue.is_empty() => Some(d),
            _ => None,
        };
        let m = match direct.filter(|_| direct_ok()) {
            Some(d) => {
                let m = make();
                if let Some(place) = d.admit(&m) {
                    return Offer::Direct(d.clone(), m, place);
                }
                // Not admitted: queued (an empty queue has room).
                m
            }
            None => {
                let full = s.queue.len() >= self.capacity || s.bytes.saturating_add(cost) > self.byte_capacity;
                if full && !s.queue.is_empty() && !past_capacity {
                    s.refused = true;
                    return Offer::Full;
                }
                make()
            }
        };
        debug_assert_eq!(m.cost(), cost, "an offer named another cost than its message's");
        s.queue.push_back(m);
        s.bytes += cost;
        self.publish(&s);
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

    /// Pops a message without registering anyone: `Ready(None)` once closed
    /// and empty. An inbox that looks empty and open is `Pending` without
    /// the lock.
    pub fn poll_pop_now(&self) -> Poll<Option<M>> {
        if self.shadow.load(Ordering::Acquire) == 0 {
            return Poll::Pending;
        }
        let mut s = self.state.lock();
        if let Some(m) = self.pop_front(&mut s) {
            return Poll::Ready(Some(m));
        }
        if s.closed {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    /// Takes the first message; if an offer was refused, rings so the
    /// message left waiting in its channel is offered again.
    fn pop_front(&self, s: &mut State<M>) -> Option<M> {
        let m = s.queue.pop_front()?;
        s.bytes -= m.cost();
        self.publish(s);
        if s.refused {
            s.refused = false;
            self.doorbell.ring_now();
        }
        Some(m)
    }

    /// Pops a message, or registers `cx`'s waker; `Ready(None)` once closed and empty.
    pub fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<M>> {
        let mut s = self.state.lock();
        if let Some(m) = self.pop_front(&mut s) {
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

    /// The first queued message, for the direct taker if it admits it now
    /// (a replacement processor takes the calls queued behind a stuck one,
    /// see `handoff`).
    pub fn take_queued(&self) -> Option<(Direct<M>, M, Place)> {
        let mut s = self.state.lock();
        let d = s.direct.clone()?;
        let place = d.admit(s.queue.front()?)?;
        let m = self.pop_front(&mut s)?;
        Some((d, m, place))
    }

    /// Whether messages are queued for a direct taker.
    pub fn queued_for_direct(&self) -> bool {
        let s = self.state.lock();
        s.direct.is_some() && !s.queue.is_empty()
    }

    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether the queue looks empty, without the lock: a message queued
    /// meanwhile (by a channel whose order the caller does not hold) may
    /// not show yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.shadow.load(Ordering::Acquire) & !CLOSED == 0
    }

    /// The bytes queued: the sum of the queued messages' costs.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.state.lock().bytes
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
        s.bytes = 0;
        self.publish(&s);
        drop(s);
        drop(direct);
        for w in waiters {
            w.wake();
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test message: a number and what it costs.
    #[derive(Debug, PartialEq)]
    struct M(u32, usize);

    impl Cost for M {
        fn cost(&self) -> usize {
            self.1
        }
    }

    fn inbox(capacity: usize, bytes: usize) -> Inbox<M> {
        Inbox::new(capacity, bytes, Arc::new(Doorbell::create().unwrap()))
    }

    fn offer(i: &Inbox<M>, cost: usize, m: u32) -> bool {
        match i.offer(|| false, cost, || M(m, cost), false) {
            Offer::Accepted => true,
            Offer::Full => false,
            _ => unreachable!(),
        }
    }

    /// Regression (defect 3): only messages were counted, so 1024 messages
    /// of any size were queued.
    #[test]
    fn the_byte_bound_refuses_before_the_message_bound() {
        let i = inbox(1024, 1000);
        assert!((0..10).all(|m| offer(&i, 100, m)));
        assert!(!offer(&i, 1, 10), "1001 bytes queued against a bound of 1000");
        assert_eq!((i.len(), i.bytes()), (10, 1000));
        // A pop makes room for exactly what it took.
        assert_eq!(i.try_pop(), Some(M(0, 100)));
        assert!(!offer(&i, 101, 11));
        assert!(offer(&i, 100, 11));
        assert_eq!(i.bytes(), 1000);
    }

    #[test]
    fn an_empty_inbox_takes_one_message_larger_than_the_bound() {
        let i = inbox(1024, 1000);
        assert!(offer(&i, 5000, 1), "a large message could never be delivered");
        assert!(!offer(&i, 64, 2), "a second message joined one past the bound");
        assert_eq!(i.try_pop(), Some(M(1, 5000)));
        assert_eq!(i.bytes(), 0);
        assert!(offer(&i, 64, 2));
    }

    #[test]
    fn past_capacity_ignores_both_bounds_and_close_forgets_the_bytes() {
        let i = inbox(1, 100);
        assert!(offer(&i, 100, 1));
        assert!(matches!(i.offer(|| false, 100, || M(2, 100), true), Offer::Accepted));
        assert_eq!((i.len(), i.bytes()), (2, 200));
        assert_eq!(i.close(), vec![M(1, 100), M(2, 100)]);
        assert_eq!(i.bytes(), 0);
    }

    /// The look without the lock (`poll_pop_now`, `is_empty`) follows every
    /// change under it: an offer, a pop, a close with messages left.
    #[test]
    fn a_look_without_the_lock_sees_what_the_lock_guards() {
        let i = inbox(8, 1000);
        assert!(i.is_empty() && i.poll_pop_now().is_pending());
        assert!(offer(&i, 10, 1) && offer(&i, 10, 2));
        assert!(!i.is_empty());
        assert_eq!(i.poll_pop_now(), Poll::Ready(Some(M(1, 10))));
        assert_eq!(i.poll_pop_now(), Poll::Ready(Some(M(2, 10))));
        assert!(i.is_empty() && i.poll_pop_now().is_pending(), "empty again");
        assert!(offer(&i, 10, 3));
        assert_eq!(i.close(), vec![M(3, 10)]);
        assert!(i.is_empty());
        assert_eq!(i.poll_pop_now(), Poll::Ready(None), "closed: not pending");
    }

    /// A direct taker admitting with places of a gate of `max`.
    struct Taking(Arc<crate::rpc::gate::Gate>);

    impl Taker<M> for Taking {
        fn admit(&self, _: &M) -> Option<Place> {
            self.0.try_enter(1)
        }
        fn take(&self, _: M, _: Place) {}
    }

    /// Regression (review of issue 15, defect 5): the direct taker's place
    /// was counted at admission but owned only once `take` ran, so a direct
    /// message dropped on the way (a panic unwinding through the loop that
    /// runs them, a shutdown) kept it for good, and after `max_running_calls`
    /// such losses the service ran nothing.
    #[test]
    fn a_direct_message_dropped_untaken_frees_its_place() {
        let i = inbox(8, 1000);
        let gate = crate::rpc::gate::Gate::new(1);
        i.set_direct(Some(Arc::new(Taking(gate.clone()))));
        let entry = match i.offer(|| true, 10, || M(1, 10), false) {
            Offer::Direct(d, m, place) => (d, m, place),
            _ => panic!("not for the direct taker"),
        };
        assert_eq!(gate.running(), 1);
        // With no place free, a message is queued.
        assert!(matches!(i.offer(|| true, 10, || M(2, 10), false), Offer::Accepted));
        assert_eq!(i.try_pop(), Some(M(2, 10)));
        drop(entry);
        assert_eq!(gate.running(), 0, "the dropped message's place was not freed");
        assert!(matches!(i.offer(|| true, 10, || M(3, 10), false), Offer::Direct(..)), "the service runs calls again");
    }
}
