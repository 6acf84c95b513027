//! TCP connections not yet authenticated: each runs its handshake (or name
//! query) on a thread of its own, apart from the team's blocking pool, so a
//! stranger on the cluster port never delays `spawn_blocking`, binds or
//! name look-ups. Their number is bounded, so that no connection ever waits
//! for a thread: at most `per_source` at once from one address, and at most
//! `MAX_STRANGERS` in all from addresses that are no node's of the cluster
//! file (a node's address always has its own `per_source`). A connection
//! past either bound is closed at once. The whole handshake has one
//! deadline: the reactor shuts a connection still here then (a stranger
//! trickling a byte at a time cannot stretch it read by read). One that
//! succeeds as its deadline passes is dropped, not made a dead channel
//! (`Ticket::finish`). A connection refused for a bound is told so
//! (`LimitReached(Handshakes)`; `LimitReached(OpenFiles)` if the process
//! is out of descriptors); a connector refused for `Handshakes` tries
//! again within its deadline.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most handshakes at once from addresses that are no node's.
pub(crate) const MAX_STRANGERS: usize = 64;

/// The handshakes under way in a team (see the module's documentation).
pub(crate) struct Handshakes {
    state: Mutex<State>,
    per_source: usize,
    /// The cluster's nodes' addresses (theirs are not strangers).
    nodes: HashSet<IpAddr>,
}

#[derive(Default)]
struct State {
    live: HashMap<u64, Live>,
    from: HashMap<IpAddr, usize>,
    strangers: usize,
    next: u64,
}

struct Live {
    from: IpAddr,
    until: Instant,
    /// The connection (another descriptor of it), shut at `until`.
    sock: TcpStream,
    shut: bool,
}

/// Why a connection was not taken.
#[derive(Debug)]
pub(crate) enum Full {
    /// `per_source` handshakes from its address are under way.
    Source(usize),
    /// `MAX_STRANGERS` handshakes from addresses that are no node's.
    Strangers,
    /// The process is out of descriptors (the connection's second one,
    /// to shut it at its deadline, could not be made).
    OpenFiles,
}

/// One handshake's place; given back when dropped.
pub(crate) struct Ticket {
    of: Arc<Handshakes>,
    id: u64,
}

impl Handshakes {
    pub fn new(per_source: usize, nodes: impl IntoIterator<Item = IpAddr>) -> Handshakes {
        let nodes = nodes.into_iter().map(|a| a.to_canonical()).collect();
        Handshakes { state: Mutex::default(), per_source, nodes }
    }

    /// A place for a handshake on `sock` (from `from`) that must end
    /// within `patience`, if the bounds allow it.
    pub fn start(self: &Arc<Self>, sock: &TcpStream, from: IpAddr, patience: Duration) -> Result<Ticket, Full> {
        let from = from.to_canonical();
        let stranger = !self.nodes.contains(&from);
        let mut s = self.state.lock();
        let n = s.from.get(&from).copied().unwrap_or(0);
        if n >= self.per_source {
            return Err(Full::Source(self.per_source));
        }
        if stranger && s.strangers >= MAX_STRANGERS {
            return Err(Full::Strangers);
        }
        // Without a second descriptor it could not be shut at its deadline:
        // not taken (dup fails only for want of descriptors).
        let sock = sock.try_clone().map_err(|_| Full::OpenFiles)?;
        *s.from.entry(from).or_default() += 1;
        s.strangers += usize::from(stranger);
        s.next += 1;
        let id = s.next;
        s.live.insert(id, Live { from, until: Instant::now() + patience, sock, shut: false });
        Ok(Ticket { of: self.clone(), id })
    }

    /// When the first handshake under way is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.state.lock().live.values().filter(|l| !l.shut).map(|l| l.until).min()
    }

    /// Shuts every connection whose handshake is past its deadline: its
    /// thread's read or write fails at once, and it ends (giving its place
    /// back). Returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        self.shut(|l| l.until <= now)
    }

    /// Shuts every connection still in its handshake (the team leaves).
    pub fn shut_all(&self) {
        self.shut(|_| true);
    }

    fn shut(&self, due: impl Fn(&Live) -> bool) -> usize {
        let mut s = self.state.lock();
        let mut n = 0;
        for l in s.live.values_mut().filter(|l| !l.shut && due(l)) {
            let _ = l.sock.shutdown(std::net::Shutdown::Both);
            l.shut = true;
            n += 1;
        }
        n
    }

    /// Handshakes under way.
    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.state.lock().live.len()
    }
}

