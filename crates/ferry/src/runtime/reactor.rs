//! The reactor: one thread per team that sleeps in epoll on the team's
//! listening sockets (new binds: its Unix socket, and in a cluster the
//! node's TCP address, shared by the node's teams), on binds in progress,
//! and on every channel's liveness descriptor (`Transport::liveness_fd`:
//! for shared memory its bind socket, whose hang-up means the peer died).
//! It is never on the path of a message.
//!
//! A TCP bind is taken on a thread of its own, never the team's blocking
//! pool (its handshake has three steps), within one deadline, and only as
//! many at once as `handshakes` allows; one that names another team of
//! this node is handed to that team over its Unix socket (see `cluster`):
//! after its hello, or in TLS after its preamble, before TLS starts (a TLS
//! session cannot move to another process).
//!
//! It takes binds itself, with no thread per connection: a connection
//! waits in epoll for the connector's hello (one message), at most
//! `HANDSHAKE_TIMEOUT`, and the rest of the acceptor's side never waits.
//! A burst of connections costs a descriptor and a few words each, and at
//! most `MAX_PENDING` of them are kept.

use super::channel::Channel;
use super::cluster::Cluster;
use super::handshakes::{Full, Handshakes, Ticket};
use super::TeamInner;
use crate::error::{Error, Result};
use crate::transport::shm::area::{Cooler, COOL_AFTER};
use crate::transport::tcp::handshake::{Link, HELLO_BYTES};
use crate::transport::{shm, tcp, Liveness};
use parking_lot::Mutex;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, eventfd, EventfdFlags};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const LISTENER: u64 = 0;
const WAKE: u64 = 1;
const TCP_LISTENER: u64 = 2;
const COOL: u64 = 3;

/// Magic of a TCP connection handed over by another team of this node:
/// the message carries the connector's hello and the connection's fd.
const HANDED_OVER: &[u8; 8] = b"FERRYTHO";
/// Magic of a TCP connection in TLS handed over by another team of this
/// node, whose preamble was read: the message carries the team id the
/// preamble named (then zeros, to a hello's length) and the fd.
const HANDED_OVER_TLS: &[u8; 8] = b"FERRYTHT";

/// What a team that handed a TCP connection over had read of it.
pub(crate) enum Handed {
    /// The connector's hello.
    Hello([u8; HELLO_BYTES]),
    /// A TLS preamble naming this team (not answered yet).
    Tls(crate::id::TeamId),
}

/// Most connections to the team's Unix socket kept waiting for their hello;
/// past that the oldest is closed (a connector that is really binding sends
/// its hello at once).
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
    /// The node's TCP address, listened on by all its teams (in a cluster).
    tcp: Option<TcpListener>,
    /// TCP connections whose handshake is under way.
    handshakes: Arc<Handshakes>,
    watched: Mutex<HashMap<u64, Arc<Channel>>>,
    next_token: AtomicU64,
    /// Set once it stopped taking binds ([`Reactor::close`]).
    closed: AtomicBool,
    /// A descriptor kept in reserve: out of descriptors, the reactor lets
    /// it go to take a waiting bind and refuse it, naming the limit (else
    /// the connector would wait for its handshake's timeout). Taken again
    /// when binds are next taken.
    reserve: Mutex<Option<OwnedFd>>,
    /// Armed by the team's shared-memory ends when their payload areas
    /// hold pages to give back later: the reactor then cools every
    /// channel once per `COOL_AFTER` until none has such pages.
    pub(crate) cooler: Arc<Cooler>,
}

