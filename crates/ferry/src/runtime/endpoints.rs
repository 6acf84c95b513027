//! The team's endpoints: slot numbers and the inbox behind each.

use super::channel::Incoming;
use super::inbox::Inbox;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::{Addr, EndpointId, TeamId};
use crate::transport::doorbell::Doorbell;
use crate::wire::NackReason;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// An endpoint's queue of received messages.
pub(crate) type EndpointInbox = Inbox<Incoming>;

pub(crate) struct Endpoints {
    team: TeamId,
    inboxes: RwLock<HashMap<u32, Arc<EndpointInbox>>>,
    next_slot: AtomicU32,
    capacity: usize,
    byte_capacity: usize,
    /// Rung by an inbox that makes room after refusing a message.
    doorbell: Arc<Doorbell>,
}

impl Endpoints {
    pub fn new(team: TeamId, capacity: usize, byte_capacity: usize, doorbell: Arc<Doorbell>) -> Endpoints {
        let inboxes = RwLock::new(HashMap::new());
        Endpoints { team, inboxes, next_slot: AtomicU32::new(1), capacity, byte_capacity, doorbell }
    }

    fn open(&self) -> Result<(EndpointId, Arc<EndpointInbox>)> {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let id = self.team.endpoint(slot).ok_or(Error::Refused("endpoint slots exhausted".into()))?;
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

    /// Closes an endpoint: later messages are refused; queued ones are nacked.
    pub fn close_endpoint(&self, id: EndpointId) {
        if let Some(inbox) = self.endpoints.remove(id) {
            for m in inbox.close() {
                if let Some(ch) = &m.channel {
                    self.nack(ch, &m.header, NackReason::NoSuchEndpoint, "endpoint closed");
                }
            }
        }
    }
}
