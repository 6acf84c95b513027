//! Peers: the channel to each peer team — found, bound on first use,
//! reclaimed when the peer is gone.

use super::channel::Channel;
use super::team::TeamInner;
use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::names::NodeNames;
use crate::transport::shm;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
pub(crate) struct Peers {
    /// The channel used to send to each peer team.
    map: Mutex<HashMap<u32, Arc<Channel>>>,
    /// Held while binding, so two threads never bind to one peer at once.
    connecting: Mutex<()>,
}

impl Peers {
    /// The live channel to `team`; `NoSuchTeam` if its number belongs to
    /// another incarnation now (numbers are unique among live teams, so the
    /// one asked for is gone).
    fn live(&self, team: TeamId) -> Result<Option<Arc<Channel>>> {
        match self.map.lock().get(&team.team).filter(|c| !c.is_gone()) {
            Some(c) if c.peer == team => Ok(Some(c.clone())),
            Some(_) => Err(Error::NoSuchTeam(team)),
            None => Ok(None),
        }
    }

    /// Makes `ch` the channel to its peer, unless a live one to the same
    /// incarnation is there already.
    fn insert(&self, ch: &Arc<Channel>) {
        let mut map = self.map.lock();
        match map.get(&ch.peer.team) {
            Some(old) if !old.is_gone() && old.peer == ch.peer => {}
            _ => {
                map.insert(ch.peer.team, ch.clone());
            }
        }
    }

    /// Forgets `ch` if it is the channel to its peer.
    fn remove(&self, ch: &Arc<Channel>) {
        let mut map = self.map.lock();
        if map.get(&ch.peer.team).is_some_and(|c| Arc::ptr_eq(c, ch)) {
            map.remove(&ch.peer.team);
        }
    }

    pub fn clear(&self) {
        self.map.lock().clear();
    }
}

impl TeamInner {
    /// The channel to `team`, binding one if there is none yet.
    pub fn channel_to(&self, team: TeamId) -> Result<Arc<Channel>> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        if team == self.id {
            return Ok(self.loopback.clone());
        }
        if team.node != self.id.node {
            return Err(Error::NoSuchTeam(team));
        }
        if let Some(ch) = self.peers.live(team)? {
            return Ok(ch);
        }
        let _one_at_a_time = self.peers.connecting.lock();
        if let Some(ch) = self.peers.live(team)? {
            return Ok(ch);
        }
        let path = self.names.dir().team_socket(team.team);
        let stream = std::os::unix::net::UnixStream::connect(&path).map_err(|_| Error::NoSuchTeam(team))?;
        // A team that exits while we bind resets or closes the socket: it is gone.
        let end = shm::connect(stream, &self.bind_config(), team)?;
        let ch = Arc::new(Channel::new(team, Box::new(end)));
        self.add_channel(ch.clone());
        tracing::debug!(me = %self.id, peer = %team, "bound shared-memory channel");
        Ok(ch)
    }

    /// Publishes a newly bound channel. The order matters: the channel is
    /// in `peers` and in the channel list before the reactor watches its
    /// liveness, because only a watched end can find the peer gone, and
    /// `finish_channel` must then find it everywhere it removes it from
    /// (else a peer that leaves at once leaks its channel until we exit).
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
        self.channels.update(|v| v.iter().filter(|c| !Arc::ptr_eq(c, ch)).cloned().collect());
        self.peers.remove(ch);
        self.reactor.unwatch(ch);
        // Tells the peer too (it may not know: a protocol violation is found here).
        ch.close();
        tracing::debug!(me = %self.id, peer = %ch.peer, "peer gone; channel reclaimed");
        self.calls.fail_channel(ch, || self.gone_error(ch));
        self.calls.orphan_channel(ch);
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
/// progress loop: it takes file locks and reads a directory). Its socket can hang up a moment
/// before the kernel drops its lock, so if it still looks alive, a short
/// background retry finishes the job.
pub(super) fn sweep_dead_team(names: &NodeNames, team: u32) {
    if !names.team_has_files(team) {
        return; // it left cleanly
    }
    if !names.team_alive(team) {
        names.sweep_team(team);
        return;
    }
    let names = names.clone();
    let _ = std::thread::Builder::new().name("ferry-sweep".into()).spawn(move || {
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(10));
            if !names.team_alive(team) {
                names.sweep_team(team);
                return;
            }
        }
    });
}
