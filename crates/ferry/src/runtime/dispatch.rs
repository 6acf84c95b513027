//! The receive path: the progress loop drains each channel, reassembles
//! pieces, routes answers to the sends waiting for them and data to its
//! endpoint's inbox (or the channel's hold queue when that inbox is full).

use super::channel::{Channel, Direct, Incoming, RxState, CONTROL_BACKLOG};
use super::config::message_cost;
use super::deadline::{deadline_on_arrival, LocalTime};
use super::executor;
use super::handoff;
use super::idle;
use super::inbox::Offer;
use super::payload::Payload;
use super::served::FrameBytes;
use super::team::TeamInner;
use crate::error::{Error, Refusal, Result, Violation};
use crate::id::Addr;
use crate::rpc::Place;
use crate::transport::{Body, Recv, RecvError};
use crate::wire::{flags, Checkpoint, Header, Kind, Nack, NackReason};
use rustix::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What one drain of a channel did.
#[derive(Default)]
pub(super) struct Drained {
    /// Frames taken.
    pub taken: usize,
    /// The transport reported `PeerGone`: everything the peer sent was taken.
    pub peer_gone: bool,
}

impl Drained {
    /// What one receive from a transport did, as a drain's outcome.
    pub(super) fn of(got: std::result::Result<Recv, RecvError>) -> std::result::Result<Drained, Violation> {
        match got {
            Ok(Recv::Consumed) => Ok(Drained { taken: 1, peer_gone: false }),
            Ok(Recv::PeerGone) => Ok(Drained { taken: 0, peer_gone: true }),
            Ok(Recv::Empty | Recv::Kept) => Ok(Drained::default()),
            Err(RecvError::Corrupt(v)) => Err(v),
        }
    }
}

impl TeamInner {
    /// Drains each of `channels` (an idle thread's snapshot of the team's
    /// list) once. Returns whether anything was received.
    pub fn progress_on(&self, channels: &[Arc<Channel>]) -> bool {
        let mut did = false;
        for ch in channels.iter() {
            did |= self.progress_one(ch);
        }
        did
    }

    /// Drains one channel once (if it has something to do and nobody else
    /// drains it). Returns whether anything was received.
    #[inline]
    pub fn progress_one(&self, ch: &Arc<Channel>) -> bool {
        // The common case, nothing to do, without a call: every spinning
        // turn asks it of every channel it looks at.
        ch.needs_attention() && self.progress_busy(ch)
    }

    #[inline(never)]
    fn progress_busy(&self, ch: &Arc<Channel>) -> bool {
        let Some(mut rx) = ch.rx.try_lock() else { return false };
        ch.flush_backlog();
        let drained = self.drain(ch, &mut rx);
        self.after_drain(ch, rx, drained)
    }

    /// What follows a drain of `ch` (by the progress loop, or a direct
    /// receive): a channel whose peer broke the protocol or is gone is
    /// finished, direct takers run, answers go out, waiting sends move on.
    /// Returns whether anything was received.
    pub(super) fn after_drain(
        &self,
        ch: &Arc<Channel>,
        mut rx: parking_lot::MutexGuard<'_, RxState>,
        drained: std::result::Result<Drained, Violation>,
    ) -> bool {
        let mut did = false;
        let finished = match drained {
            Ok(d) => {
                did = d.taken > 0;
                // A gone peer's channel is finished once everything it sent
                // was taken: the transport says so with `PeerGone`.
                d.peer_gone && !ch.finished.load(Ordering::Acquire)
            }
            Err(violation) => {
                tracing::warn!(peer = %ch.peer, %violation, "closing channel: peer broke the protocol");
                ch.close();
                true
            }
        };
        if finished {
            self.settle_gone(ch, &mut rx);
        }
        // The answers corked by the frames taken (served frames' replies,
        // acks) and by the direct calls run go out now, together, not a
        // turn later (after a look at every other channel and a read of
        // this one: 0.8 µs of a served round trip over TCP).
        if self.run_direct(rx) || did {
            ch.transport.flush_pending();
        }
        // Our waiting sends, once the peer made room (or gave payload ranges back: taken in the drain).
        if ch.outbox.is_used() && (did || ch.outbox_due()) {
            did |= self.advance_outbox(ch, false);
        }
        if finished {
            self.finish_channel(ch);
        }
        did
    }