impl Reactor {
    pub fn new(path: &Path, tcp: Option<SocketAddr>, handshakes: Handshakes) -> Result<Reactor> {
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
        let cooler = Arc::new(Cooler::new()?);
        epoll::add(&ep, cooler.fd(), epoll::EventData::new_u64(COOL), epoll::EventFlags::IN)?;
        let tcp = tcp.map(listen_shared).transpose()?;
        if let Some(l) = &tcp {
            epoll::add(&ep, l, epoll::EventData::new_u64(TCP_LISTENER), epoll::EventFlags::IN)?;
        }
        Ok(Reactor {
            epoll: ep,
            listener,
            path: path.to_path_buf(),
            wake,
            tcp,
            handshakes: Arc::new(handshakes),
            watched: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(COOL + 1),
            closed: AtomicBool::new(false),
            reserve: Mutex::new(reserve_fd()),
            cooler,
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

    /// Arms the listeners (`true`) or has them rest (`false`: epoll does not
    /// report them).
    fn arm_listeners(&self, on: bool) {
        let flags = if on { epoll::EventFlags::IN } else { epoll::EventFlags::empty() };
        let _ = epoll::modify(&self.epoll, &self.listener, epoll::EventData::new_u64(LISTENER), flags);
        if let Some(l) = &self.tcp {
            let _ = epoll::modify(&self.epoll, l, epoll::EventData::new_u64(TCP_LISTENER), flags);
        }
    }

    /// Stops taking binds, once the reactor thread is gone: the socket file
    /// goes (connectors find no team), the listeners refuse, and connections
    /// already queued or in their handshake are closed, so their connectors
    /// see the team gone at once instead of waiting out a handshake. Done before the team number
    /// is released: a later team with the number makes the file again.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Both);
        while self.listener.accept().is_ok() {}
        if let Some(l) = &self.tcp {
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
            while l.accept().is_ok() {}
        }
        // Their threads end at once (each holds the team).
        self.handshakes.shut_all();
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.close();
    }
}

pub(crate) fn run(team: Arc<TeamInner>) {
    let r = &team.reactor;
    let mut events = Vec::with_capacity(32);
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    // While accepting fails (out of descriptors), the listeners rest until then.
    let mut resting: Option<Instant> = None;
    // When to cool the channels next (while some payload area holds pages above its warm part).
    let mut cool_at: Option<Instant> = None;
    while !team.is_shut_down() {
        events.clear();
        // Sleep until the first silent connection is due, the listeners' rest
        // ends, or the channels are to be cooled.
        let due = pending.values().map(|p| p.until).chain(resting).chain(cool_at);
        let timeout = due.chain(r.handshakes.next_deadline()).min().map(|until| {
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
            let accepted = match ev.data.u64() {
                WAKE => return,
                COOL => {
                    r.cooler.take_wake();
                    cool_at.get_or_insert_with(|| Instant::now() + COOL_AFTER);
                    continue;
                }
                LISTENER => accept_all(&team, &mut pending),
                TCP_LISTENER => accept_tcp(&team),
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
                    continue;
                }
            };
            if let Err(e) = accepted {
                if resting.is_none() {
                    // A connection the listener cannot take stays ready: without
                    // a rest, this loop would spin on it.
                    tracing::warn!(error = %e, "cannot take binds: the listeners rest {LISTENERS_REST:?}");
                    r.arm_listeners(false);
                    resting = Some(Instant::now() + LISTENERS_REST);
                }
            }
        }
        let now = Instant::now();
        if resting.is_some_and(|until| until <= now) {
            r.arm_listeners(true);
            resting = None;
        }
        let late = r.handshakes.expire(now);
        if late > 0 {
            tracing::warn!("shut {late} TCP connection(s) whose handshake took more than {:?}", shm::HANDSHAKE_TIMEOUT);
        }
        if cool_at.is_some_and(|at| at <= now) {
            cool_at = cool_channels(&team, now).then_some(now + COOL_AFTER);
        }
        let before = pending.len();
        pending.retain(|_, p| p.until > now);
        if pending.len() < before {
            let n = before - pending.len();
            tracing::warn!("closed {n} connection(s) that sent no bind hello within {:?}", shm::HANDSHAKE_TIMEOUT);
        }
    }
}

/// Gives back the memory the channels' transports did not need lately;
/// whether to come back in `COOL_AFTER`. Disarms the cooler first: an end
/// that finds pages to give back after its channel was looked at arms it
/// again (and wakes the reactor).
fn cool_channels(team: &TeamInner, now: Instant) -> bool {
    let r = &team.reactor;
    r.cooler.set_armed(false);
    let channels: Vec<Arc<Channel>> = r.watched.lock().values().cloned().collect();
    let mut again = false;
    for ch in &channels {
        again |= ch.transport.cool(now);
    }
    if again {
        r.cooler.set_armed(true);
    }
    again
}

/// How long the listeners rest after accepting failed (out of descriptors,
/// say) before they try again.
const LISTENERS_REST: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether an accept's failure is the listener's (it cannot take any
/// connection now: out of descriptors or memory) rather than one
/// connection's (aborted before it was taken).
fn listener_failed(e: &std::io::Error) -> bool {
    !matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EPERM))
}

/// Takes every connection waiting on the team's socket: each binds at
/// once if its hello is there, else waits in `pending`.
fn accept_all(team: &Arc<TeamInner>, pending: &mut HashMap<u64, Pending>) -> Result<()> {
    let r = &team.reactor;
    {
        let mut reserve = r.reserve.lock();
        if reserve.is_none() {
            *reserve = reserve_fd();
        }
    }
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
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            // Out of descriptors (what accept says first, whether or not a
            // bind waits): the reserve makes room to take one, which its
            // handshake refuses once its hello came, naming the limit.
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) && r.reserve.lock().take().is_some() => {}
            Err(e) if listener_failed(&e) => return Err(Error::io("accept a bind")(e)),
            Err(e) => tracing::debug!(error = %e, "a bind went away before it was taken"),
        }
    }
}

