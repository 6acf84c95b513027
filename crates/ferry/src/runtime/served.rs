//! Served frames: the extension point through which a primitive (remote
//! memory, fifos, signals, links, ...) plugs into the core.
//!
//! A primitive takes a range of the served frame kinds
//! ([`SERVED_KINDS`](crate::wire::SERVED_KINDS)) and registers one
//! [`FrameHandler`] for it with [`Team::serve_frames`]. Its peers send it
//! frames of those kinds with a sender made by [`Team::frame_sender`] (a
//! `RawSender` whose frames are of that kind): the send machinery of
//! ports — binding, deadlines, room, `PeerGone` — serves them unchanged,
//! and the answer comes back as a port's does (an Ack, a Reply, a Nack).
//!
//! Whichever thread drains the channel a frame came on runs the handler
//! as it takes the frame: a processor, the replacement started for a
//! processor stuck in user code, a thread inside a blocking call of the
//! team, the waiting thread of a `processors(0)` team. Never a user task:
//! a frame is served while every task of the team is blocked. So a handler
//! must not block; it answers through the [`ServedFrame`] it is given, on
//! the channel's bounded answer path (a reply that finds no room waits in
//! the channel's outbox, and while answers wait for a peer that does not
//! read, the team takes no more frames from it that need answers).
//!
//! The primitive keeps its own state (in its handler); the core knows
//! only the kinds and the handler.

use super::channel::Channel;
use super::payload::Payload;
use super::peers::Route;
use super::{Team, TeamInner};
use crate::error::{Error, Result};
use crate::id::{Addr, EndpointId};
use crate::port::{RawSender, Responder};
use crate::wire::{flags, Checkpoint, Header, Kind, NackReason, SERVED_KINDS};
use parking_lot::RwLock;
use rustix::fd::BorrowedFd;
use std::ops::RangeInclusive;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A primitive's handler of its frame kinds (see the module's text).
pub trait FrameHandler: Send + Sync + 'static {
    /// Serves one frame. Runs on the thread that took it off its channel,
    /// with that channel held: it must not block (no lock another thread
    /// may hold for long, no system call that waits). Dropping `frame`
    /// without answering answers for it: a `NoReply` nack if its sender
    /// waits for a reply, nothing otherwise.
    fn serve(&self, frame: ServedFrame<'_>);

    /// The team's channel to `peer` is gone (the peer died, hung up or
    /// broke the protocol): what it had in flight for this primitive is
    /// lost. Runs once per channel, on the thread that reclaimed it, with
    /// no channel held; it must not block. (A primitive whose handles hold
    /// a [`PeerLiveness`] need not use it.)
    fn peer_gone(&self, _peer: crate::id::TeamId) {}
}

/// The team's handlers, by served kind.
pub(crate) struct Served {
    handlers: RwLock<Vec<Option<Arc<dyn FrameHandler>>>>,
    /// The team itself (set when a handler is registered): what a deferred
    /// answer ([`ServedFrame::defer`]) sends through.
    team: std::sync::OnceLock<Weak<TeamInner>>,
}

impl Default for Served {
    fn default() -> Self {
        Served { handlers: RwLock::new(vec![None; SERVED_KINDS.len()]), team: std::sync::OnceLock::new() }
    }
}

impl Served {
    fn index(kind: u8) -> usize {
        usize::from(kind - SERVED_KINDS.start())
    }

    fn handler(&self, kind: u8) -> Option<Arc<dyn FrameHandler>> {
        self.handlers.read()[Served::index(kind)].clone()
    }

    /// Tells every handler that the channel to `peer` is gone (each once).
    pub fn peer_gone(&self, peer: crate::id::TeamId) {
        let mut handlers: Vec<Arc<dyn FrameHandler>> = Vec::new();
        for h in self.handlers.read().iter().flatten() {
            if !handlers.iter().any(|k| Arc::ptr_eq(k, h)) {
                handlers.push(h.clone());
            }
        }
        for h in handlers {
            h.peer_gone(peer);
        }
    }

