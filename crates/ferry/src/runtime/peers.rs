//! Peers: the channel to each peer team — found, bound on first use,
//! reclaimed when the peer is gone.
//!
//! A bind (connect, then a handshake of up to 5 s) is made once per peer at
//! a time: the first caller starts it, later ones wait for it. A blocking
//! caller binds on its own thread; an async send never does: its bind runs
//! on one of the team's blocking threads, and the async sends made
//! meanwhile wait in the bind's queue, to go first, in order, once the
//! channel is there.

use super::channel::Channel;
use super::idle;
use super::outbox::Queued;
use super::panic_message;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::names::NodeNames;
use crate::transport::{shm, tcp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

#[derive(Default)]
pub(crate) struct Peers {
    /// The channel used to send to each peer team, by its node and number
    /// (numbers are pids: teams of different nodes, containers above all,
    /// often have the same one). The incarnation tells an entry's team from
    /// a later one with its number.
    map: Mutex<HashMap<(u16, u32), Arc<Channel>>>,
    /// Binds in progress, one per peer team: later callers wait for it
    /// (async sends queue in it) rather than bind again.
    binding: Mutex<HashMap<TeamId, Arc<Binding>>>,
    /// The last peer a failed bind lost posted frames of, and when it was
    /// told at `warn`: every poster to a dead team binds again and fails,
    /// so one death would fill the log (see `loss_is_news`).
    lost_told: Mutex<Option<(TeamId, Instant)>>,
}

/// A failed bind that lost frames to the peer told last is told again at
/// `warn` only this long after.
const LOST_TOLD_EVERY: Duration = Duration::from_secs(10);

/// A bind to one peer team, in progress or just done.
pub(crate) struct Binding {
    team: TeamId,
    state: Mutex<BindState>,
}

#[derive(Default)]
struct BindState {
    /// The outcome, once known.
    result: Option<Result<Arc<Channel>>>,
    /// Async sends made meanwhile, in order: the first on the channel.
    queue: Vec<Arc<Queued>>,
    /// Blocking callers waiting for the outcome.
    wakers: Vec<Waker>,
}

impl Binding {
    /// The channel, once bound.
    pub fn channel(&self) -> Option<Arc<Channel>> {
        self.outcome()?.ok()
    }

    /// The outcome, once known (`None` while it binds).
    pub fn outcome(&self) -> Option<Result<Arc<Channel>>> {
        self.state.lock().result.as_ref().map(|r| r.as_ref().cloned().map_err(Error::duplicate))
    }

    /// Queues the send `make` makes, to go out first once the channel is
    /// bound (`None`); or, if the bind is over, its outcome.
    pub fn join(&self, make: impl FnOnce() -> Arc<Queued>) -> Option<Result<Arc<Channel>>> {
        let mut s = self.state.lock();
        match &s.result {
            Some(r) => Some(r.as_ref().cloned().map_err(Error::duplicate)),
            None => {
                s.queue.push(make());
                None
            }
        }
    }

    fn poll(&self, cx: Option<&mut Context<'_>>) -> Poll<Result<Arc<Channel>>> {
        let mut s = self.state.lock();
        match (&s.result, cx) {
            (Some(r), _) => Poll::Ready(r.as_ref().cloned().map_err(Error::duplicate)),
            (None, Some(cx)) => {
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    s.wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
            (None, None) => Poll::Pending,
        }
    }
}

/// A bind handed to a blocking thread. If it never runs (the team left
/// first, or no thread could start), dropping it ends the bind.
struct BindJob {
    team: Arc<TeamInner>,
    bind: Option<Arc<Binding>>,
}

impl BindJob {
    fn run(mut self) {
        let bind = self.bind.take().expect("runs once");
        let _ = self.team.bind(&bind);
    }
}

impl Drop for BindJob {
    fn drop(&mut self) {
        if let Some(bind) = self.bind.take() {
            let e = match self.team.is_shut_down() {
                true => Error::Shutdown,
                false => Error::Refused(crate::error::Refusal::NoBlockingThread),
            };
            let _ = self.team.end_bind(&bind, Err(e));
        }
    }
}

/// Where sends to a peer team go.
pub(crate) enum Route {
    /// Its channel.
    Ready(Arc<Channel>),
    /// The bind making its channel.
    Binding(Arc<Binding>),
}

impl Peers {
    /// Whether frames lost to `team` at `now` are news: not if they were
    /// to the team told of last, within `LOST_TOLD_EVERY`.
    fn loss_is_news(&self, team: TeamId, now: Instant) -> bool {
        let mut told = self.lost_told.lock();
        if told.is_some_and(|(t, at)| t == team && now.duration_since(at) < LOST_TOLD_EVERY) {
            return false;
        }
        *told = Some((team, now));
        true
    }

    /// The live channel to `team`; `NoSuchTeam` if its node and number
    /// belong to another incarnation now, whose channel lives (they are
    /// unique among a node's live teams, so the one asked for is gone).
    fn live(&self, team: TeamId) -> Result<Option<Arc<Channel>>> {
        match self.map.lock().get(&route_key(team)).filter(|c| !c.is_gone()) {
            Some(c) if c.peer == team => Ok(Some(c.clone())),
            Some(_) => Err(Error::NoSuchTeam(team)),
            None => Ok(None),
        }
    }

    /// Makes `ch` the channel to its peer, unless a live one to the same
    /// incarnation is there already.
    fn insert(&self, ch: &Arc<Channel>) {
        let mut map = self.map.lock();
        match map.get(&route_key(ch.peer)) {
            Some(old) if !old.is_gone() && old.peer == ch.peer => {}
            _ => {
                map.insert(route_key(ch.peer), ch.clone());
            }
        }
    }

    /// Forgets `ch` if it is the channel to its peer.
    fn remove(&self, ch: &Arc<Channel>) {
        let mut map = self.map.lock();
        if map.get(&route_key(ch.peer)).is_some_and(|c| Arc::ptr_eq(c, ch)) {
            map.remove(&route_key(ch.peer));
        }
    }

    pub fn clear(&self) {
        self.map.lock().clear();
    }
}

/// A route's key: the team's node and number (its incarnation aside).
fn route_key(team: TeamId) -> (u16, u32) {
    (team.node, team.team)
}

impl TeamInner {
    /// The channel to `team`, binding one on this thread if there is none
    /// yet (or waiting, driving the team, for a bind in progress).
    pub fn channel_to(&self, team: TeamId) -> Result<Arc<Channel>> {
        match self.find_route(team)? {
            (Route::Ready(ch), _) => Ok(ch),
            (Route::Binding(bind), true) => self.bind(&bind),
            (Route::Binding(bind), false) => idle::wait_until(self, |cx| bind.poll(cx)),
        }
    }

    /// Where sends to `team` go, never waiting: a bind it needs runs on a
    /// blocking thread, and the sends made meanwhile wait in it.
    pub fn route_async(self: &Arc<Self>, team: TeamId) -> Result<Route> {
        let (route, mine) = self.find_route(team)?;
        if let (Route::Binding(bind), true) = (&route, mine) {
            let job = BindJob { team: self.clone(), bind: Some(bind.clone()) };
            drop(self.blocking.spawn(move || job.run()));
        }
        Ok(route)
    }

    /// The channel to `team`, or the bind making it; `true` if that bind is
    /// new, for the caller to run.
    fn find_route(&self, team: TeamId) -> Result<(Route, bool)> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        if team == self.id {
            return Ok((Route::Ready(self.loopback.clone()), false));
        }
        if team.node != self.id.node && self.cfg.cluster.as_ref().and_then(|c| c.address_of(team.node)).is_none() {
            // Not in our cluster (or we are in none): out of reach.
            return Err(Error::NoSuchTeam(team));
        }
        if let Some(ch) = self.peers.live(team)? {
            return Ok((Route::Ready(ch), false));
        }
        let mut binding = self.peers.binding.lock();
        // Looked at again: a bind may have ended since.
        if let Some(ch) = self.peers.live(team)? {
            return Ok((Route::Ready(ch), false));
        }
        if let Some(bind) = binding.get(&team) {
            return Ok((Route::Binding(bind.clone()), false));
        }
        let bind = Arc::new(Binding { team, state: Mutex::new(BindState::default()) });
        binding.insert(team, bind.clone());
        Ok((Route::Binding(bind), true))
    }

    /// Runs a bind: connects and handshakes (blocking, up to the handshake
    /// timeout), then publishes the channel with the sends that waited.
    fn bind(&self, bind: &Arc<Binding>) -> Result<Arc<Channel>> {
        // Whatever happens, the bind ends: its waiters must not wait for good.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.connect(bind.team)))
            .unwrap_or_else(|p| Err(Error::Panicked(panic_message(&*p))));
        self.end_bind(bind, r)
    }

    fn connect(&self, team: TeamId) -> Result<Arc<Channel>> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        self.room_for_a_channel()?;
        if team.node != self.id.node {
            return self.connect_tcp(team);
        }
        let path = self.names.dir().team_socket(team.team);
        let stream = std::os::unix::net::UnixStream::connect(&path).map_err(unreachable(team))?;
        // A team that exits while we bind resets or closes the socket: it is gone.
        let end = shm::connect(stream, &self.connect_config(), team)?;
        tracing::debug!(me = %self.id, peer = %team, "bound shared-memory channel");
        Ok(Arc::new(Channel::new(team, Box::new(end))))
    }

    /// Binds to a team of another node of the cluster, over TCP.
    fn connect_tcp(&self, team: TeamId) -> Result<Arc<Channel>> {
        let cluster = self.cfg.cluster.as_ref().ok_or(Error::NoSuchTeam(team))?;
        let addr = cluster.address_of(team.node).ok_or(Error::NoSuchTeam(team))?;
        let side = self.tcp_bind(cluster);
        // A node at its bound of handshakes from our address is tried again
        // (other teams of this node bind there at once) within the bind's deadline.
        let deadline = std::time::Instant::now() + shm::HANDSHAKE_TIMEOUT;
        let end = tcp::handshake::retry_while_busy(deadline, |left| {
            // Nobody listening there (the node is down, or the link): out of reach.
            let sock = std::net::TcpStream::connect_timeout(&addr, left).map_err(unreachable(team))?;
            tcp::handshake::connect(sock, &side, team)
        })?;
        tracing::debug!(me = %self.id, peer = %team, %addr, "bound TCP channel");
        Ok(Arc::new(Channel::new(team, Box::new(end))))
    }

    /// Ends a bind with its outcome. The sends that waited for it join the
    /// channel's outbox before anyone else can find the channel (so no
    /// later send overtakes them), and are sent as far as there is room.
    fn end_bind(&self, bind: &Arc<Binding>, r: Result<Arc<Channel>>) -> Result<Arc<Channel>> {
        let (queue, wakers) = {
            let mut s = bind.state.lock();
            if let Some(ended) = &s.result {
                // Ended by the team's shutdown meanwhile.
                return ended.as_ref().cloned().map_err(Error::duplicate);
            }
            let queue = std::mem::take(&mut s.queue);
            if let Ok(ch) = &r {
                for q in &queue {
                    self.calls.ours.bind(q.call, ch.key());
                    ch.outbox.push(q.clone());
                }
            }
            s.result = Some(r.as_ref().cloned().map_err(Error::duplicate));
            (queue, std::mem::take(&mut s.wakers))
        };
        if let Ok(ch) = &r {
            self.add_channel(ch.clone());
        }
        {
            let mut binding = self.peers.binding.lock();
            if binding.get(&bind.team).is_some_and(|b| Arc::ptr_eq(b, bind)) {
                binding.remove(&bind.team);
            }
        }
        for w in wakers {
            w.wake();
        }
        match &r {
            Ok(ch) => {
                self.advance_outbox(ch, true);
                self.fail_immediate_sends(ch);
            }
            Err(e) => {
                // Frames posted meanwhile are lost, and nobody waits on
                // them: their primitives hear of it as of a channel gone.
                let posted = queue.iter().any(|q| q.is_unwatched());
                for q in queue {
                    q.fail(self, e.duplicate());
                }
                if posted && !self.is_shut_down() {
                    if self.peers.loss_is_news(bind.team, Instant::now()) {
                        tracing::warn!(me = %self.id, peer = %bind.team, error = %e, "a bind failed: frames posted to the team are lost");
                    } else {
                        tracing::debug!(me = %self.id, peer = %bind.team, error = %e, "a bind failed again: frames posted to the team are lost");
                    }
                    self.served.peer_gone(bind.team);
                }
            }
        }
        r
    }

    /// At shutdown: binds in progress end with `Shutdown` (what they finish later is dropped).
    pub(super) fn end_binds(&self) {
        let binds: Vec<_> = self.peers.binding.lock().values().cloned().collect();
        for bind in binds {
            let _ = self.end_bind(&bind, Err(Error::Shutdown));
        }
    }

    /// Publishes a newly bound channel. The order matters: the channel is
    /// in `peers` and in the channel list before the reactor watches its
    /// liveness, because only a watched end can find the peer gone, and
    /// `finish_channel` must then find it everywhere it removes it from
    /// (else a peer that leaves at once leaks its channel until we exit).
    /// `LimitReached` if the team has `max_channels` channels already.
    pub(crate) fn room_for_a_channel(&self) -> Result<()> {
        // The loop-back channel is in the list too.
        let max = self.cfg.max_channels;
        if self.channels.len() > max {
            return Err(Error::LimitReached { limit: crate::Limit::Channels, max: max as u64 });
        }
        Ok(())
    }

    pub(crate) fn add_channel(&self, ch: Arc<Channel>) {
        self.peers.insert(&ch);
        self.channels.update(|v| v.iter().chain([&ch]).cloned().collect());
        // A frame may have come (and rung) before the channel was in the list.
        self.doorbell.ring_now();
        self.reactor.watch(&ch);
        if self.is_shut_down() {
            // Shutdown took the channel list before this one joined it.
            ch.close();
            self.finish_channel(&ch);
        }
    }

    /// A channel whose peer is gone and which holds nothing more: fail what
    /// waits on it and forget it.
    pub(super) fn finish_channel(&self, ch: &Arc<Channel>) {
        if ch.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        ch.gone.store(true, Ordering::Release);
        self.channels.update(|v| v.iter().filter(|c| !Arc::ptr_eq(c, ch)).cloned().collect());
        self.peers.remove(ch);
        self.reactor.unwatch(ch);
        // Tells the peer too (it may not know: a protocol violation is found here).
        ch.close();
        tracing::debug!(me = %self.id, peer = %ch.peer, "peer gone; channel reclaimed");
        self.calls.ours.fail_waiting(Some(ch.key()), || self.gone_error(ch));
        self.fail_outbox(ch);
        self.calls.orphan_channel(ch);
        self.served.peer_gone(ch.peer);
    }

    /// Called by the reactor once the transport recorded the peer gone (or
    /// its end closed) and the dead team was swept.
    pub(crate) fn peer_hung_up(&self) {
        // Wake every sleeper: someone must drain what is left (up to the
        // transport's `PeerGone`) and fail the waiters.
        self.doorbell.ring_now();
    }

    pub(super) fn gone_error(&self, ch: &Channel) -> Error {
        if self.is_shut_down() {
            Error::Shutdown
        } else {
            Error::PeerGone { peer: ch.peer }
        }
    }
}

