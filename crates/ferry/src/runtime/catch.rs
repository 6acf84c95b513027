//! Direct receive: a thread blocked on one inbox (`RawPort::recv_blocking`)
//! drives the team's channels itself while it spins, so the frame it waits
//! for is most often taken by its own drain. That drain hands the message
//! straight to the wait: no lock of the inbox on either side, no queue
//! push and pop.
//!
//! The wait registers, in thread-locals, the inbox it waits on and a slot
//! on its stack; `dispatch::deliver` asks [`wants`] for each message and
//! catches it only while the inbox is quiet (nothing queued, open, no
//! direct taker): queued messages go first, and order per channel is kept,
//! since a message the same channel delivered earlier was queued before
//! this drain took the channel. One message is caught per wait; later
//! ones are queued.

use super::channel::Incoming;
use super::inbox::Inbox;
use std::cell::Cell;
use std::ptr;

/// Where a wait's caught message goes.
#[derive(Default)]
pub(crate) struct Slot {
    /// Whether `message` holds one: the spinning wait looks at this every
    /// turn, which is cheaper than taking the 128-byte option out.
    full: Cell<bool>,
    message: Cell<Option<Incoming>>,
}

impl Slot {
    /// The caught message, if one came.
    #[inline]
    pub fn take(&self) -> Option<Incoming> {
        if !self.full.get() {
            return None;
        }
        self.full.set(false);
        self.message.take()
    }
}

thread_local! {
    /// The inbox this thread's wait catches for, or null.
    static WANTED: Cell<*const Inbox<Incoming>> = const { Cell::new(ptr::null()) };
    /// Where the caught message goes: the wait's slot (valid while `WANTED` is set).
    static SLOT: Cell<*const Slot> = const { Cell::new(ptr::null()) };
}

/// Whether this thread waits on `inbox` and has caught nothing yet.
#[inline]
pub(crate) fn wants(inbox: &Inbox<Incoming>) -> bool {
    ptr::eq(WANTED.get(), inbox)
}

/// Hands `m` (for the inbox [`wants`] named) to the waiting thread; the
/// catch is over.
pub(crate) fn put(m: Incoming) {
    WANTED.set(ptr::null());
    let slot = SLOT.get();
    // SAFETY: `wants` was true on this thread, so a `catching` call on this
    // thread's stack registered `slot` and has not returned (its guard
    // clears `WANTED` before the slot goes): the pointer is live. Only this
    // thread reaches it, and only through `Cell`s.
    let slot = unsafe { &*slot };
    slot.message.set(Some(m));
    slot.full.set(true);
}

/// Runs the wait `f` with this thread catching a message for `inbox` into
/// the slot `f` is given (which `f` must look at before the inbox). A
/// nested wait (a task this wait runs may block on another port) restores
/// the outer wait's registration when it ends.
pub(crate) fn catching<R>(inbox: &Inbox<Incoming>, f: impl FnOnce(&Slot) -> R) -> R {
    struct Restore(*const Inbox<Incoming>, *const Slot);
    impl Drop for Restore {
        fn drop(&mut self) {
            WANTED.set(self.0);
            SLOT.set(self.1);
        }
    }
    let slot = Slot::default();
    let _restore = Restore(WANTED.replace(inbox), SLOT.replace(&slot));
    f(&slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Team;
    use crate::Checkpoint;

    fn pair(dir: &tempfile::TempDir) -> (Team, Team) {
        let b = || Team::builder().runtime_dir(dir.path()).processors(0);
        (b().start().unwrap(), b().start().unwrap())
    }

    /// This thread's drains, until `port`'s channel from `from` took a frame.
    fn drain(team: &Team) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !team.inner.progress_on(&team.inner.channels.snapshot()) {
            assert!(std::time::Instant::now() < until, "no frame came");
        }
    }

    /// A message this thread's own drain finds for the inbox it waits on
    /// goes to the wait, not the inbox; one per wait, the next is queued.
    #[test]
    fn a_waiting_threads_drain_hands_it_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = pair(&dir);
        let port = b.open_raw_port().unwrap();
        let to = a.raw_sender(port.id());
        to.send(b"bind", Checkpoint::Immediate).unwrap();
        assert_eq!(port.recv_blocking().unwrap().payload(), b"bind");
        to.send(b"one", Checkpoint::Immediate).unwrap();
        to.send(b"two", Checkpoint::Immediate).unwrap();
        catching(port.inbox(), |slot| {
            drain(&b);
            assert_eq!(slot.take().map(|m| m.payload.as_local().unwrap().to_vec()), Some(b"one".to_vec()));
            assert!(slot.take().is_none());
        });
        assert_eq!(port.len(), 1, "the second message was not queued");
        assert_eq!(port.try_recv().unwrap().payload(), b"two");
    }

    /// While messages are queued, a drain of the waiting thread queues the
    /// next one behind them: the wait takes the queue's first.
    #[test]
    fn queued_messages_go_before_a_catch() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = pair(&dir);
        let port = b.open_raw_port().unwrap();
        let to = a.raw_sender(port.id());
        to.send(b"one", Checkpoint::Immediate).unwrap();
        drain(&b); // Queued: no wait on this thread yet.
        assert_eq!(port.len(), 1);
        to.send(b"two", Checkpoint::Immediate).unwrap();
        catching(port.inbox(), |slot| {
            drain(&b);
            assert!(slot.take().is_none(), "caught past a queued message");
        });
        assert_eq!(port.recv_blocking().unwrap().payload(), b"one");
        assert_eq!(port.recv_blocking().unwrap().payload(), b"two");
    }

    /// A wait nested in an outer one (a task it runs blocks on another
    /// inbox) catches for its own, then the outer catches for its own again.
    #[test]
    fn a_nested_wait_restores_the_outer_catch() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = pair(&dir);
        let (outer, inner) = (b.open_raw_port().unwrap(), b.open_raw_port().unwrap());
        catching(outer.inbox(), |outer_slot| {
            catching(inner.inbox(), |_| assert!(wants(inner.inbox()) && !wants(outer.inbox())));
            assert!(wants(outer.inbox()));
            a.raw_sender(outer.id()).send(b"out", Checkpoint::Immediate).unwrap();
            drain(&b);
            assert!(outer_slot.take().is_some());
        });
        assert!(!wants(outer.inbox()), "the registration outlived its wait");
    }
}
