//! The producer's side: opening a fifo, and enqueueing — into its own ring
//! (one machine), or through its owner's runtime (across machines).

use super::check_shape;
use super::owner::{Fifos, Liveness, Producer, Shared};
use super::ring::{Closed, Producing, Ring};
use super::wire::{self, parse_opened, refusal};
use crate::error::{Error, Result};
use crate::extend::PeerLiveness;
use crate::id::EndpointId;
use crate::memory::Key;
use crate::port::RawSender;
use crate::sys::shm::Mapping;
use crate::wire::Checkpoint;
use crate::Team;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long opening a fifo (and a served enqueue) waits for the owner.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A producer of a fifo (see [`crate::fifo`]): its elements reach the
/// owner in the order it enqueues them. One ring, one writer: enqueueing
/// takes `&mut self` (threads that produce at once open a producer each).
pub struct FifoRef {
    id: EndpointId,
    element_size: usize,
    place: Place,
    /// Tells the owner this producer is done (another process or machine).
    done: Option<(RawSender, Vec<u8>)>,
}

enum Place {
    /// Its ring is mapped here: an enqueue is a copy and a store.
    Mapped {
        ring: Arc<MappedRing>,
        /// This producer's state of its ring.
        at: Producing,
        wake: Wake,
    },
    /// On another machine: an enqueue is a served frame, one way, within
    /// the credit the owner last gave (its ring's free slots).
    Served { sender: RawSender, credit_sender: RawSender, key: Key, ring: u32, capacity: u64, credit: u64 },
}

/// A ring and what keeps it mapped.
struct MappedRing {
    ring: Ring,
    /// The owner's control page (word 0: the owner is parked).
    parked: *const AtomicU64,
    _memory: Memory,
}

// SAFETY: `parked` points into `_memory`'s control page, mapped while this lives; read atomically only.
unsafe impl Send for MappedRing {}
unsafe impl Sync for MappedRing {}

enum Memory {
    /// The owner is in this process: its own ring and fifo.
    Shared(Arc<Producer>, Arc<Shared>),
    /// Mapped from the memfds the owner handed over (the ring, the control
    /// page): kept, not read, so that the ring and `parked` stay mapped.
    Mapped(#[allow(dead_code)] Mapping, #[allow(dead_code)] Mapping),
}

/// How a producer wakes its parked owner.
enum Wake {
    Local(Arc<Shared>),
    Remote { sender: RawSender, owner: PeerLiveness },
}

impl Team {
    /// Opens the fifo named `name` with `key`, as a producer.
    pub fn open_fifo(&self, name: &str, key: Key) -> Result<FifoRef> {
        let id = self.lookup(name)?;
        self.open_fifo_at(id, key)
    }

    /// [`Team::open_fifo`], as a future: the opening (a round trip to the
    /// owner, which hands the ring over) runs on a blocking thread of the
    /// team, never on the task's.
    pub async fn open_fifo_async(&self, name: &str, key: Key) -> Result<FifoRef> {
        let (team, name) = (self.clone(), name.to_string());
        self.spawn_blocking(move || team.open_fifo(&name, key)).await?
    }

    /// Opens the fifo `fifo` with `key`, as a producer: `AccessDenied` if
    /// the key is not its key, `NoSuchEndpoint` if there is no such fifo,
    /// `LimitReached` past [`MAX_PRODUCERS`](super::MAX_PRODUCERS).
    pub fn open_fifo_at(&self, fifo: EndpointId, key: Key) -> Result<FifoRef> {
        let on_this_machine = fifo.node() == self.id().node;
        if let Some(found) = Fifos::in_this_process(fifo, &key).filter(|_| on_this_machine) {
            let shared = found.map_err(|s| refusal(s, fifo).expect("a refusal"))?;
            let (_, p) = shared.add_producer(self.id(), false, Liveness::Team(Arc::downgrade(&self.inner)))?;
            let shape = shared.shape;
            // SAFETY: the ring's mapping lives in `p`, held by `_memory`.
            let ring = unsafe { Ring::new(p.mapping_ptr(), shape) };
            let parked: *const AtomicU64 = shared.parked();
            let ring = MappedRing { ring, parked, _memory: Memory::Shared(p, shared.clone()) };
            let place = Place::Mapped { ring: Arc::new(ring), at: Producing::default(), wake: Wake::Local(shared) };
            return Ok(FifoRef { id: fifo, element_size: shape.element_size, place, done: None });
        }
        let opening = self.open_at_owner(fifo, wire::OPEN, &key.to_bytes(), TIMEOUT)?;
        let opened = parse_opened(&opening.answer, fifo)?;
        let shape = check_shape(opened.capacity, opened.element_size)?;
        let done = Some((self.frame_sender(fifo, wire::DONE)?, wire::enqueue(&key.to_bytes(), opened.ring, &[])));
        if !on_this_machine {
            let place = Place::Served {
                sender: self.frame_sender(fifo, wire::ENQUEUE)?,
                credit_sender: self.frame_sender(fifo, wire::CREDIT)?.with_timeout(TIMEOUT),
                key,
                ring: opened.ring,
                capacity: shape.capacity,
                credit: shape.capacity,
            };
            return Ok(FifoRef { id: fifo, element_size: shape.element_size, place, done });
        }
        let bad = || Error::Protocol {
            peer: fifo.team_id(),
            violation: crate::Violation::BadRegionAnswer("a fifo's opening without its two memfds".into()),
        };
        let [ring_fd, control_fd]: [_; 2] = opening.descriptors.try_into().map_err(|_| bad())?;
        let mapping = Mapping::open(ring_fd, shape.bytes())?;
        let control = Mapping::open_read_only(control_fd, 4096)?;
        // SAFETY: the ring's mapping is `shape.bytes()` bytes, page-aligned, held by `_memory`.
        let ring = unsafe { Ring::new(mapping.as_ptr(), shape) };
        let parked = control.as_ptr().cast::<AtomicU64>().cast_const();
        let owner = opening.owner.ok_or_else(bad)?;
        let wake = Wake::Remote { sender: self.frame_sender(fifo, wire::WAKE)?, owner };
        let ring = MappedRing { ring, parked, _memory: Memory::Mapped(mapping, control) };
        let place = Place::Mapped { ring: Arc::new(ring), at: Producing::default(), wake };
        Ok(FifoRef { id: fifo, element_size: shape.element_size, place, done })
    }
}

impl FifoRef {
    /// The fifo's id.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Bytes of one element at most.
    pub fn element_size(&self) -> usize {
        self.element_size
    }

