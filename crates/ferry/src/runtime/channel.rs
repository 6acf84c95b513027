//! A channel: this team's end of a transport to one peer team, plus the
//! state the runtime keeps for it (messages held for full inboxes, a
//! backlog of control frames, whether the peer is gone).

use super::inbox::{self, Inbox};
use super::payload::Payload;
use crate::id::{Addr, EndpointId, TeamId};
use crate::transport::{SendError, Transport};
use crate::wire::Header;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A message as it arrived: its header (source, call id, checkpoint,
/// deadline), its payload, and the channel it came on when the sender
/// waits for an answer (an ack, a reply or a nack goes back on it).
pub(crate) struct Incoming {
    pub header: Header,
    /// The sender: `header.src` in the incarnation of the channel it came on.
    pub from: EndpointId,
    /// The sender's deadline, from the budget the frame carried, as of its arrival.
    pub deadline: Option<std::time::Instant>,
    pub payload: Payload,
    pub channel: Option<Arc<Channel>>,
    /// Cost accounting: when it was queued (only while recording).
    pub arrived: Option<std::time::Instant>,
}

/// Takes an endpoint's messages as they arrive (see `Inbox::set_direct`).
pub(crate) type Direct = inbox::Direct<Incoming>;

pub(crate) struct Channel {
    pub peer: TeamId,
    /// Unique in this process, never reused (an address could be): names
    /// the channel in the tables of calls only it may answer or cancel.
    serial: u64,
    pub transport: Box<dyn Transport>,
    /// The receive side; `try_lock`ed so one thread at a time drains it.
    pub rx: Mutex<RxState>,
    /// Acks and nacks that found the transport busy or full; sent before anything else is received.
    pub backlog: Mutex<VecDeque<(Header, Vec<u8>)>>,
    /// Whether `backlog` may hold anything: lets the progress loop skip its lock.
    backlog_used: AtomicBool,
    /// Whether `rx.held` holds messages their full inboxes refused.
    pub held: AtomicBool,
    /// The peer died or broke the protocol: no more sends; receive until empty, then finalize.
    pub gone: AtomicBool,
    /// Finalized: pending operations failed, removed from the team.
    pub finished: AtomicBool,
    /// The bind socket, kept open only so its hang-up tells us the peer died.
    pub socket: Option<UnixStream>,
}

#[derive(Default)]
pub(crate) struct RxState {
    /// The inbox the last data frame went to: most traffic on a channel
    /// goes to one endpoint, so this saves the team's endpoint table.
    pub last_inbox: Option<(u32, Arc<Inbox<Incoming>>)>,
    /// Data messages their full inboxes refused, in arrival order; offered
    /// again first. Holding them (up to a bound) keeps the channel moving
    /// for acks, replies and other endpoints' messages behind them.
    pub held: VecDeque<(Header, Payload)>,
    /// Cost accounting: when the frame being routed was picked up.
    pub since: Option<std::time::Instant>,
    /// Messages for direct takers, run once the channel's locks are released.
    pub direct: Vec<(Direct, Incoming)>,
}

impl Channel {
    pub fn new(peer: TeamId, transport: Box<dyn Transport>, socket: Option<UnixStream>) -> Channel {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Channel {
            peer,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            transport,
            rx: Mutex::new(RxState::default()),
            backlog: Mutex::new(VecDeque::new()),
            backlog_used: AtomicBool::new(false),
            held: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            socket,
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

    /// Whether the progress loop has anything to do here (lock-free check).
    #[inline]
    pub fn needs_attention(&self) -> bool {
        self.transport.has_frame()
            || self.transport.needs_tidy()
            || self.backlog_used.load(Ordering::Relaxed)
            || self.held.load(Ordering::Relaxed)
            || self.is_gone()
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
        self.transport.close();
    }

    /// Sends a small control frame from the progress loop, which must never
    /// wait: if the transport is busy or full, the frame joins the backlog.
    pub fn send_control(&self, header: Header, payload: Vec<u8>) {
        if self.is_gone() {
            return;
        }
        let mut backlog = self.backlog.lock();
        if backlog.is_empty() {
            match self.transport.try_send(&header, &payload) {
                Ok(()) | Err(SendError::Closed) => return,
                Err(SendError::Full) | Err(SendError::TooLarge) => {}
            }
        }
        backlog.push_back((header, payload));
        self.backlog_used.store(true, Ordering::Release);
    }

    /// Sends what the backlog holds, in order, as far as the transport takes it.
    pub fn flush_backlog(&self) {
        if !self.backlog_used.load(Ordering::Acquire) {
            return;
        }
        let mut backlog = self.backlog.lock();
        if backlog.is_empty() {
            self.backlog_used.store(false, Ordering::Release);
            return;
        }
        while let Some((h, p)) = backlog.front() {
            match self.transport.try_send(h, p) {
                Ok(()) => {
                    backlog.pop_front();
                }
                Err(SendError::Closed) => {
                    backlog.clear();
                    return;
                }
                Err(_) => {
                    // Be woken when the peer makes room, not at the next park timeout.
                    self.transport.want_space();
                    return;
                }
            }
        }
    }
}
