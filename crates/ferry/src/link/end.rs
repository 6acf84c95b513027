//! One end of a link: what its holder sends and receives ([`Link`]), and
//! what the team's handler hands it ([`End::arrive`]).

use super::bytes::LinkBytes;
use super::route::{self, Control, Effect, Hop, Router, Way};
use super::stream::{Broken, Stream};
use super::table::{self, Links};
use super::wire::{self, Answer, Body, Carried, Data, Frame, Queued, Short, What, HEAD};
use super::{LinkId, Side, Window};
use crate::error::{Error, Refusal, Result, Violation};
use crate::id::TeamId;
use crate::runtime::{idle, Sleep, TeamInner};
use crate::wire::{codec, Checkpoint, Header, Kind};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// One end of a link, held by one team (see the module's text).
pub struct Link {
    end: Arc<End>,
    timeout: Option<Duration>,
}

/// What an end shares with its team's handler: its router (which stays,
/// a proxy, once the end moved away) and, while this team holds the end,
/// what its holder sends and receives.
pub(super) struct End {
    pub id: LinkId,
    /// This router: this team, the end's side and epoch.
    pub hop: Hop,
    team: Arc<TeamInner>,
    links: Arc<Links>,
    state: Mutex<State>,
    /// Whether a receive finds something now (a message queued, or the
    /// end ended): a receive that only looks (a spinning wait's) reads it
    /// without the state's lock. Changed under that lock.
    receivable: AtomicBool,
    /// This router's handle in its team's table (0 before it is there):
    /// what short frames to it name (`wire::Short`).
    handle: AtomicU32,
}

/// A frame of an end's own on its route: its number and bytes (`wire::Data`).
pub(super) type Numbered = (u64, Vec<u8>);

struct State {
    router: Router<Numbered>,
    /// Set once the end moved away: what it carried (the same bytes if
    /// it is serialized again, as a size is taken before a send).
    moved: Option<Vec<u8>>,
    stream: Stream,
    /// Messages taken in order, for the user.
    queue: VecDeque<Arrived>,
    /// This end's messages awaiting their answer, by call number.
    calls: HashMap<u32, Call>,
    /// The other end's requests its holder took here and did not answer yet.
    unanswered: std::collections::HashSet<u32>,
    next_call: u32,
    /// The other end probed: it waits for room.
    peer_waits: bool,
    /// This end probed since its last acknowledgement came.
    probed: bool,
    receiver: Option<Waker>,
    senders: Vec<Waker>,
    /// Why nothing more comes or goes, once it is so.
    ended: Option<Ended>,
    /// This router left its route (and its team's table). A frame the
    /// handler found it for just before answers as for a router not there.
    retired: bool,
    /// The sender to the team frames went to last (most go to the outward
    /// router's): saves the table's lookup per frame.
    sender: Option<(TeamId, crate::port::RawSender)>,
    /// Where frames are encoded before they are posted (kept: no
    /// allocation per frame).
    scratch: Vec<u8>,
    /// The head of this end's frames to the outward router it was made
    /// for, and room for their data's: each frame numbers and fills it in
    /// place rather than encoding it.
    prefix: Option<(Hop, [u8; wire::FRAMING])>,
    /// The handles of routers next to this one (learnt from their full
    /// frames' headers), the last few: a short frame is taken from a
    /// router known so, and goes to one.
    known: Vec<(Hop, u32)>,
    /// The outward router this terminal's short frames go to, and its
    /// handle: set as a full frame goes to it (which tells it this
    /// router's handle) once its handle is known here.
    short_to: Option<(Hop, u32)>,
}

impl State {
    /// Whether this router is a terminal of its own, which its blocked
    /// receiver may serve itself (`End::take_own`): not a proxy, not moved
    /// away, not closed here (those go through the links' handler).
    fn takes_own(&self) -> bool {
        !self.router.is_proxy() && self.moved.is_none() && !matches!(self.ended, Some(Ended::Closed))
    }
}

/// Most neighbours' handles a router remembers: its two neighbours, the
/// ones bypasses replace them with, and room to spare (a neighbour
/// forgotten while it still sends short frames would be off its route).
const MOST_KNOWN: usize = 8;

