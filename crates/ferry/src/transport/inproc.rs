//! In-process transport: two bounded queues in ordinary memory.
//!
//! Used between tasks of one team (the runtime's loop-back channel) and as
//! the reference implementation the conformance suite checks others against.
//! A payload larger than a frame is handed over as it is (`Staged::Owned`):
//! its bytes count against a second bound, `max_detached`.
//!
//! There is no handshake (both ends are made together) and no liveness
//! descriptor: closing or dropping an end closes both queues, so each end's
//! receive reports `PeerGone` once drained, and sends fail at once.

use super::doorbell::Doorbell;
use super::{Body, Detached, Liveness, Recv, RecvError, SendError, Staged, Transport};
use crate::wire::{Header, HEADER_LEN};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

struct Queue {
    frames: Mutex<Frames>,
    /// Doorbell of the team that receives from this queue.
    reader: Arc<Doorbell>,
    /// Doorbell of the team that sends into this queue.
    writer: Arc<Doorbell>,
    writer_waiting: AtomicBool,
    /// Nothing more goes in (either end was closed or dropped); its reader
    /// reports `PeerGone` once it is empty. Set under the `frames` lock and
    /// checked there by writers, so nothing is queued after a reader saw it
    /// set and the queue empty.
    closed: AtomicBool,
    /// Frames queued, readable without the lock.
    queued: AtomicUsize,
}

struct Frames {
    queue: VecDeque<(Header, Vec<u8>)>,
    /// Bytes held, counting each frame's header, against `capacity`.
    bytes: usize,
    capacity: usize,
    /// Bytes of detached payloads held, against `detached_capacity`.
    detached: usize,
    detached_capacity: usize,
}

impl Frames {
    /// What a frame holds of each bound: (frame bytes, detached bytes).
    fn cost(h: &Header, payload: &[u8]) -> (usize, usize) {
        if h.detached() {
            (HEADER_LEN, payload.len())
        } else {
            (HEADER_LEN + payload.len(), 0)
        }
    }
}

impl Queue {
    fn new(capacity: usize, detached_capacity: usize, reader: Arc<Doorbell>, writer: Arc<Doorbell>) -> Arc<Queue> {
        let frames = Frames { queue: VecDeque::new(), bytes: 0, capacity, detached: 0, detached_capacity };
        Arc::new(Queue {
            frames: Mutex::new(frames),
            reader,
            writer,
            writer_waiting: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
        })
    }
}

/// One end of an in-process pipe.
pub struct InprocEnd {
    tx: Arc<Queue>,
    rx: Arc<Queue>,
    max_payload: usize,
    /// This end was closed by its owner (not by the peer).
    closed_here: AtomicBool,
}

/// Makes a connected pair; `capacity` bytes of frames and `max_detached`
/// bytes of detached payloads each way. `a` and `b` are the doorbells of
/// the teams owning each end (the same one for a loop-back).
#[cfg(any(test, feature = "testing"))]
pub fn pair(capacity: usize, max_detached: usize, a: Arc<Doorbell>, b: Arc<Doorbell>) -> (InprocEnd, InprocEnd) {
    let a_to_b = Queue::new(capacity, max_detached, b.clone(), a.clone());
    let b_to_a = Queue::new(capacity, max_detached, a, b);
    let max_payload = (capacity / 4).max(1);
    (InprocEnd::new(a_to_b.clone(), b_to_a.clone(), max_payload), InprocEnd::new(b_to_a, a_to_b, max_payload))
}

/// An end whose sends come back to itself: a team talking to its own ports.
pub fn loopback(capacity: usize, max_detached: usize, doorbell: Arc<Doorbell>) -> InprocEnd {
    let q = Queue::new(capacity, max_detached, doorbell.clone(), doorbell);
    InprocEnd::new(q.clone(), q, (capacity / 4).max(1))
}

impl Queue {
    /// After room was made: wakes the writer if it waits for some. The flag
    /// is cleared here, before ringing, never by a writer (see
    /// `ShmEnd::wake_waiting_writer`).
    fn made_room(&self) {
        if self.writer_waiting.load(Ordering::SeqCst) && self.writer_waiting.swap(false, Ordering::AcqRel) {
            self.writer.ring_now();
        }
    }
}

/// A payload handed over in process: the sender's bytes, counted against
/// the pipe's `max_detached` until the receiver drops them.
pub struct Handed {
    bytes: Option<Vec<u8>>,
    queue: Arc<Queue>,
}

impl Handed {
    /// The payload.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_deref().unwrap_or_default()
    }

    /// The bytes themselves, no copy (their space is given back now).
    pub fn into_vec(mut self) -> Vec<u8> {
        let v = self.bytes.take().unwrap_or_default();
        self.give_back(v.len());
        v
    }

    fn give_back(&self, len: usize) {
        self.queue.frames.lock().detached -= len;
        self.queue.made_room();
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(v) = self.bytes.take() {
            self.give_back(v.len());
        }
    }
}

impl std::fmt::Debug for Handed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handed({} bytes)", self.bytes().len())
    }
}

