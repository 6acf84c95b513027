//! A team's links: the ends it holds (by link id and side), its
//! listeners, and the handler of its link frames.

use super::end::{End, Link};
use super::route::{Control, Hop};
use super::wire::{self, status, Open};
use super::{LinkId, Side, Window, BACKLOG, KINDS};
use crate::error::{Error, Limit, Result};
use crate::extend::{FrameHandler, PerTeam, ServedFrame};
use crate::id::{EndpointId, TeamId};
use crate::port::RawSender;
use crate::runtime::{idle, TeamInner};
use crate::wire::Kind;
use crate::Team;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

static LINKS: PerTeam<Links> = PerTeam::new(KINDS);

/// How long `link_to` waits for the listener's team to answer.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A team's routers, by link, side and epoch (what full frames name) and
/// by handle (what short frames name: `wire::Short`).
#[derive(Default)]
struct Routers {
    /// (Peers choose the ids looked up here: the hash is seeded per
    /// process, not a fixed one as FxHash.)
    by_key: foldhash::HashMap<(LinkId, Side, u32), Arc<End>>,
    /// Slot `h - 1` holds the router whose handle is `h`.
    by_handle: Vec<Option<Arc<End>>>,
    /// Handles given back, for the next routers.
    free: Vec<u32>,
}

impl Routers {
    fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Adds `end` and gives it a handle. (Below `LINK_SLOTS`: `max_links`
    /// is at most `MAX_REGIONS`, far fewer.)
    fn insert(&mut self, end: Arc<End>) {
        let handle = self.free.pop().unwrap_or_else(|| {
            self.by_handle.push(None);
            self.by_handle.len() as u32
        });
        end.set_handle(handle);
        self.by_handle[handle as usize - 1] = Some(end.clone());
        self.by_key.insert((end.id, end.hop.side, end.hop.epoch), end);
    }

    fn remove(&mut self, key: (LinkId, Side, u32)) {
        if let Some(end) = self.by_key.remove(&key) {
            let handle = end.handle();
            if let Some(slot) = self.by_handle.get_mut((handle as usize).wrapping_sub(1)) {
                *slot = None;
                self.free.push(handle);
            }
        }
    }

    /// The router whose handle is `handle`.
    fn by_handle(&self, handle: u32) -> Option<Arc<End>> {
        self.by_handle.get((handle as usize).wrapping_sub(1))?.clone()
    }

    fn all(&self) -> Vec<Arc<End>> {
        self.by_key.values().cloned().collect()
    }
}

pub(super) struct Links {
    team: Weak<TeamInner>,
    /// The ends this team holds, and the proxies ends that moved away left.
    ends: Mutex<Routers>,
    /// Senders of link frames, by team.
    senders: Mutex<HashMap<TeamId, RawSender>>,
    listeners: Mutex<HashMap<u32, Arc<Listening>>>,
    counter: AtomicU64,
    /// Frames refused for coming off their link's route (`LinkRouters::off_route`).
    pub off_route: AtomicU64,
}

impl Links {
    fn of(team: &Team) -> Result<Arc<Links>> {
        Links::of_inner(&team.inner)
    }

    /// The links state of `team`, made on first use.
    pub fn of_inner(team: &Arc<TeamInner>) -> Result<Arc<Links>> {
        LINKS.of_inner(team, || Links {
            team: Arc::downgrade(team),
            ends: Mutex::default(),
            senders: Mutex::default(),
            listeners: Mutex::default(),
            counter: AtomicU64::new(0),
            off_route: AtomicU64::new(0),
        })
    }

    /// What an end of `team` grants its peer: the team's `link_window`,
    /// and messages whose frames are no larger than its `max_message` (the
    /// runtime refuses larger frames before a link sees them).
    pub(super) fn window(team: &TeamInner) -> Window {
        let (messages, bytes) = team.cfg.link_window;
        Window { messages, bytes, largest: team.cfg.max_message.saturating_sub(wire::FRAMING) as u64 }
    }

    /// A new end of this team's, registered, within the team's `max_links`.
    fn add_end(
        self: &Arc<Links>,
        team: &Arc<TeamInner>,
        id: LinkId,
        side: Side,
        peer: TeamId,
        window_out: Window,
    ) -> Result<Arc<End>> {
        let mut ends = self.ends.lock();
        if ends.len() >= team.cfg.max_links {
            return Err(Error::LimitReached { limit: Limit::Links, max: team.cfg.max_links as u64 });
        }
        let end = End::new(id, side, team.clone(), self.clone(), peer, Links::window(team), window_out);
        ends.insert(end.clone());
        Ok(end)
    }

