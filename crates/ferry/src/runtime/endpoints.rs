//! The team's endpoints: slot numbers and the inbox behind each.

use super::channel::Incoming;
use super::inbox::Inbox;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::{Addr, EndpointId, TeamId, LINK_SLOTS};
use crate::transport::doorbell::Doorbell;
use crate::wire::NackReason;
use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// An endpoint's queue of received messages.
pub(crate) type EndpointInbox = Inbox<Incoming>;

pub(crate) struct Endpoints {
    team: TeamId,
    /// Keyed by slot with a fast hash, not SipHash (a lookup per message):
    /// only this team inserts, and its slots are consecutive, so a peer
    /// naming any slot it likes cannot grow a bucket.
    inboxes: RwLock<FxHashMap<u32, Arc<EndpointInbox>>>,
    next_slot: AtomicU32,
    capacity: usize,
    byte_capacity: usize,
    /// Rung by an inbox that makes room after refusing a message.
    doorbell: Arc<Doorbell>,
}

impl Endpoints {
    pub fn new(team: TeamId, capacity: usize, byte_capacity: usize, doorbell: Arc<Doorbell>) -> Endpoints {
        let inboxes = RwLock::new(FxHashMap::default());
        Endpoints { team, inboxes, next_slot: AtomicU32::new(1), capacity, byte_capacity, doorbell }
    }

    /// A slot no endpoint had before.
    fn reserve(&self) -> Result<EndpointId> {
        // Slots are never reused (an id has no generation of its own: a
        // stale sender would reach the new port), so a team opens at most
        // `LINK_SLOTS - 1` endpoints in its life.
        let exhausted = || Error::LimitReached { limit: crate::Limit::Endpoints, max: u64::from(LINK_SLOTS - 1) };
        let slot = self
            .next_slot
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| (s < LINK_SLOTS).then_some(s + 1))
            .map_err(|_| exhausted())?;
        self.team.endpoint(slot).ok_or_else(exhausted)
    }

    fn open(&self) -> Result<(EndpointId, Arc<EndpointInbox>)> {
        let id = self.reserve()?;
        let slot = id.slot();
        let inbox = Arc::new(Inbox::new(self.capacity, self.byte_capacity, self.doorbell.clone()));
        self.inboxes.write().insert(slot, inbox.clone());
        Ok((id, inbox))
    }

    /// The inbox of a live endpoint of this team.
    /// (A frame's `dst` is an address: the channel it came on was bound to
    /// this incarnation, and the frame was checked to name this team.)
    pub fn get(&self, dst: Addr) -> Option<Arc<EndpointInbox>> {
        self.inboxes.read().get(&dst.slot()).cloned()
    }

    fn remove(&self, id: EndpointId) -> Option<Arc<EndpointInbox>> {
        self.inboxes.write().remove(&id.slot())
    }

    /// Closes every inbox (at shutdown), waking their receivers.
    /// The inboxes with messages queued for a direct taker.
    pub fn queued_for_direct(&self) -> Vec<Arc<EndpointInbox>> {
        self.inboxes.read().values().filter(|i| i.queued_for_direct()).cloned().collect()
    }

    pub fn close_all(&self) {
        let inboxes: Vec<_> = self.inboxes.write().drain().map(|(_, i)| i).collect();
        for i in inboxes {
            i.close();
        }
    }
}

impl TeamInner {
    /// Opens a new endpoint with its inbox.
    pub fn open_endpoint(&self) -> Result<(EndpointId, Arc<EndpointInbox>)> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        self.endpoints.open()
    }

    /// A new endpoint id with no inbox: a primitive's object (a region)
    /// that peers reach by served frames (see `served`).
    pub fn reserve_endpoint(&self) -> Result<EndpointId> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        self.endpoints.reserve()
    }

    /// Closes an endpoint: later messages are refused; queued ones are nacked.
    pub fn close_endpoint(&self, id: EndpointId) {
        if let Some(inbox) = self.endpoints.remove(id) {
            for m in inbox.close() {
                if let Some(ch) = &m.channel {
                    self.nack(ch, &m.header, NackReason::NoSuchEndpoint, b"endpoint closed");
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Slots run out for good (they are never reused): `LimitReached`.
    #[test]
    fn endpoint_slots_are_never_reused() {
        let team = TeamId { node: 0, team: 1, incarnation: 1 };
        let eps = Endpoints::new(team, 8, 1 << 20, Arc::new(Doorbell::create().unwrap()));
        eps.next_slot.store(LINK_SLOTS - 2, Ordering::Relaxed);
        let (a, _) = eps.open().unwrap();
        let (b, _) = eps.open().unwrap();
        assert_eq!((a.slot(), b.slot()), (LINK_SLOTS - 2, LINK_SLOTS - 1));
        for _ in 0..2 {
            let e = eps.open().map(|(id, _)| id).unwrap_err();
            assert!(matches!(e, Error::LimitReached { limit: crate::Limit::Endpoints, .. }), "{e:?}");
        }
    }
}