#[cfg(test)]
thread_local! {
    /// Messages this thread's blocked receive took at once (`End::catch_message`).
    pub(crate) static CAUGHT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Short frames this thread took for a router (`wire::Short`).
    pub(crate) static SHORTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Most bytes of the encoding buffer an end keeps between frames.
const KEPT_SCRATCH: usize = 64 << 10;

struct Arrived {
    checkpoint: Checkpoint,
    call: u32,
    bytes: LinkBytes,
}

#[derive(Default)]
struct Call {
    answer: Option<Result<Vec<u8>>>,
    waker: Option<Waker>,
}

#[derive(Clone)]
enum Ended {
    /// The other end closed; what it sent before was received.
    PeerClosed,
    /// This end closed.
    Closed,
    /// The team holding the other end is gone (or its channel is).
    PeerGone(TeamId),
    /// The peer broke the link's protocol.
    Broken(TeamId, String),
    /// This end was sent away inside a message.
    Moved,
}

impl Ended {
    fn error(&self, link: LinkId) -> Error {
        match self {
            Ended::PeerClosed | Ended::Closed => Error::LinkClosed { link },
            Ended::PeerGone(peer) => Error::PeerGone { peer: *peer },
            Ended::Moved => Error::LinkMoved { link },
            Ended::Broken(peer, why) => {
                Error::Protocol { peer: *peer, violation: Violation::BadLinkFrame(why.clone()) }
            }
        }
    }
}

impl End {
    /// A fresh end (epoch 0) of this team's whose other end is `peer`'s.
    pub fn new(
        id: LinkId,
        side: Side,
        team: Arc<TeamInner>,
        links: Arc<Links>,
        peer: TeamId,
        window_in: Window,
        window_out: Window,
    ) -> Arc<End> {
        let hop = Hop { team: team.id, side, epoch: 0 };
        let router = Router::terminal(hop, Hop { team: peer, side: side.other(), epoch: 0 });
        End::with(id, team, links, router, Stream::new(window_in, window_out))
    }

    fn with(id: LinkId, team: Arc<TeamInner>, links: Arc<Links>, router: Router<Numbered>, stream: Stream) -> Arc<End> {
        let state = State {
            router,
            moved: None,
            stream,
            queue: VecDeque::new(),
            calls: HashMap::new(),
            unanswered: Default::default(),
            next_call: 1,
            peer_waits: false,
            probed: false,
            receiver: None,
            senders: Vec::new(),
            ended: None,
            retired: false,
            sender: None,
            scratch: Vec::new(),
            prefix: None,
            known: Vec::new(),
            short_to: None,
        };
        let hop = state.router.hop();
        Arc::new(End {
            id,
            hop,
            team,
            links,
            state: Mutex::new(state),
            receivable: AtomicBool::new(false),
            handle: AtomicU32::new(0),
        })
    }

    /// Its handle (0: none yet).
    pub fn handle(&self) -> u32 {
        self.handle.load(Ordering::Relaxed)
    }

    /// Set by its team's table as it enters it.
    pub fn set_handle(&self, handle: u32) {
        self.handle.store(handle, Ordering::Relaxed);
    }

    /// The slot naming this router in its frames' headers (0 without a handle).
    fn slot(&self) -> u32 {
        match self.handle() {
            0 => 0,
            h => table::slot(h),
        }
    }

    pub fn is_proxy(&self) -> bool {
        self.state.lock().router.is_proxy()
    }

    /// This router's state in one line, for a test's failure message
    /// (`Team::link_diagnostics`): the router, its stream's numbers (frames
    /// that came early wait for the one due), what waits in its queue, why
    /// it ended.
    pub fn diagnostics(&self) -> String {
        let s = self.state.lock();
        format!(
            "{:?}, {}, {} queued, ended {:?}",
            s.router,
            s.stream.describe(),
            s.queue.len(),
            s.ended.as_ref().map(|e| e.error(self.id).to_string())
        )
    }

    pub fn into_link(self: Arc<End>) -> Link {
        Link { end: self, timeout: None }
    }

    pub fn set_window_out(&self, w: Window) {
        self.state.lock().stream.window_out = w;
    }

    /// Sends a frame of this end's own to the other side, numbered `seq`,
    /// with this end's acknowledgement (under the state's lock: frames
    /// leave in order). In line, with `sender_in`, `post_parts` and
    /// `TeamInner::post`'s common case: every message goes through them,
    /// and their prologues and epilogues were a third of a send's own work.
    #[inline(always)]
    fn post(&self, s: &mut State, seq: u64, body: Body<'_>) -> Result<()> {
        let to = s.router.outward();
        // A small message to a router that knows this one's handle, and
        // whose handle this one knows, goes as a short frame (no
        // acknowledgement: `Credit`s carry it, see `Stream::consumed`).
        let short = match body {
            Body::Message { checkpoint: Checkpoint::Immediate, bytes, .. } if bytes.len() <= wire::SHORT_MAX => {
                s.short_to.filter(|(hop, _)| *hop == to).map(|(_, h)| h)
            }
            _ => None,
        };
        if short.is_none() && !matches!(&s.prefix, Some((hop, _)) if *hop == to) {
            let m = s.router.send(());
            let route::Body::Data { toward, .. } = m.body else { unreachable!("a terminal's frame is data") };
            let mut prefix = [0u8; wire::FRAMING];
            prefix[..HEAD].copy_from_slice(&wire::head(
                self.id,
                (to.side, to.epoch),
                (m.from.side, m.from.epoch),
                Some(toward),
                0,
            ));
            s.prefix = Some((to, prefix));
        }
        let ack = if short.is_none() { Some(s.stream.ack()) } else { None };
        let State { prefix, sender, known, short_to, .. } = s;
        let seq_head = Short::head(seq);
        // A short frame: its number, then the message's bytes. A full one:
        // its head and its data's, numbered and filled in where they are
        // kept, then the data's bytes. Either is written into the channel
        // as two pieces, never joined here (one call below: in line once).
        let (kind, dst, head, bytes) = match (short, prefix) {
            (Some(h), _) => {
                let Body::Message { bytes, .. } = body else { unreachable!("only a message goes short") };
                (wire::SHORT, table::slot(h), &seq_head[..], bytes)
            }
            (None, Some((_, prefix))) => {
                wire::number(prefix, seq);
                let data = (&mut prefix[HEAD..]).try_into().expect("a prefix is a head and a data head");
                let (len, bytes) = Data { ack, body }.encode_head_into(data);
                (wire::FRAME, 0, &prefix[..HEAD + len], bytes)
            }
            (None, None) => unreachable!("made above"),
        };
        self.sender_in(sender, to.team)?.post_parts_as(kind, self.slot(), dst, head, bytes)?;
        if short.is_none() {
            // Its header told `to` this router's handle.
            *short_to = known.iter().find(|(hop, _)| *hop == to).copied();
        }
        Ok(())
    }

    /// A frame of this link from router `from` to router `to`.
    fn frame<'a>(&self, from: Hop, to: Hop, what: What<'a>) -> Frame<'a> {
        Frame { link: self.id, to: (to.side, to.epoch), from: (from.side, from.epoch), what }
    }

    /// Sends the frame `encode` writes to team `to` (through the sender
    /// it used last, if it is that team's).
    fn send(&self, s: &mut State, to: TeamId, encode: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut frame = std::mem::take(&mut s.scratch);
        frame.clear();
        encode(&mut frame);
        let slot = self.slot();
        let sent = self
            .sender_in(&mut s.sender, to)
            .and_then(|sender| sender.post_parts_as(wire::FRAME, slot, 0, &[], &frame));
        if frame.capacity() <= KEPT_SCRATCH {
            s.scratch = frame;
        }
        sent
    }

    /// The sender of link frames to team `to`: the one used last (kept in
    /// `kept`), if it is that team's.
    #[inline(always)]
    fn sender_in<'s>(
        &self,
        kept: &'s mut Option<(TeamId, crate::port::RawSender)>,
        to: TeamId,
    ) -> Result<&'s crate::port::RawSender> {
        if !matches!(kept, Some((team, _)) if *team == to) {
            *kept = Some((to, self.links.sender(to)?));
        }
        match kept {
            Some((_, sender)) => Ok(sender),
            None => unreachable!("set above"),
        }
    }

    /// Passes a frame on to the router `to`; one it cannot reach is lost
    /// (see `router_lost`).
    fn pass(&self, s: &mut State, to: Hop, encode: impl FnOnce(&mut Vec<u8>)) {
        if let Err(e) = self.send(s, to.team, encode) {
            // A team shutting down drops its links' frames as a matter of
            // course: that is not news.
            if matches!(e, crate::Error::Shutdown) {
                tracing::debug!(link = %self.id, me = ?self.hop, ?to, "a link's frame could not go: the team is shut down");
            } else {
                tracing::info!(link = %self.id, me = ?self.hop, ?to, error = %e, "a link's frame could not go: its router there is lost");
            }
            self.router_lost(s, to.team);
        }
    }

    /// Does what the router asked.
    fn apply(&self, s: &mut State, effects: Vec<Effect<Numbered>>) {
        for e in effects {
            match e {
                Effect::Send(m) => {
                    let what = match &m.body {
                        route::Body::Data { toward, data: (seq, data) } => {
                            What::Data { toward: *toward, seq: *seq, data }
                        }
                        route::Body::Control(c) => What::Control(c.clone()),
                    };
                    let f = self.frame(m.from, m.to, what);
                    self.pass(s, m.to, |out| f.encode_into(out));
                }
                Effect::Deliver((seq, data)) => self.deliver(s, seq, &data),
                Effect::Retire => {
                    s.retired = true;
                    self.links.forget(self.id, self.hop);
                }
                Effect::Broken(at) => self.route_broke(s, at.team, |h| h == at),
            }
        }
    }

    /// A frame of the other end's came to this terminal: put in order and
    /// taken (it is copied only if it came ahead of its turn).
    fn deliver(&self, s: &mut State, seq: u64, data: &[u8]) {
        if matches!(s.ended, Some(Ended::Closed)) {
            // Closed here: it waits (still a router of the route) only
            // for the other end's close.
            if matches!(Data::decode(data), Ok(Data { body: Body::Close, .. })) {
                self.give_up(s, |_| false);
            }
            return;
        }
        if s.ended.is_some() || s.moved.is_some() {
            return;
        }
        if let Err(Broken(why)) = self.take_due(s, seq, data) {
            tracing::warn!(link = %self.id, %why, "a link's peer broke its protocol");
            let peer = s.router.outward().team;
            self.end(s, Ended::Broken(peer, why));
        }
    }

    /// Takes the frame `seq` if it is due, then those that came ahead of it.
    fn take_due(&self, s: &mut State, seq: u64, data: &[u8]) -> std::result::Result<(), Broken> {
        if s.stream.arrive(seq, data)? {
            self.take(s, data)?;
        }
        while let Some(frame) = s.stream.next_due() {
            self.take(s, &frame)?;
        }
        Ok(())
    }

    /// A router next to this one is gone (its team, or the channel to it):
    /// a proxy leaves (its neighbours learn it so too); a terminal's route broke.
    fn router_lost(&self, s: &mut State, team: TeamId) {
        match s.router.is_proxy() {
            true => self.give_up(s, |h| h.team == team),
            false => self.route_broke(s, team, |h| h.team == team),
        }
    }

    /// This terminal's route broke at `team`: its end sees `PeerGone`;
    /// closed, it waited for the other end's close and leaves now (telling
    /// its neighbours but those `skip` names).
    fn route_broke(&self, s: &mut State, team: TeamId, skip: impl Fn(Hop) -> bool) {
        match s.ended {
            Some(Ended::Closed) => self.give_up(s, skip),
            None if s.moved.is_none() => self.end(s, Ended::PeerGone(team)),
            _ => {}
        }
    }

    /// A proxy past its lifetime (`TeamBuilder::link_proxy_lifetime`) that
    /// is still there: its route was not repaired; it gives up.
    fn expire(&self) {
        let mut s = self.state.lock();
        if s.router.is_proxy() {
            tracing::warn!(link = %self.id, "a link's proxy was not bypassed within its lifetime: the route is given up");
            self.give_up(&mut s, |_| false);
        }
    }

    /// This router leaves its route: its neighbours (but those `skip`
    /// names) learn it (`Gone`), so that proxies still being bypassed on
    /// the way leave now, not at their lifetime's end.
    fn give_up(&self, s: &mut State, skip: impl Fn(Hop) -> bool) {
        let effects = s.router.give_up(skip);
        self.apply(s, effects);
    }

    /// Posts a frame that is not a message; a failure ends the link.
    fn post_control(&self, s: &mut State, body: Body<'_>) {
        let seq = s.stream.next_frame();
        if let Err(e) = self.post(s, seq, body) {
            tracing::debug!(link = %self.id, error = %e, "a link's frame could not go");
            let peer = s.router.outward().team;
            self.end(s, Ended::PeerGone(peer));
        }
    }

    /// Records why the link ended (the first reason stays), failing what waits.
    fn end(&self, s: &mut State, why: Ended) {
        if s.ended.is_none() {
            s.ended = Some(why.clone());
            self.receivable.store(true, Ordering::Release);
        }
        for call in s.calls.values_mut() {
            call.answer.get_or_insert_with(|| Err(why.error(self.id)));
            if let Some(w) = call.waker.take() {
                w.wake();
            }
        }
        wake(s);
    }

    /// Starts a message: waits for room in the window (an `Immediate` one
    /// fails with `WouldBlock` instead); returns its call number if it
    /// waits for an answer.
    fn poll_send(&self, cx: &mut Context<'_>, bytes: &[u8], checkpoint: Checkpoint) -> Poll<Result<u32>> {
        let mut s = self.state.lock();
        if let Some(why) = &s.ended {
            return Poll::Ready(Err(why.error(self.id)));
        }
        if self.team.is_shut_down() {
            return Poll::Ready(Err(Error::Shutdown));
        }
        if let Err(e) = s.stream.fits(bytes.len()) {
            return Poll::Ready(Err(e));
        }
        if !s.stream.may_send(bytes.len()) {
            if !s.probed {
                s.probed = true;
                self.post_control(&mut s, Body::Probe);
            }
            if checkpoint == Checkpoint::Immediate {
                let to = s.router.outward().team.endpoint(0).expect("slot 0 fits");
                return Poll::Ready(Err(Error::WouldBlock { to }));
            }
            s.senders.push(cx.waker().clone());
            return Poll::Pending;
        }
        let call = match checkpoint {
            Checkpoint::Immediate => 0,
            _ => {
                let call = s.next_call;
                s.next_call = s.next_call.wrapping_add(1).max(1);
                s.calls.insert(call, Call::default());
                call
            }
        };
        let seq = s.stream.send_message(bytes.len());
        if let Err(e) = self.post(&mut s, seq, Body::Message { checkpoint, call, bytes }) {
            s.calls.remove(&call);
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(call))
    }

    fn poll_answer(&self, cx: &mut Context<'_>, call: u32) -> Poll<Result<Vec<u8>>> {
        let mut s = self.state.lock();
        let shut_down = self.team.is_shut_down();
        let Some(c) = s.calls.get_mut(&call) else { return Poll::Ready(Err(Error::Cancelled)) };
        match c.answer.take() {
            None if shut_down => {
                s.calls.remove(&call);
                Poll::Ready(Err(Error::Shutdown))
            }
            Some(answer) => {
                s.calls.remove(&call);
                Poll::Ready(answer)
            }
            None => {
                c.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn forget_call(&self, call: u32) {
        self.state.lock().calls.remove(&call);
    }

    fn poll_recv(&self, cx: Option<&mut Context<'_>>) -> Poll<Result<Arrived>> {
        if cx.is_none() && !self.receivable.load(Ordering::Acquire) && !self.team.is_shut_down() {
            return Poll::Pending; // (A look, without the lock.)
        }
        let mut s = self.state.lock();
        let Some(m) = s.queue.pop_front() else {
            if let Some(why) = &s.ended {
                return Poll::Ready(Err(why.error(self.id)));
            }
            if self.team.is_shut_down() {
                return Poll::Ready(Err(Error::Shutdown));
            }
            if let Some(cx) = cx {
                s.receiver = Some(cx.waker().clone());
            }
            return Poll::Pending;
        };
        if s.queue.is_empty() && s.ended.is_none() {
            self.receivable.store(false, Ordering::Relaxed);
        }
        if m.checkpoint == Checkpoint::OnReturn {
            s.unanswered.insert(m.call);
        }
        super::received_by(&self.team);
        let peer_waits = std::mem::take(&mut s.peer_waits);
        let ack_now = s.stream.consumed(m.bytes.len(), peer_waits);
        if s.ended.is_none() {
            match m.checkpoint {
                // Its answer carries the acknowledgement.
                Checkpoint::OnDelivery => {
                    self.post_control(&mut s, Body::Answer { call: m.call, answer: Answer::Delivery, bytes: &[] })
                }
                _ if ack_now => self.post_control(&mut s, Body::Credit),
                _ => {}
            }
        }
        Poll::Ready(Ok(m))
    }

    /// Answers the other side's message `call` (a reply, or `NoReply`).
    fn answer(&self, call: u32, answer: Answer, bytes: &[u8]) -> Result<()> {
        let mut s = self.state.lock();
        if let Some(why) = &s.ended {
            return Err(why.error(self.id));
        }
        if !s.unanswered.remove(&call) {
            return Err(Error::InvalidArgument(format!("no request {call} of {} waits for an answer here", self.id)));
        }
        // A reply the other side would not take: its requester is told
        // `NoReply`, and the replier why.
        let fits = s.stream.fits(bytes.len());
        let (answer, bytes) = if fits.is_ok() { (answer, bytes) } else { (Answer::NoReply, &[][..]) };
        let seq = s.stream.next_frame();
        self.post(&mut s, seq, Body::Answer { call, answer, bytes })?;
        fits
    }

    /// A frame for this router came from team `from`, whose header named
    /// the sending router's handle `src` (the handler's part).
    pub fn arrive(&self, from: TeamId, src: Option<u32>, f: Frame<'_>) {
        let mut s = self.state.lock();
        learn(&mut s.known, Hop { team: from, side: f.from.0, epoch: f.from.1 }, src);
        self.arrive_locked(&mut s, from, f)
    }

    /// A short frame for this router came from team `from`, whose header
    /// named the sending router's handle `src` (the handler's part): the
    /// frame that router sends toward the other side, if this router
    /// knows it (else it is off its route).
    pub fn arrive_short(&self, from: TeamId, src: Option<u32>, short: Short<'_>) {
        let mut s = self.state.lock();
        #[cfg(test)]
        SHORTS.set(SHORTS.get() + 1);
        match sender_of(&s.known, from, src) {
            Some(hop) => self.arrive_bare(&mut s, hop, short),
            None => self.links.off_route(from, "a short frame from a router not known here"),
        }
    }

    /// A short frame from the router `hop`, as the full frame it stands
    /// for (its message bare: `Data::bare`; at most `SHORT_MAX` bytes, as
    /// `Short::decode` checked).
    fn arrive_bare(&self, s: &mut State, hop: Hop, short: Short<'_>) {
        let mut data = [0u8; 1 + wire::SHORT_MAX];
        let n = wire::bare_into(&mut data, short.bytes);
        let what = What::Data { toward: hop.side.other(), seq: short.seq, data: &data[..n] };
        self.arrive_locked(s, hop.team, self.frame(hop, self.hop, what))
    }

    /// A served frame (its header `h`) from team `from`, offered to this
    /// end's blocked receiver before the links' handler (see
    /// `runtime::direct_receive`): taken here if it is for this router
    /// while it is a terminal of its own (what the handler's table finds
    /// for it then: this end is registered until it moves or closes), so
    /// without the handler's lookups; else `false`, for the handler. The
    /// other end's next message, due now with nothing queued before it,
    /// goes straight to `caught` (see `catch_message`). In line, with
    /// `catch_message` and the checks it makes (`Router::way`,
    /// `Data::decode`, `Stream::take_at_once`): a caught message's whole
    /// path is then one function (65 fewer instructions per round trip).
    #[inline(always)]
    fn take_own(&self, h: &Header, from: TeamId, bytes: &[u8], caught: &mut Option<Arrived>) -> bool {
        match h.kind {
            Kind::Served(wire::SHORT) => {
                let Ok(short) = Short::decode(bytes) else { return false };
                if table::handle(h.dst.slot()) != Some(self.handle()) {
                    return false;
                }
                let mut s = self.state.lock();
                let Some(hop) = sender_of(&s.known, from, table::handle(h.src.slot())) else { return false };
                if !s.takes_own() {
                    return false;
                }
                #[cfg(test)]
                SHORTS.set(SHORTS.get() + 1);
                let toward = hop.side.other();
                if !self.catch_message(&mut s, hop, toward, short.seq, Data::bare(short.bytes), caught) {
                    self.arrive_bare(&mut s, hop, short);
                }
                true
            }
            Kind::Served(wire::FRAME) => {
                let Ok(f) = Frame::decode(bytes) else { return false };
                if f.link != self.id || f.to != (self.hop.side, self.hop.epoch) {
                    return false;
                }
                let mut s = self.state.lock();
                if !s.takes_own() {
                    return false;
                }
                let hop = Hop { team: from, side: f.from.0, epoch: f.from.1 };
                learn(&mut s.known, hop, table::handle(h.src.slot()));
                if let What::Data { toward, seq, data } = f.what {
                    if let Ok(data) = Data::decode(data) {
                        if self.catch_message(&mut s, hop, toward, seq, data, caught) {
                            return true;
                        }
                    }
                }
                self.arrive_locked(&mut s, from, f);
                true
            }
            _ => false,
        }
    }

    /// The common case of `arrive_locked` → `deliver` → `take` →
    /// `poll_recv`, in one step, for a blocked receiver: the other end's
    /// next message (`data`, numbered `seq`, from router `from` toward
    /// side `toward`), due now (in order, none early) with nothing queued
    /// before it, goes to `caught` as it is taken — no queue, no second
    /// lock. `false`, and nothing changed, for any other frame, and for
    /// one that breaks the protocol: the general path takes it (and says
    /// what is wrong with it).
    #[inline(always)]
    fn catch_message(
        &self,
        s: &mut State,
        from: Hop,
        toward: Side,
        seq: u64,
        data: Data<'_>,
        caught: &mut Option<Arrived>,
    ) -> bool {
        let Data { ack, body: Body::Message { checkpoint, call, bytes } } = data else { return false };
        if !s.queue.is_empty()
            || s.ended.is_some()
            || s.retired
            || !matches!(s.router.way(from, toward), Ok(Way::Deliver))
        {
            return false;
        }
        // An `OnReceipt` message's answer goes first; an `OnDelivery` one's
        // is its acknowledgement (both the general path's).
        if matches!(checkpoint, Checkpoint::OnReceipt | Checkpoint::OnDelivery) {
            return false;
        }
        let Some(ack_now) = s.stream.take_at_once(seq, ack, bytes.len(), s.peer_waits) else { return false };
        (s.probed, s.peer_waits) = (false, false);
        if !s.senders.is_empty() {
            s.senders.drain(..).for_each(Waker::wake);
        }
        if checkpoint == Checkpoint::OnReturn {
            s.unanswered.insert(call);
        }
        super::received_by(&self.team);
        if ack_now {
            self.post_control(s, Body::Credit);
        }
        *caught = Some(Arrived { checkpoint, call, bytes: LinkBytes::from_slice(bytes) });
        #[cfg(test)]
        CAUGHT.set(CAUGHT.get() + 1);
        true
    }

    fn arrive_locked(&self, s: &mut State, from: TeamId, f: Frame<'_>) {
        if s.retired {
            // The handler's table gave this router out as it left: it is
            // not there. (A proxy that had given up took its adopter's
            // `Adopt` and said nothing, so the adopted end waited for
            // good: the links stress test's rare stall.)
            return self.links.no_router(from, &f);
        }
        let from = Hop { team: from, side: f.from.0, epoch: f.from.1 };
        let (off, what) = match f.what {
            // A frame of the ends' own: taken, or passed on, where it is.
            What::Data { toward, seq, data } => match s.router.way(from, toward) {
                Ok(Way::Deliver) => return self.deliver(s, seq, data),
                Ok(Way::Forward(to)) => {
                    let f = self.frame(self.hop, to, What::Data { toward, seq, data });
                    return self.pass(s, to, |out| f.encode_into(out));
                }
                Ok(Way::Hold) => return s.router.hold((seq, data.to_vec())),
                Err(off) => (off, format!("data {seq}")),
            },
            What::Control(c) => {
                let (gone, op) = (c == Control::Gone, c.clone());
                match s.router.receive(route::Message { from, to: self.hop, body: route::Body::Control(c) }) {
                    Ok(effects) => return self.apply(s, effects),
                    // A `Gone` from a router this one does not know yet or
                    // any more (one announced to it that gave up before its
                    // bypass came; `Links::no_router`'s answer for a router
                    // it left): nothing to do, as the model has it.
                    Err(_) if gone => return,
                    Err(off) => (off, format!("{op:?}")),
                }
            }
        };
        // Not on the route this link set up: a team cannot join a link by its id.
        self.links.off_route.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(link = %self.id, ?from, me = ?self.hop, what, why = off.0, "a link's frame off its route");
    }

    /// Takes one frame due in order.
    fn take(&self, s: &mut State, frame: &[u8]) -> std::result::Result<(), Broken> {
        let f = Data::decode(frame).map_err(|e| Broken(e.to_string()))?;
        s.stream.took_ack(f.ack)?;
        s.probed = false;
        if !s.senders.is_empty() {
            s.senders.drain(..).for_each(Waker::wake);
        }
        match f.body {
            Body::Message { checkpoint, call, bytes } => {
                s.stream.received(bytes.len())?;
                if checkpoint == Checkpoint::OnReceipt {
                    self.post_control(s, Body::Answer { call, answer: Answer::Receipt, bytes: &[] });
                }
                s.queue.push_back(Arrived { checkpoint, call, bytes: LinkBytes::from_slice(bytes) });
                self.receivable.store(true, Ordering::Release);
                if let Some(w) = s.receiver.take() {
                    w.wake();
                }
            }
            Body::Answer { call, answer, bytes } => {
                s.stream.within_largest(bytes.len())?;
                // An answer to a call nobody waits for any more is dropped.
                if let Some(c) = s.calls.get_mut(&call) {
                    c.answer = Some(match answer {
                        Answer::NoReply => Err(Error::Refused(Refusal::NoReply)),
                        _ => Ok(bytes.to_vec()),
                    });
                    if let Some(w) = c.waker.take() {
                        w.wake();
                    }
                }
            }
            Body::Credit => {}
            Body::Probe => match s.stream.owes_ack() {
                true => self.post_control(s, Body::Credit),
                false => s.peer_waits = true,
            },
            Body::Close => self.end(s, Ended::PeerClosed),
        }
        Ok(())
    }

    /// This end moves away inside a message: its router becomes a proxy,
    /// and the returned bytes are the end (`wire::Carried`; the same bytes
    /// again if it is serialized again). Requests its holder took and did
    /// not answer are answered `NoReply` first; its own calls waiting for
    /// an answer fail with `LinkMoved`.
    fn move_away(self: &Arc<Self>) -> Result<Vec<u8>> {
        let mut s = self.state.lock();
        if let Some(carried) = &s.moved {
            return Ok(carried.clone());
        }
        if let Some(why) = &s.ended {
            return Err(why.error(self.id));
        }
        let mut calls: Vec<u32> = s.unanswered.drain().collect();
        calls.sort_unstable();
        for call in calls {
            self.post_control(&mut s, Body::Answer { call, answer: Answer::NoReply, bytes: &[] });
        }
        if let Some(why) = &s.ended {
            return Err(why.error(self.id));
        }
        let token = u64::from_le_bytes(crate::memory::Key::random().to_bytes()[..8].try_into().expect("8 bytes"));
        let moved = s.router.moved(token);
        let windows = (s.stream.window_in, s.stream.window_out);
        let stream = std::mem::replace(&mut s.stream, Stream::new(windows.0, windows.1));
        let queue = s
            .queue
            .drain(..)
            .map(|a| Queued { checkpoint: a.checkpoint, call: a.call, bytes: a.bytes.into_vec() })
            .collect();
        let carried = Carried { link: self.id, side: self.hop.side, moved, stream, queue }.encode();
        s.moved = Some(carried.clone());
        self.end(&mut s, Ended::Moved);
        // The proxy's lifetime: past it, a route not repaired is given up.
        let (proxy, at) =
            (Arc::downgrade(self), Sleep::until(&self.team, Instant::now() + self.team.cfg.link_proxy_lifetime));
        drop(self.team.exec.spawn(async move {
            at.await;
            if let Some(end) = proxy.upgrade() {
                end.expire();
            }
        }));
        Ok(carried)
    }

    /// The end `carried` arrives in `team`: its new router, registered,
    /// and its adoption sent to the proxy it left. An end whose peer may
    /// send messages larger than `team` takes (its `max_message` is
    /// smaller than the link's) is adopted and closed at once: the other
    /// end sees `LinkClosed`, this one `TooLarge`.
    fn adopt(team: &Arc<TeamInner>, carried: &[u8]) -> Result<Link> {
        let c = Carried::decode(carried).ok_or_else(|| Error::Codec("a link end of no form ferry makes".into()))?;
        let (granted, here) = (c.stream.window_in.largest, Links::window(team).largest);
        let link = Self::adopt_carried(team, c)?;
        match granted > here {
            true => Err(Error::TooLarge { len: granted as usize, max: here as usize }),
            false => Ok(link),
        }
    }

    fn adopt_carried(team: &Arc<TeamInner>, c: Carried) -> Result<Link> {
        let links = Links::of_inner(team)?;
        let (router, adopt) = Router::adopt(team.id, c.side, &c.moved);
        let end = End::with(c.link, team.clone(), links.clone(), router, c.stream);
        links.register(team, &end)?;
        {
            let mut s = end.state.lock();
            s.queue = c
                .queue
                .into_iter()
                .map(|q| Arrived { checkpoint: q.checkpoint, call: q.call, bytes: q.bytes.into() })
                .collect();
            end.receivable.store(!s.queue.is_empty(), Ordering::Release);
            end.apply(&mut s, vec![adopt]);
        }
        Ok(end.into_link())
    }

    /// The team holding the other end is gone.
    pub fn peer_gone(&self, peer: TeamId) {
        let mut s = self.state.lock();
        if s.sender.as_ref().is_some_and(|(team, _)| *team == peer) {
            s.sender = None; // Its channel goes with the peer.
        }
        if s.router.neighbours().any(|h| h.team == peer) {
            self.router_lost(&mut s, peer);
        }
    }

    /// Closes this end: the other end sees `LinkClosed` after what was sent before.
    ///
    /// Its router stays (answering its route's protocol, so that proxies
    /// on the way are bypassed and leave) until the other end's close
    /// comes; if the other end closed already, or is gone, it leaves now
    /// and tells its neighbours (see `give_up`).
    fn close(&self) {
        let mut s = self.state.lock();
        if s.moved.is_some() {
            return; // Its router is a proxy now: it leaves by the route's protocol.
        }
        let leave = s.ended.is_some();
        if !leave {
            self.post_control(&mut s, Body::Close);
        }
        self.end(&mut s, Ended::Closed);
        if leave {
            self.give_up(&mut s, |_| false);
        }
    }
}

fn wake(s: &mut State) {
    if let Some(w) = s.receiver.take() {
        w.wake();
    }
    s.senders.drain(..).for_each(Waker::wake);
}

/// Removes a call's entry if its future is dropped before the answer.
struct CallGuard<'a> {
    end: &'a End,
    call: u32,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.call != 0 {
            self.end.forget_call(self.call);
        }
    }
}