    /// Enqueues `element` (at most `element_size` bytes) now, or fails
    /// `WouldBlock` if this producer's ring is full: never a drop. On one
    /// machine a copy into the ring and a store (a system call only if the
    /// owner is parked); across machines a round trip to the owner's runtime.
    pub fn enqueue(&mut self, element: &[u8]) -> Result<()> {
        if element.len() > self.element_size {
            return Err(Error::TooLarge { len: element.len(), max: self.element_size });
        }
        match &mut self.place {
            Place::Mapped { ring, at, wake } => {
                if let Wake::Remote { owner, .. } = wake {
                    owner.check()?;
                }
                if let Some(why) = ring.ring.closed() {
                    return Err(closed(self.id, why));
                }
                if !ring.ring.push(at, element) {
                    return Err(Error::WouldBlock { to: self.id });
                }
                // The push (a full barrier), then the look at the owner's
                // flag; the owner sets its flag, then looks at the rings:
                // one of the two sees the other.
                // SAFETY: `parked` is word 0 of the control page, mapped while `ring` lives.
                if unsafe { &*ring.parked }.load(Ordering::SeqCst) != 0 {
                    match wake {
                        Wake::Local(shared) => shared.wake(),
                        // Full channel: the owner has frames to read, and looks at its rings after.
                        Wake::Remote { sender, .. } => drop(sender.send(&[], Checkpoint::Immediate)),
                    }
                }
                Ok(())
            }
            Place::Served { sender, credit_sender, key, ring, capacity, credit } => {
                if *credit == 0 {
                    // Asked after every element sent: the answer counts them all.
                    let payload = wire::enqueue(&key.to_bytes(), *ring, &[]);
                    let answer = credit_sender.call(&payload).map_err(Error::gone_if_missing)?;
                    *credit = wire::parse_credit(&answer, *capacity, self.id)?;
                    if *credit == 0 {
                        return Err(Error::WouldBlock { to: self.id });
                    }
                }
                let frame = wire::enqueue(&key.to_bytes(), *ring, element);
                sender.send(&frame, Checkpoint::Immediate).map_err(Error::gone_if_missing)?;
                *credit -= 1;
                Ok(())
            }
        }
    }

    /// Enqueues `element`, waiting at most `limit` for room (polling the
    /// ring with a growing pause): else `DeadlineExceeded`.
    pub fn enqueue_timeout(&mut self, element: &[u8], limit: Duration) -> Result<()> {
        let until = Instant::now() + limit;
        let mut pause = Duration::from_micros(1);
        loop {
            match self.enqueue(element) {
                Err(Error::WouldBlock { .. }) if Instant::now() < until => {
                    std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
                Err(Error::WouldBlock { .. }) => return Err(Error::DeadlineExceeded),
                other => return other,
            }
        }
    }

    /// Enqueues `element`; the future waits for room (the team's timer,
    /// a growing pause) as long as it is polled.
    pub async fn enqueue_async(&mut self, team: &Team, element: &[u8]) -> Result<()> {
        let mut pause = Duration::from_micros(10);
        loop {
            match self.enqueue(element) {
                Err(Error::WouldBlock { .. }) => {
                    team.sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }
}

/// The error a ring's `closed` word says.
fn closed(fifo: EndpointId, why: u64) -> Error {
    match why {
        w if w == Closed::Dropped as u64 => Error::NoSuchEndpoint(fifo),
        _ => Error::Closed { endpoint: fifo, why: "the fifo's owner found this producer's ring corrupt" },
    }
}

impl Drop for FifoRef {
    /// The owner drops the ring once it has drained it (else when this
    /// team's channel goes, if this message finds no room).
    fn drop(&mut self) {
        if let Some((sender, payload)) = &self.done {
            let _ = sender.send(payload, Checkpoint::Immediate);
        }
        if let Place::Mapped { ring, .. } = &self.place {
            if let Memory::Shared(p, shared) = &ring._memory {
                p.mark_done();
                shared.wake();
            }
        }
    }
}

impl FifoRef {
    /// Writes `tail` over this producer's ring's tail, as a buggy or
    /// hostile producer might (tests: the owner must find it out). `false`
    /// if the ring is not mapped here.
    #[cfg(any(test, feature = "testing"))]
    pub fn scribble_tail(&self, tail: u64) -> bool {
        match &self.place {
            Place::Mapped { ring, .. } => {
                ring.ring.scribble_tail(tail);
                true
            }
            Place::Served { .. } => false,
        }
    }
}
