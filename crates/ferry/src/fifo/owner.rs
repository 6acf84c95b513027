//! The owner's side: the fifos a team owns, the handler of their frames,
//! and the owner's dequeue, which drains every producer's ring in turn.

use super::ring::{Closed, Consuming, Ring, Shape};
use super::wire::{self, status, Opened};
use super::{check_shape, KINDS, MAX_PRODUCERS};
use crate::error::{Error, Result};
use crate::extend::{FrameHandler, PeerLiveness, PerTeam, ServedFrame};
use crate::id::{EndpointId, TeamId};
use crate::memory::Key;
use crate::sys::shm::Mapping;
use crate::Team;
use parking_lot::Mutex;
use rustix::fd::AsFd;
use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// Bytes of a fifo's control page (the owner's: producers map it read-only).
const CONTROL: usize = 4096;

/// One producer's ring, as the owner keeps it.
pub(super) struct Producer {
    mapping: Mapping,
    pub ring: Ring,
    /// The team that opened it: only its frames push into a served ring.
    team: TeamId,
    /// Pushed by this runtime (the producer is on another machine).
    served: bool,
    /// A served ring's producer state (its pusher is the handler).
    served_tail: Mutex<super::ring::Producing>,
    /// The producer's team's liveness: its channel's (another process or
    /// machine), or the team itself (this process).
    liveness: Liveness,
    /// The producer said it is done (its handle was dropped).
    done: AtomicBool,
}

impl Producer {
    fn gone(&self) -> bool {
        self.done.load(Ordering::Acquire)
            || match &self.liveness {
                Liveness::Channel(l) => l.is_gone(),
                Liveness::Team(t) => t.upgrade().is_none_or(|t| t.is_shut_down()),
            }
    }

    /// The memfd producers map.
    pub fn fd(&self) -> &rustix::fd::OwnedFd {
        self.mapping.fd()
    }

    pub fn mapping_ptr(&self) -> *mut u8 {
        self.mapping.as_ptr()
    }

    pub fn mark_done(&self) {
        self.done.store(true, Ordering::Release);
    }
}

/// How the owner learns that a producer's team is gone.
pub(super) enum Liveness {
    Channel(PeerLiveness),
    Team(std::sync::Weak<crate::runtime::TeamInner>),
}

/// A fifo: what its owner's handle and its handler share.
pub(super) struct Shared {
    pub key: Key,
    pub shape: Shape,
    pub id: EndpointId,
    name: String,
    /// The owner's control page: word 0 says the owner's dequeue is parked
    /// (a producer that sees it wakes it).
    control: Mapping,
    producers: Mutex<Vec<Option<Arc<Producer>>>>,
    /// Bumped when a producer joins: the dequeue then reads the list again.
    generation: AtomicU64,
    waker: Mutex<Option<Waker>>,
    closed: AtomicBool,
}

impl Shared {
    pub fn parked(&self) -> &AtomicU64 {
        // SAFETY: word 0 of the control page, mapped (writable here) while `self` lives.
        unsafe { AtomicU64::from_ptr(self.control.as_ptr().cast()) }
    }

    pub fn control_fd(&self) -> &rustix::fd::OwnedFd {
        self.control.fd()
    }

    /// Wakes the owner's parked dequeue.
    pub fn wake(&self) {
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }

