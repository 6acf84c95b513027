//! A channel: this team's end of a transport to one peer team, plus the
//! state the runtime keeps for it (messages held for full inboxes, a
//! backlog of control frames, whether it is finished). Whether the peer is
//! gone is the transport's to say (`Recv::PeerGone`, `is_closed`).
//!
//! What a channel may cost this team is bounded: the hold queue by
//! `hold_capacity` messages and `hold_bytes` bytes, the control backlog by
//! [`CONTROL_BACKLOG`] frames (see there for how), the ring and payload
//! area by their sizes.

use super::config::message_cost;
use super::deadline::LocalTime;
use super::inbox::{self, Inbox};
use super::outbox::Outbox;
use super::payload::Payload;
use crate::id::{Addr, EndpointId, TeamId};
use crate::transport::{SendError, Transport};
use crate::wire::{Header, Kind};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A message as it arrived: its header (source, call id, checkpoint,
/// deadline), its payload, and the channel it came on when the sender
/// waits for an answer (an ack, a reply or a nack goes back on it).
///
/// Kept to 128 bytes (checked below): it is moved into and out of an inbox
/// per message, and a larger one is moved by a `memcpy` call (callgrind: 8 %
/// more instructions per round trip at 160 bytes).
pub(crate) struct Incoming {
    pub header: Header,
    pub payload: Payload,
    pub channel: Option<Arc<Channel>>,
    /// The incarnation of the sender's team (the channel's peer).
    pub incarnation: u32,
    /// The sender's deadline, from the budget the frame carried, as of its arrival.
    pub deadline: LocalTime,
    /// Cost accounting: when it was queued (only while recording).
    pub arrived: LocalTime,
}

const _: () = assert!(std::mem::size_of::<Incoming>() <= 128);

impl Incoming {
    /// The sending endpoint.
    pub fn from(&self) -> EndpointId {
        EndpointId::at(self.header.src, self.incarnation)
    }
}

impl inbox::Cost for Incoming {
    fn cost(&self) -> usize {
        super::config::message_cost(self.payload.len())
    }
}

/// Takes an endpoint's messages as they arrive (see `Inbox::set_direct`).
pub(crate) type Direct = inbox::Direct<Incoming>;

/// Most control frames (acks, nacks, cancels) a channel keeps waiting for
/// room in its ring, which the peer makes by reading it.
///
/// A peer that sends messages asking for answers but never reads its ring
/// would otherwise grow this team's heap by one answer per message. At the
/// bound, the progress loop takes no more frames from that peer's ring that
/// may need an answer (data frames other than `Immediate` ones): they wait
/// in the ring, and the peer's own sends back up, hurting only itself.
/// Once it reads its ring, the backlog drains and taking resumes. (The
/// loop-back channel is exempt: we are its reader, so stopping would stall
/// it for good; each frame taken from it makes room for its answer.)
///
/// So the progress loop's own answers keep the backlog within the bound.
/// Answers owed for messages taken before are never refused, for the
/// sender waits for them: an `OnDelivery` ack made when a receiver takes
/// the message, the nack of a responder dropped unanswered, the nacks of a
/// closed port's queued messages. Each stands for one message already in
/// this team's memory (an inbox or hold queue, within their bounds) or held
/// by the application, so they add at most one frame per such message.
/// Cancels of our own calls, sent from `Drop`, cannot wait either: one for a
/// call whose cancel is queued already is not queued again, and past the
/// bound it is dropped; the peer then runs the call to its end or its
/// deadline, and the reply is ignored.
///
/// Replies never go through the backlog: they wait for ring (or payload
/// area) room like data, with the request's deadline (see
/// `TeamInner::reply`), so the bound never refuses one. An RPC server's
/// replies do not even wait: one that finds no room waits in the channel's
/// outbox (see `TeamInner::reply`), and the same bound applies to
/// them (this many, or `hold_bytes` bytes of them): past it, no frame that
/// may need an answer is taken from the peer until it reads.
pub const CONTROL_BACKLOG: usize = 4096;

pub(crate) struct Channel {
    pub peer: TeamId,
    /// Unique in this process, never reused (an address could be): names
    /// the channel in the tables of calls only it may answer or cancel.
    serial: u64,
    pub transport: Box<dyn Transport>,
    /// `transport.max_payload()`, fixed for its life: read at every send
    /// without a virtual call.
    pub max_payload: usize,
    /// The receive side; `try_lock`ed so one thread at a time drains it.
    pub rx: Padded<Mutex<RxState>>,
    /// Acks, nacks and cancels that found the transport full, in order;
    /// sent before anything else (see [`CONTROL_BACKLOG`]).
    backlog: Mutex<VecDeque<(Header, Vec<u8>)>>,
    /// Whether `backlog` may hold anything: lets the progress loop skip its lock.
    backlog_used: AtomicBool,
    /// Whether `rx.held` holds messages their full inboxes refused.
    pub held: AtomicBool,
    /// Finalized: pending operations failed, removed from the team.
    pub finished: AtomicBool,
    /// Set once the peer is known gone (or the channel closed), shared with
    /// what outlives the channel and must learn it without holding it: a
    /// primitive's handles (`crate::extend::PeerLiveness`).
    pub gone: Arc<AtomicBool>,
    /// Async sends waiting for room, in order.
    pub outbox: Outbox,
}

/// Keeps what it holds on cache lines of its own (128 bytes: cores fetch
/// lines in pairs). The receive state's lock is written at every poll by
/// the receiving thread; the words senders read at every send (the outbox
/// and backlog flags) must not share its line, or each send pulls it over.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[derive(Default)]
pub(crate) struct RxState {
    /// The inbox the last data frame went to: most traffic on a channel
    /// goes to one endpoint, so this saves the team's endpoint table.
    pub last_inbox: Option<(u32, Arc<Inbox<Incoming>>)>,
    /// Data messages their full inboxes refused, in arrival order; offered
    /// again first. Holding them (up to a bound) keeps the channel moving
    /// for acks, replies and other endpoints' messages behind them.
    /// Changed only through `hold`, `unhold` and `take_held`.
    pub held: VecDeque<(Header, Payload)>,
    /// What `held` costs against `hold_bytes`.
    held_bytes: usize,
    /// Cost accounting: when the frame being routed was picked up.
    pub since: Option<std::time::Instant>,
    /// Messages for direct takers, with the places they were admitted to,
    /// run once the channel's locks are released.
    pub direct: Vec<(Direct, Incoming, crate::rpc::Place)>,
}

impl RxState {
    /// Whether the hold queue has room for a message of `len` payload bytes
    /// (an empty one always has: a large message gets in alone).
    pub fn hold_has_room(&self, len: usize, capacity: usize, bytes: usize) -> bool {
        self.held.is_empty()
            || (self.held.len() < capacity && self.held_bytes.saturating_add(message_cost(len)) <= bytes)
    }

    /// Holds a message at position `at` (the end: `held.len()`).
    pub fn hold(&mut self, at: usize, h: Header, p: Payload) {
        self.held_bytes += message_cost(p.len());
        self.held.insert(at, (h, p));
    }

    pub fn unhold(&mut self, at: usize) -> (Header, Payload) {
        let (h, p) = self.held.remove(at).expect("a held message");
        self.held_bytes -= message_cost(p.len());
        (h, p)
    }

    pub fn take_held(&mut self) -> VecDeque<(Header, Payload)> {
        self.held_bytes = 0;
        std::mem::take(&mut self.held)
    }
}

impl Channel {
    pub fn new(peer: TeamId, transport: Box<dyn Transport>) -> Channel {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Channel {
            peer,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            max_payload: transport.max_payload(),
            transport,
            rx: Padded(Mutex::new(RxState::default())),
            backlog: Mutex::new(VecDeque::new()),
            backlog_used: AtomicBool::new(false),
            held: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            gone: Arc::default(),
            outbox: Outbox::default(),
        }
    }

    /// Names this channel in the tables of calls that only it may answer or cancel.
    #[inline]
    pub fn key(&self) -> u64 {
        self.serial
    }

    /// The peer's endpoint at `addr` (the channel fixes its incarnation).
    #[inline]
    pub fn peer_endpoint(&self, addr: Addr) -> EndpointId {
        EndpointId::at(addr, self.peer.incarnation)
    }

    /// Whether `h` may travel on this channel: it comes from the peer and
    /// goes to `me` (a frame naming other teams is a protocol violation).
    #[inline]
    pub fn carries(&self, h: &Header, me: TeamId) -> bool {
        self.peer.owns(h.src) && me.owns(h.dst)
    }

    /// Whether a frame or a held message waits here (or the end of the
    /// stream: a gone peer's channel to finish): work that needs a poller now.
    #[inline]
    pub fn has_frame_or_held(&self) -> bool {
        self.transport.has_frame_or_gone() || self.held.load(Ordering::Relaxed)
    }

    /// Whether the progress loop has anything to do here (lock-free check).
    #[inline]
    pub fn needs_attention(&self) -> bool {
        // The transport's probes in one virtual call.
        self.transport.needs_attention()
            || self.backlog_used.load(Ordering::Relaxed)
            || self.held.load(Ordering::Relaxed)
            || self.outbox_due()
    }

    /// Whether sends wait in the outbox and the peer made room since they asked.
    #[inline]
    pub fn outbox_due(&self) -> bool {
        self.outbox.is_used() && !self.transport.wants_space()
    }

    /// Whether sends on this channel fail: its peer is known gone, or it was closed.
    pub fn is_gone(&self) -> bool {
        self.transport.is_closed()
    }

    /// Closes the channel (the peer broke the protocol, or this team
    /// leaves): sends fail, the peer is told; the progress loop finishes it
    /// once its receive reports `PeerGone`, unless the caller does at once.
    pub fn close(&self) {
        self.transport.close();
    }

    /// Sends an answer (an ack or a nack) to a message this team took from
    /// the channel. It must neither wait nor be lost (the sender waits for
    /// it): if the transport is full, it joins the backlog at any length.
    /// The bound is kept where messages are taken (see [`CONTROL_BACKLOG`]).
    pub fn send_control(&self, header: Header, payload: Vec<u8>) {
        if self.is_gone() {
            return;
        }
        let mut backlog = self.backlog.lock();
        if backlog.is_empty() {
            match self.transport.try_send(&header, &payload) {
                Ok(()) | Err(SendError::Closed) => return,
                Err(SendError::Full | SendError::TooLarge | SendError::Unwritten(_)) => {}
            }
        }
        backlog.push_back((header, payload));
        self.backlog_used.store(true, Ordering::Release);
    }

    /// Tells the peer we stopped waiting for our call `header.call_id`. Sent
    /// from `Drop`, so it cannot wait: queued once per call, and dropped if
    /// the backlog is at its bound (see [`CONTROL_BACKLOG`]).
    pub fn send_cancel(&self, header: Header) {
        if self.is_gone() {
            return;
        }
        let mut backlog = self.backlog.lock();
        if backlog.is_empty() {
            match self.transport.try_send(&header, &[]) {
                Ok(()) | Err(SendError::Closed) => return,
                Err(SendError::Full | SendError::TooLarge | SendError::Unwritten(_)) => {}
            }
        } else if backlog.iter().any(|(h, _)| h.kind == Kind::Cancel && h.call_id == header.call_id) {
            return;
        }
        if backlog.len() >= CONTROL_BACKLOG {
            tracing::debug!(peer = %self.peer, call = header.call_id, "control backlog full: cancel dropped");
            return;
        }
        backlog.push_back((header, Vec::new()));
        self.backlog_used.store(true, Ordering::Release);
    }

    /// Whether the backlog is at its bound: no frame that may need an answer
    /// is taken from the peer until it reads its ring.
    pub fn backlog_full(&self) -> bool {
        self.backlog_used.load(Ordering::Acquire) && self.backlog.lock().len() >= CONTROL_BACKLOG
    }

    #[cfg(test)]
    pub fn backlog_len(&self) -> usize {
        self.backlog.lock().len()
    }

    /// Sends what the backlog holds, in order, as far as the transport takes
    /// it. Returns whether the backlog is empty now: other frames must wait
    /// until it is (control frames first, so the peer that reads our ring
    /// drains the backlog before it is sent anything that needs an answer).
    #[inline]
    pub fn flush_backlog(&self) -> bool {
        !self.backlog_used.load(Ordering::Acquire) || self.flush_backlog_now()
    }

    #[inline(never)]
    fn flush_backlog_now(&self) -> bool {
        let mut backlog = self.backlog.lock();
        while let Some((h, p)) = backlog.front() {
            match self.transport.try_send(h, p) {
                Ok(()) => {
                    backlog.pop_front();
                }
                Err(SendError::Closed) => {
                    backlog.clear();
                    break;
                }
                Err(_) => {
                    // Be woken when the peer makes room, not at the next park timeout.
                    self.transport.want_space();
                    return false;
                }
            }
        }
        self.backlog_used.store(false, Ordering::Release);
        true
    }
}