    /// The peer is gone and everything it sent was taken: what the channel
    /// still holds is settled so that it finishes now, failing the calls
    /// that wait on it. Messages held for full inboxes go to them past
    /// their capacity (that memory is spent already) rather than keep the
    /// channel, and every call on it, waiting for a reader. (No message is
    /// ever half-received: a large one is staged whole before its frame is
    /// sent.)
    fn settle_gone(&self, ch: &Arc<Channel>, rx: &mut RxState) {
        for (h, p) in rx.take_held() {
            let len = p.len();
            let mut slot = Some(p);
            self.deliver(ch, rx, &h, len, || slot.take().unwrap(), true);
        }
        ch.held.store(false, Ordering::Relaxed);
    }

    /// Runs what a drain found for direct takers, once `rx` is unlocked (a
    /// taker may send, wait, or drain this channel itself). Returns
    /// whether any ran.
    #[inline]
    pub(super) fn run_direct(&self, rx: parking_lot::MutexGuard<'_, RxState>) -> bool {
        let any = !rx.direct.is_empty();
        if any {
            self.run_direct_now(rx);
        }
        any
    }

    #[inline(never)]
    fn run_direct_now(&self, mut rx: parking_lot::MutexGuard<'_, RxState>) {
        thread_local! {
            /// A buffer to swap with `rx.direct`, so neither allocates per message.
            static SPARE: std::cell::Cell<Vec<(Direct, Incoming, Place)>> = const { std::cell::Cell::new(Vec::new()) };
        }
        // A taker runs handlers: like a task, a blocking call it makes must
        // keep running the team's tasks (one of them may be what it waits for).
        let _in_task = executor::InTask::enter();
        if rx.direct.len() == 1 {
            // The common case, one call: no batch to keep for a replacement.
            if let Some((taker, m, place)) = rx.direct.pop() {
                drop(rx);
                return idle::user_code(self, || taker.take(m, place));
            }
        }
        let mut batch = SPARE.take();
        std::mem::swap(&mut batch, &mut rx.direct);
        drop(rx);
        idle::user_code(self, || match handoff::my_slot(self) {
            // A processor keeps the rest of a batch where a replacement can
            // take it, should one of the calls block (see `handoff`).
            Some(slot) if batch.len() > 1 && self.handoff.enabled() => {
                let mut kept = slot.batch.lock();
                if kept.is_empty() {
                    // The buffers trade places (no call is moved): ours
                    // becomes the slot's queue, its empty one our spare.
                    let queue = std::collections::VecDeque::from(std::mem::take(&mut batch));
                    batch = Vec::from(std::mem::replace(&mut *kept, queue));
                } else {
                    kept.extend(batch.drain(..));
                }
                drop(kept);
                run_batch(&slot.batch);
            }
            // A panic here drops the rest, and their places with them.
            _ => {
                for (taker, m, place) in batch.drain(..) {
                    taker.take(m, place);
                }
            }
        });
        SPARE.set(batch);
    }

    /// A replacement processor's first act (see `handoff`): writes what
    /// the stuck processors' corked sends queued, and runs the rest of
    /// their batches of direct calls.
    pub(super) fn take_over(&self) {
        for ch in self.channels.snapshot().iter() {
            ch.transport.flush_pending();
        }
        let _in_task = executor::InTask::enter();
        for batch in self.handoff.stuck_batches() {
            idle::user_code(self, || run_batch(batch));
        }
        self.take_queued_calls();
    }

    /// Runs the calls queued for direct takers (a service's calls that
    /// threads other than processors received, which its serving task
    /// takes: it may be the one stuck). Replacements do it while a
    /// processor is stuck.
    pub(super) fn take_queued_calls(&self) {
        let _in_task = executor::InTask::enter();
        for inbox in self.endpoints.queued_for_direct() {
            idle::user_code(self, || {
                while let Some((taker, m, place)) = inbox.take_queued() {
                    taker.take(m, place);
                }
            });
        }
    }

    /// Whether work for the team waits: a ready task, a channel with
    /// something to do (a frame, a corked send), a batch's calls.
    pub(super) fn work_waits(&self) -> bool {
        self.exec.has_ready()
            || self.channels.snapshot().iter().any(|c| c.needs_attention())
            || self.handoff.batches_wait()
            || !self.endpoints.queued_for_direct().is_empty()
    }

    /// Whether this thread runs the team's tasks: a processor, a thread
    /// inside a task, or any thread of a team without processors. Only such
    /// threads run direct takers (they run a service's handlers).
    fn runs_tasks_here(&self) -> bool {
        self.cfg.processors == 0 || executor::in_task() || idle::is_processor_of(self)
    }