    /// A new producer's ring (`served`: pushed by this runtime for a
    /// producer on another machine).
    pub fn add_producer(&self, team: TeamId, served: bool, liveness: Liveness) -> Result<(u32, Arc<Producer>)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::NoSuchEndpoint(self.id));
        }
        let mut producers = self.producers.lock();
        if producers.iter().flatten().count() >= MAX_PRODUCERS {
            return Err(Error::LimitReached { limit: crate::Limit::FifoProducers, max: MAX_PRODUCERS as u64 });
        }
        let mapping = Mapping::create(&format!("ferry-fifo:{}", self.name), self.shape.bytes())?;
        // SAFETY: the mapping is `shape.bytes()` bytes, page-aligned, and lives in the `Producer` with the ring.
        let ring = unsafe { Ring::new(mapping.as_ptr(), self.shape) };
        let p = Arc::new(Producer {
            mapping,
            ring,
            team,
            served,
            served_tail: Mutex::default(),
            liveness,
            done: AtomicBool::new(false),
        });
        let index = match producers.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                producers.push(None);
                producers.len() - 1
            }
        };
        producers[index] = Some(p.clone());
        self.generation.fetch_add(1, Ordering::Release);
        Ok((index as u32, p))
    }

    fn producer(&self, ring: u32) -> Option<Arc<Producer>> {
        self.producers.lock().get(ring as usize).cloned().flatten()
    }
}

/// A team's fifos: their state, and the handler of their frames.
pub(super) struct Fifos {
    table: Mutex<HashMap<u32, Arc<Shared>>>,
}

/// Every team of this process that owns fifos: a producer in the owner's
/// process pushes into its ring directly.
static TEAMS: PerTeam<Fifos> = PerTeam::new(KINDS);

impl Fifos {
    fn of(team: &Team) -> Result<Arc<Fifos>> {
        TEAMS.of(team, |_| Fifos { table: Mutex::default() })
    }

    /// The fifo `fifo` of a team of this process, if `key` is its key; else
    /// why not (a status).
    pub fn in_this_process(fifo: EndpointId, key: &Key) -> Option<std::result::Result<Arc<Shared>, u8>> {
        let fifos = TEAMS.find(fifo.team_id())?;
        Some(fifos.find(fifo.slot(), &key.to_bytes()))
    }

    fn find(&self, slot: u32, key: &[u8]) -> std::result::Result<Arc<Shared>, u8> {
        match self.table.lock().get(&slot) {
            None => Err(status::NO_FIFO),
            Some(f) if !f.key.matches(key) => Err(status::DENIED),
            Some(f) => Ok(f.clone()),
        }
    }
}

impl FrameHandler for Fifos {
    fn serve(&self, frame: ServedFrame<'_>) {
        let slot = frame.slot();
        match frame.kind() {
            wire::OPEN => {
                let opened = frame.with_payload(|key| self.find(slot, key)).and_then(|fifo| {
                    let asked = frame.asks_for_descriptors();
                    // Its channel's liveness: its ring goes (once drained) when the producer's team does.
                    match fifo.add_producer(frame.from().team_id(), !asked, Liveness::Channel(frame.peer_liveness())) {
                        Ok((ring, p)) => Ok((fifo, ring, p)),
                        Err(Error::LimitReached { .. }) => Err(status::TOO_MANY_PRODUCERS),
                        Err(_) => Err(status::NO_FIFO),
                    }
                });
                let (fifo, ring, p) = match opened {
                    Ok(o) => o,
                    Err(why) => {
                        let _ = frame.reply(&[why]);
                        return;
                    }
                };
                let shape = fifo.shape;
                let answer =
                    Opened { ring, capacity: shape.capacity, element_size: shape.element_size as u64 }.encode();
                let sent = match p.served {
                    true => frame.reply(&answer),
                    false => frame.reply_with_descriptors(&answer, &[p.fd().as_fd(), fifo.control_fd().as_fd()]),
                };
                if let Err(e) = sent {
                    tracing::debug!(error = %e, "a fifo's producer ring could not be handed over");
                    p.mark_done();
                }
            }
            // One way: the producer keeps within its credit. One that does
            // not (or pushes to a ring closed meanwhile) loses its own
            // element; its next CREDIT says why.
            wire::ENQUEUE => {
                let from = frame.from().team_id();
                let pushed = frame.with_payload(|payload| {
                    let (key, ring, element) = wire::parse_enqueue(payload)?;
                    Some(self.served_push(slot, key, ring, element, from))
                });
                if pushed != Some(status::OK) {
                    tracing::debug!(status = ?pushed, "a fifo's enqueue from another machine was not taken");
                }
            }
            wire::CREDIT => {
                let from = frame.from().team_id();
                let answer = frame.with_payload(|payload| {
                    let (key, ring, _) = wire::parse_enqueue(payload)?;
                    Some(self.served_credit(slot, key, ring, from))
                });
                match answer {
                    Some(Ok(free)) => drop(frame.reply(&wire::credit(free))),
                    Some(Err(why)) => drop(frame.reply(&[why])),
                    None => frame.refuse("a fifo's credit request of no known form"),
                }
            }
            wire::WAKE => {
                if let Some(f) = self.table.lock().get(&slot) {
                    f.wake();
                }
            }
            wire::DONE => {
                let from = frame.from().team_id();
                frame.with_payload(|payload| {
                    let Some((key, ring, _)) = wire::parse_enqueue(payload) else { return };
                    let Ok(fifo) = self.find(slot, key) else { return };
                    if let Some(p) = fifo.producer(ring).filter(|p| p.team == from) {
                        p.mark_done();
                        fifo.wake();
                    }
                });
            }
            _ => frame.refuse("a fifo request this team does not serve"),
        }
    }
}

