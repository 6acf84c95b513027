//! In-process transport: two bounded queues in ordinary memory.
//!
//! Used between tasks of one team (the runtime's loop-back channel) and as
//! the reference implementation the conformance suite checks others against.

use super::doorbell::Doorbell;
use super::{Recv, RecvError, SendError, Transport};
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
    closed: AtomicBool,
    /// Frames queued, readable without the lock.
    queued: AtomicUsize,
}

struct Frames {
    queue: VecDeque<(Header, Vec<u8>)>,
    /// Bytes held, counting each frame's header, against `capacity`.
    bytes: usize,
    capacity: usize,
}

impl Queue {
    fn new(capacity: usize, reader: Arc<Doorbell>, writer: Arc<Doorbell>) -> Arc<Queue> {
        Arc::new(Queue {
            frames: Mutex::new(Frames { queue: VecDeque::new(), bytes: 0, capacity }),
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
}

/// Makes a connected pair; `capacity` bytes each way. `a` and `b` are the
/// doorbells of the teams owning each end (the same one for a loop-back).
pub fn pair(capacity: usize, a: Arc<Doorbell>, b: Arc<Doorbell>) -> (InprocEnd, InprocEnd) {
    let a_to_b = Queue::new(capacity, b.clone(), a.clone());
    let b_to_a = Queue::new(capacity, a, b);
    let max_payload = (capacity / 4).max(1);
    (
        InprocEnd { tx: a_to_b.clone(), rx: b_to_a.clone(), max_payload },
        InprocEnd { tx: b_to_a, rx: a_to_b, max_payload },
    )
}

/// An end whose sends come back to itself: a team talking to its own ports.
pub fn loopback(capacity: usize, doorbell: Arc<Doorbell>) -> InprocEnd {
    let q = Queue::new(capacity, doorbell.clone(), doorbell);
    InprocEnd { tx: q.clone(), rx: q, max_payload: (capacity / 4).max(1) }
}

impl Transport for InprocEnd {
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError> {
        if payload.len() > self.max_payload {
            return Err(SendError::TooLarge);
        }
        if self.tx.closed.load(Ordering::Acquire) {
            return Err(SendError::Closed);
        }
        let cost = HEADER_LEN + payload.len();
        {
            let mut f = self.tx.frames.lock();
            if f.bytes + cost > f.capacity {
                return Err(SendError::Full);
            }
            f.bytes += cost;
            let mut h = *header;
            h.len = payload.len() as u32;
            f.queue.push_back((h, payload.to_vec()));
            self.tx.queued.fetch_add(1, Ordering::Release);
        }
        // The writer-waiting flag is left alone: another writer may be waiting.
        self.tx.reader.ring();
        Ok(())
    }

    fn want_space(&self) {
        self.tx.writer_waiting.store(true, Ordering::SeqCst);
    }

    fn has_frame(&self) -> bool {
        self.rx.queued.load(Ordering::Acquire) != 0
    }

    fn try_recv(&self, accept: &mut dyn FnMut(&Header, &[u8]) -> bool) -> Result<Recv, RecvError> {
        // Take the frame out before calling `accept`, which may send on this
        // very queue (a loop-back end acknowledging its own message). Only one
        // consumer runs at a time, so putting a refused frame back in front
        // keeps the order.
        let Some((h, payload)) = self.rx.frames.lock().queue.pop_front() else { return Ok(Recv::Empty) };
        if !accept(&h, &payload) {
            self.rx.frames.lock().queue.push_front((h, payload));
            return Ok(Recv::Kept);
        }
        self.rx.frames.lock().bytes -= HEADER_LEN + payload.len();
        self.rx.queued.fetch_sub(1, Ordering::Release);
        // Cleared here, before ringing, never by a writer (see `ShmEnd::wake_waiting_writer`).
        if self.rx.writer_waiting.load(Ordering::SeqCst) && self.rx.writer_waiting.swap(false, Ordering::AcqRel) {
            self.rx.writer.ring_now();
        }
        Ok(Recv::Consumed)
    }

    fn close(&self) {
        for q in [&self.tx, &self.rx] {
            q.closed.store(true, Ordering::Release);
        }
        self.tx.reader.ring_now();
        self.rx.writer.ring_now();
    }

    fn is_closed(&self) -> bool {
        self.tx.closed.load(Ordering::Acquire)
    }
}
