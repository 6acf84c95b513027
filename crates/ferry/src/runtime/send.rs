//! The send path: one message onto a channel (out of band if it is larger
//! than a frame), waiting for room on the calling thread if asked (a
//! blocking send) or else, for an async send, leaving it in the channel's
//! outbox (see `outbox`); and the answers a receiver sends back (acks,
//! replies, nacks).

use super::channel::Channel;
use super::deadline::budget_ns;
use super::delivery::{Delivery, On, Waiting};
use super::idle;
use super::out::Out;
use super::outbox::{Load, Queued};
use super::peers::Binding;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::EndpointId;
use crate::transport::{SendError, Staged};
use crate::wire::codec::Sink;
use crate::wire::{flags, Checkpoint, Header, Kind, NackReason};
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl TeamInner {
    /// Sends one message. One larger than a frame is staged out of band
    /// (copied once, with nothing held), then a frame referring to it is
    /// sent: a large message never holds the channel up for other traffic.
    /// With `wait` false, no room fails with `WouldBlock` instead of
    /// waiting; with a deadline, waiting ends there. Async sends queued on
    /// the channel go first (see `outbox`): a waiting send sends them
    /// (copying a large one out of band if it must), one that does not wait
    /// finds no room while they wait.
    pub fn send_message(
        &self,
        ch: &Channel,
        header: Header,
        payload: &[u8],
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.check_size(ch, payload.len())?;
        // The common case, tried first without the retry machinery below: a
        // message that fits a frame with no async send queued ahead of it
        // (the same first try `attempt` makes). Full goes on to the general path.
        if payload.len() <= ch.max_payload && !ch.outbox.is_used() {
            let first = match ch.flush_backlog() {
                true if self.hand_over(ch, &header, payload) => Ok(()),
                true => ch.transport.try_send(&header, payload),
                false => Err(SendError::Full),
            };
            if let Some(r) = self.send_outcome(ch, &header, wait, first) {
                return r;
            }
        }
        self.send_waiting(ch, header, &Out::from(payload), wait, deadline)
    }

    /// [`TeamInner::send_message`] of bytes made or encoded (a typed value).
    #[inline]
    pub fn send_out(
        &self,
        ch: &Channel,
        header: Header,
        payload: &Out<'_>,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        match payload {
            Out::Bytes(b) => self.send_message(ch, header, b, wait, deadline),
            Out::Encoded { len, .. } => {
                self.check_size(ch, *len)?;
                match *len <= ch.max_payload {
                    true => self.send_message(ch, header, &payload.to_vec()?, wait, deadline),
                    false => self.send_waiting(ch, header, payload, wait, deadline),
                }
            }
        }
    }

    /// `send_message` past its first try (the message is one larger than a
    /// frame if encoded): waits for room if `wait`. (Out of line: the first
    /// try stays as short as it was.)
    #[inline(never)]
    fn send_waiting(
        &self,
        ch: &Channel,
        header: Header,
        payload: &Out<'_>,
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let staged = RefCell::new(None);
        self.wait_for_room(ch, &header, wait, deadline, &|| {
            // Once staged (the outbox was empty then), it is ahead of what
            // queued since: its range must not wait behind them.
            if ch.outbox.is_used() && staged.borrow().is_none() {
                self.advance_outbox(ch, wait);
                if ch.outbox.is_used() {
                    return Err(SendError::Full);
                }
            }
            self.try_put(ch, &header, payload, &mut staged.borrow_mut())
        })
    }

    fn check_size(&self, ch: &Channel, len: usize) -> Result<()> {
        if len > self.cfg.max_message {
            return Err(Error::TooLarge { len, max: self.cfg.max_message });
        }
        if len > ch.max_payload {
            let max = ch.transport.max_detached();
            if len > max {
                return Err(Error::TooLarge { len, max });
            }
        }
        Ok(())
    }

    /// One try at writing a message: a small one in a frame; a large one
    /// staged out of band (once: `staged` keeps it between tries, so only
    /// its frame waits for room; an encoded one is encoded there), then its
    /// frame. An encoded `payload` is one larger than a frame (`Out::framed`).
    ///
    /// Control frames go first: while the backlog holds any, the channel
    /// counts as full. Room the peer makes by reading goes to our answers
    /// before new frames that would need answers of their own, so a
    /// backlog empties as fast as the peer reads, and two teams flooding
    /// each other do not hold each other's backlogs at the bound.
    #[inline]
    fn try_put(
        &self,
        ch: &Channel,
        header: &Header,
        payload: &Out<'_>,
        staged: &mut Option<Staged>,
    ) -> std::result::Result<(), SendError> {
        if let Out::Bytes(b) = payload {
            if b.len() <= ch.max_payload {
                return if ch.flush_backlog() { ch.transport.try_send(header, b) } else { Err(SendError::Full) };
            }
        }
        if staged.is_none() {
            *staged = Some(payload.stage(&*ch.transport)?);
        }
        if ch.flush_backlog() {
            ch.transport.try_send_staged(header, staged)
        } else {
            Err(SendError::Full)
        }
    }

    /// Runs `attempt` until it does not find the channel full, waiting for
    /// room in between if `wait` (driving the team's channels meanwhile, so
    /// the room the peer makes, and anything else, is taken in).
    fn wait_for_room(
        &self,
        ch: &Channel,
        h: &Header,
        wait: bool,
        deadline: Option<Instant>,
        attempt: &dyn Fn() -> std::result::Result<(), SendError>,
    ) -> Result<()> {
        let outcome = |r| self.send_outcome(ch, h, wait, r);
        if let Some(r) = outcome(attempt()) {
            return r;
        }
        let mut idle = idle::Idle::new(self);
        idle.until(deadline);
        loop {
            if self.is_shut_down() {
                return Err(Error::Shutdown);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::DeadlineExceeded);
            }
            // Asked for (and retried) only after counting as sleeping, so
            // room made between the two is not slept through, and a writer
            // that merely spins costs the reader no wake-up calls.
            let done = std::cell::Cell::new(None);
            idle.step(
                &|| {
                    ch.transport.want_space();
                    let r = outcome(attempt());
                    let ready = r.is_some();
                    done.set(r);
                    ready
                },
                &|_| {},
            );
            if let Some(r) = done.take() {
                return r;
            }
            if let Some(r) = outcome(attempt()) {
                return r;
            }
        }
    }

    /// What one try at sending `h` means for the send: done (or failed),
    /// or `None` to wait for room.
    #[inline]
    fn send_outcome(
        &self,
        ch: &Channel,
        h: &Header,
        wait: bool,
        r: std::result::Result<(), SendError>,
    ) -> Option<Result<()>> {
        match r {
            Ok(()) => Some(Ok(())),
            Err(SendError::Closed) => Some(Err(self.gone_error(ch))),
            Err(SendError::TooLarge) => unreachable!("sizes are checked before"),
            Err(SendError::Unwritten(e)) => Some(Err(Error::Codec(*e))),
            Err(SendError::Full) if !wait => Some(Err(Error::WouldBlock { to: ch.peer_endpoint(h.dst) })),
            Err(SendError::Full) => None,
        }
    }

    /// Sends a message to `dst` over `ch` (the channel to its team, which a
    /// sender caches) and returns a future for its checkpoint. With
    /// `wait_here` (a blocking call) it waits for room on this thread;
    /// else a message that finds no room waits in the channel's outbox,
    /// and the future with it (see `outbox`).
    #[allow(clippy::too_many_arguments)]
    pub fn send_on(
        self: &Arc<Self>,
        ch: &Arc<Channel>,
        form: Form,
        src: EndpointId,
        dst: EndpointId,
        payload: Out<'_>,
        checkpoint: Checkpoint,
        deadline: Option<Instant>,
        wait_here: bool,
    ) -> Delivery {
        let mut header = data_header(form, src, dst, checkpoint, deadline);
        idle::sent_on(ch);
        if checkpoint == Checkpoint::Immediate {
            let sent = match &payload {
                Out::Bytes(b) => self.send_immediate(ch, header, b),
                encoded => {
                    let sent = self.send_out(ch, header, encoded, false, None);
                    self.hand_off(ch);
                    sent
                }
            };
            return match sent {
                Ok(()) => Delivery::done(),
                Err(e) => Delivery::failed(e),
            };
        }
        let call = match self.calls.ours.start(ch.key()) {
            Ok(id) => id,
            Err(e) => return Delivery::failed(e),
        };
        header.call_id = call;
        if header.flags & flags::HANDOVER != 0 {
            // Asked before the call goes out: its answer may come at once.
            if let Err(e) = ch.transport.ask_handover(call) {
                self.calls.ours.forget(call);
                return Delivery::failed(e);
            }
            self.calls.ours.ask_handover(call);
        }
        let sent = match wait_here {
            true => self.send_out(ch, header, &payload, true, deadline).map(|()| None),
            false => self.send_or_queue(ch, header, payload, call),
        };
        let queued = match sent {
            Ok(q) => q,
            Err(e) => {
                self.calls.ours.forget(call);
                ch.transport.unask_handover(call);
                return Delivery::failed(e);
            }
        };
        self.hand_off(ch);
        // A peer that died while we sent would never answer, unless it did
        // (the answer already ended the call).
        if ch.is_gone() && ch.finished.load(Ordering::Acquire) && self.calls.ours.finish(call, Err(self.gone_error(ch)))
        {
            if let Some(q) = &queued {
                q.withdraw();
            }
        }
        let on = match queued {
            Some(q) => On::Queued(ch.clone(), q),
            None => On::Sent(ch.clone()),
        };
        Delivery::waiting(Waiting { team: self.clone(), header, call, on }, deadline)
    }

    /// An async send: written now if there is room, else queued in the
    /// channel's outbox with its message (a large one staged already if
    /// there was room for that; one encoded as it is sent is made into
    /// bytes to wait). Returns the queued send, if it waits.
    fn send_or_queue(&self, ch: &Channel, header: Header, payload: Out<'_>, call: u64) -> Result<Option<Arc<Queued>>> {
        self.check_size(ch, payload.len())?;
        let payload = payload.framed(ch.max_payload)?;
        if ch.outbox.is_used() {
            // Maybe there is room for them now (or only withdrawn sends are left).
            self.advance_outbox(ch, false);
        }
        let mut staged = None;
        if !ch.outbox.is_used() {
            match self.try_put(ch, &header, &payload, &mut staged) {
                Ok(()) => return Ok(None),
                Err(SendError::Closed) => return Err(self.gone_error(ch)),
                Err(SendError::TooLarge) => unreachable!("sizes are checked before"),
                Err(SendError::Unwritten(e)) => return Err(Error::Codec(*e)),
                Err(SendError::Full) => {}
            }
        }
        let q = match staged {
            Some(s) => {
                let q = Queued::new(header, call, Load::Staged(Some(s)));
                ch.outbox.push_first(q.clone());
                q
            }
            None => {
                let q = Queued::new(header, call, Load::Bytes(payload.into_vec()?));
                ch.outbox.push(q.clone());
                q
            }
        };
        if ch.finished.load(Ordering::Acquire) {
            // Its channel finished before the push: nobody else looks here now.
            self.fail_outbox(ch);
        }
        // Room made since the try (`want_space` is asked in there first).
        self.advance_outbox(ch, true);
        Ok(q.is_waiting().then_some(q))
    }

    /// Sends a message to `dst`, whose team's channel `bind` is being bound:
    /// it waits in the bind's queue and goes first once the channel is there.
    #[allow(clippy::too_many_arguments)]
    pub fn send_when_bound(
        self: &Arc<Self>,
        bind: &Arc<Binding>,
        form: Form,
        src: EndpointId,
        dst: EndpointId,
        payload: Out<'_>,
        checkpoint: Checkpoint,
        deadline: Option<Instant>,
    ) -> Delivery {
        if payload.len() > self.cfg.max_message {
            return Delivery::failed(Error::TooLarge { len: payload.len(), max: self.cfg.max_message });
        }
        // Waits for the bind as bytes (an encoded value is made into them).
        let mut payload = match payload.into_vec() {
            Ok(v) => Some(v),
            Err(e) => return Delivery::failed(e),
        };
        let mut header = data_header(form, src, dst, checkpoint, deadline);
        // An `Immediate` send waits for the bind, not for room: the bind's
        // sender finishes its call once written (or full). Its call id on
        // the wire stays 0: no answer is asked for.
        let call = match self.calls.ours.start(0) {
            Ok(id) => id,
            Err(e) => return Delivery::failed(e),
        };
        if checkpoint != Checkpoint::Immediate {
            header.call_id = call;
        }
        let mut queued = None;
        let joined = bind.join(|| {
            let q = Queued::new(header, call, Load::Bytes(payload.take().expect("made once")));
            queued = Some(q.clone());
            q
        });
        if joined.is_some() {
            self.calls.ours.forget(call);
        }
        match joined {
            // Bound meanwhile (`join` made nothing): sent as usual.
            Some(Ok(ch)) => {
                let payload = Out::Bytes(Cow::Owned(payload.take().expect("not queued")));
                self.send_on(&ch, form, src, dst, payload, checkpoint, deadline, false)
            }
            Some(Err(e)) => Delivery::failed(e),
            None => {
                let on = On::Binding(bind.clone(), queued.expect("queued"));
                Delivery::waiting(Waiting { team: self.clone(), header, call, on }, deadline)
            }
        }
    }

    /// Replies to a received `OnReturn` message `h`, on the channel it came
    /// by, without waiting for room (a port's or an RPC server's thread: a
    /// caller that reads nothing must not hold it up, and every other
    /// caller with it). The reply goes now if the channel
    /// takes it; else it waits in the channel's outbox, in order, and goes
    /// when the peer makes room (or goes with the channel when it closes).
    /// `Ok` means written or waiting. While [`CONTROL_BACKLOG`] answers (or
    /// `hold_bytes` bytes of them) wait on a channel, the team takes no more
    /// calls from its peer (see `answers_wait`): a peer that does not read
    /// holds up its own calls only.
    ///
    /// [`CONTROL_BACKLOG`]: super::channel::CONTROL_BACKLOG
    pub fn reply(&self, ch: &Channel, h: &Header, payload: &[u8]) -> Result<()> {
        self.answer(ch, Header::new(Kind::Reply, h.dst, h.src, h.call_id), payload)
    }

    /// [`TeamInner::reply`] with its header made (a reply with flags of its own).
    pub fn answer(&self, ch: &Channel, header: Header, payload: &[u8]) -> Result<()> {
        self.check_size(ch, payload.len())?;
        // The common case first, as `send_message` does: it fits a frame and nothing waits.
        if payload.len() <= ch.max_payload && !ch.outbox.is_used() && ch.flush_backlog() {
            if self.hand_over(ch, &header, payload) {
                return Ok(());
            }
            match ch.transport.try_send(&header, payload) {
                Ok(()) => return Ok(()),
                Err(SendError::Closed) => return Err(self.gone_error(ch)),
                Err(_) => {}
            }
        }
        self.reply_queued(ch, header, Out::from(payload))
    }

    /// [`TeamInner::reply`] with bytes made or encoded (a typed value: a
    /// large one is encoded where it is staged).
    pub fn reply_out(&self, ch: &Channel, h: &Header, payload: Out<'_>) -> Result<()> {
        match payload {
            Out::Bytes(b) => self.reply(ch, h, &b),
            encoded => {
                self.check_size(ch, encoded.len())?;
                self.reply_queued(ch, Header::new(Kind::Reply, h.dst, h.src, h.call_id), encoded)
            }
        }
    }

    /// `reply` past its first try: staged (or framed), or left in the outbox.
    #[inline(never)]
    fn reply_queued(&self, ch: &Channel, header: Header, payload: Out<'_>) -> Result<()> {
        let payload = payload.framed(ch.max_payload)?;
        let mut staged = None;
        if !ch.outbox.is_used() {
            match self.try_put(ch, &header, &payload, &mut staged) {
                Ok(()) => return Ok(()),
                Err(SendError::Closed) => return Err(self.gone_error(ch)),
                Err(SendError::TooLarge) => unreachable!("sizes are checked before"),
                Err(SendError::Unwritten(e)) => return Err(Error::Codec(*e)),
                Err(SendError::Full) => {}
            }
        }
        match staged {
            // Staged when the outbox was empty: it goes first (as in `send_or_queue`).
            Some(s) => ch.outbox.push_first(Queued::never_refused(header, Load::Staged(Some(s)))),
            None => ch.outbox.push(Queued::never_refused(header, Load::Bytes(payload.into_vec()?))),
        }
        if ch.finished.load(Ordering::Acquire) {
            // Its channel finished before the push: nobody else looks here
            // now. It did not go (a poster learns it: its frame is lost).
            self.fail_outbox(ch);
            return Err(self.gone_error(ch));
        }
        // Room made since the try (`want_space` is asked in there first).
        self.advance_outbox(ch, true);
        Ok(())
    }

    pub fn ack(&self, ch: &Arc<Channel>, h: &Header, checkpoint: Checkpoint) {
        let mut a = Header::new(Kind::Ack, h.dst, h.src, h.call_id).with_checkpoint(checkpoint);
        a.len = 0;
        ch.send_control(a, Vec::new());
    }

    pub fn nack(&self, ch: &Arc<Channel>, h: &Header, why: NackReason, detail: &[u8]) {
        if h.call_id == 0 {
            tracing::warn!(from = %h.src, to = %h.dst, ?why, "dropping a message nobody waits on");
            return;
        }
        let mut p = vec![why as u8];
        p.extend_from_slice(detail);
        ch.send_control(Header::new(Kind::Nack, h.dst, h.src, h.call_id), p);
    }

    /// Tells the receiver of our `OnReturn` send `h` that we stopped waiting.
    pub fn cancel(&self, ch: &Channel, h: &Header) {
        if h.checkpoint() == Checkpoint::OnReturn {
            ch.send_cancel(Header::new(Kind::Cancel, h.src, h.dst, h.call_id));
        }
    }

    /// An `Immediate` frame that never waits and is never refused for room
    /// (a primitive's own flow control bounds what it posts): written now,
    /// or queued in the channel's outbox behind what waits there, in order.
    /// No task hand-off: the caller may hold its primitive's locks, which
    /// the frame's handler takes. Its payload is `prefix` then `rest` (a
    /// primitive's frame head, then its caller's bytes), written as two
    /// pieces wherever it goes.
    #[inline(always)]
    pub fn post(&self, ch: &Channel, header: Header, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let len = prefix.len() + rest.len();
        // The common case first, in line (a link's every frame): a frame
        // that fits, on a channel where nothing waits before it.
        if len <= ch.max_payload && len <= self.cfg.max_message && !ch.outbox.is_used() && ch.flush_backlog() {
            match ch.transport.try_send_parts(&header, prefix, rest) {
                Ok(()) => return Ok(()),
                Err(SendError::Closed) => return Err(self.gone_error(ch)),
                Err(_) => {}
            }
        }
        self.post_queued(ch, header, prefix, rest)
    }

    /// [`TeamInner::post`] past its first try: a large frame, or one behind others.
    #[inline(never)]
    fn post_queued(&self, ch: &Channel, header: Header, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let len = prefix.len() + rest.len();
        self.check_size(ch, len)?;
        // The two pieces written one after the other where the frame goes:
        // into the staged place for a large one, never joined here first.
        let write = |sink: &mut dyn Sink| sink.put(prefix).and_then(|()| sink.put(rest));
        self.reply_queued(ch, header, Out::Encoded { len, write: &write })
    }

    /// [`TeamInner::post`] to a team whose channel `bind` is making (on a
    /// blocking thread): the frame waits in the bind and goes first once
    /// bound; this thread never waits.
    pub fn post_when_bound(&self, bind: &Binding, header: Header, prefix: &[u8], rest: &[u8]) -> Result<()> {
        let len = prefix.len() + rest.len();
        if len > self.cfg.max_message {
            return Err(Error::TooLarge { len, max: self.cfg.max_message });
        }
        match bind.join(|| Queued::never_refused(header, Load::Bytes([prefix, rest].concat()))) {
            // Bound meanwhile (`join` queued nothing): posted as usual.
            Some(Ok(ch)) => self.post(&ch, header, prefix, rest),
            Some(Err(e)) => Err(e),
            None => Ok(()),
        }
    }

    /// An `Immediate` send: buffered in the channel now, or `WouldBlock`.
    pub fn send_immediate(&self, ch: &Arc<Channel>, header: Header, payload: &[u8]) -> Result<()> {
        let sent = self.send_message(ch, header, payload, false, None);
        self.hand_off(ch);
        sent
    }

    /// Same-team send: the sender puts the message into its inbox itself
    /// (task hand-off), rather than leaving it for whichever thread polls
    /// next. A message handed over (`hand_over`) left nothing to drain: the
    /// channel is drained only if a frame waits in its queue or a message
    /// is held (two lock-free looks, not the receive lock and a drain).
    #[inline]
    fn hand_off(&self, ch: &Arc<Channel>) {
        if Arc::ptr_eq(ch, &self.loopback) && (ch.transport.has_frame_or_gone() || ch.held.load(Ordering::Relaxed)) {
            self.hand_off_now(ch);
        }
    }

    /// A same-team message, handed over: with the loop-back channel's
    /// receive side free and no frame ahead of it there (in the queue, or
    /// held for a full inbox), it goes where a drain would put it (its
    /// inbox, a direct taker, the call it answers) without the trip through
    /// the channel's queue (a copy into an allocation, and a lock and two
    /// locked counts each way). False: not handed over; send it as usual.
    #[inline]
    fn hand_over(&self, ch: &Channel, header: &Header, payload: &[u8]) -> bool {
        std::ptr::eq(ch, &*self.loopback) && self.hand_over_now(header, payload)
    }

    #[inline(never)]
    fn hand_over_now(&self, header: &Header, payload: &[u8]) -> bool {
        let ch = &self.loopback;
        let Some(mut rx) = ch.rx.try_lock() else { return false };
        // (Gone: the queue refuses it, with the error it gives.)
        if !rx.held.is_empty() || ch.transport.has_frame_or_gone() {
            return false;
        }
        // The header as the queue would carry it.
        let mut h = *header;
        h.len = payload.len() as u32;
        h.flags &= !flags::DETACHED;
        let mut violation = None;
        rx.since = crate::cost::start();
        if !self.route(ch, &mut rx, &h, crate::transport::Body::Inline(payload), &mut violation) {
            return false;
        }
        let _ = self.run_direct(rx);
        true
    }

    #[inline(never)]
    fn hand_off_now(&self, ch: &Arc<Channel>) {
        if let Some(mut rx) = ch.rx.try_lock() {
            let _ = self.drain(ch, &mut rx);
            let _ = self.run_direct(rx);
        }
    }
}

