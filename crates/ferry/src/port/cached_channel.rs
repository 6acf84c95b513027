//! A sender's cached channel to its destination's team: what a send uses
//! with one atomic load (and the `Weak` upgrade), instead of looking the
//! route up in the team's peers map.
//!
//! When the cached channel dies (a link cut, a peer that broke the
//! protocol) and the team binds a new one, the new one is cached in its
//! place, so sends are back on the fast path. A send may still be upgrading
//! the channel it loaded as another replaces it, so a replaced entry is not
//! released before the cache: it keeps at most [`MAX_CACHED`] channels
//! (weakly: the allocation, not the channel's memory, rings or socket,
//! which go when the team drops the channel). Past that, sends look the
//! route up every time (counted: `Team::route_lookups`).
//!
//! Before a channel is cached, sends that did not wait for a bind wait in
//! it (`send_when_bound`, `RawSender::post`); the cache keeps that bind
//! (`joined`) so that the sender's next sends go where those went — into
//! the same bind, then onto its channel — and not onto a channel the peer
//! bound to us meanwhile, which they would overtake.

use crate::runtime::channel::Channel;
use crate::runtime::{Binding, Route};
use parking_lot::Mutex;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Weak};

/// Most channels one sender (with its clones) caches in its life: a peer
/// reconnected to this often stays on the slow path.
pub(crate) const MAX_CACHED: usize = 64;

pub(crate) struct CachedChannel {
    /// The newest entry of `held` (`Weak::as_ptr`), or null: what sends read.
    current: AtomicPtr<Channel>,
    /// Every channel cached so far, oldest first. Never shrinks while the
    /// cache lives: a send may be upgrading any of them.
    held: Mutex<Vec<Weak<Channel>>>,
    /// The bind this sender's sends joined, until a channel is cached.
    joined: Mutex<Option<Arc<Binding>>>,
}

impl CachedChannel {
    pub fn new() -> CachedChannel {
        CachedChannel {
            current: AtomicPtr::new(std::ptr::null_mut()),
            held: Mutex::new(Vec::new()),
            joined: Mutex::new(None),
        }
    }

    /// The cached channel, while it lives and its peer is not gone.
    #[inline]
    pub fn get(&self) -> Option<Arc<Channel>> {
        let p = self.current.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` is `Weak::as_ptr` of a `Weak` in `held`, which is kept
        // until the cache drops, so the allocation (and the weak reference
        // `from_raw` stands for) outlives this borrow. `ManuallyDrop`: the
        // reference is `held`'s, not ours to release.
        let weak = ManuallyDrop::new(unsafe { Weak::from_raw(p) });
        weak.upgrade().filter(|c| !c.is_gone())
    }

    /// Caches `ch`, the current channel to the destination's team, unless
    /// it is cached already or the cache is full.
    pub fn set(&self, ch: &Arc<Channel>) {
        *self.joined.lock() = None;
        let mut held = self.held.lock();
        if held.last().is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(ch))) || held.len() >= MAX_CACHED {
            return;
        }
        let weak = Arc::downgrade(ch);
        self.current.store(weak.as_ptr().cast_mut(), Ordering::Release);
        held.push(weak);
    }

    /// Remembers the bind a send with no channel cached joined.
    pub fn join(&self, bind: &Arc<Binding>) {
        *self.joined.lock() = Some(bind.clone());
    }

    /// Where the bind this sender's sends joined goes: into it while it
    /// binds, onto its channel once bound; `None` if there is none (or it failed).
    pub fn joined_route(&self) -> Option<Route> {
        let bind = self.joined.lock().clone()?;
        match bind.outcome() {
            None => Some(Route::Binding(bind)),
            Some(Ok(ch)) => Some(Route::Ready(ch)),
            Some(Err(_)) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::Checkpoint;
    use crate::Team;
    use std::time::Duration;

    /// Defect 8 of issue 15: the cache was a `OnceLock`, so once its
    /// channel died every send of the sender looked its route up in the
    /// peers map for good. After a reconnect the new channel is cached:
    /// one look-up for the first send, none for the next hundred.
    #[test]
    fn a_sender_caches_the_channel_bound_after_its_channel_died() {
        let dir = tempfile::tempdir().unwrap();
        let a = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let b = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let port = b.open_raw_port().unwrap();
        let to = a.raw_sender(port.id());
        let send = |n: usize| {
            for _ in 0..n {
                to.send(b"x", Checkpoint::OnReceipt).unwrap();
                port.recv_timeout(Duration::from_secs(5)).unwrap();
            }
        };
        send(100);
        assert_eq!(a.route_lookups(), 1, "the first send looks the route up, the others take the cache");
        // The channel dies (as when a link is cut, or the peer broke the protocol).
        let ch = a.inner.channels.snapshot().iter().find(|c| c.peer == b.id()).unwrap().clone();
        ch.close();
        drop(ch);
        send(1);
        assert_eq!(a.route_lookups(), 2, "the first send after the channel died binds a new one");
        send(100);
        assert_eq!(a.route_lookups(), 2, "sends after the reconnect took the slow path");
    }
}