/// Removes a dead peer's names and files (on the reactor thread, never the
/// progress loop: it takes file locks and reads a directory). Its socket can
/// hang up a moment before the kernel drops its lock, so if it still looks
/// alive, the process's one sweeper thread looks again (see [`sweep_later`]).
pub(super) fn sweep_dead_team(names: &NodeNames, team: u32) {
    if !names.team_has_files(team) {
        return; // it left cleanly
    }
    if !names.team_alive(team) {
        names.sweep_team(team);
        return;
    }
    sweep_later(names, team);
}

/// How long the sweeper keeps looking at a team that hung up but still
/// holds its lock, and how often.
const SWEEP_PATIENCE: Duration = Duration::from_secs(3);
const SWEEP_EVERY: Duration = Duration::from_millis(10);

/// Teams that hung up while their lock was still held, with when to stop
/// looking; and whether the sweeper thread runs.
struct Later {
    teams: Vec<(NodeNames, u32, std::time::Instant)>,
    sweeping: bool,
}

static LATER: Mutex<Later> = Mutex::new(Later { teams: Vec::new(), sweeping: false });

/// Sweeps `team` once the kernel has dropped its lock, looking again every
/// [`SWEEP_EVERY`] for [`SWEEP_PATIENCE`] after its last hang-up.
///
/// One thread per process does it for every team that waits, and a team
/// waits once however often it hangs up: a live peer that binds and hangs
/// up in a loop (each hang-up looks like a death) used to start a thread
/// per hang-up, each looking for 3 s — hundreds of threads at once.
fn sweep_later(names: &NodeNames, team: u32) {
    let until = std::time::Instant::now() + SWEEP_PATIENCE;
    let mut later = LATER.lock();
    match later.teams.iter_mut().find(|(n, t, _)| *t == team && n.dir() == names.dir()) {
        Some(waiting) => waiting.2 = until,
        None => later.teams.push((names.clone(), team, until)),
    }
    if !later.sweeping {
        let started = std::thread::Builder::new().name("ferry-sweep".into()).spawn(sweeper);
        // Without a thread, the leftovers go when a lookup or a new team meets them.
        later.sweeping = started.is_ok();
        if !later.sweeping {
            later.teams.clear();
        }
    }
}

