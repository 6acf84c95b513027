//! Post-bind resources: descriptors (shared-memory segments) a peer hands
//! this end after the bind, on the channel's bind socket.
//!
//! The protocol, for one call of ours that may get descriptors back:
//!
//! 1. We *ask*: the call's id goes into `asked` before the call is sent.
//! 2. The peer sends one socket message, its 8 bytes the call's id (LE),
//!    carrying 1..=`MAX_FDS` descriptors; then its answer, flagged
//!    `HANDOVER`, on the ring (so the descriptors are in our socket buffer
//!    before the answer can be read).
//! 3. Whoever reads the socket first — the reactor, woken by the message,
//!    or the receive path, at the answer — takes the message into `got`.
//! 4. The answer takes its descriptors out of `got`; an answer without
//!    `HANDOVER` just removes its call from `asked`.
//!
//! A message no call asked for, or not shaped as above, is a protocol
//! violation (the channel closes): a peer can never make us hold, let
//! alone map, what we did not ask for. What was taken and not claimed is
//! closed with the end.

use crate::error::Violation;
use crate::sys::fdpass;
use parking_lot::Mutex;
use rustix::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Handovers one end may have asked for and not received at once.
pub const MAX_ASKED: usize = 64;

#[derive(Default)]
pub(crate) struct Handovers {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Our calls that may get descriptors back.
    asked: Vec<u64>,
    /// Descriptors taken off the socket, by call, not claimed yet.
    got: Vec<(u64, Vec<OwnedFd>)>,
}

impl Handovers {
    pub fn ask(&self, tag: u64) -> crate::Result<()> {
        let mut st = self.state.lock();
        if st.asked.len() >= MAX_ASKED {
            return Err(crate::Error::LimitReached { limit: crate::Limit::Handovers, max: MAX_ASKED as u64 });
        }
        st.asked.push(tag);
        Ok(())
    }

    pub fn unask(&self, tag: u64) {
        let mut st = self.state.lock();
        st.asked.retain(|t| *t != tag);
        st.got.retain(|(t, _)| *t != tag);
    }

    /// (asked, received and not taken): for the fuzz harness's checks.
    #[cfg(any(test, feature = "testing"))]
    pub fn counts(&self) -> (usize, usize) {
        let st = self.state.lock();
        (st.asked.len(), st.got.len())
    }

    /// Whether any handover is asked for (then the socket may carry one).
    pub fn any_asked(&self) -> bool {
        !self.state.lock().asked.is_empty()
    }

    /// Takes the handover messages waiting on `socket` that were asked
    /// for (step 3); leaves the socket alone when none is.
    pub fn receive(&self, socket: &UnixStream) -> Result<(), Violation> {
        let mut st = self.state.lock();
        while st.got.len() < st.asked.len() {
            let mut tag = [0u8; 8];
            let (n, fds) = match fdpass::try_recv(socket.as_fd(), &mut tag) {
                Ok(Some(got)) => got,
                // Nothing there, or the socket failed (its hang-up is the
                // liveness look's to see).
                Ok(None) | Err(_) => return Ok(()),
            };
            if n == 0 {
                return Ok(()); // hung up
            }
            let tag = u64::from_le_bytes(tag);
            let asked = st.asked.contains(&tag) && !st.got.iter().any(|(t, _)| *t == tag);
            if n != 8 || fds.is_empty() || fds.len() > fdpass::MAX_FDS || !asked {
                return Err(Violation::UnaskedHandover { tag: if n == 8 { tag } else { 0 } });
            }
            st.got.push((tag, fds));
        }
        Ok(())
    }

