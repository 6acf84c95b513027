//! Transports: reliable, ordered, bounded frame pipes between two teams.
//!
//! # The contract
//!
//! Every transport follows one life cycle, and every transport must pass
//! the conformance suite in `tests/transport_conformance.rs`, which checks
//! each step below.
//!
//! 1. **Connect / accept (the bind handshake).** The team that sends first
//!    (the *connector*) opens a connection to the other team's well-known
//!    address and sends a *hello*: a magic naming the protocol and its
//!    version, its own team id **with its incarnation**, and the settings it
//!    proposes. The *acceptor* checks the hello (magic and version, settings
//!    within its bounds, and that the process on the other end really is the
//!    team it claims to be: on one node its pid, over a network its
//!    credentials) and answers with a *welcome* naming itself, incarnation
//!    included. The connector checks that the welcome names the team *and
//!    incarnation* it meant to reach. A bind is refused with a typed error on
//!    the side that finds the fault:
//!    - [`Error::Protocol`](crate::Error::Protocol): the peer broke the
//!      protocol (a hello or welcome of another magic or version, settings
//!      out of bounds, a claimed identity that is not the process on the
//!      other end, wrong attachments);
//!    - [`Error::NoSuchTeam`](crate::Error::NoSuchTeam) (connector): nobody
//!      is there, the welcome names another incarnation (the number belongs
//!      to a later process now), or the acceptor closed the connection
//!      without a word (it is exiting, or it refused us and logs why);
//!    - [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded): the peer
//!      stayed silent past the handshake's deadline (an acceptor closes such
//!      a connection; it never waits on one connection: it is handed
//!      readable ones);
//!    - [`Error::Unauthenticated`](crate::Error::Unauthenticated) (both
//!      sides, over a network): the other side could not prove it holds
//!      the cluster's key, so its claim to be a team of the cluster does
//!      not stand (or, over TLS, one side refused the other's certificate);
//!    - [`Error::Tls`](crate::Error::Tls) (both sides, over a network):
//!      one side uses TLS and the other does not, or the TLS session broke.
//!
//!    The shared-memory flavor is [`shm::connect`] / [`shm::accept_hello`] (the
//!    hello carries the segment, the doorbell's state page and the
//!    channel's wake-up lines as descriptors; see `docs/WIRE.md`). The TCP
//!    flavor is [`tcp::handshake::connect`] / [`tcp::handshake::accept`]
//!    (identities, credit grants and an HMAC challenge–response).
//!    In-process pipes have no handshake: both ends are made together by
//!    the one team that owns both ([`inproc::loopback`]).
//! 2. **Frames.** Whole frames (header + payload of at most
//!    [`Transport::max_payload`] bytes) in order, none lost or repeated,
//!    bounded each way: [`Transport::try_send`] fails with `Full` having
//!    written nothing, [`Transport::want_space`] asks for a wake-up (through
//!    the team's doorbell) when room comes; [`Transport::try_recv`] offers
//!    the next frame, which the receiver may refuse (it stays first).
//! 3. **Out-of-band payloads.** A larger payload (up to
//!    [`Transport::max_detached`]) is *staged* (copied where the receiver
//!    can read it: a payload area of shared memory, or the buffer handed
//!    over in process), then a frame flagged `DETACHED` refers to it; the
//!    receiver gets it as a [`Detached`] and gives the space back when it
//!    drops it, read or not. A `Detached` stays readable (whole, never
//!    garbage) even after either end is gone. Nothing is held between the two
//!    steps, so a large message never holds a channel up, and a message is
//!    never split: a peer that dies leaves no half of one.
//! 4. **Liveness.** An end learns that the peer's end is gone (the peer
//!    died, dropped or closed its end) through [`Transport::check_liveness`],
//!    which its owner calls when [`Transport::liveness_fd`] fires (a team's
//!    reactor waits on it in epoll; a transport without one, in process,
//!    knows at once). From then on sends fail with [`SendError::Closed`],
//!    and [`Transport::try_recv`] hands out every frame the peer sent before,
//!    then reports [`Recv::PeerGone`]: final, an end of stream rather than an
//!    error. [`Transport::is_peer_gone`] lets a polling loop notice without a
//!    lock.
//! 5. **Close.** [`Transport::close`] (or dropping the end) ends this end:
//!    its sends fail with `Closed` at once, the peer is told (it sees
//!    `PeerGone` once it took what we sent), and its own receive drains what
//!    had arrived, then reports `PeerGone` too. Frames a peer sends after
//!    the other end closed may be lost; that peer learns of it (`Closed`) as
//!    soon as its end sees the hang-up.
//!
//! The other way a stream ends is [`RecvError::Corrupt`]: the peer wrote
//! something that is not a valid frame, and the end is closed.