/// A message received on a link.
pub struct LinkMessage<T> {
    /// Its value.
    pub value: T,
    reply: Option<LinkReply>,
}

/// The right (and duty) to answer a request: dropped unanswered, it tells
/// the requester `Refused(NoReply)`.
struct LinkReply {
    end: Arc<End>,
    call: u32,
}

impl Drop for LinkReply {
    fn drop(&mut self) {
        if self.call != 0 {
            let _ = self.end.answer(self.call, Answer::NoReply, &[]);
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for LinkMessage<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkMessage").field("value", &self.value).field("wants_reply", &self.wants_reply()).finish()
    }
}

impl<T> LinkMessage<T> {
    /// Whether its sender waits for a reply (a `call`, or `OnReturn`).
    pub fn wants_reply(&self) -> bool {
        self.reply.is_some()
    }

    /// Replies with `value`'s bytes (MessagePack). `InvalidArgument` if no
    /// reply is awaited; `LinkClosed` or `PeerGone` if the link ended.
    pub fn reply<R: Serialize + ?Sized>(self, value: &R) -> Result<()> {
        self.reply_bytes(&codec::encode(value)?)
    }

    /// Replies with `bytes`.
    pub fn reply_bytes(mut self, bytes: &[u8]) -> Result<()> {
        let Some(mut r) = self.reply.take() else {
            return Err(Error::InvalidArgument("the message's sender awaits no reply".into()));
        };
        let call = std::mem::take(&mut r.call);
        r.end.answer(call, Answer::Reply, bytes)
    }

