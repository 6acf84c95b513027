//! A channel's outbox: async sends that found the channel full (or were
//! made while it was being bound), in order, each holding its message until
//! there is room. So an async send never waits on its caller's thread.
//!
//! The rule that keeps one sender's messages in order: while the outbox
//! holds anything, every new send on the channel goes behind it (an async
//! one queues; a blocking one sends the queue first, then its own; an
//! `Immediate` one fails with `WouldBlock` unless the queue empties first).
//!
//! Who sends what waits, as soon as there may be room (room the peer made
//! wakes this team through `want_space`; see `Transport::wants_space`):
//! the progress loop, after draining the channel; a blocking send on the
//! channel; and each waiting future when polled. Any of them sends in
//! order, so a future that is not polled holds nothing up — except a large
//! message not yet staged out of band at the head: copying it is left to
//! the sends themselves (its future, a later future, a blocking send),
//! never to the progress loop, which wakes the waiting futures instead.
//!
//! Answers wait here too: the replies of an RPC server, which never waits
//! for room (see `TeamInner::reply`). No future waits on one, so the
//! progress loop stages their large payloads itself, and none is ever
//! refused for lack of room; how many wait on a channel is counted, and at
//! a bound the team takes no more calls from that peer (`answers_wait`).

use super::channel::Channel;
use super::payload::Payload;
use super::team::TeamInner;
use crate::error::Error;
use crate::transport::{SendError, Staged};
use crate::wire::{Checkpoint, Header};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

/// One send waiting for room (or for its channel's bind).
pub(crate) struct Queued {
    pub header: Header,
    /// Payload bytes when queued (what an answer counts against its bound).
    len: usize,
    /// Its call (see `CallSlab`; 0: nobody waits), ended with the answer,
    /// as for any send; or here, by whoever fails it (or, for an
    /// `Immediate` send, writes it).
    pub call: u64,
    /// Waits for room as long as its channel lives (an answer, or a frame
    /// `RawSender::post` queued), rather than fail as an `Immediate` send does.
    never_refused: bool,
    slot: Mutex<Slot>,
}

struct Slot {
    load: Load,
    /// The waiting future's waker (from its last poll): woken when a large
    /// payload at the head of the outbox waits to be staged.
    waker: Option<Waker>,
}

pub(crate) enum Load {
    /// The payload, not in the channel yet (a large one not staged yet).
    Bytes(Vec<u8>),
    /// Being staged by some thread, which sends it (or puts it back) next.
    Staging,
    /// Staged out of band: only its frame waits (it is not copied again).
    Staged(Option<Staged>),
    /// Sent, failed, or withdrawn by its future: dropped from the queue by the next pass.
    Gone,
}

impl Queued {
    pub fn new(header: Header, call: u64, load: Load) -> Arc<Queued> {
        Queued::made(header, call, load, false)
    }

    /// An answer, or a posted frame, waiting for room: it waits as long as
    /// its channel lives (nobody waits on it).
    pub fn never_refused(header: Header, load: Load) -> Arc<Queued> {
        Queued::made(header, 0, load, true)
    }

    fn made(header: Header, call: u64, load: Load, never_refused: bool) -> Arc<Queued> {
        let len = match &load {
            Load::Bytes(b) => b.len(),
            _ => 0,
        };
        Arc::new(Queued { header, len, call, never_refused, slot: Mutex::new(Slot { load, waker: None }) })
    }

    /// A reply (no future waits on it), not a message of ours.
    pub fn is_answer(&self) -> bool {
        !self.header.kind.is_request()
    }

    /// An answer or a posted frame: nobody waits on it (its loss is told
    /// another way).
    pub fn is_unwatched(&self) -> bool {
        self.never_refused
    }

    /// A message that never waits for room: fails with `WouldBlock` if there is none.
    fn is_immediate(&self) -> bool {
        !self.never_refused && self.header.kind.is_request() && self.header.checkpoint() == Checkpoint::Immediate
    }

    /// Whether it still waits to be sent.
    pub fn is_waiting(&self) -> bool {
        !matches!(self.slot.lock().load, Load::Gone)
    }

    /// Registers the waker of the future waiting on it (one per send: it replaces the last).
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.slot.lock();
        if !matches!(slot.load, Load::Gone) && !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            slot.waker = Some(waker.clone());
        }
    }

    /// Takes the send back (it will not go out) if it still waits; false
    /// if it went out (or failed) already.
    pub fn withdraw(&self) -> bool {
        let mut slot = self.slot.lock();
        let waiting = !matches!(slot.load, Load::Gone);
        slot.load = Load::Gone;
        slot.waker = None;
        waiting
    }

    /// Fails the send with `e` (unless it is gone already).
    pub fn fail(&self, team: &TeamInner, e: Error) {
        if self.withdraw() {
            team.calls.ours.finish(self.call, Err(e));
        }
    }

    /// A large payload that waits to be staged: `max_payload` is the channel's.
    fn needs_staging(&self, max_payload: usize) -> bool {
        matches!(&self.slot.lock().load, Load::Bytes(b) if b.len() > max_payload)
    }
}