impl Ticket {
    /// Gives the place back as the handshake succeeds, before its
    /// connection becomes a channel's: false if it was shut at its
    /// deadline meanwhile (the channel would be born dead). Under the lock,
    /// so that `expire` shuts it either before (false) or never.
    pub fn finish(self) -> bool {
        self.give_back().is_some_and(|shut| !shut)
    }

    /// Gives the place back; whether its connection was shut (`None`: given back already).
    fn give_back(&self) -> Option<bool> {
        let mut s = self.of.state.lock();
        let l = s.live.remove(&self.id)?;
        if let Some(n) = s.from.get_mut(&l.from) {
            *n -= 1;
            if *n == 0 {
                s.from.remove(&l.from);
            }
        }
        if !self.of.nodes.contains(&l.from) {
            s.strangers -= 1;
        }
        Some(l.shut)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    #[test]
    fn bounds_per_source_and_for_strangers_and_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let node: IpAddr = "10.0.0.1".parse().unwrap();
        let hs = Arc::new(Handshakes::new(2, [node]));
        let (_c, s) = pair(&l);
        let patience = Duration::from_secs(60);
        let a = hs.start(&s, node, patience).unwrap();
        let _b = hs.start(&s, node, patience).unwrap();
        assert!(matches!(hs.start(&s, node, patience), Err(Full::Source(2))));
        drop(a);
        let _a = hs.start(&s, node, patience).unwrap();
        // Strangers: at most MAX_STRANGERS, whatever their addresses.
        let mut strangers = Vec::new();
        for i in 0..MAX_STRANGERS {
            let ip = IpAddr::from([192, 168, (i / 2) as u8, 1]);
            strangers.push(hs.start(&s, ip, patience).unwrap());
        }
        assert!(matches!(hs.start(&s, "192.168.200.1".parse().unwrap(), patience), Err(Full::Strangers)));
        strangers.clear();
        assert_eq!(hs.count(), 2);
        // Past its deadline, a connection is shut: its peer reads the end.
        let (mut c, s) = pair(&l);
        let t = hs.start(&s, "127.0.0.1".parse().unwrap(), Duration::ZERO).unwrap();
        assert!(hs.next_deadline().unwrap() <= Instant::now());
        assert_eq!(hs.expire(Instant::now()), 1);
        assert!(hs.next_deadline().unwrap() > Instant::now(), "an expired one is not due again");
        let mut b = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut c, &mut b).unwrap(), 0);
        drop(t);
        assert_eq!(hs.count(), 2);
        // A handshake that ends before its deadline keeps its connection;
        // one shut at its deadline first says so (its channel would be dead).
        let (mut c, s) = pair(&l);
        let t = hs.start(&s, "127.0.0.1".parse().unwrap(), patience).unwrap();
        assert!(t.finish(), "finished in time");
        assert_eq!(hs.count(), 2);
        hs.shut_all();
        (&s).write_all(b"alive").unwrap();
        assert_eq!(std::io::Read::read(&mut c, &mut b).unwrap(), 1, "a finished handshake's connection was shut");
        let (_c, s) = pair(&l);
        let t = hs.start(&s, "127.0.0.1".parse().unwrap(), Duration::ZERO).unwrap();
        assert_eq!(hs.expire(Instant::now()), 1);
        assert!(!t.finish(), "shut at its deadline");
        assert_eq!(hs.count(), 2);
        // When the team leaves, every one is shut.
        let (mut c, s) = pair(&l);
        let _t = hs.start(&s, "127.0.0.1".parse().unwrap(), patience).unwrap();
        hs.shut_all();
        assert_eq!(std::io::Read::read(&mut c, &mut b).unwrap(), 0);
    }
}