pub(crate) mod cork;
pub mod doorbell;
pub mod inproc;
pub mod shm;
pub mod tcp;

use crate::error::Violation;
use crate::wire::codec::Sink;
use crate::wire::{Header, HeaderError};
use std::os::fd::BorrowedFd;

/// Why a send did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No room right now; nothing was written. Call [`Transport::want_space`], then retry.
    #[error("transport full")]
    Full,
    /// The peer's end is gone (as far as this end knows) or this end was closed.
    #[error("transport closed")]
    Closed,
    /// The payload exceeds `max_payload` (stage it) or `max_detached`.
    #[error("frame too large")]
    TooLarge,
    /// [`Transport::stage_with`]'s writer failed, or wrote other than the
    /// length it announced; nothing was staged. (Boxed: a `try_send`'s
    /// result stays two words, which come back in registers; a `String`
    /// here made it 24 bytes, returned through memory, and a spinning
    /// call ~3 % slower.)
    #[error("payload not written: {0}")]
    Unwritten(Box<String>),
}

// See `SendError::Unwritten`.
const _: () = assert!(std::mem::size_of::<Result<(), SendError>>() <= 16);

impl SendError {
    /// [`SendError::Unwritten`], saying `why`.
    pub fn unwritten(why: impl ToString) -> SendError {
        SendError::Unwritten(Box::new(why.to_string()))
    }
}

/// Writes a payload into where it is staged (see [`Transport::stage_with`]).
pub type Writer<'a> = dyn FnMut(&mut dyn Sink) -> crate::Result<()> + 'a;

/// Checks that a writer that announced `len` bytes wrote exactly that many
/// (a `Serialize` that differs between its size pass and its encoding).
pub fn check_written(len: usize, written: usize) -> Result<(), SendError> {
    match written == len {
        true => Ok(()),
        false => Err(SendError::unwritten(format!("the encoder wrote {written} bytes of the {len} it counted"))),
    }
}

/// Stages `len` bytes written by `write` in a fresh vector (in process,
/// and the buffer a TCP end writes to its socket).
pub fn stage_vec(len: usize, write: &mut Writer<'_>) -> Result<Staged, SendError> {
    write_vec(len, write).map(Staged::Owned)
}

/// The `len` bytes `write` writes, in a fresh vector that takes no more
/// (also how an encoded message that must wait in an outbox is made).
pub fn write_vec(len: usize, write: &mut Writer<'_>) -> Result<Vec<u8>, SendError> {
    let mut v = crate::sys::huge_pages::try_vec_with_capacity(len)
        .map_err(|_| SendError::unwritten(format!("no memory for {len} bytes")))?;
    let mut bounded = Bounded { out: &mut v, len };
    write(&mut bounded).map_err(SendError::unwritten)?;
    check_written(len, v.len())?;
    Ok(v)
}

/// A vector that takes at most `len` bytes.
struct Bounded<'a> {
    out: &'a mut Vec<u8>,
    len: usize,
}

impl Sink for Bounded<'_> {
    fn put(&mut self, bytes: &[u8]) -> crate::Result<()> {
        if bytes.len() > self.len - self.out.len() {
            return Err(crate::Error::Codec(format!("the encoder wrote past the {} bytes it counted", self.len)));
        }
        self.out.extend_from_slice(bytes);
        Ok(())
    }
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
    /// Read off a stream (TCP).
    Received(tcp::Received),
}

impl Detached {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        match self {
            Detached::Inproc(h) => h.bytes().len(),
            Detached::Shm(l) => l.len(),
            Detached::Received(r) => r.bytes().len(),
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
            Detached::Received(r) => {
                out.clear();
                out.extend_from_slice(r.bytes());
            }
        }
    }

    /// The payload as a vector (no copy when it was handed over in process).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Detached::Inproc(h) => h.into_vec(),
            Detached::Shm(l) => {
                let mut v = crate::sys::huge_pages::vec_with_capacity(l.len());
                l.read_into(&mut v);
                v
            }
            Detached::Received(r) => r.into_vec(),
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

/// What asking a transport that passes no descriptors for a handover is.
pub(crate) fn no_handover() -> crate::Error {
    crate::Error::InvalidArgument("descriptors travel only over shared-memory channels".into())
}

/// Why a receive failed. Final for this end (it is closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// The peer wrote something that is not a valid frame.
    #[error("corrupt channel: {0}")]
    Corrupt(Violation),
}