/// A descriptor to keep in reserve (see `Reactor::reserve`).
fn reserve_fd() -> Option<OwnedFd> {
    rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .ok()
}

/// Takes the connector's hello if it has come, and binds; hands the
/// connection back if it has not (it stays in epoll, or joins it). What
/// came is read once and then told apart (a hello, or a TCP connection
/// another team of this node hands over): a look before the read would let
/// a hand-over that came between them be read as a bad hello (and the TCP
/// connection's connector told `NoSuchTeam`).
fn handshake(team: &Arc<TeamInner>, p: Pending) -> Option<Pending> {
    #[cfg(test)]
    as_it_looks(team.id.team);
    // Room for a shared-memory hello or a hand-over, the larger.
    let mut buf = [0u8; 8 + HELLO_BYTES];
    let (n, fds) = match crate::sys::fdpass::try_recv(&p.stream, &mut buf) {
        Ok(Some(got)) => got,
        Ok(None) => return Some(p),
        Err(e) => {
            if let Error::LimitReached { limit, max } = e {
                shm::refuse(&p.stream, limit, max);
            }
            tracing::warn!(error = %e, "refused a bind");
            return None;
        }
    };
    let msg = &buf[..n];
    if msg.starts_with(HANDED_OVER) || msg.starts_with(HANDED_OVER_TLS) {
        take_handed_over(team, msg, fds);
        return None;
    }
    if let Err(Error::LimitReached { limit, max }) = team.room_for_a_channel() {
        // Refused once its hello was read (its descriptors closed with it):
        // the connector then waits for our answer, and a socket closed with
        // unread data would reset its read.
        tracing::warn!("refused a bind: {}", Error::LimitReached { limit, max });
        shm::refuse(&p.stream, limit, max);
        return None;
    }
    let names = &team.names;
    let is_peer = |peer: crate::id::TeamId, pid, lease: Option<&std::fs::File>| match lease {
        Some(lock) => names.holds_lease(peer.team, lock),
        None => names.team_pid(peer.team) == Some(pid),
    };
    match shm::accept_hello(p.stream, msg, fds, &team.bind_config(), is_peer) {
        Ok((end, peer)) => {
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
        Liveness::Alive => {
            drop(rx);
            // The look reads the socket: it may have taken frames (and the
            // socket's edge, their one wake-up) while a woken thread found
            // the channel locked and went back to sleep. Wake one for them.
            if ch.needs_attention() {
                team.doorbell.ring_now();
            }
            return;
        }
        // The files of a dead team of this node (a team of another node has none here).
        Liveness::Gone if !team.is_shut_down() && ch.peer.node == team.id.node => {
            super::peers::sweep_dead_team(&team.names, ch.peer.team)
        }
        // Closed: by this team, or because the peer broke the protocol on
        // it; nothing was learnt of the peer's life. Gone at shutdown: the
        // sweep is for survivors.
        Liveness::Gone | Liveness::Closed => {}
    }
    // Known now, also to handles that hold no channel (and in a team no
    // thread drains before it next calls): the primitives' liveness flags.
    ch.gone.store(true, Ordering::Release);
    drop(rx);
    team.reactor.unwatch(ch);
    team.peer_hung_up();
}

/// A TCP listener on `addr` that the node's other teams share (`SO_REUSEPORT`).
fn listen_shared(addr: SocketAddr) -> Result<TcpListener> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() { AddressFamily::INET } else { AddressFamily::INET6 };
    let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &addr).map_err(|e| Error::io("bind the node's TCP address")(e.into()))?;
    rustix::net::listen(&fd, 128)?;
    Ok(TcpListener::from(fd))
}