    /// Its value, and no reply (dropped: the requester gets `NoReply`).
    pub fn into_value(self) -> T {
        self.value
    }
}

impl Link {
    /// This link's id (the same at both ends).
    pub fn id(&self) -> LinkId {
        self.end.id
    }

    /// The same end, with a time limit on every send that waits (for room
    /// or an answer) and every receive: `DeadlineExceeded` when it passes.
    pub fn with_timeout(mut self, limit: Duration) -> Link {
        self.timeout = Some(limit);
        self
    }

    /// Messages this end sent that the other end has not acknowledged
    /// consuming: after `PeerGone`, how many may have been lost (at most).
    pub fn unconfirmed(&self) -> u64 {
        self.end.state.lock().stream.unconfirmed()
    }

    /// Sends `bytes`; resolves at `checkpoint` (`OnReturn`: to the reply).
    /// Waits for room in the window the other end grants first; an
    /// `Immediate` send that finds none fails with `WouldBlock`.
    pub fn send_bytes_async<'a>(
        &'a self,
        bytes: &'a [u8],
        checkpoint: Checkpoint,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send + 'a {
        self.timed(async move {
            let call = poll_fn(|cx| self.end.poll_send(cx, bytes, checkpoint)).await?;
            let guard = CallGuard { end: &self.end, call };
            if call == 0 {
                return Ok(Vec::new());
            }
            let answer = poll_fn(|cx| self.end.poll_answer(cx, call)).await;
            std::mem::forget(guard);
            answer
        })
    }

