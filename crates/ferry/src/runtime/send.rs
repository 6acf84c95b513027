//! The send path: one message onto a channel (out of band if it is larger
//! than a frame), waiting for room if asked, and the answers a receiver
//! sends back (acks, replies, nacks).

use super::channel::Channel;
use super::deadline::budget_ns;
use super::delivery::{Delivery, Waiting};
use super::idle;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::EndpointId;
use crate::transport::SendError;
use crate::wire::{Checkpoint, Header, Kind, NackReason};
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl TeamInner {
    /// Sends one message. One larger than a frame is staged out of band
    /// (copied once, with nothing held), then a frame referring to it is
    /// sent: a large message never holds the channel up for other traffic.
    /// With `wait` false, no room fails with `WouldBlock` instead of
    /// waiting; with a deadline, waiting ends there.
    pub fn send_message(
        &self,
        ch: &Channel,
        header: Header,
        payload: &[u8],
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if payload.len() > self.cfg.max_message {
            return Err(Error::TooLarge { len: payload.len(), max: self.cfg.max_message });
        }
        // Control frames go first: while the backlog holds any, the channel
        // counts as full. Room the peer makes by reading goes to our answers
        // before new frames that would need answers of their own, so a
        // backlog empties as fast as the peer reads, and two teams flooding
        // each other do not hold each other's backlogs at the bound.
        let after_backlog = |send: &dyn Fn() -> std::result::Result<(), SendError>| {
            if ch.flush_backlog() {
                send()
            } else {
                Err(SendError::Full)
            }
        };
        if payload.len() <= ch.transport.max_payload() {
            return self.wait_for_room(ch, &header, wait, deadline, &|| {
                after_backlog(&|| ch.transport.try_send(&header, payload))
            });
        }
        let max = ch.transport.max_detached();
        if payload.len() > max {
            return Err(Error::TooLarge { len: payload.len(), max });
        }
        let staged = RefCell::new(None);
        let stage = || ch.transport.stage(payload).map(|s| *staged.borrow_mut() = Some(s));
        self.wait_for_room(ch, &header, wait, deadline, &stage)?;
        // The staged bytes are not copied again: only the frame waits for room.
        self.wait_for_room(ch, &header, wait, deadline, &|| {
            after_backlog(&|| ch.transport.try_send_staged(&header, &mut staged.borrow_mut()))
        })
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
        let outcome = |r: std::result::Result<(), SendError>| match r {
            Ok(()) => Some(Ok(())),
            Err(SendError::Closed) => Some(Err(self.gone_error(ch))),
            Err(SendError::TooLarge) => unreachable!("sizes are checked before"),
            Err(SendError::Full) if !wait => Some(Err(Error::WouldBlock { to: ch.peer_endpoint(h.dst) })),
            Err(SendError::Full) => None,
        };
        if let Some(r) = outcome(attempt()) {
            return r;
        }
        let mut idle = idle::Idle::new(self).until(deadline);
        loop {
            if self.is_shut_down() {
                return Err(Error::Shutdown);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::DeadlineExceeded);
            }
            // Asked for (and retried) only after the park ticket is taken, so
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

    /// Sends a message to `dst` over `ch` (the channel to its team, which a
    /// sender caches) and returns a future for its checkpoint.
    pub fn send_on(
        self: &Arc<Self>,
        ch: &Arc<Channel>,
        src: EndpointId,
        dst: EndpointId,
        payload: &[u8],
        checkpoint: Checkpoint,
        deadline: Option<Instant>,
    ) -> Delivery {
        let mut header = Header::new(Kind::Data, src.addr(), dst.addr(), 0).with_checkpoint(checkpoint);
        header.budget_ns = deadline.map_or(0, budget_ns);
        if checkpoint == Checkpoint::Immediate {
            return match self.send_immediate(ch, header, payload) {
                Ok(()) => Delivery::done(),
                Err(e) => Delivery::failed(e),
            };
        }
        let (call_id, completion) = self.calls.start(ch);
        header.call_id = call_id;
        if let Err(e) = self.send_message(ch, header, payload, true, deadline) {
            self.calls.forget(call_id);
            return Delivery::failed(e);
        }
        self.hand_off(ch);
        // A peer that died while we sent would never answer, unless it did
        // (the answer already completed the call and took it from `pending`).
        if ch.is_gone() && ch.finished.load(Ordering::Acquire) && self.calls.forget(call_id) {
            return Delivery::failed(self.gone_error(ch));
        }
        Delivery::waiting(Waiting { team: self.clone(), channel: ch.clone(), header, completion }, deadline)
    }

    /// Replies to a received `OnReturn` message `h`, on the channel it came
    /// by. Nobody waits for a reply past the request's `deadline`.
    ///
    /// A reply is never refused for lack of control backlog room: it does
    /// not go through the backlog (which only acks, nacks and cancels join,
    /// see `CONTROL_BACKLOG`) but waits, like any message, for ring and
    /// payload area room, behind the backlog, which the peer drains by
    /// reading. Its one stand-in that does join the backlog, the `NoReply`
    /// nack of a responder dropped unanswered, is never refused either.
    pub fn reply(&self, ch: &Channel, h: &Header, deadline: Option<Instant>, payload: &[u8]) -> Result<()> {
        self.send_message(ch, Header::new(Kind::Reply, h.dst, h.src, h.call_id), payload, true, deadline)
    }

    pub fn ack(&self, ch: &Arc<Channel>, h: &Header, checkpoint: Checkpoint) {
        let mut a = Header::new(Kind::Ack, h.dst, h.src, h.call_id).with_checkpoint(checkpoint);
        a.len = 0;
        ch.send_control(a, Vec::new());
    }

    pub fn nack(&self, ch: &Arc<Channel>, h: &Header, why: NackReason, text: &str) {
        if h.call_id == 0 {
            tracing::warn!(from = %h.src, to = %h.dst, ?why, text, "dropping a message nobody waits on");
            return;
        }
        let mut p = vec![why as u8];
        p.extend_from_slice(text.as_bytes());
        ch.send_control(Header::new(Kind::Nack, h.dst, h.src, h.call_id), p);
    }

    /// Tells the receiver of our `OnReturn` send `h` that we stopped waiting.
    pub fn cancel(&self, ch: &Channel, h: &Header) {
        if h.checkpoint() == Checkpoint::OnReturn {
            ch.send_cancel(Header::new(Kind::Cancel, h.src, h.dst, h.call_id));
        }
    }

    /// An `Immediate` send: buffered in the channel now, or `WouldBlock`.
    pub fn send_immediate(&self, ch: &Arc<Channel>, header: Header, payload: &[u8]) -> Result<()> {
        let sent = self.send_message(ch, header, payload, false, None);
        self.hand_off(ch);
        sent
    }

    /// Same-team send: the sender puts the message into its inbox itself
    /// (task hand-off), rather than leaving it for whichever thread polls next.
    fn hand_off(&self, ch: &Arc<Channel>) {
        if Arc::ptr_eq(ch, &self.loopback) {
            if let Some(mut rx) = ch.rx.try_lock() {
                let _ = self.drain(ch, &mut rx);
                self.run_direct(rx);
            }
        }
    }
}
