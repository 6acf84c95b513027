//! The reactor: one thread per team that sleeps in epoll on the team's
//! listening socket (new binds) and on every channel's bind socket (a
//! hang-up means the peer died). It is never on the path of a message.

use super::channel::Channel;
use super::TeamInner;
use crate::error::{Error, Result};
use crate::transport::shm;
use parking_lot::Mutex;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const LISTENER: u64 = 0;
const WAKE: u64 = 1;

pub(crate) struct Reactor {
    epoll: OwnedFd,
    listener: UnixListener,
    path: PathBuf,
    wake: OwnedFd,
    watched: Mutex<HashMap<u64, Arc<Channel>>>,
    next_token: AtomicU64,
}

impl Reactor {
    pub fn new(path: &Path) -> Result<Reactor> {
        // A stale socket file of a dead team with our number was swept with its lease.
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(Error::io("bind team socket"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(Error::io("chmod team socket"))?;
        listener.set_nonblocking(true).map_err(Error::io("team socket"))?;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(&ep, &listener, epoll::EventData::new_u64(LISTENER), epoll::EventFlags::IN)?;
        epoll::add(&ep, &wake, epoll::EventData::new_u64(WAKE), epoll::EventFlags::IN)?;
        Ok(Reactor {
            epoll: ep,
            listener,
            path: path.to_path_buf(),
            wake,
            watched: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(2),
        })
    }

    /// Starts watching a channel's bind socket for hang-up.
    pub fn watch(&self, ch: &Arc<Channel>) {
        let Some(sock) = &ch.socket else { return };
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        self.watched.lock().insert(token, ch.clone());
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if epoll::add(&self.epoll, sock, epoll::EventData::new_u64(token), flags).is_err() {
            self.watched.lock().remove(&token);
            ch.mark_gone();
        }
    }

    pub fn unwatch(&self, ch: &Arc<Channel>) {
        let mut w = self.watched.lock();
        w.retain(|_, c| !Arc::ptr_eq(c, ch));
        if let Some(sock) = &ch.socket {
            let _ = epoll::delete(&self.epoll, sock);
        }
    }

    pub fn stop(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(crate) fn run(team: Arc<TeamInner>) {
    let r = &team.reactor;
    let mut events = Vec::with_capacity(32);
    while !team.is_shut_down() {
        events.clear();
        if let Err(e) = epoll::wait(&r.epoll, spare_capacity(&mut events), None) {
            if e == rustix::io::Errno::INTR {
                continue;
            }
            tracing::error!(error = %e, "reactor: epoll_wait failed");
            return;
        }
        for ev in &events {
            match ev.data.u64() {
                WAKE => return,
                LISTENER => accept_all(&team),
                token => {
                    let ch = r.watched.lock().get(&token).cloned();
                    if let Some(ch) = ch {
                        check_hangup(&team, &ch);
                    }
                }
            }
        }
    }
}

fn accept_all(team: &Arc<TeamInner>) {
    loop {
        match team.reactor.listener.accept() {
            Ok((stream, _)) => {
                // The handshake may take up to its timeout: off the reactor
                // thread, so a silent connector cannot delay hang-up detection.
                let team = team.clone();
                let spawned = std::thread::Builder::new().name("ferry-bind".into()).spawn(move || {
                    if let Err(e) = accept_one(&team, stream) {
                        tracing::warn!(error = %e, "refused a bind");
                    }
                });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a bind thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return;
            }
        }
    }
}

fn accept_one(team: &Arc<TeamInner>, stream: UnixStream) -> Result<()> {
    stream.set_nonblocking(false).map_err(Error::io("bind socket"))?;
    let names = &team.names;
    let (end, peer) = shm::accept(&stream, &team.bind_config(), |peer, pid| names.team_pid(peer.team) == Some(pid))?;
    stream.set_nonblocking(true).map_err(Error::io("bind socket"))?;
    team.add_channel(Arc::new(Channel::new(peer, Box::new(end), Some(stream))));
    tracing::debug!(me = %team.id, %peer, "accepted shared-memory channel");
    Ok(())
}

/// The bind socket carries nothing after the handshake: readable means the
/// peer hung up (or, if bytes came, broke the protocol); either ends the channel.
fn check_hangup(team: &Arc<TeamInner>, ch: &Arc<Channel>) {
    let Some(sock) = &ch.socket else { return };
    let mut b = [0u8; 1];
    match rustix::net::recv(sock.as_fd(), &mut b, rustix::net::RecvFlags::DONTWAIT) {
        Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => return,
        Ok((1, _)) => tracing::warn!(peer = %ch.peer, "peer wrote on its bind socket; closing the channel"),
        _ => {}
    }
    team.reactor.unwatch(ch);
    // Sends fail from now on; the channel is finished (its waiters failed)
    // only after the sweep, below.
    ch.transport.close();
    if !team.is_shut_down() {
        // Before the waiters learn of it: whoever sees `PeerGone` finds the
        // dead team's names and files gone (or being swept).
        super::peers::sweep_dead_team(&team.names, ch.peer.team);
    }
    team.peer_hung_up(ch);
}