/// Takes every TCP connection waiting on the node's address: each is bound
/// (or handed over) on a thread of its own, as `handshakes` allows.
fn accept_tcp(team: &Arc<TeamInner>) -> Result<()> {
    let r = &team.reactor;
    let Some(listener) = &r.tcp else { return Ok(()) };
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                if let Some(ticket) = admit(team, &stream, from.ip()) {
                    handshake_thread(team, ticket, stream, None);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if listener_failed(&e) => return Err(Error::io("accept a TCP bind")(e)),
            Err(e) => tracing::debug!(error = %e, "a TCP bind went away before it was taken"),
        }
    }
}

/// A place for a TCP connection's handshake, if the bounds allow one;
/// else it is refused at once (`LimitReached(Handshakes)` for a connector
/// that reads the refusal, or `LimitReached(OpenFiles)` if this process
/// is out of descriptors) and closed.
fn admit(team: &Arc<TeamInner>, stream: &TcpStream, from: IpAddr) -> Option<Ticket> {
    let (limit, max) = match team.reactor.handshakes.start(stream, from, shm::HANDSHAKE_TIMEOUT) {
        Ok(ticket) => return Some(ticket),
        Err(Full::Source(n)) => {
            tracing::warn!(%from, "{n} TCP handshakes from this address under way: refused another");
            (crate::Limit::Handshakes, n as u64)
        }
        Err(Full::Strangers) => {
            let n = super::handshakes::MAX_STRANGERS;
            tracing::warn!(%from, "{n} TCP handshakes from addresses that are no node's under way: refused another");
            (crate::Limit::Handshakes, n as u64)
        }
        Err(Full::OpenFiles) => {
            let n = crate::error::open_files_limit();
            tracing::warn!(%from, "out of descriptors (open-files limit {n}): refused a TCP connection");
            (crate::Limit::OpenFiles, n)
        }
    };
    // What came is read (a socket closed with unread bytes resets, and the
    // connector might lose the refusal); nothing waits for more.
    let _ = rustix::net::recv(stream, &mut [0u8; 64], rustix::net::RecvFlags::DONTWAIT);
    let refusal = limit.refusal(tcp::handshake::REFUSED, max);
    let _ = rustix::net::send(stream, &refusal, rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL);
    None
}

/// Runs a TCP connection's handshake on a thread of its own (bounded by
/// `handshakes`: the ticket's place), which ends with it.
fn handshake_thread(team: &Arc<TeamInner>, ticket: Ticket, stream: TcpStream, handed: Option<Handed>) {
    let t = team.clone();
    let started = std::thread::Builder::new().name(format!("ferry-handshake-{}", team.id.team)).spawn(move || {
        tcp_bind(&t, stream, handed, ticket);
    });
    if let Err(e) = started {
        tracing::warn!(error = %e, "refused a TCP bind: cannot start its thread");
    }
}