    /// Registers a router made elsewhere (an end adopted here); `false`
    /// if one has its place (an end decoded twice) or the team holds its
    /// most ends.
    pub fn register(&self, team: &TeamInner, end: &Arc<End>) -> Result<()> {
        let mut ends = self.ends.lock();
        if ends.len() >= team.cfg.max_links {
            return Err(Error::LimitReached { limit: Limit::Links, max: team.cfg.max_links as u64 });
        }
        if ends.by_key.contains_key(&(end.id, end.hop.side, end.hop.epoch)) {
            return Err(Error::Codec(format!("{} arrived twice", end.id)));
        }
        ends.insert(end.clone());
        Ok(())
    }

    pub fn forget(&self, id: LinkId, hop: Hop) {
        self.ends.lock().remove((id, hop.side, hop.epoch));
    }

    /// A sender of link frames to `team` (`Shutdown` once this team left).
    pub fn sender(&self, team: TeamId) -> Result<RawSender> {
        let mut senders = self.senders.lock();
        if let Some(s) = senders.get(&team) {
            return Ok(s.clone());
        }
        let me = self.team.upgrade().ok_or(Error::Shutdown)?;
        let s = RawSender::of_team(me, team.endpoint(0).expect("slot 0 fits")).of_kind(Kind::Served(wire::FRAME));
        senders.insert(team, s.clone());
        Ok(s)
    }

    fn new_id(&self, team: TeamId) -> LinkId {
        LinkId::new(team, self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// An opening from `from` for the listener at `slot`.
    fn open(self: &Arc<Links>, from: TeamId, slot: u32, request: &[u8]) -> Vec<u8> {
        let refuse = |s: u8| vec![s];
        let (Some(team), Some(open)) = (self.team.upgrade(), Open::decode(request)) else {
            return refuse(status::NO_LISTENER);
        };
        let Some(listening) = self.listeners.lock().get(&slot).cloned() else { return refuse(status::NO_LISTENER) };
        let mut queue = listening.queue.lock();
        if queue.links.len() >= BACKLOG {
            return refuse(status::BACKLOG_FULL);
        }
        let Ok(end) = self.add_end(&team, open.link, Side::B, from, open.window) else {
            return refuse(status::TOO_MANY_LINKS);
        };
        queue.links.push_back(end.into_link());
        if let Some(w) = queue.waker.take() {
            w.wake();
        }
        let mut answer = vec![status::OPENED];
        answer.extend_from_slice(&wire::encode_window(Links::window(&team)));
        answer
    }

    /// A frame refused for coming off its link's route: counted and logged.
    pub(super) fn off_route(&self, from: TeamId, what: &str) {
        self.off_route.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%from, what, "a link's frame off its route");
    }

    /// A frame for a router that is not here (gone, or never here): its
    /// sender learns that its route broke here (`Gone`) — an end that
    /// adopted its place after its proxy gave up, say, would otherwise
    /// wait for that proxy for good. (A `Gone` is not answered.)
    pub(super) fn no_router(&self, from: TeamId, f: &wire::Frame<'_>) {
        if matches!(f.what, wire::What::Control(Control::Gone)) {
            return;
        }
        let gone = wire::Frame { link: f.link, to: f.from, from: f.to, what: wire::What::Control(Control::Gone) };
        if let Ok(sender) = self.sender(from) {
            let _ = sender.post(&gone.encode());
        }
    }
}

/// The router handle a frame's slot names (`LINK_SLOTS + handle`), if
/// it names one.
pub(super) fn handle(slot: u32) -> Option<u32> {
    slot.checked_sub(crate::id::LINK_SLOTS).filter(|&h| h != 0)
}

/// The slot that names router handle `handle` (at most `MAX_REGIONS`).
pub(super) fn slot(handle: u32) -> u32 {
    crate::id::LINK_SLOTS + handle
}

impl FrameHandler for Links {
    fn serve(&self, frame: ServedFrame<'_>) {
        let from = frame.from().team_id();
        match frame.kind() {
            wire::FRAME => frame.with_payload(|b| {
                let f = match wire::Frame::decode(b) {
                    Ok(f) => f,
                    Err(e) => return tracing::warn!(%from, error = %e, "a malformed link frame"),
                };
                let end = self.ends.lock().by_key.get(&(f.link, f.to.0, f.to.1)).cloned();
                match end {
                    Some(end) => end.arrive(from, handle(frame.from().slot()), f),
                    None => self.no_router(from, &f),
                }
            }),
            wire::SHORT => frame.with_payload(|b| {
                let short = match wire::Short::decode(b) {
                    Ok(f) => f,
                    Err(e) => return tracing::warn!(%from, error = %e, "a malformed short link frame"),
                };
                let (src, dst) = (handle(frame.from().slot()), handle(frame.slot()));
                match dst.and_then(|h| self.ends.lock().by_handle(h)) {
                    Some(end) => end.arrive_short(from, src, short),
                    None => self.off_route(from, "a short frame for no router here"),
                }
            }),
            wire::OPEN => {
                // The ends it makes hold their table (to leave it when dropped).
                let Some(me) = self.team.upgrade().and_then(|t| LINKS.find(t.id)) else { return };
                let answer = frame.with_payload(|b| me.open(from, frame.slot(), b));
                let _ = frame.reply(&answer);
            }
            _ => frame.refuse("no such link frame kind"),
        }
    }