#[cfg(test)]
thread_local! {
    /// Frames this thread queued (tests of the same-team hand-over, `runtime::send`).
    pub(crate) static PUSHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl InprocEnd {
    fn new(tx: Arc<Queue>, rx: Arc<Queue>, max_payload: usize) -> InprocEnd {
        InprocEnd { tx, rx, max_payload, closed_here: AtomicBool::new(false) }
    }

    /// Queues one frame if both bounds allow it; gives the bytes back if not.
    fn push(&self, mut h: Header, payload: Vec<u8>) -> Result<(), (SendError, Vec<u8>)> {
        #[cfg(test)]
        PUSHES.set(PUSHES.get() + 1);
        h.len = payload.len() as u32;
        let (bytes, detached) = Frames::cost(&h, &payload);
        {
            let mut f = self.tx.frames.lock();
            // Under the lock: see `Queue::closed`.
            if self.tx.closed.load(Ordering::Relaxed) {
                return Err((SendError::Closed, payload));
            }
            if f.bytes + bytes > f.capacity || f.detached + detached > f.detached_capacity {
                return Err((SendError::Full, payload));
            }
            f.bytes += bytes;
            f.detached += detached;
            f.queue.push_back((h, payload));
            self.tx.queued.fetch_add(1, Ordering::Release);
        }
        // The writer-waiting flag is left alone: another writer may be waiting.
        self.tx.reader.ring();
        Ok(())
    }
}

impl InprocEnd {
    /// Whether `len` bytes may be staged now (checked, not reserved:
    /// `try_send_staged` may still find it full).
    fn check_stage(&self, len: usize) -> Result<(), SendError> {
        let f = self.tx.frames.lock();
        if len > f.detached_capacity {
            return Err(SendError::TooLarge);
        }
        if self.tx.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        if f.detached + len > f.detached_capacity {
            return Err(SendError::Full);
        }
        Ok(())
    }
}

impl Transport for InprocEnd {
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn peer_activity(&self) -> Option<super::doorbell::Activity> {
        // On the loop-back channel the peer is the reader's own team, the
        // waiting thread among its pollers: nothing to learn.
        (!Arc::ptr_eq(&self.tx.reader, &self.tx.writer)).then(|| self.tx.reader.activity())
    }

    fn max_detached(&self) -> usize {
        self.tx.frames.lock().detached_capacity
    }

    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError> {
        if payload.len() > self.max_payload {
            return Err(SendError::TooLarge);
        }
        let mut h = *header;
        h.flags &= !crate::wire::flags::DETACHED;
        self.push(h, payload.to_vec()).map_err(|(e, _)| e)
    }

    fn stage(&self, payload: &[u8]) -> Result<Staged, SendError> {
        self.check_stage(payload.len())?;
        Ok(Staged::Owned(payload.to_vec()))
    }

    fn stage_with(&self, len: usize, write: &mut super::Writer<'_>) -> Result<Staged, SendError> {
        self.check_stage(len)?;
        super::stage_vec(len, write)
    }

    fn try_send_staged(&self, header: &Header, staged: &mut Option<Staged>) -> Result<(), SendError> {
        let Some(Staged::Owned(bytes)) = staged.take() else {
            panic!("a payload staged by another transport");
        };
        let mut h = *header;
        h.flags |= crate::wire::flags::DETACHED;
        self.push(h, bytes).map_err(|(e, bytes)| {
            *staged = Some(Staged::Owned(bytes));
            e
        })
    }

    fn want_space(&self) {
        self.tx.writer_waiting.store(true, Ordering::SeqCst);
    }

    fn wants_space(&self) -> bool {
        self.tx.writer_waiting.load(Ordering::Acquire)
    }

    fn has_frame(&self) -> bool {
        self.rx.queued.load(Ordering::Acquire) != 0
    }

    fn try_recv(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        // Take the frame out before calling `accept`, which may send on this
        // very queue (a loop-back end acknowledging its own message). Only one
        // consumer runs at a time, so putting a refused frame back in front
        // keeps the order.
        let next = {
            let mut f = self.rx.frames.lock();
            let next = f.queue.pop_front();
            // Under the lock: see `Queue::closed`.
            if next.is_none() && self.rx.closed.load(Ordering::Relaxed) {
                return Ok(Recv::PeerGone);
            }
            next
        };
        let Some((h, payload)) = next else { return Ok(Recv::Empty) };
        let (bytes, detached) = Frames::cost(&h, &payload);
        let payload = if h.detached() {
            let mut body = Some(Detached::Inproc(Handed { bytes: Some(payload), queue: self.rx.clone() }));
            if accept(&h, Body::Detached(&mut body)) {
                None
            } else {
                let Some(Detached::Inproc(mut refused)) = body else { panic!("a refused frame's body was taken") };
                Some(refused.bytes.take().expect("bytes"))
            }
        } else if accept(&h, Body::Inline(&payload)) {
            None
        } else {
            Some(payload)
        };
        if let Some(payload) = payload {
            self.rx.frames.lock().queue.push_front((h, payload));
            return Ok(Recv::Kept);
        }
        // A detached payload's bytes stay counted until the receiver drops it.
        let _ = detached;
        self.rx.frames.lock().bytes -= bytes;
        self.rx.queued.fetch_sub(1, Ordering::Release);
        self.rx.made_room();
        Ok(Recv::Consumed)
    }

    fn check_liveness(&self) -> Liveness {
        if self.closed_here.load(Ordering::Acquire) {
            Liveness::Closed
        } else if self.rx.closed.load(Ordering::Acquire) {
            Liveness::Gone
        } else {
            Liveness::Alive
        }
    }

    fn is_peer_gone(&self) -> bool {
        self.rx.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.closed_here.store(true, Ordering::Release);
        // Both ways: the peer can no longer send to an end that will not read.
        for q in [&self.tx, &self.rx] {
            let _f = q.frames.lock();
            q.closed.store(true, Ordering::Release);
        }
        // Wake the peer's readers (to see `PeerGone`) and writers (to see `Closed`).
        self.tx.reader.ring_now();
        self.rx.writer.ring_now();
    }

    fn is_closed(&self) -> bool {
        self.tx.closed.load(Ordering::Acquire)
    }
}

impl Drop for InprocEnd {
    fn drop(&mut self) {
        self.close();
    }
}