/// Takes a TCP bind (on its own thread, holding its `ticket`, its place
/// among the handshakes): reads what the connection opens with unless the
/// team that handed it over did (a hello, a name
/// query, or a TLS preamble: then TLS, and the hello or query in it), then
/// binds if it names this team, or hands it to the team of this node it
/// names. A node with TLS refuses a connection without, and the other way
/// round (both sides learn why: `Tls`).
fn tcp_bind(team: &Arc<TeamInner>, mut stream: TcpStream, handed: Option<Handed>, ticket: Ticket) {
    let Some(cluster) = team.cfg.cluster.clone() else { return };
    let side = team.tcp_bind(&cluster);
    let _ = stream.set_nonblocking(false);
    let refused = |e: Error| tracing::warn!(error = %e, "refused a TCP bind");
    // The link, its first 8 bytes (read), and whom its TLS preamble named.
    let (mut link, magic, tls_for) = match handed {
        Some(Handed::Hello(hello)) => {
            return accept(team, Link::Plain(stream), hello, &side, ticket);
        }
        Some(Handed::Tls(to)) => match start_tls(stream, &side) {
            Ok((link, magic)) => (link, magic, Some(to)),
            Err(e) => return refused(e),
        },
        None => {
            // A bind, a name query from another node, or TLS (its first 8 bytes say).
            let mut magic = [0u8; 8];
            let read = stream.set_read_timeout(Some(side.patience)).and_then(|()| stream.read_exact(&mut magic));
            if let Err(e) = read {
                return tracing::debug!(error = %e, "a TCP connection closed before saying what it wants");
            }
            if &magic == tcp::handshake::TLS_START {
                let to = match tcp::handshake::read_tls_start_rest(&mut stream, team.id) {
                    Ok(to) => to,
                    Err(e) => return refused(e),
                };
                if to.node == team.id.node && to.team != 0 && to.team != team.id.team {
                    return hand_over(team, stream, Handed::Tls(to), to);
                }
                match start_tls(stream, &side) {
                    Ok((link, magic)) => (link, magic, Some(to)),
                    Err(e) => return refused(e),
                }
            } else if side.tls.is_some() {
                return refused(tcp::handshake::refuse_plain(stream, side.patience));
            } else {
                (Link::Plain(stream), magic, None)
            }
        }
    };
    if &magic == crate::names::remote::QUERY {
        if tls_for.is_some_and(|to| to.team != 0) {
            return tracing::warn!("refused a name query in TLS opened for a team");
        }
        if let Err(e) = crate::names::remote::answer(link, &cluster.key, &team.names, side.patience) {
            tracing::warn!(error = %e, "refused a name query");
        }
        return;
    }
    let (hello, to) = match tcp::handshake::read_hello_rest(&mut link, magic, side.patience, team.id) {
        Ok(got) => got,
        Err(e) => return refused(e),
    };
    match tls_for {
        // In TLS the preamble said whom, and the connection stays here.
        Some(said) if said != to => refused(Error::Protocol {
            peer: to,
            violation: crate::error::Violation::PreambleMismatch { preamble: said, hello: to },
        }),
        Some(_) if to.node != team.id.node || to.team != team.id.team => {
            tracing::debug!(%to, "refused a TCP bind in TLS for a team that is not here")
        }
        Some(_) => accept(team, link, hello, &side, ticket),
        None if to.team != team.id.team || to.node != team.id.node => {
            let Link::Plain(stream) = link else { unreachable!("no TLS here") };
            hand_over(team, stream, Handed::Hello(hello), to)
        }
        None => accept(team, link, hello, &side, ticket),
    }
}

/// Answers a TLS preamble and reads the first 8 bytes in TLS.
fn start_tls(stream: TcpStream, side: &tcp::handshake::TcpBind) -> Result<(Link, [u8; 8])> {
    let mut link = tcp::handshake::start_tls(stream, side)?;
    let mut magic = [0u8; 8];
    link.read_exact(&mut magic).map_err(|e| {
        let closed = Error::Protocol {
            peer: tcp::tls::UNKNOWN,
            violation: crate::error::Violation::ClosedBefore(crate::error::HandshakeMessage::Opening),
        };
        tcp::handshake::read_failed(e, tcp::tls::UNKNOWN, closed)
    })?;
    Ok((link, magic))
}

/// The bind handshake's last steps, and the channel.
fn accept(team: &Arc<TeamInner>, link: Link, hello: [u8; HELLO_BYTES], side: &tcp::handshake::TcpBind, ticket: Ticket) {
    if let Err(Error::LimitReached { limit, max }) = team.room_for_a_channel() {
        tracing::warn!("refused a TCP bind: {}", Error::LimitReached { limit, max });
        return tcp::handshake::refuse(link, limit, max);
    }
    let may_be = may_be(team, &link);
    match tcp::handshake::accept_hello_from(link, hello, side, may_be) {
        Ok((end, peer)) => {
            #[cfg(test)]
            run_hook(&AT_THE_DEADLINE, team.id.team);
            // Given back before the connection is a channel's: a place
            // past its deadline would be shut with the channel's socket.
            // Shut at its deadline just now (after `ACCEPTED`): the channel
            // would be born dead, so there is none (the connector's ends).
            if !ticket.finish() {
                return tracing::warn!(%peer, "refused a TCP bind: its handshake's deadline passed as it ended");
            }
            team.add_channel(Arc::new(Channel::new(peer, Box::new(end))));
            tracing::debug!(me = %team.id, %peer, "accepted TCP channel");
        }
        Err(e) => tracing::warn!(error = %e, "refused a TCP bind"),
    }
}