    /// Drops every handler (at shutdown: they may hold the team's own
    /// objects). Dropped after the lock is let go: a handler's drop may
    /// drop its own registration (`ServedKinds`), which takes it.
    pub fn clear(&self) {
        let handlers: Vec<_> = self.handlers.write().iter_mut().map(Option::take).collect();
        drop(handlers);
    }
}

/// Keeps a handler registered (see [`Team::serve_frames`]); dropping it
/// unregisters the handler: frames of its kinds are then nacked `NotServed`.
#[must_use = "dropping it unregisters the handler"]
pub struct ServedKinds {
    team: Weak<TeamInner>,
    kinds: RangeInclusive<u8>,
}

impl Drop for ServedKinds {
    fn drop(&mut self) {
        if let Some(team) = self.team.upgrade() {
            // Dropped after the lock is let go (see `Served::clear`).
            let _removed: Vec<_> = {
                let mut handlers = team.served.handlers.write();
                self.kinds.clone().map(|k| handlers[Served::index(k)].take()).collect()
            };
        }
    }
}

impl Team {
    /// Registers `handler` for the served frame kinds `kinds` (within
    /// [`SERVED_KINDS`](crate::wire::SERVED_KINDS), none of them taken)
    /// until the returned guard is dropped.
    pub fn serve_frames(&self, kinds: RangeInclusive<u8>, handler: Arc<dyn FrameHandler>) -> Result<ServedKinds> {
        self.inner.serve_frames(kinds, handler)
    }

    /// A new endpoint id of this team, for an object of a primitive (a
    /// region) that its peers name in frames they send it ([`ServedFrame::slot`])
    /// and may find by name ([`Team::bind_name`]). No port has it: a
    /// message sent to it is refused (`NoSuchEndpoint`).
    pub fn reserve_endpoint(&self) -> Result<EndpointId> {
        self.inner.reserve_endpoint()
    }

    /// Binds `name` to `id` in the team's name plane (as a named port's
    /// name is bound: the names of ports and of primitives' objects are one
    /// name space), counted in `TeamBuilder::max_names`.
    pub fn bind_name(&self, name: &str, id: EndpointId) -> Result<()> {
        self.inner.register_name(name, id)
    }

    /// Unbinds `name`, which [`Team::bind_name`] bound.
    pub fn unbind_name(&self, name: &str) {
        self.inner.unregister_name(name)
    }

    /// A sender of frames of the served kind `kind` to the team `to` (its
    /// slot 0: a handler reads what the frame is about from its payload, or
    /// from [`ServedFrame::slot`] of an endpoint-like `to`). Sends take a
    /// checkpoint as a port's: `OnReturn` waits for the handler's reply.
    pub fn frame_sender(&self, to: EndpointId, kind: u8) -> Result<RawSender> {
        if !SERVED_KINDS.contains(&kind) {
            return Err(Error::InvalidArgument(format!("frame kind {kind} is not a served kind ({SERVED_KINDS:?})")));
        }
        Ok(self.raw_sender(to).of_kind(Kind::Served(kind)))
    }

    /// Asks the owner of `object` (a primitive's object: a region, a fifo)
    /// to open it: a frame of `kind` carrying `request`, answered within
    /// `limit`. On this machine the answer may bring shared-memory segments
    /// ([`RawSender::call_for_descriptors`]); on another node it cannot. A
    /// team that serves no such kind has no such object: `NoSuchEndpoint`.
    pub fn open_at_owner(&self, object: EndpointId, kind: u8, request: &[u8], limit: Duration) -> Result<Opening> {
        let sender = self.frame_sender(object, kind)?.with_timeout(limit);
        // Within one team no descriptors are handed over (the primitive's
        // memory is its own already), nor across machines.
        let answer = match object.node() == self.id().node && object.team_id() != self.id() {
            true => sender.call_for_descriptors(request),
            false => sender.call(request).map(|a| (a, Vec::new())),
        };
        let (answer, descriptors) = answer.map_err(|e| match e {
            Error::Refused(crate::Refusal::NotServed { .. }) => Error::NoSuchEndpoint(object),
            e => e,
        })?;
        Ok(Opening { answer, descriptors, owner: sender.peer_liveness() })
    }
}

