//! The reactor: one thread per team that sleeps in epoll on the team's
//! listening socket (new binds), on binds in progress, and on every
//! channel's liveness descriptor (`Transport::liveness_fd`: for shared
//! memory its bind socket, whose hang-up means the peer died). It is never
//! on the path of a message.
//!
//! It takes binds itself, with no thread per connection: a connection
//! waits in epoll for the connector's hello (one message), at most
//! `HANDSHAKE_TIMEOUT`, and the rest of the acceptor's side never waits.
//! A burst of connections costs a descriptor and a few words each, and at
//! most `MAX_PENDING` of them are kept.

use super::channel::Channel;
use super::TeamInner;
use crate::error::{Error, Result};
use crate::transport::{shm, Liveness};
use parking_lot::Mutex;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const LISTENER: u64 = 0;
const WAKE: u64 = 1;

/// Most connections kept waiting for their hello; past that the oldest is
/// closed (a connector that is really binding sends its hello at once).
const MAX_PENDING: usize = 1024;

/// A connection whose hello has not come yet.
struct Pending {
    stream: UnixStream,
    /// Closed then if still silent.
    until: Instant,
}

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

    /// Starts watching a channel's liveness descriptor (for the peer's hang-up).
    pub fn watch(&self, ch: &Arc<Channel>) {
        let Some(fd) = ch.transport.liveness_fd() else { return };
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        self.watched.lock().insert(token, ch.clone());
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if epoll::add(&self.epoll, fd, epoll::EventData::new_u64(token), flags).is_err() {
            self.watched.lock().remove(&token);
            // Unwatched, its peer's death would go unseen: give it up now.
            ch.close();
        }
    }

    pub fn unwatch(&self, ch: &Arc<Channel>) {
        let mut w = self.watched.lock();
        w.retain(|_, c| !Arc::ptr_eq(c, ch));
        if let Some(fd) = ch.transport.liveness_fd() {
            let _ = epoll::delete(&self.epoll, fd);
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
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    while !team.is_shut_down() {
        events.clear();
        // Sleep until the first silent connection is due, if any.
        let timeout = pending.values().map(|p| p.until).min().map(|until| {
            let d = until.saturating_duration_since(Instant::now());
            // Rounded up to a millisecond: waking just before it is due would spin.
            rustix::event::Timespec::try_from(d.max(std::time::Duration::from_millis(1))).unwrap_or_default()
        });
        if let Err(e) = epoll::wait(&r.epoll, spare_capacity(&mut events), timeout.as_ref()) {
            if e == rustix::io::Errno::INTR {
                continue;
            }
            tracing::error!(error = %e, "reactor: epoll_wait failed");
            return;
        }
        for ev in &events {
            match ev.data.u64() {
                WAKE => return,
                LISTENER => accept_all(&team, &mut pending),
                token => {
                    if let Some(p) = pending.remove(&token) {
                        if let Some(p) = handshake(&team, p) {
                            pending.insert(token, p);
                        }
                        continue;
                    }
                    let ch = r.watched.lock().get(&token).cloned();
                    if let Some(ch) = ch {
                        check_hangup(&team, &ch);
                    }
                }
            }
        }
        let (now, before) = (Instant::now(), pending.len());
        pending.retain(|_, p| p.until > now);
        if pending.len() < before {
            let n = before - pending.len();
            tracing::warn!("closed {n} connection(s) that sent no bind hello within {:?}", shm::HANDSHAKE_TIMEOUT);
        }
    }
}

/// Takes every connection waiting on the team's socket: each binds at
/// once if its hello is there, else waits in `pending`.
fn accept_all(team: &Arc<TeamInner>, pending: &mut HashMap<u64, Pending>) {
    let r = &team.reactor;
    loop {
        match r.listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = stream.set_nonblocking(true) {
                    tracing::warn!(error = %e, "refused a bind: bind socket");
                    continue;
                }
                let until = Instant::now() + shm::HANDSHAKE_TIMEOUT;
                let Some(p) = handshake(team, Pending { stream, until }) else { continue };
                if pending.len() >= MAX_PENDING {
                    let oldest = pending.iter().min_by_key(|(_, p)| p.until).map(|(t, _)| *t);
                    if let Some(t) = oldest {
                        pending.remove(&t);
                        tracing::warn!("{MAX_PENDING} connections wait for their bind hello: closed the oldest");
                    }
                }
                let token = r.next_token.fetch_add(1, Ordering::Relaxed);
                let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
                match epoll::add(&r.epoll, &p.stream, epoll::EventData::new_u64(token), flags) {
                    Ok(()) => {
                        pending.insert(token, p);
                    }
                    Err(e) => tracing::warn!(error = %e, "refused a bind: cannot watch its socket"),
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

/// Takes the connector's hello if it has come, and binds; hands the
/// connection back if it has not (it stays in epoll, or joins it).
fn handshake(team: &Arc<TeamInner>, p: Pending) -> Option<Pending> {
    let names = &team.names;
    let is_peer = |peer: crate::id::TeamId, pid| names.team_pid(peer.team) == Some(pid);
    let Pending { stream, until } = p;
    match shm::accept(stream, &team.bind_config(), is_peer) {
        Ok(shm::Accepted::Waiting(stream)) => Some(Pending { stream, until }),
        Ok(shm::Accepted::Bound(end, peer)) => {
            // Watched from now on as the channel's liveness, under another token.
            let end: Box<dyn crate::transport::Transport> = end;
            if let Some(fd) = end.liveness_fd() {
                let _ = epoll::delete(&team.reactor.epoll, fd);
            }
            team.add_channel(Arc::new(Channel::new(peer, end)));
            tracing::debug!(me = %team.id, %peer, "accepted shared-memory channel");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a bind");
            None
        }
    }
}

/// A channel's liveness descriptor fired: the transport looks (and records
/// a hang-up: sends fail from then on). A gone peer's files are swept
/// before any thread can drain the channel to its `PeerGone` and fail the
/// waiters: the reactor holds the channel's receive side meanwhile (the
/// progress loop only `try_lock`s it), so whoever sees `PeerGone` finds the
/// dead team's names and files gone (or being swept).
fn check_hangup(team: &Arc<TeamInner>, ch: &Arc<Channel>) {
    let rx = ch.rx.lock();
    match ch.transport.check_liveness() {
        Liveness::Alive => return,
        Liveness::Gone if !team.is_shut_down() => super::peers::sweep_dead_team(&team.names, ch.peer.team),
        // Closed: by this team, or because the peer broke the protocol on
        // it; nothing was learnt of the peer's life. Gone at shutdown: the
        // sweep is for survivors.
        Liveness::Gone | Liveness::Closed => {}
    }
    drop(rx);
    team.reactor.unwatch(ch);
    team.peer_hung_up();
}