/// Whether a connector on `link`, which proved the key, may be the team it
/// claims: one of a node of the cluster file, with TLS whose certificate is
/// valid for the node's `peer` address, else which connects from that
/// address (or from a block its `peer ... from` line allows). Best effort
/// without TLS: a node holding the key can send from another's address if
/// the network lets it (the key is shared; it cannot tell the nodes apart).
fn may_be(team: &TeamInner, link: &Link) -> impl FnOnce(crate::id::TeamId) -> std::result::Result<(), String> {
    let cluster = team.cfg.cluster.clone();
    let source = link.socket().peer_addr().map(|a| a.ip());
    // With TLS: the nodes whose address its certificate is valid for.
    let certified: Option<Vec<u16>> = match (link, &cluster) {
        (Link::Tls(t), Some(c)) => {
            let nodes = c.peers.keys().copied().chain([c.node]);
            Some(nodes.filter(|&n| c.address_of(n).is_some_and(|a| tcp::tls::certified_for(t, a.ip()))).collect())
        }
        _ => None,
    };
    move |peer| match cluster {
        Some(c) => claim_allowed(&c, certified.as_deref(), source, peer.node),
        None => Ok(()),
    }
}

/// Whether a connector that proved the key may be node `node` of `c`:
/// never this node (teams of one node always bind over shared memory, so a
/// TCP claim of it is never honest: it would take the route to our own
/// team), else as [`may_be`] says (`certified`: the nodes its TLS
/// certificate is valid for; `source`: its address).
fn claim_allowed(
    c: &Cluster,
    certified: Option<&[u16]>,
    source: std::io::Result<IpAddr>,
    node: u16,
) -> std::result::Result<(), String> {
    if node == c.node {
        return Err(format!("it claims node {node}, this node (whose teams bind over shared memory)"));
    }
    if c.address_of(node).is_none() {
        return Err(format!("node {node} is not in this node's cluster file"));
    }
    if let Some(nodes) = certified {
        return match nodes.contains(&node) {
            true => Ok(()),
            false => Err(format!("its TLS certificate is not valid for node {node}'s address")),
        };
    }
    match source {
        Ok(ip) if c.may_come_from(node, ip) => Ok(()),
        Ok(ip) => Err(format!(
            "it claims node {node} from {ip}, not that node's address (a `peer N ADDR from CIDR` line allows others)"
        )),
        Err(e) => Err(format!("its address is unknown ({e})")),
    }
}

/// Hands a TCP connection whose hello (or TLS preamble) names another team
/// of this node to that team (over its Unix socket); closes it if there is
/// no such team.
fn hand_over(team: &Arc<TeamInner>, stream: TcpStream, read: Handed, to: crate::id::TeamId) {
    if to.node != team.id.node {
        return tracing::warn!(%to, "refused a TCP bind for a team of another node");
    }
    let path = team.names.dir().team_socket(to.team);
    let unix = match UnixStream::connect(&path) {
        Ok(unix) => unix,
        Err(e) => {
            if let (Handed::Hello(_), Error::LimitReached { limit, max }) = (&read, Error::io("connect")(e)) {
                // We are out of descriptors, not the team gone: the connector is told so.
                tracing::warn!(%to, "refused a TCP bind: {}", Error::LimitReached { limit, max });
                return tcp::handshake::refuse(Link::Plain(stream), limit, max);
            }
            return tracing::debug!(%to, "refused a TCP bind for a team that is not here");
        }
    };
    let msg = handed_over_bytes(&read);
    if let Err(e) = crate::sys::fdpass::send(unix.as_fd(), &msg, &[stream.as_fd()]) {
        tracing::warn!(error = %e, %to, "could not hand a TCP bind over");
    }
}

/// What a handed-over message (a local peer's bytes) that came with `fds`
/// descriptors carries; `None` unless it is one such message whole, with
/// the connection's descriptor.
pub(crate) fn handed_over(msg: &[u8], fds: usize) -> Option<Handed> {
    if msg.len() != 8 + HELLO_BYTES || fds != 1 {
        return None;
    }
    match &msg[..8] {
        m if m == HANDED_OVER => Some(Handed::Hello(msg[8..].try_into().ok()?)),
        m if m == HANDED_OVER_TLS => Some(Handed::Tls(tcp::handshake::get_id(&msg[8..20]))),
        _ => None,
    }
}