    fn peer_gone(&self, peer: TeamId) {
        let ends = self.ends.lock().all();
        for end in ends {
            end.peer_gone(peer);
        }
        self.senders.lock().remove(&peer);
    }
}

/// What [`Team::link_routers`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkRouters {
    /// Link ends held (or closed and still answering their route).
    pub ends: usize,
    /// Proxies left by ends that moved away, forwarding until bypassed.
    pub proxies: usize,
    /// Frames refused since the team started because they came off their
    /// link's route: a peer's forgery, or (between teams that follow the
    /// protocol) a defect.
    pub off_route: u64,
}

/// A listener's queue of links made for it.
struct Listening {
    queue: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    links: VecDeque<Link>,
    waker: Option<Waker>,
    closed: bool,
}

/// Where other teams make links to this team ([`Team::link_to`]): each
/// link made comes out of [`LinkListener::accept`] as this team's end.
pub struct LinkListener {
    links: Arc<Links>,
    team: Arc<TeamInner>,
    id: EndpointId,
    name: Option<String>,
    listening: Arc<Listening>,
}

impl LinkListener {
    /// Its endpoint id, for [`Team::link_to`].
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// The next link made for it (this team's end of it).
    pub async fn accept(&self) -> Result<Link> {
        poll_fn(|cx| self.poll_accept(Some(cx))).await
    }

    /// [`LinkListener::accept`], blocking this thread.
    pub fn accept_blocking(&self) -> Result<Link> {
        idle::wait_until(&self.team, |cx| self.poll_accept(cx))
    }

    /// A link if one waits.
    pub fn try_accept(&self) -> Option<Link> {
        self.listening.queue.lock().links.pop_front()
    }

    fn poll_accept(&self, cx: Option<&mut std::task::Context<'_>>) -> Poll<Result<Link>> {
        let mut q = self.listening.queue.lock();
        if let Some(link) = q.links.pop_front() {
            return Poll::Ready(Ok(link));
        }
        if q.closed || self.team.is_shut_down() {
            return Poll::Ready(Err(Error::Shutdown));
        }
        if let Some(cx) = cx {
            q.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for LinkListener {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            self.team.unregister_name(name);
        }
        self.links.listeners.lock().remove(&self.id.slot());
        // The links nobody accepted are closed (dropped after the lock is let go).
        let left = {
            let mut q = self.listening.queue.lock();
            q.closed = true;
            std::mem::take(&mut q.links)
        };
        drop(left);
    }
}

impl Team {
    /// A link whose two ends are both this team's (hand one to another
    /// team inside a message once ends can move).
    pub fn link_pair(&self) -> Result<(Link, Link)> {
        let links = Links::of(self)?;
        let id = links.new_id(self.id());
        let w = Links::window(&self.inner);
        let a = links.add_end(&self.inner, id, Side::A, self.id(), w)?;
        let b = match links.add_end(&self.inner, id, Side::B, self.id(), w) {
            Ok(b) => b,
            Err(e) => {
                links.forget(id, a.hop);
                return Err(e);
            }
        };
        Ok((a.into_link(), b.into_link()))
    }

    /// The routers of links this team has now: the ends it holds, and the
    /// proxies ends that moved away left (each leaves once the route is
    /// repaired behind the end). A diagnostic: a proxy that stays is a
    /// route that was not repaired.
    pub fn link_routers(&self) -> LinkRouters {
        let Some(links) = LINKS.find(self.id()) else { return LinkRouters::default() };
        // Not under the table's lock: an end's lock is taken before it
        // (a router that retires leaves the table under its own lock).
        let ends = links.ends.lock().all();
        let proxies = ends.iter().filter(|e| e.is_proxy()).count();
        LinkRouters { ends: ends.len() - proxies, proxies, off_route: links.off_route.load(Ordering::Relaxed) }
    }

    /// Every router this team has, with its link, in one line each: a
    /// stalled test's evidence.
    #[doc(hidden)]
    pub fn link_diagnostics(&self) -> Vec<(LinkId, String)> {
        let Some(links) = LINKS.find(self.id()) else { return Vec::new() };
        // Not under the table's lock (as in `link_routers`).
        let ends = links.ends.lock().all();
        ends.iter().map(|e| (e.id, e.diagnostics())).collect()
    }

    /// A listener for links other teams make to this one ([`Team::link_to`]).
    pub fn link_listener(&self) -> Result<LinkListener> {
        self.listener(None)
    }