    /// [`Link::send_bytes_async`], blocking this thread (spin, then park).
    pub fn send_bytes(&self, bytes: &[u8], checkpoint: Checkpoint) -> Result<Vec<u8>> {
        if checkpoint == Checkpoint::Immediate {
            // It never waits (no room is `WouldBlock`): one poll, no future.
            if let Poll::Ready(sent) = self.end.poll_send(&mut Context::from_waker(Waker::noop()), bytes, checkpoint) {
                return sent.map(|_| Vec::new());
            }
        }
        self.send_bytes_waiting(bytes, checkpoint)
    }

    /// [`Link::send_bytes`] past its first try: kept out of line, so the
    /// common `Immediate` send does not set up the blocking one's frame.
    #[inline(never)]
    fn send_bytes_waiting(&self, bytes: &[u8], checkpoint: Checkpoint) -> Result<Vec<u8>> {
        idle::block_on(&self.end.team, self.send_bytes_async(bytes, checkpoint))
    }

    /// Sends `value` (MessagePack); blocks until `checkpoint` (for
    /// `OnReturn` the reply is dropped: see [`Link::call`]).
    pub fn send<T: Serialize + ?Sized>(&self, value: &T, checkpoint: Checkpoint) -> Result<()> {
        self.send_bytes(&codec::encode(value)?, checkpoint).map(drop)
    }