#[derive(Default)]
pub(crate) struct Outbox {
    queue: Mutex<VecDeque<Arc<Queued>>>,
    /// Whether `queue` may hold anything: the one load a send pays when it is empty.
    used: AtomicBool,
    /// Held by the one thread sending from the queue.
    flushing: Mutex<()>,
    /// Answers in `queue`, and their payload bytes (changed under its lock).
    answers: AtomicUsize,
    answer_bytes: AtomicUsize,
}

impl Outbox {
    #[inline]
    pub fn is_used(&self) -> bool {
        self.used.load(Ordering::Acquire)
    }

    pub fn push(&self, q: Arc<Queued>) {
        let mut queue = self.queue.lock();
        self.count(&q, true);
        queue.push_back(q);
        self.used.store(true, Ordering::Release);
    }

    /// Puts `q` first: a send that found the queue empty, staged its large
    /// payload, then found no room for its frame. Whatever is queued now
    /// came after it looked, so it may go first (no sender's order is
    /// broken), and must: its staged range must not wait behind sends that
    /// need that space to be staged themselves.
    pub fn push_first(&self, q: Arc<Queued>) {
        let mut queue = self.queue.lock();
        self.count(&q, true);
        queue.push_front(q);
        self.used.store(true, Ordering::Release);
    }

    /// Counts an answer joining (or leaving) the queue; called under its lock.
    fn count(&self, q: &Queued, joins: bool) {
        if q.is_answer() {
            let (n, bytes) = (&self.answers, &self.answer_bytes);
            if joins {
                n.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(q.len, Ordering::Relaxed);
            } else {
                n.fetch_sub(1, Ordering::Relaxed);
                bytes.fetch_sub(q.len, Ordering::Relaxed);
            }
        }
    }

    /// Whether at least `most` answers, or `most_bytes` bytes of them, wait here.
    #[inline]
    pub fn answers_over(&self, most: usize, most_bytes: usize) -> bool {
        self.is_used()
            && (self.answers.load(Ordering::Relaxed) >= most || self.answer_bytes.load(Ordering::Relaxed) >= most_bytes)
    }

    fn front(&self) -> Option<Arc<Queued>> {
        self.queue.lock().front().cloned()
    }

    /// Drops `q` from the front (only once it went out, failed or was withdrawn).
    fn pop(&self, q: &Arc<Queued>) {
        let mut queue = self.queue.lock();
        if queue.front().is_some_and(|f| Arc::ptr_eq(f, q)) {
            queue.pop_front();
            self.count(q, false);
        }
        self.used.store(!queue.is_empty(), Ordering::Release);
    }

    /// The first send still waiting.
    fn first_waiting(&self) -> Option<Arc<Queued>> {
        self.queue.lock().iter().find(|q| q.is_waiting()).cloned()
    }

    fn wake_all(&self) {
        let wakers: Vec<Waker> = self.queue.lock().iter().filter_map(|q| q.slot.lock().waker.take()).collect();
        for w in wakers {
            w.wake();
        }
    }

    /// Empties the queue (its channel is finished or the team leaves).
    pub fn take_all(&self) -> Vec<Arc<Queued>> {
        let mut queue = self.queue.lock();
        self.used.store(false, Ordering::Release);
        self.answers.store(0, Ordering::Relaxed);
        self.answer_bytes.store(0, Ordering::Relaxed);
        queue.drain(..).collect()
    }
}

impl TeamInner {
    /// Sends what waits in `ch`'s outbox, in order, as far as there is
    /// room. `copy`: may stage another send's large payload (any send may,
    /// as it would wait behind it anyway; the progress loop never does, it
    /// wakes the waiting futures instead). Returns whether anything went out.
    pub(crate) fn advance_outbox(&self, ch: &Channel, copy: bool) -> bool {
        let mut sent = false;
        loop {
            sent |= self.flush_outbox(ch);
            let Some(q) = ch.outbox.first_waiting() else { return sent };
            if !q.needs_staging(ch.max_payload) {
                return sent;
            }
            // No future waits on an answer to stage it: the progress loop does.
            if !copy && !q.is_answer() {
                // Asked first, so a later wake-up is not missed; the futures
                // may find room at once, then it costs one spurious wake-up.
                ch.transport.want_space();
                ch.outbox.wake_all();
                return sent;
            }
            if !self.stage_queued(ch, &q) {
                return sent;
            }
        }
    }

