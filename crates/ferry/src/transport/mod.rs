//! Transports: reliable, ordered, bounded frame pipes between two teams.
//!
//! A transport end carries whole frames (header + payload of at most
//! [`Transport::max_payload`] bytes). A larger payload (up to
//! [`Transport::max_detached`]) travels out of band: the sender *stages* it
//! (copies it where the receiver can read it: a payload area of shared
//! memory, or a buffer handed over in process), then sends a frame flagged
//! `DETACHED` that refers to it; the receiver gets it as a [`Detached`]
//! and gives the space back when it drops it. Nothing is held between the
//! two steps, so a large message never holds a channel up for other
//! traffic. Every transport must pass the conformance suite in
//! `tests/transport_conformance.rs`.

pub mod doorbell;
pub mod inproc;
pub mod shm;

use crate::wire::{Header, HeaderError};

/// Why a send did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No room right now; nothing was written. Call [`Transport::want_space`], then retry.
    #[error("transport full")]
    Full,
    /// The peer is gone or the end was closed.
    #[error("transport closed")]
    Closed,
    /// The payload exceeds `max_payload` (stage it) or `max_detached`.
    #[error("frame too large")]
    TooLarge,
}

/// A payload staged out of band, not yet sent (see [`Transport::stage`]).
/// Dropped unsent, its space is freed.
#[derive(Debug)]
pub enum Staged {
    /// In process: the bytes themselves move to the receiver.
    Owned(Vec<u8>),
    /// A range of this end's payload area.
    Shm(shm::StagedRange),
}

/// A received payload that travelled out of band. Its space goes back to
/// the sender when it is dropped.
#[derive(Debug)]
pub enum Detached {
    /// In process: the sender's bytes themselves.
    Inproc(inproc::Handed),
    /// A range of the peer's payload area, read only by copy (boxed: it is
    /// rare, and keeps every message's `Payload` small).
    Shm(Box<shm::Lent>),
}

impl Detached {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        match self {
            Detached::Inproc(h) => h.bytes().len(),
            Detached::Shm(l) => l.len(),
        }
    }

    /// Whether the payload is empty.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces `out`'s contents with the payload, reusing its capacity.
    pub fn read_into(&self, out: &mut Vec<u8>) {
        match self {
            Detached::Inproc(h) => {
                out.clear();
                out.extend_from_slice(h.bytes());
            }
            Detached::Shm(l) => l.read_into(out),
        }
    }

    /// The payload as a vector (no copy when it was handed over in process).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Detached::Inproc(h) => h.into_vec(),
            Detached::Shm(l) => {
                let mut v = Vec::new();
                l.read_into(&mut v);
                v
            }
        }
    }
}

/// A frame's payload as the receiver is offered it.
pub enum Body<'a> {
    /// In the frame (valid during the call only).
    Inline(&'a [u8]),
    /// Out of band: take it (`Option::take`) to accept the frame. Left in
    /// place, the frame stays and is offered again.
    Detached(&'a mut Option<Detached>),
}

/// Why a receive failed. Either is final for this end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The peer wrote something that is not a valid frame.
    #[error("corrupt channel: {0}")]
    Corrupt(String),
}

impl From<HeaderError> for RecvError {
    fn from(e: HeaderError) -> Self {
        RecvError::Corrupt(e.to_string())
    }
}

/// What a receive did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// No frame is waiting.
    Empty,
    /// A frame was handed over and consumed.
    Consumed,
    /// A frame was handed over and refused; it stays first in line.
    Kept,
}

/// One end of a frame pipe.
///
/// Sends may come from many threads at once; receives are serialized by the
/// caller (one consumer at a time), which the runtime guarantees.
pub trait Transport: Send + Sync {
    /// Largest payload one frame can carry.
    fn max_payload(&self) -> usize;

    /// Largest payload [`Transport::stage`] takes.
    fn max_detached(&self) -> usize;

    /// Stages a payload larger than a frame for [`Transport::try_send_staged`],
    /// copying it out of band. `Full` while the space it needs is lent to the
    /// receiver (call [`Transport::want_space`] and retry: releases wake the
    /// writer like ring space does); `TooLarge` above `max_detached`.
    fn stage(&self, payload: &[u8]) -> Result<Staged, SendError>;

    /// Sends a frame referring to `staged`, flagged `DETACHED`; on success
    /// takes it (it now belongs to the receiver). `Full` leaves it in place
    /// to retry: the payload is not copied again.
    fn try_send_staged(&self, header: &Header, staged: &mut Option<Staged>) -> Result<(), SendError>;

    /// Writes one frame now, or fails with `Full` having written nothing.
    /// Wakes the receiving team if it sleeps.
    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError>;

    /// Asks to be woken (through this team's doorbell) when the peer next
    /// frees space. That wake-up consumes the request (and wakes every
    /// writer of this end waiting then); another writer's successful
    /// `try_send` does not, so with several writers none loses its wake-up.
    /// A writer therefore asks again before every park: take the park
    /// ticket, `want_space`, retry `try_send`, then park. A request whose
    /// writer found room anyway costs one spurious wake-up at most.
    fn want_space(&self);

    /// Whether this end's last `want_space` request is still outstanding:
    /// false once the peer took it (it made room since), or if none was
    /// made. A cheap probe (a load) for a runtime that sends on behalf of
    /// waiting futures: it tries again only once room may have appeared.
    /// `false` is always safe (it only costs a retry).
    fn wants_space(&self) -> bool {
        false
    }

    /// Whether a frame may be waiting: a cheap probe (a load or two, no
    /// lock) that the idle loop runs on every channel at every turn. A
    /// `false` may be stale; a `true` may be spurious.
    fn has_frame(&self) -> bool;

    /// Whether work was deferred off the receive path (see [`Transport::tidy`]).
    fn needs_tidy(&self) -> bool {
        false
    }

    /// Does deferred work (e.g. returning consumed space to the peer); the
    /// idle loop calls it when no frame waits. Serialized like `try_recv`.
    fn tidy(&self) {}

    /// Offers the next frame to `accept`; if it returns `false` the frame
    /// stays (a detached body must then be left in place). Works after the
    /// peer is gone until every frame it sent was taken. The space of a
    /// consumed frame may return to the writer only at the next `try_recv`
    /// or `tidy` (shared memory defers it off the hot path).
    fn try_recv(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError>;

    /// Marks the end closed: later sends fail with `Closed`; receives still drain.
    fn close(&self);

    /// Whether sends on this end now fail with `Closed`.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    fn is_closed(&self) -> bool;
}