    /// Sends `request` and blocks for the reply.
    pub fn call<Q: Serialize + ?Sized, R: DeserializeOwned>(&self, request: &Q) -> Result<R> {
        codec::decode(&self.send_bytes(&codec::encode(request)?, Checkpoint::OnReturn)?)
    }

    /// [`Link::call`], as a future.
    pub async fn call_async<Q: Serialize + ?Sized, R: DeserializeOwned>(&self, request: &Q) -> Result<R> {
        let bytes = codec::encode(request)?;
        codec::decode(&self.send_bytes_async(&bytes, Checkpoint::OnReturn).await?)
    }

    /// The next message's bytes (in the order they were sent). After the
    /// other end closed and everything it sent was received:
    /// `LinkClosed`; if its team died: `PeerGone`.
    pub fn recv_bytes(&self) -> impl Future<Output = Result<LinkMessage<LinkBytes>>> + Send + '_ {
        self.timed(async move {
            let m = poll_fn(|cx| self.end.poll_recv(Some(cx))).await?;
            Ok(self.message(m))
        })
    }

    /// [`Link::recv_bytes`], blocking this thread (spin, then park).
    pub fn recv_bytes_blocking(&self) -> Result<LinkMessage<LinkBytes>> {
        if self.timeout.is_none() {
            // A link frame at the head of a channel goes straight to its
            // end (see `runtime::direct_receive`).
            let team = &self.end.team;
            let m = idle::wait_catching(
                team,
                |cx| self.end.poll_recv(cx),
                |ch| {
                    let mut caught = None;
                    let mut mine = |h: &_, from, bytes: &[u8]| self.end.take_own(h, from, bytes, &mut caught);
                    if !team.serve_direct(ch, &super::KINDS, &mut mine) {
                        return None;
                    }
                    match caught {
                        Some(m) => Some(Ok(m)),
                        None => match self.end.poll_recv(None) {
                            Poll::Ready(m) => Some(m),
                            Poll::Pending => None,
                        },
                    }
                },
                None,
            );
            let Some(m) = m else { unreachable!("a wait with no deadline ends only when ready") };
            return Ok(self.message(m?));
        }
        idle::block_on(&self.end.team, self.recv_bytes())
    }

    /// The next message, decoded as a `T`.
    pub async fn recv<T: DeserializeOwned>(&self) -> Result<LinkMessage<T>> {
        decoded(self.recv_bytes().await?)
    }

    /// [`Link::recv`], blocking this thread.
    pub fn recv_blocking<T: DeserializeOwned>(&self) -> Result<LinkMessage<T>> {
        decoded(self.recv_bytes_blocking()?)
    }

    /// A message if one is waiting.
    pub fn try_recv<T: DeserializeOwned>(&self) -> Option<Result<LinkMessage<T>>> {
        match self.end.poll_recv(None) {
            Poll::Ready(Ok(m)) => Some(decoded(self.message(m))),
            Poll::Ready(Err(e)) => Some(Err(e)),
            Poll::Pending => None,
        }
    }

    /// Closes this end (as dropping it does): the other end receives what
    /// was sent before, then `LinkClosed`.
    pub fn close(self) {}

    fn message(&self, m: Arrived) -> LinkMessage<LinkBytes> {
        let reply = (m.checkpoint == Checkpoint::OnReturn).then(|| LinkReply { end: self.end.clone(), call: m.call });
        LinkMessage { value: m.bytes, reply }
    }

    /// `fut`, bounded by the link's time limit.
    async fn timed<R>(&self, fut: impl Future<Output = Result<R>>) -> Result<R> {
        match self.timeout.and_then(crate::runtime::deadline_after) {
            Some(at) => crate::port::race(fut, Sleep::until(&self.end.team, at)).await,
            None => fut.await,
        }
    }
}