/// The message that hands a TCP connection (what was `read` of it) to
/// another team of this node (the connection's descriptor goes with it).
pub(crate) fn handed_over_bytes(read: &Handed) -> [u8; 8 + HELLO_BYTES] {
    let mut msg = [0u8; 8 + HELLO_BYTES];
    match read {
        Handed::Hello(hello) => {
            msg[..8].copy_from_slice(HANDED_OVER);
            msg[8..].copy_from_slice(hello);
        }
        Handed::Tls(to) => {
            msg[..8].copy_from_slice(HANDED_OVER_TLS);
            tcp::handshake::put_id(&mut msg[8..20], *to);
        }
    }
    msg
}

/// A TCP connection another team of this node handed over (its message
/// `msg`, read, and the descriptors that came with it): the bind goes on
/// (on a thread of its own, if `handshakes` allows) from the hello (or
/// TLS preamble) that team read.
fn take_handed_over(team: &Arc<TeamInner>, msg: &[u8], mut fds: Vec<OwnedFd>) {
    let Some(read) = handed_over(msg, fds.len()) else {
        return tracing::warn!("a TCP bind handed over came with {} bytes and {} descriptors", msg.len(), fds.len());
    };
    let Some(fd) = fds.pop() else { return };
    let stream = TcpStream::from(fd);
    let Ok(from) = stream.peer_addr() else { return };
    if let Some(ticket) = admit(team, &stream, from.ip()) {
        handshake_thread(team, ticket, stream, Some(read));
    }
}

/// Tests: run once by the reactor of team `.0` as it looks at a bind's
/// connection, before it reads what came: what the hook sends comes as
/// the reactor looks.
#[cfg(test)]
pub(crate) static AS_IT_LOOKS: Mutex<Option<(u32, Hook)>> = Mutex::new(None);

/// Tests: run once by team `.0` as a TCP bind's handshake has succeeded,
/// before its connection becomes a channel (when the deadline may pass).
#[cfg(test)]
pub(crate) static AT_THE_DEADLINE: Mutex<Option<(u32, Hook)>> = Mutex::new(None);

#[cfg(test)]
type Hook = Box<dyn FnOnce() + Send>;

#[cfg(test)]
fn as_it_looks(team: u32) {
    run_hook(&AS_IT_LOOKS, team);
}