/// The owner's answer to [`Team::open_at_owner`].
pub struct Opening {
    /// Its bytes (the primitive's).
    pub answer: Vec<u8>,
    /// The segments it handed over (on this machine only).
    pub descriptors: Vec<rustix::fd::OwnedFd>,
    /// The owner's liveness (its channel's).
    pub owner: Option<PeerLiveness>,
}

/// Whether a peer is gone, for a primitive's handle that outlives its
/// calls (a region's importer): a flag the runtime sets when it learns the
/// peer died or its channel closed — the team's reactor sees it at once,
/// whether or not a thread of the team is draining channels. Holds no
/// channel: a dead peer's channel is reclaimed as usual.
#[derive(Clone)]
pub struct PeerLiveness {
    gone: Arc<std::sync::atomic::AtomicBool>,
    peer: crate::id::TeamId,
}

impl PeerLiveness {
    /// Whether the peer is gone (a load).
    #[inline]
    pub fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Acquire)
    }

    /// `PeerGone` if the peer is gone.
    #[inline]
    pub fn check(&self) -> Result<()> {
        match self.is_gone() {
            true => Err(Error::PeerGone { peer: self.peer }),
            false => Ok(()),
        }
    }
}

impl RawSender {
    /// Sends `bytes` as an `Immediate` frame that never waits for room and
    /// is never refused for it: written now, or queued in the channel's
    /// outbox behind what waits there, in order. For a primitive whose own
    /// flow control bounds what it sends (a link's window), and which may
    /// hold its own locks meanwhile (no task hand-off is made: the frame's
    /// handler, even in this team, runs on the thread that drains it).
    ///
    /// It never waits, also for a bind: with no channel to the team yet,
    /// a blocking thread binds one and the frame waits in that bind, to go
    /// first once bound. (A handler posting from a thread that drains
    /// channels must not bind there: the bind's wait drains them too, and
    /// could run that handler again under its own locks, as the links
    /// stress test found.) If the bind fails, the frame is lost with it
    /// and every handler hears `peer_gone` for that team. Fails only if
    /// the channel is gone (`PeerGone`), the team is out of reach
    /// (`NoSuchTeam`), or the frame is too large (`TooLarge`).
    pub fn post(&self, bytes: &[u8]) -> Result<()> {
        self.post_parts(&[], bytes)
    }

    /// [`RawSender::post`] of the frame `prefix` then `rest` (a head of the
    /// primitive's own, then its caller's bytes), written where it goes
    /// without joining them first where the transport can.
    #[inline]
    pub fn post_parts(&self, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let h = Header::new(self.form.kind, self.team.id.endpoint(0).unwrap().addr(), self.to().addr(), 0);
        self.post_header(h, prefix, rest)
    }

    /// [`RawSender::post_parts`] of a frame of served kind `kind` from
    /// this team's slot `src_slot` to the peer's slot `dst_slot`: for a
    /// primitive whose objects on both sides have slots of their own (a
    /// link's routers), which its frames name. `InvalidArgument` for a
    /// kind that is not a served one or a slot past `MAX_SLOT`.
    #[inline]
    pub fn post_parts_as(&self, kind: u8, src_slot: u32, dst_slot: u32, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let (me, to) = (self.team.id, self.to());
        let (Some(src), Some(dst), true) = (
            Addr::new(me.node, me.team, src_slot),
            Addr::new(to.node(), to.team(), dst_slot),
            SERVED_KINDS.contains(&kind),
        ) else {
            return Err(bad_served_frame(kind, src_slot, dst_slot));
        };
        self.post_header(Header::new(Kind::Served(kind), src, dst, 0), prefix, rest)
    }