fn decoded<T: DeserializeOwned>(m: LinkMessage<LinkBytes>) -> Result<LinkMessage<T>> {
    let LinkMessage { value, reply } = m;
    Ok(LinkMessage { value: codec::decode(&value)?, reply })
}

/// A link end inside a message: serializing it moves it (the end here
/// answers `LinkMoved` from then on; see `docs/LINK.md`, "Moving an end").
impl Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let carried = self.end.move_away().map_err(serde::ser::Error::custom)?;
        serializer.serialize_bytes(&carried)
    }
}

/// A link end taken out of a message: it becomes the end of the team that
/// received the message (the team whose port, link or service took it on
/// this thread last).
impl<'de> serde::Deserialize<'de> for Link {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Link, D::Error> {
        struct Carried;
        impl serde::de::Visitor<'_> for Carried {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a link end's bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> std::result::Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
        }
        let carried = deserializer.deserialize_bytes(Carried)?;
        let team = super::receiver().ok_or_else(|| {
            serde::de::Error::custom("a link end is taken out of a message a team received (its port, link or service)")
        })?;
        End::adopt(&team, &carried).map_err(serde::de::Error::custom)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.end.close();
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({}, side {:?})", self.end.id, self.end.hop.side)
    }
}

/// Remembers that router `hop` has handle `handle` (from its full frame's
/// header), among the last `MOST_KNOWN`, newest first (the router a
/// short frame comes from is most often the newest).
fn learn(known: &mut Vec<(Hop, u32)>, hop: Hop, handle: Option<u32>) {
    let Some(handle) = handle else { return };
    match known.iter_mut().find(|(h, _)| *h == hop) {
        Some(k) => k.1 = handle,
        None => {
            known.truncate(MOST_KNOWN - 1);
            known.insert(0, (hop, handle));
        }
    }
}

