//! Direct receive: a thread blocked on one queue (a port's inbox, a link
//! end's) drives the team's channels itself while it spins, so the frame
//! it waits for is most often taken by its own drain. That drain hands the
//! message straight to the wait: no queue push and pop, no second lock, no
//! wake-up.
//!
//! The wait registers, in thread-locals, what it waits on (its key) and a
//! slot on its stack ([`catching`]); the code that would queue a message
//! asks [`wants`] and, while its queue is empty, [`put`]s it in the slot
//! instead: queued messages go first, so order is kept. One message is
//! caught per wait; later ones are queued.

use std::any::TypeId;
use std::cell::Cell;
use std::ptr;

/// What a wait can catch for: the queue (or its owner) a message would go to.
pub(crate) trait Catchable: 'static {
    /// What a message caught for it is.
    type Caught;
}

/// Where a wait's caught message goes.
pub(crate) struct Slot<T> {
    /// Whether `message` holds one: the spinning wait looks at this every
    /// turn, which is cheaper than taking a large option out.
    full: Cell<bool>,
    message: Cell<Option<T>>,
}

impl<T> Slot<T> {
    /// The caught message, if one came.
    #[inline]
    pub fn take(&self) -> Option<T> {
        if !self.full.get() {
            return None;
        }
        self.full.set(false);
        self.message.take()
    }
}

/// A wait's registration: its key's address and type, and its slot.
#[derive(Clone, Copy)]
struct Wanted {
    key: *const (),
    kind: TypeId,
    slot: *const (),
}

thread_local! {
    /// What this thread's wait catches for, if it waits and caught nothing yet.
    static WANTED: Cell<Option<Wanted>> = const { Cell::new(None) };
}

/// Whether this thread waits on `key` and has caught nothing yet.
#[inline]
pub(crate) fn wants<K: Catchable>(key: &K) -> bool {
    matches!(WANTED.get(), Some(w) if ptr::eq(w.key, (key as *const K).cast()) && w.kind == TypeId::of::<K>())
}

/// Hands `m`, a message for `key`, to this thread's wait, which [`wants`]
/// it; the catch is over.
pub(crate) fn put<K: Catchable>(key: &K, m: K::Caught) {
    assert!(wants(key), "a message caught with no wait for it");
    let w = WANTED.take().expect("checked by `wants`");
    // SAFETY: `wants(key)` held on this thread, so a `catching::<K>` call
    // on this thread's stack registered `w.slot`, a `Slot<K::Caught>`
    // (the key's type picks the slot's), and has not returned (its guard
    // clears the registration before the slot goes): the pointer is live
    // and of this type. Only this thread reaches it, and only through
    // `Cell`s.
    let slot = unsafe { &*w.slot.cast::<Slot<K::Caught>>() };
    slot.message.set(Some(m));
    slot.full.set(true);
}

/// Runs the wait `f` with this thread catching a message for `key` into
/// the slot `f` is given (which `f` must look at before the queue). A
/// nested wait (a task this wait runs may block on another queue)
/// restores the outer wait's registration when it ends.
pub(crate) fn catching<K: Catchable, R>(key: &K, f: impl FnOnce(&Slot<K::Caught>) -> R) -> R {
    struct Restore(Option<Wanted>);
    impl Drop for Restore {
        fn drop(&mut self) {
            WANTED.set(self.0);
        }
    }
    let slot = Slot { full: Cell::new(false), message: Cell::new(None) };
    let me = Wanted {
        key: (key as *const K).cast(),
        kind: TypeId::of::<K>(),
        slot: (&slot as *const Slot<K::Caught>).cast(),
    };
    let _restore = Restore(WANTED.replace(Some(me)));
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
        catching(&**port.inbox(), |slot| {
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
        catching(&**port.inbox(), |slot| {
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
        catching(&**outer.inbox(), |outer_slot| {
            catching(&**inner.inbox(), |_| assert!(wants(&**inner.inbox()) && !wants(&**outer.inbox())));
            assert!(wants(&**outer.inbox()));
            a.raw_sender(outer.id()).send(b"out", Checkpoint::Immediate).unwrap();
            drain(&b);
            assert!(outer_slot.take().is_some());
        });
        assert!(!wants(&**outer.inbox()), "the registration outlived its wait");
    }
}