impl From<HeaderError> for RecvError {
    fn from(e: HeaderError) -> Self {
        RecvError::Corrupt(Violation::BadHeader(e))
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
    /// The peer's end is gone (or this end was closed) and every frame that
    /// had arrived was taken: nothing will come any more. Final: every later
    /// receive says the same. Not an error: the stream's end.
    PeerGone,
}

/// What [`Transport::check_liveness`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The peer's end is there, as far as this end can tell (a spurious wake-up).
    Alive,
    /// The peer's end is gone: it hung up, died, dropped or closed its end.
    /// Recorded: sends fail with `Closed` from now on, and receives report
    /// [`Recv::PeerGone`] once drained.
    Gone,
    /// This end was closed (by [`Transport::close`], or because the peer
    /// broke the protocol): nothing was learnt about the peer, which may
    /// well be alive.
    Closed,
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
    /// writer like ring space does); `TooLarge` above `max_detached`;
    /// `Closed` once sends fail.
    fn stage(&self, payload: &[u8]) -> Result<Staged, SendError>;

    /// Stages the `len` bytes `write` puts into its sink, written straight
    /// where they are staged (no copy of the payload before): as
    /// [`Transport::stage`] otherwise. A writer that fails, or writes other
    /// than `len` bytes (the sink refuses more), stages nothing:
    /// [`SendError::Unwritten`].
    fn stage_with(&self, len: usize, write: &mut Writer<'_>) -> Result<Staged, SendError>;

    /// Sends a frame referring to `staged`, flagged `DETACHED`; on success
    /// takes it (it now belongs to the receiver). `Full` leaves it in place
    /// to retry: the payload is not copied again.
    fn try_send_staged(&self, header: &Header, staged: &mut Option<Staged>) -> Result<(), SendError>;

    /// Writes one frame now, or fails with `Full` having written nothing.
    /// Wakes the receiving team if it sleeps.
    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError>;

    /// [`Transport::try_send`] of the payload `prefix` then `rest` (a
    /// primitive's frame head, then its caller's bytes), written where the
    /// frame goes without joining them first where the transport can.
    fn try_send_parts(&self, header: &Header, prefix: &[u8], rest: &[u8]) -> Result<(), SendError> {
        self.try_send(header, &[prefix, rest].concat())
    }

    /// Asks to be woken (through this team's doorbell) when the peer next
    /// frees space. That wake-up consumes the request (and wakes every
    /// writer of this end waiting then); another writer's successful
    /// `try_send` does not, so with several writers none loses its wake-up.
    /// A writer therefore asks again before every park: count as
    /// sleeping, `want_space`, retry `try_send`, then park. A request whose
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

    /// `has_frame_or_gone()`, without a system call: a socket's transport
    /// answers from what it has read (the others as
    /// [`Transport::has_frame_or_gone`]). A drain that took a frame asks it
    /// before the next, so a request is served without a read that finds
    /// nothing in between (the next turn reads again).
    #[inline]
    fn more_at_hand(&self) -> bool {
        self.has_frame_or_gone()
    }

    /// Whether work was deferred off the receive path (see [`Transport::tidy`]).
    fn needs_tidy(&self) -> bool {
        false
    }

    /// Writes what sends queued without writing (a TCP end whose thread
    /// corked its sends, to write a burst of frames in one system call).
    fn flush_pending(&self) {}

    /// Does deferred work (e.g. returning consumed space to the peer, or
    /// writing the rest of frames a socket could not take at once); the
    /// idle loop calls it when no frame waits and `needs_tidy` says so.
    /// Serialized like `try_recv`.
    fn tidy(&self) {}

    /// Gives memory nothing needed lately back to the kernel (a
    /// shared-memory end's payload area above its warm part, see
    /// `shm::area`). Returns whether to call again in about
    /// `shm::area::COOL_AFTER` (some may go then). The team's reactor calls
    /// it, off the paths of messages; not serialized with anything.
    fn cool(&self, _now: std::time::Instant) -> bool {
        false
    }

    /// Offers the next frame to `accept`; if it returns `false` the frame
    /// stays (a detached body must then be left in place). Once the peer is
    /// known gone (see [`Transport::check_liveness`]) it still hands out
    /// every frame the peer sent, then reports [`Recv::PeerGone`]. The space
    /// of a consumed frame may return to the writer only at the next
    /// `try_recv` or `tidy` (shared memory defers it off the hot path).
    /// An inline body is in this process's own memory, which the peer
    /// cannot write while `accept` reads it (shared memory copies each
    /// record out of the ring first): handlers read it where it is.
    fn try_recv(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError>;

    /// [`Transport::try_recv`] again and again while `accept` takes the
    /// frames, at most `max` (≥ 1) of them and while more are at hand
    /// ([`Transport::more_at_hand`]): how many it took, and what the last
    /// receive did (`Consumed` if it stopped at `max`; `Consumed` or
    /// `Empty` if none was at hand). A drain's burst; shared memory takes
    /// it under one lock, with one look for a writer waiting for room.
    fn try_recv_many(
        &self,
        max: usize,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<(usize, Recv), RecvError> {
        let mut taken = 0;
        loop {
            match self.try_recv(accept)? {
                Recv::Consumed => {
                    taken += 1;
                    // The probe saves a receive that would find nothing (a
                    // gone peer's stream still has its end to read), and a
                    // socket read between a request and its answer.
                    if taken == max || !self.more_at_hand() {
                        return Ok((taken, Recv::Consumed));
                    }
                }
                last => return Ok((taken, last)),
            }
        }
    }

    /// [`Transport::try_recv`] by a caller that makes every receive-side
    /// call on this transport (`try_recv`, `try_recv_many`, `tidy` and
    /// their `_serialized` forms) under a lock of its own, as the runtime
    /// does under its channel's receive lock: shared memory then skips its
    /// consumer's lock, two locked instructions on every message's path.
    ///
    /// # Safety
    /// No other receive-side call on this transport runs meanwhile.
    #[inline]
    unsafe fn try_recv_serialized(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        self.try_recv(accept)
    }

    /// [`Transport::try_recv_many`] as [`Transport::try_recv_serialized`] is `try_recv`.
    ///
    /// # Safety
    /// No other receive-side call on this transport runs meanwhile.
    #[inline]
    unsafe fn try_recv_many_serialized(
        &self,
        max: usize,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<(usize, Recv), RecvError> {
        self.try_recv_many(max, accept)
    }

    /// [`Transport::tidy`] as [`Transport::try_recv_serialized`] is `try_recv`.
    ///
    /// # Safety
    /// No other receive-side call on this transport runs meanwhile.
    #[inline]
    unsafe fn tidy_serialized(&self) {
        self.tidy()
    }

    /// A descriptor that becomes readable (or hangs up) when the peer's end
    /// may be gone, for the owner's poller (a team's reactor, in epoll); call
    /// [`Transport::check_liveness`] when it fires. `None`: the transport
    /// knows without one (in process), and `check_liveness` says at once.
    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Post-bind resources: the next answer to our call `tag` may bring
    /// descriptors (shared-memory segments); until it comes, a handover
    /// tagged `tag` is taken and kept for [`Transport::take_handover`]
    /// (any other is a protocol violation). Only transports that can pass
    /// descriptors (shared memory) support it; a few calls at a time.
    fn ask_handover(&self, _tag: u64) -> crate::Result<()> {
        Err(no_handover())
    }

    /// The answer to `tag` came without descriptors: a handover tagged
    /// `tag` is no longer expected.
    fn unask_handover(&self, _tag: u64) {}

    /// Hands `fds` to the peer for its call `tag` (it asked, see
    /// [`Transport::ask_handover`]), ahead of the answer that announces them.
    fn hand_over(&self, _tag: u64, _fds: &[BorrowedFd<'_>]) -> crate::Result<()> {
        Err(no_handover())
    }

    /// The descriptors handed over for our call `tag`, which an answer
    /// announced: a violation if none came (or we never asked).
    fn take_handover(&self, tag: u64) -> Result<Vec<rustix::fd::OwnedFd>, Violation> {
        Err(Violation::UnaskedHandover { tag })
    }

    /// Looks, without waiting, whether the peer's end is gone, and records
    /// it if so (see [`Liveness::Gone`]). Cheap enough to call on every
    /// wake-up of `liveness_fd`, not meant for the receive path.
    fn check_liveness(&self) -> Liveness;

    /// Whether this end knows the peer's end is gone or was closed itself,
    /// so that a receive will report [`Recv::PeerGone`] once drained: a load,
    /// no lock, for the polling loop. A `false` may be stale.
    fn is_peer_gone(&self) -> bool;

    /// `has_frame() || is_peer_gone()`: whether a receive has something to
    /// report, in one call (the receive loop asks after every frame).
    #[inline]
    fn has_frame_or_gone(&self) -> bool {
        self.has_frame() || self.is_peer_gone()
    }

    /// `has_frame() || needs_tidy() || is_peer_gone()` in one call: the
    /// transport's part of the idle loop's per-channel, per-turn check.
    #[inline]
    fn needs_attention(&self) -> bool {
        self.has_frame() || self.needs_tidy() || self.is_peer_gone()
    }

    /// What the peer team's threads are doing, where its memory tells (a
    /// peer on this machine); `None` over a network, or on a team's
    /// channel to itself.
    fn peer_activity(&self) -> Option<doorbell::Activity> {
        None
    }

    /// Ends this end: later sends (and stages) fail with `Closed`; the peer
    /// is told, and sees `PeerGone` once it took what we sent; receives here
    /// drain what had arrived, then report `PeerGone`. Dropping an end closes
    /// it. Closing twice is harmless.
    fn close(&self);

    /// Whether sends on this end now fail with `Closed`: it was closed, or
    /// it knows the peer's end is gone.
    fn is_closed(&self) -> bool;
}