/// Runs `hook` if it is team `team`'s (once).
#[cfg(test)]
fn run_hook(hook: &Mutex<Option<(u32, Hook)>>, team: u32) {
    let mut hook = hook.lock();
    if let Some((_, f)) = hook.take_if(|(t, _)| *t == team) {
        drop(hook);
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Checkpoint;
    use crate::Team;
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::time::Duration;

    /// Defect 13 of issue 15 (a send to a live team of another node failed
    /// `NoSuchTeam`, once in a soak): a TCP bind that node 1's team X took
    /// for team T, X hands over on T's Unix socket. T's reactor looked (a
    /// peek) for what came on that connection, then read it as a bind
    /// hello: a hand-over that came between the two was read as a bad
    /// hello, and the TCP connection closed on its connector. Here the
    /// hand-over comes just as the reactor looks; the bind must succeed.
    #[test]
    fn a_connection_handed_over_as_the_reactor_looks_is_taken() {
        let key: Arc<[u8]> = Arc::from(&b"a cluster key of more than 16 bytes"[..]);
        let free = crate::testing::free_loopback_addr;
        // Node 1's address in node 2's cluster is the test's, which plays X.
        let x = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (listen1, listen2) = (free(), free());
        let cluster = |node: u16, listen, peer: u16, at| Cluster {
            node,
            listen,
            peers: BTreeMap::from([(peer, at)]),
            key: key.clone(),
            tls: None,
            from: BTreeMap::new(),
            handshakes_per_source: None,
        };
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let t = Team::builder().runtime_dir(dirs[0].path()).cluster(cluster(1, listen1, 2, listen2)).start().unwrap();
        let c = Team::builder()
            .runtime_dir(dirs[1].path())
            .cluster(cluster(2, listen2, 1, x.local_addr().unwrap()))
            .start()
            .unwrap();
        let port = t.open_raw_port().unwrap();
        let to = c.raw_sender(port.id()).with_timeout(Duration::from_secs(5));
        let send = std::thread::spawn(move || to.send(b"x", Checkpoint::OnReceipt));
        // X takes node 2's connection and its hello, and hands them to T.
        let (tcp, _) = x.accept().unwrap();
        let mut hello = [0u8; HELLO_BYTES];
        (&tcp).read_exact(&mut hello).unwrap();
        let (give, take) = std::sync::mpsc::channel::<UnixStream>();
        let msg = handed_over_bytes(&Handed::Hello(hello));
        *AS_IT_LOOKS.lock() = Some((
            t.id().team,
            Box::new(move || {
                let unix = take.recv().unwrap();
                crate::sys::fdpass::send(unix.as_fd(), &msg, &[tcp.as_fd()]).unwrap();
                (&unix).flush().unwrap();
            }),
        ));
        let unix = UnixStream::connect(t.inner.names.dir().team_socket(t.id().team)).unwrap();
        give.send(unix.try_clone().unwrap()).unwrap();
        let r = send.join().unwrap();
        assert!(r.is_ok(), "a bind handed over as the reactor looked: {r:?}");
        assert_eq!(port.recv_timeout(Duration::from_secs(5)).unwrap().payload(), b"x");
        drop(unix);
    }

    /// Review of issue 15's defect 10: node 1 listens on `0.0.0.0` (common
    /// in containers), which let any source claim node 1, and nothing
    /// refused a TCP claim of the accepting node itself. A team holding the
    /// key that says it is node 1 (team S) binds to node 1's team T over
    /// TCP: refused with `Unauthenticated` (it took the route to our own team).
    #[test]
    fn a_tcp_claim_of_the_accepting_nodes_own_identity_is_refused() {
        let key: Arc<[u8]> = Arc::from(&b"a cluster key of more than 16 bytes"[..]);
        let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
        let elsewhere = std::net::TcpListener::bind("127.0.0.2:0").unwrap().local_addr().unwrap();
        let cluster = |listen| Cluster {
            node: 1,
            listen,
            peers: BTreeMap::from([(2, "127.0.0.9:1".parse().unwrap())]),
            key: key.clone(),
            tls: None,
            from: BTreeMap::new(),
            handshakes_per_source: None,
        };
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let listen: SocketAddr = ([0, 0, 0, 0], port).into();
        let t = Team::builder().runtime_dir(dirs[0].path()).cluster(cluster(listen)).start().unwrap();
        let s = Team::builder().runtime_dir(dirs[1].path()).cluster(cluster(elsewhere)).start().unwrap();
        let side = s.inner.tcp_bind(&cluster(elsewhere));
        let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let r = tcp::handshake::connect(sock, &side, t.id());
        assert!(matches!(r, Err(Error::Unauthenticated { .. })), "{:?}", r.map(|_| ()));
    }

    /// Review of issue 15's defect 3: the reactor could shut a TCP
    /// handshake's connection at its deadline between the final
    /// `ACCEPTED` and the ticket's return, and the team took the connection
    /// as a channel already dead. Here the deadline passes just then: no
    /// channel is added. (T is a blocking team: nothing of its own would
    /// drain a dead channel out of its list.)
    #[test]
    fn a_handshake_shut_at_its_deadline_as_it_ends_adds_no_channel() {
        let [one, two] = super::super::cluster::loopback_pair();
        let addrs = [one.listen, two.listen];
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let t = Team::builder().blocking().runtime_dir(dirs[0].path()).cluster(one).start().unwrap();
        let c = Team::builder().blocking().runtime_dir(dirs[1].path()).cluster(two.clone()).start().unwrap();
        let inner = t.inner.clone();
        let deadline_passes = move || {
            inner.reactor.handshakes.expire(Instant::now() + Duration::from_secs(3600));
        };
        *AT_THE_DEADLINE.lock() = Some((t.id().team, Box::new(deadline_passes)));
        let before = t.inner.channels.len();
        let side = c.inner.tcp_bind(&two);
        // The connector is told `ACCEPTED` (before the deadline passed).
        let _end = tcp::handshake::connect(TcpStream::connect(addrs[0]).unwrap(), &side, t.id()).unwrap();
        // Looked at without a pause: a dead channel would soon be reaped.
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            assert_eq!(t.inner.channels.len(), before, "a channel born dead was added");
            std::thread::yield_now();
        }
        assert!(AT_THE_DEADLINE.lock().is_none(), "the hook did not run");
    }
}