/// What a sender's frames are: their kind (`Data`, or a primitive's served
/// kind) and flags of their own (`HANDOVER`: the answer may bring descriptors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Form {
    pub kind: Kind,
    pub flags: u16,
}

impl Form {
    pub const DATA: Form = Form { kind: Kind::Data, flags: 0 };
}

/// The header of a message of `form` from `src` to `dst` (its call id is
/// set when it is sent).
fn data_header(
    form: Form,
    src: EndpointId,
    dst: EndpointId,
    checkpoint: Checkpoint,
    deadline: Option<Instant>,
) -> Header {
    let mut header = Header::new(form.kind, src.addr(), dst.addr(), 0).with_checkpoint(checkpoint);
    header.flags |= form.flags;
    header.budget_ns = deadline.map_or(0, budget_ns);
    header
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::transport::inproc::PUSHES;
    use crate::{Checkpoint, Team};

    /// A message between two endpoints of one team is handed over to its
    /// endpoint, not queued on the loop-back channel. Past a full inbox
    /// and hold queue, messages wait in that queue, and all arrive in order.
    #[test]
    fn a_same_team_message_is_handed_over_not_queued() {
        let dir = tempfile::tempdir().unwrap();
        let team =
            Team::builder().runtime_dir(dir.path()).processors(0).inbox_capacity(4).hold_capacity(4).start().unwrap();
        let port = team.open_raw_port().unwrap();
        let to = team.raw_sender(port.id());
        let before = PUSHES.get();
        for i in 0..50u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(port.recv_blocking().unwrap().payload(), [i]);
        }
        assert_eq!(PUSHES.get() - before, 0, "same-team messages went through the loop-back queue");
        // Nobody receives during the burst: 4 fill the inbox; once one is
        // held, the rest wait behind it, in the channel's queue.
        for i in 0..20u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
        }
        assert_eq!(PUSHES.get() - before, 15);
        for i in 0..20u8 {
            assert_eq!(port.recv_blocking().unwrap().payload(), [i]);
        }
        team.shutdown();
    }
}