    #[inline(always)]
    fn post_header(&self, h: Header, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let ch = match self.cached() {
            Some(ch) => ch,
            None => match self.uncached_route(false)? {
                Route::Ready(ch) => ch,
                Route::Binding(bind) => return self.team.post_when_bound(&bind, h, prefix, rest),
            },
        };
        self.team.post(&ch, h, prefix, rest)
    }

    /// The liveness of the peer this sender's channel reaches (`None`
    /// before its first send: no channel yet).
    pub fn peer_liveness(&self) -> Option<PeerLiveness> {
        self.cached().map(|ch| PeerLiveness { gone: ch.gone.clone(), peer: ch.peer })
    }
}

#[cold]
fn bad_served_frame(kind: u8, src_slot: u32, dst_slot: u32) -> Error {
    Error::InvalidArgument(format!("a served frame of kind {kind} from slot {src_slot} to {dst_slot}"))
}

/// One served frame, as its handler gets it.
pub struct ServedFrame<'a> {
    team: &'a TeamInner,
    ch: &'a Arc<Channel>,
    header: &'a Header,
    payload: FrameBytes<'a>,
    answered: bool,
}

/// A served frame's bytes: inline, in memory the peer cannot write (see
/// `Transport::try_recv`), or a payload where it arrived.
pub(super) enum FrameBytes<'a> {
    Private(&'a [u8]),
    Payload(Payload),
}

impl ServedFrame<'_> {
    /// The frame's kind byte.
    pub fn kind(&self) -> u8 {
        self.header.kind.to_u8()
    }

    /// The endpoint that sent it (slot 0: its team).
    pub fn from(&self) -> EndpointId {
        self.ch.peer_endpoint(self.header.src)
    }

    /// The slot of this team it was sent to (0: the team itself).
    pub fn slot(&self) -> u32 {
        self.header.dst.slot()
    }

    /// What its sender waits for.
    pub fn checkpoint(&self) -> Checkpoint {
        self.header.checkpoint()
    }

    /// When its sender stops waiting, if it set a deadline.
    pub fn deadline(&self) -> Option<Instant> {
        super::deadline::deadline_on_arrival(self.header.budget_ns)
    }

    /// The liveness of the team that sent it (its channel's).
    pub fn peer_liveness(&self) -> PeerLiveness {
        PeerLiveness { gone: self.ch.gone.clone(), peer: self.ch.peer }
    }

    /// Whether its sender asked for descriptors with the answer
    /// ([`RawSender::call_for_descriptors`]): over shared memory only.
    pub fn asks_for_descriptors(&self) -> bool {
        self.header.flags & flags::HANDOVER != 0 && self.header.checkpoint() == Checkpoint::OnReturn
    }

    /// The payload's length (without copying it).
    pub fn payload_len(&self) -> usize {
        match &self.payload {
            FrameBytes::Private(b) => b.len(),
            FrameBytes::Payload(p) => p.len(),
        }
    }

    /// Runs `f` on the payload's bytes (copied first if they are in the
    /// peer's memory: a handler never reads memory the peer can write).
    pub fn with_payload<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &self.payload {
            FrameBytes::Private(b) => f(b),
            FrameBytes::Payload(p) => p.with_bytes(f),
        }
    }

    /// Answers with `bytes` (a sender waiting `OnReturn` gets them; one
    /// that waits for nothing gets nothing). `PeerGone` if the channel
    /// went; a reply larger than the channel takes is `TooLarge`.
    pub fn reply(mut self, bytes: &[u8]) -> Result<()> {
        self.answered = true;
        match self.header.checkpoint() {
            Checkpoint::OnReturn => self.team.reply(self.ch, self.header, bytes),
            _ => Ok(()),
        }
    }

    /// Answers with `bytes` and hands the sender `fds` (shared-memory
    /// segments: post-bind resources), which its
    /// [`RawSender::call_for_descriptors`] gets with the reply. Only if it
    /// asked for them (else `InvalidArgument`), and only over shared
    /// memory (else `InvalidArgument`: the primitive shares memory its own
    /// way in one process, and not at all across machines). On an error
    /// the frame is dropped (its sender gets `NoReply`).
    ///
    /// The sender's runtime keeps what it got only for the call that asked,
    /// and closes it with the channel; this team cannot take a descriptor
    /// back from another process: a primitive that must withdraw memory
    /// moves it to a fresh segment (see remote memory's revocation).
    pub fn reply_with_descriptors(mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        let h = self.header;
        if !self.asks_for_descriptors() {
            return Err(Error::InvalidArgument("the frame's sender did not ask for descriptors".into()));
        }
        self.ch.transport.hand_over(h.call_id, fds)?;
        self.answered = true;
        let mut reply = Header::new(Kind::Reply, h.dst, h.src, h.call_id);
        reply.flags |= flags::HANDOVER;
        self.team.answer(self.ch, reply, bytes)
    }

    /// Answers it later, from anywhere (a task the handler started): the
    /// returned [`Responder`] replies (or, dropped, tells the sender
    /// `Refused`). `None` if its sender waits for no reply (or the team is
    /// leaving).
    pub fn defer(&mut self) -> Option<Responder> {
        if self.answered || self.header.checkpoint() != Checkpoint::OnReturn {
            return None;
        }
        let team = self.team.served.team.get().and_then(Weak::upgrade)?;
        self.answered = true;
        Some(Responder::new(team, *self.header, self.ch.clone()))
    }

    /// Starts `fut` as a task of the receiving team (a primitive's work
    /// that runs user code: a handler must not run it itself).
    pub fn spawn<F>(&self, fut: F) -> crate::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.team.exec.spawn(fut)
    }

    /// Refuses it: its sender's call fails with `Refused(Peer(why))`.
    pub fn refuse(mut self, why: &str) {
        self.answered = true;
        self.team.nack(self.ch, self.header, NackReason::Other, why.as_bytes());
    }
}