/// The sweeper thread: ends when no team waits.
fn sweeper() {
    loop {
        std::thread::sleep(SWEEP_EVERY);
        let teams = LATER.lock().teams.clone();
        let now = std::time::Instant::now();
        // Swept (`None`: gone for good), or given up as of its deadline then.
        let mut done = Vec::new();
        for (names, team, until) in &teams {
            if !names.team_alive(*team) {
                names.sweep_team(*team);
                done.push((names.dir(), *team, None));
            } else if now >= *until {
                done.push((names.dir(), *team, Some(*until)));
            }
        }
        let mut later = LATER.lock();
        // A team that hung up again meanwhile has a later deadline: it stays.
        later.teams.retain(|(n, t, until)| {
            !done.iter().any(|(dir, team, at)| team == t && *dir == n.dir() && at.is_none_or(|at| at == *until))
        });
        if later.teams.is_empty() {
            later.sweeping = false;
            return;
        }
    }
}

/// What a failed connect to `team` means: it is out of reach (nobody
/// listens there), unless this process is out of descriptors.
fn unreachable(team: TeamId) -> impl FnOnce(std::io::Error) -> Error {
    move |e| match Error::io("connect")(e) {
        limit @ Error::LimitReached { .. } => limit,
        _ => Error::NoSuchTeam(team),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One dead peer makes every poster's bind fail: the log hears of it
    /// once in `LOST_TOLD_EVERY`, and of another peer at once.
    #[test]
    fn lost_frames_to_one_peer_are_told_once_in_a_while() {
        let peers = Peers::default();
        let (a, b) = (TeamId { node: 0, team: 7, incarnation: 1 }, TeamId { node: 0, team: 8, incarnation: 1 });
        let t = Instant::now();
        assert!(peers.loss_is_news(a, t));
        assert!(!peers.loss_is_news(a, t + Duration::from_millis(3)));
        assert!(peers.loss_is_news(b, t + Duration::from_millis(4)));
        assert!(peers.loss_is_news(a, t + Duration::from_millis(5)));
        assert!(!peers.loss_is_news(a, t + Duration::from_secs(9)));
        assert!(peers.loss_is_news(a, t + Duration::from_secs(11)));
    }
}