impl Fifos {
    /// The free slots of a producer's ring (on another machine): its credit.
    fn served_credit(&self, slot: u32, key: &[u8], ring: u32, from: TeamId) -> std::result::Result<u64, u8> {
        let fifo = self.find(slot, key)?;
        let p = fifo.producer(ring).filter(|p| p.served && p.team == from).ok_or(status::NO_FIFO)?;
        match p.ring.closed() {
            Some(_) => Err(status::CLOSED),
            None => Ok(p.ring.free(&p.served_tail.lock())),
        }
    }

    /// Pushes a producer's element (from another machine) into its ring: a status.
    fn served_push(&self, slot: u32, key: &[u8], ring: u32, element: &[u8], from: TeamId) -> u8 {
        let fifo = match self.find(slot, key) {
            Ok(f) => f,
            Err(why) => return why,
        };
        let Some(p) = fifo.producer(ring).filter(|p| p.served && p.team == from) else { return status::NO_FIFO };
        if element.len() > fifo.shape.element_size {
            return status::TOO_LARGE;
        }
        if p.ring.closed().is_some() {
            return status::CLOSED;
        }
        if !p.ring.push(&mut p.served_tail.lock(), element) {
            return status::FULL;
        }
        if fifo.parked().load(Ordering::SeqCst) != 0 {
            fifo.wake();
        }
        status::OK
    }
}

/// A fifo this team owns (see [`crate::fifo`]): producers enqueue, the
/// owner dequeues. Dropping it closes it: its name is unbound, and every
/// producer's next enqueue fails `Closed`.
pub struct Fifo {
    team: Team,
    shared: Arc<Shared>,
    fifos: Arc<Fifos>,
    /// The producers' rings as last read, with the owner's state of each.
    rings: Vec<(Arc<Producer>, Consuming)>,
    generation: u64,
    /// Where the next dequeue starts (producers are drained in turn).
    next: usize,
}

impl Team {
    /// Creates a fifo of `capacity` elements of at most `element_size`
    /// bytes (per producer) under `name`, with a random key.
    pub fn fifo(&self, name: &str, capacity: u64, element_size: usize) -> Result<Fifo> {
        self.fifo_with_key(name, capacity, element_size, Key::random())
    }