    /// Sends from the front of the outbox (see `advance_outbox`), one
    /// thread at a time: the lock is held for frame writes only (large
    /// payloads are copied before, outside it), and a thread that waited
    /// for it finds the outbox as far along as it can be.
    fn flush_outbox(&self, ch: &Channel) -> bool {
        let _one = ch.outbox.flushing.lock();
        let mut sent = false;
        let mut asked = false;
        while let Some(q) = ch.outbox.front() {
            let mut slot = q.slot.lock();
            let r = match &mut slot.load {
                Load::Gone => Ok(()),
                Load::Staging => return sent,
                Load::Bytes(b) if b.len() > ch.max_payload => return sent,
                Load::Bytes(b) => match ch.flush_backlog() {
                    true => ch.transport.try_send(&q.header, b),
                    false => Err(SendError::Full),
                },
                Load::Staged(s) => match ch.flush_backlog() {
                    true => ch.transport.try_send_staged(&q.header, s),
                    false => Err(SendError::Full),
                },
            };
            let immediate = q.is_immediate();
            let mut written = false;
            let failed = match r {
                Ok(()) => {
                    written = !matches!(slot.load, Load::Gone);
                    slot.load = Load::Gone;
                    slot.waker = None;
                    None
                }
                // Never waits: fails as it would have when made.
                Err(SendError::Full) if immediate => Some(Error::WouldBlock { to: ch.peer_endpoint(q.header.dst) }),
                Err(SendError::Full) if !asked => {
                    // Asked, then tried once more: room made in between is not missed.
                    drop(slot);
                    ch.transport.want_space();
                    asked = true;
                    continue;
                }
                Err(SendError::Full) => return sent,
                Err(SendError::Closed) => Some(self.gone_error(ch)),
                Err(SendError::TooLarge) => unreachable!("a frame's payload fits"),
                Err(SendError::Unwritten(e)) => Some(Error::Codec(*e)),
            };
            drop(slot);
            if let Some(e) = failed {
                q.fail(self, e);
            }
            if written && (immediate || q.is_answer()) {
                self.calls.ours.finish(q.call, Ok(Payload::from_slice(&[])));
            }
            sent |= written;
            ch.outbox.pop(&q);
        }
        sent
    }

    /// Stages the large payload of `q`, the first send waiting, out of band
    /// (copied once, with no lock held). Returns whether the outbox can
    /// move on (it was staged, or failed, or withdrawn meanwhile).
    fn stage_queued(&self, ch: &Channel, q: &Queued) -> bool {
        let bytes = {
            let mut slot = q.slot.lock();
            match std::mem::replace(&mut slot.load, Load::Staging) {
                Load::Bytes(b) => b,
                other => {
                    // Someone else is at it, or it moved on.
                    slot.load = other;
                    return false;
                }
            }
        };
        let mut asked = false;
        let r = loop {
            match ch.transport.stage(&bytes) {
                Err(SendError::Full) if !asked => {
                    ch.transport.want_space();
                    asked = true;
                }
                r => break r,
            }
        };
        let mut slot = q.slot.lock();
        if matches!(slot.load, Load::Gone) {
            // Withdrawn while it was copied: dropping the staged range frees it.
            return true;
        }
        let failed = match r {
            Ok(s) => {
                slot.load = Load::Staged(Some(s));
                return true;
            }
            Err(SendError::Full) => {
                slot.load = Load::Bytes(bytes);
                return false;
            }
            Err(SendError::Closed) => self.gone_error(ch),
            // Only possible for a send queued before its channel was bound.
            Err(SendError::TooLarge) => Error::TooLarge { len: bytes.len(), max: ch.transport.max_detached() },
            Err(SendError::Unwritten(e)) => Error::Codec(*e),
        };
        slot.load = Load::Bytes(Vec::new());
        drop(slot);
        q.fail(self, failed);
        true
    }

    /// `Immediate` sends that waited for a bind and still find no room fail
    /// with `WouldBlock`: they wait for the bind, never for room.
    pub(crate) fn fail_immediate_sends(&self, ch: &Channel) {
        let waiting: Vec<_> = ch.outbox.queue.lock().iter().filter(|q| q.is_waiting()).cloned().collect();
        for q in waiting {
            if q.is_immediate() {
                q.fail(self, Error::WouldBlock { to: ch.peer_endpoint(q.header.dst) });
            }
        }
    }

    /// Fails what waits in `ch`'s outbox: its channel is finished.
    pub(crate) fn fail_outbox(&self, ch: &Channel) {
        for q in ch.outbox.take_all() {
            q.fail(self, self.gone_error(ch));
        }
    }
}
