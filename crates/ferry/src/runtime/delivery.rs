//! `Delivery`: the future of one send, resolved at its checkpoint.

use super::channel::Channel;
use super::outbox::Queued;
use super::payload::Payload;
use super::peers::Binding;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::wire::Header;
use rustix::fd::OwnedFd;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A send on its way to its checkpoint. Resolves to the reply for
/// `OnReturn`, to an empty vector for the other checkpoints.
///
/// An async send never waits on its caller's thread: one that finds its
/// channel full, or not bound yet, keeps its message here (in the channel's
/// outbox, see [`RawSender::send_async`](crate::RawSender::send_async)) and
/// goes out, in order, once there is room. Dropping it stops waiting: a message still waiting for room or for the
/// bind is then not sent; one already sent stays sent, and for `OnReturn`
/// the receiver is told the call is cancelled.
pub struct Delivery {
    state: DeliveryState,
    deadline: Option<Instant>,
    timer: Option<u64>,
    /// Waited for by a blocked thread, whose wait ends at the deadline:
    /// no timer is needed ([`Delivery::wait_here`]).
    waited_here: bool,
}

enum DeliveryState {
    Ready(Result<Payload>),
    Waiting(Waiting),
    Done,
}

pub(super) struct Waiting {
    pub team: Arc<TeamInner>,
    pub header: Header,
    /// Its call in `calls.ours` (the wire's call id, except for an
    /// `Immediate` send waiting for its bind, which asks for no answer).
    pub call: u64,
    pub on: On,
}

/// Where the message of a waiting send is.
pub(super) enum On {
    /// Sent on this channel.
    Sent(Arc<Channel>),
    /// Waiting for room in this channel's outbox.
    Queued(Arc<Channel>, Arc<Queued>),
    /// Waiting for the channel this bind makes.
    Binding(Arc<Binding>, Arc<Queued>),
}

impl Delivery {
    pub(super) fn done() -> Delivery {
        Delivery::ready(Ok(Payload::from_slice(&[])))
    }
    pub(super) fn waiting(w: Waiting, deadline: Option<Instant>) -> Delivery {
        Delivery { state: DeliveryState::Waiting(w), deadline, timer: None, waited_here: false }
    }
    pub(crate) fn failed(e: Error) -> Delivery {
        Delivery::ready(Err(e))
    }

    fn ready(r: Result<Payload>) -> Delivery {
        Delivery { state: DeliveryState::Ready(r), deadline: None, timer: None, waited_here: false }
    }

    /// Waits for it on this thread (a blocking send), driving the team
    /// meanwhile. The wait itself ends at the deadline: no timer is
    /// registered for it (a timer costs a lock and two map updates).
    pub(crate) fn wait_here(mut self, team: &TeamInner) -> Result<Payload> {
        let until = self.waited_on_this_thread();
        super::idle::block_on_until(team, std::future::poll_fn(|cx| self.poll_payload(cx)), until)
    }

    /// Says it will be waited for by a blocked thread, whose wait ends at
    /// the deadline it returns ([`idle::block_on_until`](super::idle::block_on_until)).
    pub(crate) fn waited_on_this_thread(&mut self) -> Option<Instant> {
        self.waited_here = true;
        self.deadline
    }

    /// Waits for it here as [`Delivery::wait_here`] does; returns with the
    /// answer the descriptors it brought (see `Transport::ask_handover`).
    pub(crate) fn wait_here_for_descriptors(self, team: &TeamInner) -> Result<(Payload, Vec<OwnedFd>)> {
        let call = match &self.state {
            DeliveryState::Waiting(w) => w.call,
            _ => 0,
        };
        let r = self.wait_here(team);
        let descriptors = team.calls.ours.take_descriptors(call);
        r.map(|p| (p, descriptors))
    }

    /// The team whose answer it waits for (none once it has its outcome).
    pub(crate) fn team(&self) -> Option<&Arc<TeamInner>> {
        match &self.state {
            DeliveryState::Waiting(w) => Some(&w.team),
            _ => None,
        }
    }

    /// The outcome, if known already (an `Immediate` send, or a failure).
    pub fn take_ready(&mut self) -> Option<Result<Vec<u8>>> {
        match std::mem::replace(&mut self.state, DeliveryState::Done) {
            DeliveryState::Ready(r) => Some(r.map(Payload::into_vec)),
            other => {
                self.state = other;
                None
            }
        }
    }
}

impl Future for Delivery {
    type Output = Result<Vec<u8>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        self.get_mut().poll_payload(cx).map(|r| r.map(Payload::into_vec))
    }
}

impl Delivery {
    /// `poll` without turning a small reply into a `Vec` (RPC decodes it in place).
    pub(crate) fn poll_payload(&mut self, cx: &mut Context<'_>) -> Poll<Result<Payload>> {
        // Looked at in place: a waiting send is moved out only when it ends
        // (it is ~100 bytes, and most polls find it still waiting).
        let w = match &mut self.state {
            DeliveryState::Waiting(w) => w,
            _ => {
                return Poll::Ready(match std::mem::replace(&mut self.state, DeliveryState::Done) {
                    DeliveryState::Ready(r) => r,
                    _ => Err(Error::Cancelled),
                })
            }
        };
        w.move_on(cx);
        if let Poll::Ready(r) = w.team.calls.ours.poll(w.call, cx) {
            if let Some(t) = self.timer.take() {
                w.team.timers.cancel(t);
            }
            // A link end in the answer becomes this team's (`docs/LINK.md`).
            crate::link::received_by(&w.team);
            // Ended: dropped without giving up (there is nothing to give up).
            self.state = DeliveryState::Done;
            return Poll::Ready(r);
        }
        if let Some(at) = self.deadline {
            if Instant::now() >= at {
                w.give_up();
                self.state = DeliveryState::Done;
                return Poll::Ready(Err(Error::DeadlineExceeded));
            }
            if !self.waited_here {
                self.timer = Some(w.team.register_timer(self.timer, at, cx.waker()));
            }
        }
        Poll::Pending
    }
}

impl Waiting {
    /// A message still waiting for room tries to go out (and any waiting
    /// before it on its channel); then its waker is left to be woken when
    /// that may work.
    fn move_on(&mut self, cx: &mut Context<'_>) {
        if let On::Binding(bind, q) = &self.on {
            match bind.channel() {
                Some(ch) => self.on = On::Queued(ch, q.clone()),
                None => q.set_waker(cx.waker()),
            }
        }
        if let On::Queued(ch, q) = &self.on {
            if q.is_waiting() {
                // Registered first: a wake while it tries is not lost.
                q.set_waker(cx.waker());
                self.team.advance_outbox(ch, true);
            }
            if !q.is_waiting() {
                self.on = On::Sent(ch.clone());
            }
        }
    }

    /// Stops waiting: a message not sent yet never will be; the receiver of
    /// a sent `OnReturn` call is told.
    fn give_up(&self) {
        self.team.calls.ours.forget(self.call);
        let sent_on = match &self.on {
            On::Sent(ch) => Some(ch.clone()),
            On::Queued(ch, q) => (!q.withdraw()).then(|| ch.clone()),
            On::Binding(bind, q) => {
                if q.withdraw() {
                    None
                } else {
                    bind.channel()
                }
            }
        };
        if let Some(ch) = sent_on {
            self.team.cancel(&ch, &self.header);
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let DeliveryState::Waiting(w) = &self.state {
            w.give_up();
            if let Some(t) = self.timer {
                w.team.timers.cancel(t);
            }
        }
    }
}