    /// A listener bound to `name` in the team's name plane.
    pub fn named_link_listener(&self, name: &str) -> Result<LinkListener> {
        self.listener(Some(name))
    }

    fn listener(&self, name: Option<&str>) -> Result<LinkListener> {
        let links = Links::of(self)?;
        let id = self.reserve_endpoint()?;
        if let Some(name) = name {
            self.bind_name(name, id)?;
        }
        let listening = Arc::new(Listening { queue: Mutex::default() });
        links.listeners.lock().insert(id.slot(), listening.clone());
        Ok(LinkListener { links, team: self.inner.clone(), id, name: name.map(str::to_owned), listening })
    }

    /// Makes a link to the team of `listener` (a [`LinkListener`]'s id):
    /// returns this team's end; the other comes out of the listener's
    /// `accept`. Blocks for the listener's answer (at most 10 s):
    /// `NoSuchEndpoint` if there is no such listener, `LimitReached` if
    /// its backlog or its team's links are full.
    pub fn link_to(&self, listener: EndpointId) -> Result<Link> {
        let links = Links::of(self)?;
        let id = links.new_id(self.id());
        let peer = listener.team_id();
        // Registered before the opening goes: the other end may send at once.
        let end = links.add_end(&self.inner, id, Side::A, peer, Links::window(&self.inner))?;
        let link = end.clone().into_link();
        let open = Open { link: id, window: Links::window(&self.inner) };
        let answer = self.open_at_owner(listener, wire::OPEN, &open.encode(), OPEN_TIMEOUT)?.answer;
        let unknown = || Error::Protocol {
            peer,
            violation: crate::Violation::BadLinkFrame("an opening's answer of no known form".into()),
        };
        match answer.split_first() {
            Some((&status::OPENED, w)) => {
                let w = wire::decode_window(w).ok_or_else(unknown)?;
                end.set_window_out(w);
                Ok(link)
            }
            Some((&status::NO_LISTENER, _)) => Err(Error::NoSuchEndpoint(listener)),
            Some((&status::BACKLOG_FULL, _)) => {
                Err(Error::LimitReached { limit: Limit::LinkBacklog, max: BACKLOG as u64 })
            }
            Some((&status::TOO_MANY_LINKS, _)) => Err(Error::Refused(crate::Refusal::Peer(format!(
                "the listener's team holds its most link ends ({})",
                Limit::Links
            )))),
            _ => Err(unknown()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Checkpoint;
    use std::time::Instant;

    /// A link's id is not a capability: a third team that sends a frame
    /// naming the link (and the end's router) is refused and counted, and
    /// the end takes nothing from it; the link goes on.
    #[test]
    fn a_forged_frame_is_refused_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let start = || Team::builder().runtime_dir(dir.path()).start().unwrap();
        let (a, b, stranger) = (start(), start(), start());
        let listener = b.link_listener().unwrap();
        let here = a.link_to(listener.id()).unwrap();
        let there = listener.accept_blocking().unwrap().with_timeout(Duration::from_secs(5));
        // As from B's end (side B, epoch 0), to A's (side A, epoch 0): message 0.
        let mut frame = Vec::new();
        let what = wire::What::Data { toward: Side::A, seq: 0, data: &[] };
        wire::Frame { link: here.id(), to: (Side::A, 0), from: (Side::B, 0), what }.encode_into(&mut frame);
        let body = wire::Body::Message { checkpoint: Checkpoint::Immediate, call: 0, bytes: b"forged" };
        frame.extend(wire::Data { ack: Some(Default::default()), body }.encode());
        let forger = stranger.frame_sender(a.id().endpoint(0).unwrap(), wire::FRAME).unwrap();
        forger.send(&frame, Checkpoint::OnReceipt).unwrap();
        let t = Instant::now();
        while a.link_routers().off_route == 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "the forged frame was not refused");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(here.try_recv::<String>().is_none(), "the end took the forged frame");
        // A short frame naming the end's handle, as from B's end's
        // handle: the stranger's team is not where that router is.
        let off = a.link_routers().off_route;
        let handle = |h| crate::id::LINK_SLOTS + h;
        forger.post_parts_as(wire::SHORT, handle(1), handle(1), &wire::Short::head(0), b"forged").unwrap();
        let t = Instant::now();
        while a.link_routers().off_route == off {
            assert!(t.elapsed() < Duration::from_secs(5), "the forged short frame was not refused");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(here.try_recv::<String>().is_none(), "the end took the forged short frame");
        // The link's own message 0 is taken as usual.
        there.send(&"real", Checkpoint::Immediate).unwrap();
        assert_eq!(here.with_timeout(Duration::from_secs(5)).recv_blocking::<String>().unwrap().value, "real");
    }
}