    /// Takes frames from one channel until it is empty, a destination is
    /// full, or a budget is spent (so one busy peer cannot starve the rest).
    pub(super) fn drain(&self, ch: &Arc<Channel>, rx: &mut RxState) -> std::result::Result<Drained, Violation> {
        // Held messages first, in order per endpoint, as far as their inboxes
        // take them, and while their answers have room (see `CONTROL_BACKLOG`).
        if !rx.held.is_empty() {
            let mut refused: Vec<Addr> = Vec::new();
            let mut i = 0;
            while i < rx.held.len() && !self.answers_wait(ch) {
                let dst = rx.held[i].0.dst;
                if refused.contains(&dst) {
                    i += 1;
                    continue;
                }
                let (h, p) = rx.unhold(i);
                let len = p.len();
                let mut slot = Some(p);
                if !self.deliver(ch, rx, &h, len, || slot.take().unwrap(), false) {
                    rx.hold(i, h, slot.take().unwrap());
                    refused.push(dst);
                    i += 1;
                }
            }
            ch.held.store(!rx.held.is_empty(), Ordering::Relaxed);
        }
        if !ch.transport.has_frame_or_gone() {
            // Nothing new: a good moment for the transport's deferred work.
            // SAFETY: under `ch.rx` (`rx`), as every receive-side call.
            unsafe { ch.transport.tidy_serialized() };
            return Ok(Drained::default());
        }
        let mut violation = None;
        rx.since = crate::cost::start();
        // SAFETY: every receive-side call on a channel's transport is made
        // under its `rx` lock; `rx` is `ch`'s, held by our caller.
        let got = unsafe {
            ch.transport.try_recv_many_serialized(64, &mut |h, payload| {
                let taken = self.route(ch, rx, h, payload, &mut violation);
                rx.since = crate::cost::start();
                taken
            })
        };
        if let Some(v) = violation.take() {
            return Err(v);
        }
        let (taken, last) = got.map_err(|RecvError::Corrupt(v)| v)?;
        Ok(Drained { taken, peer_gone: last == Recv::PeerGone })
    }

    /// Whether frames that may need an answer must stay in `ch` for now:
    /// its control backlog is at its bound (see `CONTROL_BACKLOG`), or as
    /// many replies (or `hold_bytes` bytes of them) wait in its outbox for
    /// the peer to read (see `TeamInner::reply`).
    pub(super) fn answers_wait(&self, ch: &Arc<Channel>) -> bool {
        !Arc::ptr_eq(ch, &self.loopback)
            && (ch.backlog_full() || ch.outbox.answers_over(CONTROL_BACKLOG, self.cfg.hold_bytes))
    }

    /// Whether the request `h` must stay in `ch` for now: it may need an
    /// answer, and answers wait ([`TeamInner::answers_wait`]).
    #[inline]
    pub(super) fn answer_must_wait(&self, ch: &Arc<Channel>, h: &Header) -> bool {
        h.may_need_answer() && self.answers_wait(ch)
    }

    /// Handles one frame; returns false to leave it in the channel (its
    /// inbox is full and so is the channel's hold queue, or its answer
    /// would find the control backlog full).
    pub(super) fn route(
        &self,
        ch: &Arc<Channel>,
        rx: &mut RxState,
        h: &Header,
        body: Body<'_>,
        violation: &mut Option<Violation>,
    ) -> bool {
        if !ch.carries(h, self.id) {
            *violation = Some(Violation::Misaddressed { src: h.src, dst: h.dst });
            return false;
        }
        let len = match &body {
            Body::Inline(p) => p.len(),
            Body::Detached(slot) => slot.as_ref().map_or(0, |d| d.len()),
        };
        if h.flags & flags::HANDOVER != 0 && !h.kind.is_request() {
            return self.route_handed(ch, h, body, violation);
        }
        match h.kind {
            Kind::Data if !rx.hold_has_room(len, self.cfg.hold_capacity, self.cfg.hold_bytes) => false,
            Kind::Data if self.answer_must_wait(ch, h) => false,
            Kind::Cancel => {
                self.calls.cancel_arrived(ch, h.call_id);
                true
            }
            Kind::Release => {
                *violation = Some(Violation::StrayRelease);
                false
            }
            Kind::Served(_) if self.answer_must_wait(ch, h) => false,
            Kind::Served(_) => {
                self.route_served(ch, h, body);
                true
            }
            Kind::Data | Kind::Ack | Kind::Reply | Kind::Nack => {
                match body {
                    // A message or reply within one frame, past this team's
                    // `max_message` all the same (the sender's may be larger).
                    Body::Inline(p) if p.len() > self.cfg.max_message && matches!(h.kind, Kind::Data | Kind::Reply) => {
                        self.refuse_too_large(ch, h, p.len())
                    }
                    Body::Inline(p) => self.dispatch(ch, rx, h, len, || Payload::from_slice(p)),
                    Body::Detached(slot) => {
                        let d = slot.take().expect("a detached body is offered once");
                        match d.len() > self.cfg.max_message {
                            // Taken (so released at once) and refused.
                            true => self.refuse_too_large(ch, h, d.len()),
                            false => self.dispatch(ch, rx, h, len, || Payload::Detached(d)),
                        }
                    }
                }
                true
            }
        }
    }