    /// The descriptors for `tag`, which its answer announced (step 4).
    pub fn take(&self, tag: u64, socket: &UnixStream) -> Result<Vec<OwnedFd>, Violation> {
        self.receive(socket)?;
        let mut st = self.state.lock();
        if !st.asked.contains(&tag) {
            return Err(Violation::UnaskedHandover { tag });
        }
        let Some(i) = st.got.iter().position(|(t, _)| *t == tag) else {
            return Err(Violation::HandoverMissing { tag });
        };
        st.asked.retain(|t| *t != tag);
        Ok(st.got.swap_remove(i).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::shm_pair;
    use crate::transport::doorbell::Doorbell;
    use crate::transport::{Liveness, Transport};
    use rustix::fd::AsFd;
    use std::sync::Arc;

    fn memfd(text: &[u8]) -> OwnedFd {
        let fd = rustix::fs::memfd_create("ferry-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&fd, text).unwrap();
        fd
    }

    fn read_all(fd: &OwnedFd) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let n = rustix::io::pread(fd, &mut buf, 0).unwrap();
        buf[..n].to_vec()
    }

    fn pair() -> (crate::testing::ShmEnd, crate::testing::ShmEnd) {
        let bells = (Arc::new(Doorbell::create().unwrap()), Arc::new(Doorbell::create().unwrap()));
        shm_pair(1 << 16, 1 << 20, bells.0, bells.1).unwrap()
    }

    /// Asked, handed, taken (also after the liveness look took it off the
    /// socket first); a second take, or one before the handover, fails.
    #[test]
    fn an_asked_handover_reaches_its_call() {
        let (a, b) = pair();
        b.ask_handover(7).unwrap();
        b.ask_handover(8).unwrap();
        assert_eq!(b.take_handover(7).unwrap_err(), Violation::HandoverMissing { tag: 7 });
        let (one, two) = (memfd(b"segment one"), memfd(b"segment two"));
        a.hand_over(7, &[one.as_fd(), two.as_fd()]).unwrap();
        a.hand_over(8, &[one.as_fd()]).unwrap();
        // The reactor's look takes them off the socket, and keeps them.
        assert_eq!(b.check_liveness(), Liveness::Alive);
        let got = b.take_handover(7).unwrap();
        assert_eq!(got.iter().map(read_all).collect::<Vec<_>>(), [b"segment one".to_vec(), b"segment two".to_vec()]);
        assert_eq!(b.take_handover(8).unwrap().len(), 1);
        assert_eq!(b.take_handover(7).unwrap_err(), Violation::UnaskedHandover { tag: 7 });
        assert_eq!(b.check_liveness(), Liveness::Alive);
    }

    /// Descriptors nobody asked for (or for another call, or none with the
    /// tag) close the channel: a peer cannot make us keep what we did not ask for.
    #[test]
    fn an_unasked_handover_closes_the_channel() {
        let fd = memfd(b"x");
        let (a, b) = pair();
        a.hand_over(9, &[fd.as_fd()]).unwrap();
        assert_eq!(b.check_liveness(), Liveness::Closed);

        let (a, b) = pair();
        b.ask_handover(1).unwrap();
        a.hand_over(2, &[fd.as_fd()]).unwrap();
        assert_eq!(b.check_liveness(), Liveness::Closed, "a handover for another call");

        let (a, b) = pair();
        b.ask_handover(1).unwrap();
        let sock = a.socket.as_ref().unwrap();
        fdpass::send(sock.as_fd(), &1u64.to_le_bytes(), &[]).unwrap();
        assert_eq!(b.check_liveness(), Liveness::Closed, "a handover without descriptors");

        // An answer without its handover, and a call that stopped asking.
        let (_a, b) = pair();
        b.ask_handover(3).unwrap();
        b.unask_handover(3);
        assert_eq!(b.take_handover(3).unwrap_err(), Violation::UnaskedHandover { tag: 3 });
    }

    #[test]
    fn asking_is_bounded() {
        let (a, b) = pair();
        for tag in 0..MAX_ASKED as u64 {
            b.ask_handover(tag).unwrap();
        }
        assert!(matches!(
            b.ask_handover(99),
            Err(crate::Error::LimitReached { limit: crate::Limit::Handovers, max }) if max == MAX_ASKED as u64
        ));
        assert!(matches!(a.hand_over(1, &[]), Err(crate::Error::InvalidArgument(_))));
    }
}
