//! Waiting on several ports at once, fairly.

use super::{take, RawMessage, RawPort};
use crate::error::{Error, Result};
use crate::runtime::EndpointInbox as Inbox;
use crate::runtime::{idle, TeamInner};
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

/// Receives from whichever of several ports has a message. Each receive
/// starts looking one port after where the previous one started, so a busy
/// port cannot starve a quiet one: a waiting message is taken within one
/// round of receives.
pub struct Select {
    team: Arc<TeamInner>,
    inboxes: Vec<Arc<Inbox>>,
    next: usize,
}

impl Select {
    /// All ports must belong to the same team.
    pub fn new(ports: &[&RawPort]) -> Select {
        assert!(!ports.is_empty(), "select over no ports");
        let team = ports[0].team().clone();
        assert!(ports.iter().all(|p| Arc::ptr_eq(p.team(), &team)), "select over ports of different teams");
        Select { team, inboxes: ports.iter().map(|p| p.inbox().clone()).collect(), next: 0 }
    }

    /// The next message and the index of the port it came from.
    pub async fn recv(&mut self) -> Result<(usize, RawMessage)> {
        let start = self.next;
        self.next = (self.next + 1) % self.inboxes.len();
        let n = self.inboxes.len();
        poll_fn(|cx| {
            let mut closed = 0;
            for k in 0..n {
                let i = (start + k) % n;
                match self.inboxes[i].poll_pop(cx) {
                    Poll::Ready(Some(m)) => return Poll::Ready(Ok((i, take(&self.team, m)))),
                    Poll::Ready(None) => closed += 1,
                    Poll::Pending => {}
                }
            }
            if closed == n {
                Poll::Ready(Err(Error::Shutdown))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    pub fn recv_blocking(&mut self) -> Result<(usize, RawMessage)> {
        let team = self.team.clone();
        idle::block_on(&team, self.recv())
    }
}