    /// `route` of an answer that says descriptors came with it (post-bind
    /// resources): only a reply to a call of ours that asked for them
    /// brings any. (Out of line, as `route_served`: the common frames'
    /// path stays as short as it was.)
    #[cold]
    #[inline(never)]
    fn route_handed(&self, ch: &Arc<Channel>, h: &Header, body: Body<'_>, violation: &mut Option<Violation>) -> bool {
        let fds = match h.kind {
            Kind::Reply => ch.transport.take_handover(h.call_id),
            _ => Err(Violation::UnaskedHandover { tag: h.call_id }),
        };
        let fds = match fds {
            Ok(fds) => fds,
            Err(v) => {
                *violation = Some(v);
                return false;
            }
        };
        let payload = match body {
            Body::Inline(p) => Payload::from_slice(p),
            Body::Detached(slot) => Payload::Detached(slot.take().expect("a detached body is offered once")),
        };
        self.complete_handed(ch, h, Ok(payload), fds);
        true
    }

    /// Refuses a message (`TooLarge`, to its sender) or a reply (its call
    /// fails with `ReplyTooLarge`) of `len` bytes, past `max_message`.
    fn refuse_too_large(&self, ch: &Arc<Channel>, h: &Header, len: usize) {
        let max = self.cfg.max_message;
        match h.kind {
            Kind::Reply => self.complete(ch, h, Err(Error::Refused(Refusal::ReplyTooLarge { len, max }))),
            _ => self.nack(ch, h, NackReason::TooLarge, &Nack::too_large(len as u64, max as u64)),
        }
    }

    /// `route` of a served frame (its room for an answer checked): its
    /// primitive's handler runs it.
    #[inline(never)]
    pub(super) fn route_served(&self, ch: &Arc<Channel>, h: &Header, body: Body<'_>) {
        match body {
            Body::Inline(p) if p.len() > self.cfg.max_message => self.refuse_too_large(ch, h, p.len()),
            // Private already: a transport offers an inline body from this
            // process's own memory (shared memory copies it out of the ring).
            Body::Inline(p) => self.serve_frame(ch, h, FrameBytes::Private(p)),
            Body::Detached(slot) => {
                let d = slot.take().expect("a detached body is offered once");
                match d.len() > self.cfg.max_message {
                    // Taken (so released at once) and refused.
                    true => self.refuse_too_large(ch, h, d.len()),
                    false => self.serve_frame(ch, h, FrameBytes::Payload(Payload::Detached(d))),
                }
            }
        }
    }

    /// Dispatches a whole message: answers go to the sends waiting for them;
    /// data goes to its inbox, or to the hold queue if that inbox is full
    /// (or messages for the same endpoint wait there already: order per
    /// endpoint is kept).
    fn dispatch(&self, ch: &Arc<Channel>, rx: &mut RxState, h: &Header, len: usize, payload: impl FnOnce() -> Payload) {
        if h.kind != Kind::Data {
            self.complete(ch, h, Ok(payload()));
            return;
        }
        // Behind a held message for the same endpoint, or refused: hold it.
        // (`deliver` builds the payload only when it takes the message.)
        let mut make = Some(payload);
        let behind = !rx.held.is_empty() && rx.held.iter().any(|(held, _)| held.dst == h.dst);
        if behind || !self.deliver(ch, rx, h, len, || (make.take().unwrap())(), false) {
            let payload = (make.take().expect("a refused message was not built"))();
            rx.hold(rx.held.len(), *h, payload);
            ch.held.store(true, Ordering::Relaxed);
        }
    }

