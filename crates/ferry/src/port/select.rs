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
    /// The ports' team, or why these ports cannot be selected over.
    team: std::result::Result<Arc<TeamInner>, &'static str>,
    inboxes: Vec<Arc<Inbox>>,
    next: usize,
}

impl Select {
    /// Selects over `ports`: at least one, all of the same team, else
    /// `InvalidArgument`.
    pub fn try_new(ports: &[&RawPort]) -> Result<Select> {
        let select = Select::new(ports);
        select.team.as_ref().map_err(bad_ports)?;
        Ok(select)
    }

    /// Like [`Select::try_new`], but bad ports are reported by every receive
    /// (`InvalidArgument`): a library must not panic on its caller's input.
    pub fn new(ports: &[&RawPort]) -> Select {
        let team = match ports.first() {
            None => Err("select over no ports"),
            Some(p) if ports.iter().all(|q| Arc::ptr_eq(q.team(), p.team())) => Ok(p.team().clone()),
            Some(_) => Err("select over ports of different teams"),
        };
        Select { team, inboxes: ports.iter().map(|p| p.inbox().clone()).collect(), next: 0 }
    }

    /// The next message and the index of the port it came from.
    pub async fn recv(&mut self) -> Result<(usize, RawMessage)> {
        let team = self.team.as_ref().map_err(bad_ports)?;
        let start = self.next;
        self.next = (self.next + 1) % self.inboxes.len();
        let n = self.inboxes.len();
        poll_fn(|cx| {
            let mut closed = 0;
            for k in 0..n {
                let i = (start + k) % n;
                match self.inboxes[i].poll_pop(cx) {
                    Poll::Ready(Some(m)) => return Poll::Ready(Ok((i, take(team, m)))),
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

    /// [`Select::recv`], blocking this thread.
    pub fn recv_blocking(&mut self) -> Result<(usize, RawMessage)> {
        let team = self.team.as_ref().map_err(bad_ports)?.clone();
        idle::block_on(&team, self.recv())
    }
}

fn bad_ports(why: &&'static str) -> Error {
    Error::InvalidArgument(why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Team;

    fn invalid(r: Result<impl Sized>, why: &str) {
        match r {
            Err(Error::InvalidArgument(w)) => assert_eq!(w, why),
            Err(e) => panic!("expected InvalidArgument({why:?}), got {e:?}"),
            Ok(_) => panic!("expected InvalidArgument({why:?}), got Ok"),
        }
    }

    #[test]
    fn bad_ports_are_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let a = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let b = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let (pa, pb) = (a.open_raw_port().unwrap(), b.open_raw_port().unwrap());
        invalid(Select::try_new(&[]), "select over no ports");
        invalid(Select::new(&[]).recv_blocking(), "select over no ports");
        invalid(Select::try_new(&[&pa, &pb]), "select over ports of different teams");
        let mut mixed = Select::new(&[&pa, &pb]);
        invalid(mixed.recv_blocking(), "select over ports of different teams");
        invalid(a.block_on(mixed.recv()), "select over ports of different teams");
        // Good ports still select.
        let pa2 = a.open_raw_port().unwrap();
        let mut sel = Select::try_new(&[&pa, &pa2]).unwrap();
        a.raw_sender(pa2.id()).send(b"x", crate::Checkpoint::OnReceipt).unwrap();
        let (i, m) = sel.recv_blocking().unwrap();
        assert_eq!((i, m.payload()), (1, &b"x"[..]));
    }
}
