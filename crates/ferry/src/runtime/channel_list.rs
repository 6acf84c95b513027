//! The team's channel list: changed rarely (a peer binds or leaves), read at
//! every idle turn of every thread.
//!
//! A reader keeps a [`Snapshot`] and checks it with one relaxed-cost load of
//! an epoch per turn. Snapshots are also cached per thread between waits, so
//! a blocking receive does not pay for taking a fresh one each time; the
//! cache holds them weakly, so a dropped team's channels (and their shared
//! memory) are not kept alive by threads that once waited on it.

use super::channel::Channel;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

type List = Arc<Vec<Arc<Channel>>>;

pub(crate) struct ChannelList {
    list: Mutex<List>,
    /// Bumped after every change: a snapshot taken at this epoch is current.
    epoch: AtomicU64,
    /// Names this list in threads' caches; never reused within a process.
    serial: u64,
}

/// A thread's view of the list, valid while the epoch has not moved.
pub(crate) struct Snapshot {
    epoch: u64,
    list: List,
}

impl Snapshot {
    /// The list's epoch this snapshot was taken at.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Deref for Snapshot {
    type Target = [Arc<Channel>];
    fn deref(&self) -> &[Arc<Channel>] {
        &self.list
    }
}

/// (list serial, epoch, list) of one list a thread waited on.
type Cached = (u64, u64, Weak<Vec<Arc<Channel>>>);

thread_local! {
    /// The last few lists this thread waited on.
    static CACHED: RefCell<Vec<Cached>> = const { RefCell::new(Vec::new()) };
}

impl ChannelList {
    pub fn new(first: Arc<Channel>) -> ChannelList {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        ChannelList {
            list: Mutex::new(Arc::new(vec![first])),
            epoch: AtomicU64::new(0),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The current list (a clone of the `Arc`).
    fn load(&self) -> List {
        self.list.lock().clone()
    }

    /// Replaces the list with `f(current)`.
    pub fn update(&self, f: impl FnOnce(&[Arc<Channel>]) -> Vec<Arc<Channel>>) {
        let mut list = self.list.lock();
        *list = Arc::new(f(&list));
        // Under the lock, so epochs and lists change in the same order.
        self.epoch.fetch_add(1, Ordering::Release);
    }

    /// Channels in the list.
    pub fn len(&self) -> usize {
        self.list.lock().len()
    }

    /// Empties the list and returns what it held.
    pub fn take(&self) -> List {
        let mut list = self.list.lock();
        let old = std::mem::replace(&mut *list, Arc::new(Vec::new()));
        self.epoch.fetch_add(1, Ordering::Release);
        old
    }

    /// A current snapshot: this thread's cached one if still current.
    pub fn snapshot(&self) -> Snapshot {
        let epoch = self.epoch.load(Ordering::Acquire);
        let cached = CACHED.with(|c| {
            c.borrow().iter().find(|(s, e, _)| *s == self.serial && *e == epoch).and_then(|(_, _, w)| w.upgrade())
        });
        match cached {
            Some(list) => Snapshot { epoch, list },
            None => self.fresh(),
        }
    }

    /// Keeps `snap` current: one load while nothing changed.
    #[inline]
    pub fn refresh(&self, snap: &mut Snapshot) {
        if self.epoch.load(Ordering::Acquire) != snap.epoch {
            *snap = self.fresh();
        }
    }

    fn fresh(&self) -> Snapshot {
        // The epoch is read first: a change after it makes the next check
        // reload, never leaves a stale list looking current.
        let epoch = self.epoch.load(Ordering::Acquire);
        let list = self.load();
        CACHED.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|(s, _, w)| *s != self.serial && w.strong_count() > 0);
            if c.len() == 4 {
                c.remove(0);
            }
            c.push((self.serial, epoch, Arc::downgrade(&list)));
        });
        Snapshot { epoch, list }
    }
}