/// The router of team `from` whose handle is `src`, if it is known here.
fn sender_of(known: &[(Hop, u32)], from: TeamId, src: Option<u32>) -> Option<Hop> {
    let src = src?;
    known.iter().find(|(h, k)| h.team == from && *k == src).map(|(h, _)| *h)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Team;

    /// The handler may find a router in its table just as it leaves: a
    /// proxy that had given up then took its adopter's `Adopt` and said
    /// nothing, so the adopted end waited for good (the links stress
    /// test's rare stall). A router that left answers as one not there
    /// (`Gone`), so the adopter learns its route broke.
    #[test]
    fn a_router_that_left_answers_an_adoption_with_gone() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let (a, b) = team.link_pair().unwrap();
        // `b` moves, is adopted here, and moves again: its second proxy's
        // outward is its first (the same side: it starts no bypass).
        let b1 = End::adopt(&team.inner, &b.end.move_away().unwrap()).unwrap();
        let carried = b1.end.move_away().unwrap();
        let proxy = b1.end.clone();
        drop((b, b1));
        // It gives up (its lifetime ended) and leaves the table.
        proxy.expire();
        assert!(proxy.state.lock().retired);
        // The adopter, registered, whose `Adopt` the handler gave to the
        // proxy it had found just before the proxy left.
        let c = Carried::decode(&carried).unwrap();
        let links = Links::of_inner(&team.inner).unwrap();
        let (router, _) = Router::adopt(team.id(), c.side, &c.moved);
        let adopter = End::with(c.link, team.inner.clone(), links.clone(), router, c.stream);
        links.register(&team.inner, &adopter).unwrap();
        let adopt = What::Control(Control::Adopt { token: c.moved.token });
        proxy.arrive(team.id(), None, Frame { link: c.link, to: (Side::B, 1), from: (Side::B, 2), what: adopt });
        let got = adopter.into_link().with_timeout(Duration::from_secs(5)).recv_blocking::<u64>();
        assert!(matches!(got, Err(Error::PeerGone { .. })), "the adopter waits: {got:?}");
        drop(a);
    }
}