    /// [`Team::fifo`] with the key `key`.
    pub fn fifo_with_key(&self, name: &str, capacity: u64, element_size: usize, key: Key) -> Result<Fifo> {
        let shape = check_shape(capacity, element_size as u64)?;
        let fifos = Fifos::of(self)?;
        let id = self.reserve_endpoint()?;
        self.bind_name(name, id)?;
        let control = match Mapping::create_published(&format!("ferry-fifo-control:{name}"), CONTROL) {
            Ok(c) => c,
            Err(e) => {
                self.unbind_name(name);
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            key,
            shape,
            id,
            name: name.to_string(),
            control,
            producers: Mutex::default(),
            generation: AtomicU64::new(0),
            waker: Mutex::default(),
            closed: AtomicBool::new(false),
        });
        fifos.table.lock().insert(id.slot(), shared.clone());
        Ok(Fifo { team: self.clone(), shared, fifos, rings: Vec::new(), generation: u64::MAX, next: 0 })
    }
}

impl Fifo {
    /// Its key: what a producer opens it with.
    pub fn key(&self) -> Key {
        self.shared.key
    }

    /// Its endpoint id.
    pub fn id(&self) -> EndpointId {
        self.shared.id
    }

    /// Producers with a ring now (those gone are counted until their
    /// rings are drained).
    pub fn producers(&mut self) -> usize {
        self.refresh();
        self.rings.len()
    }

    /// Reads the producers' list again if one joined.
    fn refresh(&mut self) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation == self.generation {
            return;
        }
        let producers = self.shared.producers.lock();
        let mut known: HashMap<*const Producer, Consuming> =
            self.rings.drain(..).map(|(p, at)| (Arc::as_ptr(&p), at)).collect();
        self.rings = producers
            .iter()
            .flatten()
            .map(|p| (p.clone(), known.remove(&Arc::as_ptr(p)).unwrap_or_default()))
            .collect();
        self.generation = generation;
    }

    /// The next element, if any producer has one (producers in turn, each
    /// in its order): plain memory operations, no system call.
    pub fn try_dequeue(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.try_dequeue_into(&mut out).then_some(out)
    }

    /// [`Fifo::try_dequeue`] into `out` (replaced): whether there was one.
    pub fn try_dequeue_into(&mut self, out: &mut Vec<u8>) -> bool {
        self.refresh();
        let n = self.rings.len();
        let mut i = 0;
        while i < n.min(self.rings.len()) {
            let at = (self.next + i) % self.rings.len();
            let (p, head) = &mut self.rings[at];
            match p.ring.pop(head, out) {
                Ok(true) => {
                    self.next = at + 1;
                    return true;
                }
                Ok(false) if drained(p, head) => self.drop_ring(at),
                Ok(false) => i += 1,
                Err(corrupt) => {
                    tracing::warn!(fifo = %self.shared.id, why = corrupt.0, "a producer's ring is corrupt: closed");
                    p.ring.close(Closed::Corrupt);
                    self.drop_ring(at);
                }
            }
        }
        false
    }

    /// Forgets a drained ring whose producer is gone (or corrupt): its memory goes.
    fn drop_ring(&mut self, at: usize) {
        let (p, _) = self.rings.remove(at);
        let mut producers = self.shared.producers.lock();
        if let Some(slot) = producers.iter_mut().find(|s| s.as_ref().is_some_and(|q| Arc::ptr_eq(q, &p))) {
            *slot = None;
        }
    }

    /// Whether any ring holds an element (or a producer joined).
    fn any_ready(&self) -> bool {
        self.shared.generation.load(Ordering::Acquire) != self.generation
            || self.rings.iter().any(|(p, at)| !p.ring.is_empty(at) || p.gone())
    }

    /// The next element, waiting for one: spins a little (the team's
    /// `spin`), then parks until a producer wakes it (a producer rings only
    /// while the owner is parked). Drives the team meanwhile.
    pub fn dequeue_blocking(&mut self) -> Result<Vec<u8>> {
        self.dequeue_until(None)
    }

    /// [`Fifo::dequeue_blocking`], at most `limit`: else `DeadlineExceeded`.
    pub fn dequeue_timeout(&mut self, limit: Duration) -> Result<Vec<u8>> {
        self.dequeue_until(crate::runtime::deadline_after(limit))
    }

    fn dequeue_until(&mut self, until: Option<Instant>) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let spin_until = Instant::now() + self.team.config().spin;
        let mut turns = 0u32;
        loop {
            if self.try_dequeue_into(&mut out) {
                return Ok(out);
            }
            turns += 1;
            if !turns.is_multiple_of(64) || Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            if until.is_some_and(|at| Instant::now() >= at) {
                return Err(Error::DeadlineExceeded);
            }
            let team = self.team.clone();
            team.block_on(self.parked(until))?;
        }
    }

    /// The next element; the future waits for one (parked: a producer's
    /// push wakes it).
    pub async fn dequeue(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            if self.try_dequeue_into(&mut out) {
                return Ok(out);
            }
            self.parked(None).await?;
        }
    }

    /// Parks until a producer may have pushed (or `until`, or the team's
    /// park timeout: a wake lost to a full channel is found then).
    async fn parked(&mut self, until: Option<Instant>) -> Result<()> {
        let limit = self.team.config().park_timeout;
        let at = until.map_or(Instant::now() + limit, |u| u.min(Instant::now() + limit));
        let mut timeout = std::pin::pin!(self.team.sleep(at.saturating_duration_since(Instant::now())));
        let shared = self.shared.clone();
        let result = poll_fn(|cx| {
            *shared.waker.lock() = Some(cx.waker().clone());
            shared.parked().store(1, Ordering::SeqCst);
            // The flag, then the look at the rings (a producer: its push,
            // then the look at the flag): one of the two sees the other.
            std::sync::atomic::fence(Ordering::SeqCst);
            // Pushed before the flag was seen: not woken, so look again.
            if self.any_ready() {
                return Poll::Ready(Ok(()));
            }
            if self.team.inner.is_shut_down() {
                return Poll::Ready(Err(Error::Shutdown));
            }
            std::future::Future::poll(timeout.as_mut(), cx).map(Ok)
        })
        .await;
        shared.parked().store(0, Ordering::Relaxed);
        result
    }
}