    /// Puts a data message of `len` payload bytes into its endpoint's inbox;
    /// false if the inbox is full (never with `past_capacity`).
    fn deliver(
        &self,
        ch: &Arc<Channel>,
        rx: &mut RxState,
        h: &Header,
        len: usize,
        payload: impl FnOnce() -> Payload,
        past_capacity: bool,
    ) -> bool {
        let slot = h.dst.slot();
        if rx.last_inbox.as_ref().is_none_or(|(s, _)| *s != slot) {
            let Some(i) = self.endpoints.get(h.dst) else {
                self.nack(ch, h, NackReason::NoSuchEndpoint, format!("no endpoint {}", h.dst).as_bytes());
                return true;
            };
            rx.last_inbox = Some((slot, i));
        }
        let inbox = &rx.last_inbox.as_ref().unwrap().1;
        let since = rx.since.take();
        match inbox.offer(
            || self.runs_tasks_here(),
            message_cost(len),
            || incoming(ch, h, payload(), since),
            past_capacity,
        ) {
            Offer::Accepted => {
                if h.checkpoint() == Checkpoint::OnReceipt {
                    self.ack(ch, h, Checkpoint::OnReceipt);
                }
                true
            }
            Offer::Direct(taker, m, place) => {
                if h.checkpoint() == Checkpoint::OnReceipt {
                    self.ack(ch, h, Checkpoint::OnReceipt);
                }
                rx.direct.push((taker, m, place));
                true
            }
            Offer::Full => false,
            Offer::Closed => {
                rx.last_inbox = None;
                self.nack(ch, h, NackReason::NoSuchEndpoint, format!("endpoint {} closed", h.dst).as_bytes());
                true
            }
        }
    }

    /// An ack, reply or nack for one of our sends (or a failure of one).
    pub(super) fn complete(&self, ch: &Arc<Channel>, h: &Header, payload: Result<Payload>) {
        self.complete_handed(ch, h, payload, Vec::new())
    }

    /// [`TeamInner::complete`] of an answer that brought descriptors `fds`
    /// (see `Transport::ask_handover`).
    fn complete_handed(&self, ch: &Arc<Channel>, h: &Header, payload: Result<Payload>, fds: Vec<OwnedFd>) {
        let handed = h.flags & flags::HANDOVER != 0;
        let Some(mut c) = self.calls.ours.answer(ch.key(), h.call_id) else {
            tracing::debug!(call = h.call_id, peer = %ch.peer, "answer to no pending send; ignored");
            if !handed {
                // A call that asked for descriptors and was forgotten (its
                // caller gave up) got its answer, without: no longer asked.
                ch.transport.unask_handover(h.call_id);
            }
            return; // (Descriptors it brought are closed here.)
        };
        if handed {
            c.hand(fds);
        } else if c.asked_handover() {
            ch.transport.unask_handover(h.call_id);
        }
        c.finish(match (h.kind, payload) {
            (Kind::Ack | Kind::Reply, p) => p,
            (_, Ok(p)) => Err(p.with_bytes(|b| nack_error(ch, h, b))),
            (_, Err(e)) => Err(e),
        });
    }
}

/// A data message `h` with `payload`, as it reaches its endpoint from `ch`
/// (its receive timed from `since`, when cost accounting records).
#[inline]
pub(super) fn incoming(ch: &Arc<Channel>, h: &Header, payload: Payload, since: Option<std::time::Instant>) -> Incoming {
    let arrived = crate::cost::record(crate::cost::Side::Server, crate::cost::Stage::Receive, since);
    Incoming {
        header: *h,
        incarnation: ch.peer.incarnation,
        deadline: LocalTime::new(deadline_on_arrival(h.budget_ns)),
        payload,
        // The channel goes with the message only if an answer will travel back on it.
        channel: (h.checkpoint() != Checkpoint::Immediate).then(|| ch.clone()),
        arrived: LocalTime::new(arrived),
    }
}

/// The error a nack (its payload: a peer's bytes) means for the send it answers.
fn nack_error(ch: &Channel, h: &Header, payload: &[u8]) -> Error {
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    match Nack::parse(payload) {
        Nack::NoSuchEndpoint => Error::NoSuchEndpoint(ch.peer_endpoint(h.src)),
        Nack::NoReply => Error::Refused(Refusal::NoReply),
        Nack::NotServed(kind) => Error::Refused(Refusal::NotServed { kind }),
        Nack::TooLarge { len, max } => Error::TooLarge { len: size(len), max: size(max) },
        Nack::Other(text) => Error::Refused(Refusal::Peer(String::from_utf8_lossy(text).into_owned())),
    }
}

/// Runs a processor's batch of direct calls one by one, taking each under
/// its lock (another processor may take the rest meanwhile). A panic drops
/// the rest, and their places with them.
fn run_batch(batch: &parking_lot::Mutex<std::collections::VecDeque<handoff::DirectCall>>) {
    struct DropRest<'a>(&'a parking_lot::Mutex<std::collections::VecDeque<handoff::DirectCall>>);
    impl Drop for DropRest<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.lock().clear();
            }
        }
    }
    let _rest = DropRest(batch);
    loop {
        let next = batch.lock().pop_front();
        let Some((taker, m, place)) = next else { break };
        taker.take(m, place);
    }
}
