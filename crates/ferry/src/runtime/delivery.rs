//! `Delivery`: the future of one send, resolved at its checkpoint.

use super::calls::Completion;
use super::channel::Channel;
use super::payload::Payload;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::wire::Header;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A send on its way to its checkpoint. Resolves to the reply for
/// `OnReturn`, to an empty vector for the other checkpoints. Dropping it
/// stops waiting (the message itself is already sent); for `OnReturn` it
/// also tells the receiver the call is cancelled.
pub struct Delivery {
    state: DeliveryState,
    deadline: Option<Instant>,
    timer: Option<u64>,
}

enum DeliveryState {
    Ready(Result<Payload>),
    Waiting(Waiting),
    Done,
}

pub(super) struct Waiting {
    pub team: Arc<TeamInner>,
    pub channel: Arc<Channel>,
    pub header: Header,
    pub completion: Arc<Completion>,
}

impl Delivery {
    pub(super) fn done() -> Delivery {
        Delivery { state: DeliveryState::Ready(Ok(Payload::from_slice(&[]))), deadline: None, timer: None }
    }
    pub(super) fn waiting(w: Waiting, deadline: Option<Instant>) -> Delivery {
        Delivery { state: DeliveryState::Waiting(w), deadline, timer: None }
    }
    pub(crate) fn failed(e: Error) -> Delivery {
        Delivery { state: DeliveryState::Ready(Err(e)), deadline: None, timer: None }
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
        let w = match std::mem::replace(&mut self.state, DeliveryState::Done) {
            DeliveryState::Ready(r) => return Poll::Ready(r),
            DeliveryState::Done => return Poll::Ready(Err(Error::Cancelled)),
            DeliveryState::Waiting(w) => w,
        };
        if let Poll::Ready(r) = w.completion.poll_done(cx) {
            if let Some(t) = self.timer.take() {
                w.team.timers.cancel(t);
            }
            return Poll::Ready(r);
        }
        if let Some(at) = self.deadline {
            if Instant::now() >= at {
                w.team.calls.forget(w.header.call_id);
                w.cancel_remote();
                return Poll::Ready(Err(Error::DeadlineExceeded));
            }
            self.timer = Some(w.team.register_timer(self.timer, at, cx.waker()));
        }
        self.state = DeliveryState::Waiting(w);
        Poll::Pending
    }
}

impl Waiting {
    fn cancel_remote(&self) {
        self.team.cancel(&self.channel, &self.header);
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let DeliveryState::Waiting(w) = &self.state {
            w.team.calls.forget(w.header.call_id);
            w.cancel_remote();
            if let Some(t) = self.timer {
                w.team.timers.cancel(t);
            }
        }
    }
}
