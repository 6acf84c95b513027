//! Transports: reliable, ordered, bounded frame pipes between two teams.
//!
//! A transport end carries whole frames (header + payload of at most
//! [`Transport::max_payload`] bytes). Larger messages are split into pieces by
//! the runtime, the same way over every transport. Every transport must pass
//! the conformance suite in `tests/transport_conformance.rs`.

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
    /// The payload exceeds `max_payload` (the caller must split it).
    #[error("frame too large")]
    TooLarge,
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

    /// Offers the next frame to `accept`; if it returns `false` the frame stays.
    /// Works after the peer is gone until every frame it sent was taken.
    /// The space of a consumed frame may return to the writer only at the
    /// next `try_recv` or `tidy` (shared memory defers it off the hot path).
    fn try_recv(&self, accept: &mut dyn FnMut(&Header, &[u8]) -> bool) -> Result<Recv, RecvError>;

    /// Marks the end closed: later sends fail with `Closed`; receives still drain.
    fn close(&self);

    fn is_closed(&self) -> bool;
}