/// Whether a ring a look just found empty is done with: its producer is
/// gone, and the ring is still empty after that was seen. In the other
/// order, a producer that pushed its last elements and went between the
/// look and the check would lose them (the ring dropped with them in it:
/// the many-producer fifo test's rare stall, one run in ~15).
fn drained(p: &Producer, at: &Consuming) -> bool {
    p.gone() && p.ring.is_empty(at)
}

impl Drop for Fifo {
    fn drop(&mut self) {
        self.team.unbind_name(&self.shared.name);
        self.shared.closed.store(true, Ordering::Release);
        self.fifos.table.lock().remove(&self.shared.id.slot());
        for p in self.shared.producers.lock().drain(..).flatten() {
            p.ring.close(Closed::Dropped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The look finds the ring empty; then its producer pushes its last
    /// element and goes: the ring is not drained, the element comes out.
    #[test]
    fn a_ring_is_drained_only_if_empty_once_its_producer_is_seen_gone() {
        let dir = tempfile::tempdir().unwrap();
        let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let producer = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let mut fifo = owner.fifo("drained", 4, 8).unwrap();
        let mut f = producer.open_fifo_at(fifo.id(), fifo.key()).unwrap();
        assert_eq!(fifo.try_dequeue(), None);
        let (p, at) = &mut fifo.rings[0];
        assert_eq!(p.ring.pop(at, &mut Vec::new()), Ok(false));
        f.enqueue(b"last").unwrap();
        producer.shutdown();
        assert!(p.gone());
        assert!(!drained(p, at), "a ring holding an element drained");
        assert_eq!(fifo.try_dequeue().as_deref(), Some(&b"last"[..]));
        assert_eq!(fifo.try_dequeue(), None);
        assert_eq!(fifo.producers(), 0, "the drained ring of a gone producer is kept");
    }
}