impl Drop for ServedFrame<'_> {
    fn drop(&mut self) {
        if !self.answered && self.header.checkpoint() == Checkpoint::OnReturn {
            self.team.nack(self.ch, self.header, NackReason::NoReply, b"served frame dropped without a reply");
        }
    }
}

impl TeamInner {
    /// [`Team::serve_frames`].
    pub(crate) fn serve_frames(
        self: &Arc<Self>,
        kinds: RangeInclusive<u8>,
        handler: Arc<dyn FrameHandler>,
    ) -> Result<ServedKinds> {
        if kinds.is_empty() || !SERVED_KINDS.contains(kinds.start()) {
            return Err(Error::InvalidArgument(format!(
                "served kinds {kinds:?} are not a range within {SERVED_KINDS:?}"
            )));
        }
        self.served.team.get_or_init(|| Arc::downgrade(self));
        let mut handlers = self.served.handlers.write();
        if let Some(kind) = kinds.clone().find(|k| handlers[Served::index(*k)].is_some()) {
            return Err(Error::KindTaken { kind });
        }
        for k in kinds.clone() {
            handlers[Served::index(k)] = Some(handler.clone());
        }
        Ok(ServedKinds { team: Arc::downgrade(self), kinds })
    }

    /// Runs the handler of a served frame (the receive path's part).
    pub(super) fn serve_frame(&self, ch: &Arc<Channel>, h: &Header, payload: FrameBytes<'_>) {
        let kind = h.kind.to_u8();
        let Some(handler) = self.served.handler(kind) else {
            self.nack(ch, h, NackReason::NotServed, &[kind]);
            return;
        };
        if matches!(h.checkpoint(), Checkpoint::OnReceipt | Checkpoint::OnDelivery) {
            // Taken, and (the handler being its receiver) delivered.
            self.ack(ch, h, h.checkpoint());
        }
        let frame = ServedFrame { team: self, ch, header: h, payload, answered: false };
        // A handler's panic must not unwind through the receive path (the
        // channel's state): its sender gets `NoReply` (the frame's drop).
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.serve(frame))) {
            tracing::error!(kind, panic = %super::panic_message(&*e), "a served-frame handler panicked");
        }
    }
}
