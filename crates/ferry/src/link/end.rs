//! One end of a link: what its holder sends and receives ([`Link`]), and
//! what the team's handler hands it ([`End::arrive`]).

use super::stream::{Broken, Stream};
use super::table::Links;
use super::wire::{Answer, Body, Frame};
use super::{LinkId, Side, Window};
use crate::error::{Error, Refusal, Result, Violation};
use crate::id::TeamId;
use crate::port::RawSender;
use crate::runtime::{idle, Sleep, TeamInner};
use crate::wire::{codec, Checkpoint};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// One end of a link, held by one team (see the module's text).
pub struct Link {
    end: Arc<End>,
    timeout: Option<Duration>,
}

/// What an end shares with its team's handler.
pub(super) struct End {
    pub id: LinkId,
    pub side: Side,
    team: Arc<TeamInner>,
    links: Arc<Links>,
    /// Frames of kind `FRAME` to the team holding the other end.
    sender: RawSender,
    state: Mutex<State>,
}

struct State {
    /// The team holding the other end: frames are taken from it only.
    peer: TeamId,
    stream: Stream,
    /// Messages taken in order, for the user.
    queue: VecDeque<Arrived>,
    /// This end's messages awaiting their answer, by call number.
    calls: HashMap<u32, Call>,
    next_call: u32,
    /// The other end probed: it waits for room.
    peer_waits: bool,
    /// This end probed since its last acknowledgement came.
    probed: bool,
    receiver: Option<Waker>,
    senders: Vec<Waker>,
    /// Why nothing more comes or goes, once it is so.
    ended: Option<Ended>,
}

struct Arrived {
    checkpoint: Checkpoint,
    call: u32,
    bytes: Vec<u8>,
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
}

impl Ended {
    fn error(&self, link: LinkId) -> Error {
        match self {
            Ended::PeerClosed | Ended::Closed => Error::LinkClosed { link },
            Ended::PeerGone(peer) => Error::PeerGone { peer: *peer },
            Ended::Broken(peer, why) => {
                Error::Protocol { peer: *peer, violation: Violation::BadLinkFrame(why.clone()) }
            }
        }
    }
}

impl End {
    pub fn new(
        id: LinkId,
        side: Side,
        team: Arc<TeamInner>,
        links: Arc<Links>,
        peer: TeamId,
        window_in: Window,
        window_out: Window,
    ) -> Arc<End> {
        let sender = RawSender::of_team(team.clone(), peer.endpoint(0).expect("slot 0 fits"))
            .of_kind(crate::wire::Kind::Served(super::wire::FRAME));
        let state = State {
            peer,
            stream: Stream::new(window_in, window_out),
            queue: VecDeque::new(),
            calls: HashMap::new(),
            next_call: 1,
            peer_waits: false,
            probed: false,
            receiver: None,
            senders: Vec::new(),
            ended: None,
        };
        Arc::new(End { id, side, team, links, sender, state: Mutex::new(state) })
    }

    pub fn into_link(self: Arc<End>) -> Link {
        Link { end: self, timeout: None }
    }

    pub fn set_window_out(&self, w: Window) {
        self.state.lock().stream.window_out = w;
    }

    /// Sends a frame to the other side, numbered `seq`, with this end's
    /// acknowledgement (under the state's lock: frames leave in order).
    fn post(&self, s: &mut State, seq: u64, body: Body<'_>) -> Result<()> {
        let f = Frame { link: self.id, seq, to: self.side.other(), ack: s.stream.ack(), body };
        self.sender.post(&f.encode())
    }

    /// Posts a frame that is not a message; a failure ends the link.
    fn post_control(&self, s: &mut State, body: Body<'_>) {
        let seq = s.stream.next_frame();
        if let Err(e) = self.post(s, seq, body) {
            tracing::debug!(link = %self.id, error = %e, "a link's frame could not go");
            let peer = s.peer;
            self.end(s, Ended::PeerGone(peer));
        }
    }

    /// Records why the link ended (the first reason stays), failing what waits.
    fn end(&self, s: &mut State, why: Ended) {
        if s.ended.is_none() {
            s.ended = Some(why.clone());
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
        if !s.stream.may_send(bytes.len()) {
            if !s.probed {
                s.probed = true;
                self.post_control(&mut s, Body::Probe);
            }
            if checkpoint == Checkpoint::Immediate {
                return Poll::Ready(Err(Error::WouldBlock { to: s.peer.endpoint(0).expect("slot 0 fits") }));
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

    fn poll_recv(self: &Arc<Self>, cx: Option<&mut Context<'_>>) -> Poll<Result<Arrived>> {
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
        let seq = s.stream.next_frame();
        self.post(&mut s, seq, Body::Answer { call, answer, bytes })
    }

    /// A frame for this end came from `from` (the handler's part).
    pub fn arrive(&self, from: TeamId, seq: u64, bytes: &[u8]) {
        let mut s = self.state.lock();
        if from != s.peer {
            // Not on the route this link set up: a peer cannot join a link by its id.
            tracing::warn!(link = %self.id, %from, peer = %s.peer, "a link's frame from a team that holds no end of it");
            return;
        }
        if s.ended.is_some() {
            return;
        }
        let taken = match s.stream.arrive(seq, bytes) {
            Ok(due) => due.iter().try_for_each(|f| self.take(&mut s, f)),
            Err(broken) => Err(broken),
        };
        if let Err(Broken(why)) = taken {
            tracing::warn!(link = %self.id, %from, %why, "a link's peer broke its protocol");
            self.end(&mut s, Ended::Broken(from, why));
        }
    }

    /// Takes one frame due in order.
    fn take(&self, s: &mut State, bytes: &[u8]) -> std::result::Result<(), Broken> {
        let f = Frame::decode(bytes).map_err(|e| Broken(e.to_string()))?;
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
                s.queue.push_back(Arrived { checkpoint, call, bytes: bytes.to_vec() });
                if let Some(w) = s.receiver.take() {
                    w.wake();
                }
            }
            Body::Answer { call, answer, bytes } => {
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

    /// The team holding the other end is gone.
    pub fn peer_gone(&self, peer: TeamId) {
        let mut s = self.state.lock();
        if s.peer == peer && s.ended.is_none() {
            self.end(&mut s, Ended::PeerGone(peer));
        }
    }

    /// Closes this end: the other end sees `LinkClosed` after what was sent before.
    fn close(&self) {
        let mut s = self.state.lock();
        if s.ended.is_none() {
            self.post_control(&mut s, Body::Close);
        }
        self.end(&mut s, Ended::Closed);
        drop(s);
        self.links.forget(self.id, self.side);
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
    pub fn recv_bytes(&self) -> impl Future<Output = Result<LinkMessage<Vec<u8>>>> + Send + '_ {
        self.timed(async move {
            let m = poll_fn(|cx| self.end.poll_recv(Some(cx))).await?;
            Ok(self.message(m))
        })
    }

    /// [`Link::recv_bytes`], blocking this thread (spin, then park).
    pub fn recv_bytes_blocking(&self) -> Result<LinkMessage<Vec<u8>>> {
        if self.timeout.is_none() {
            let m = idle::wait_until(&self.end.team, |cx| self.end.poll_recv(cx))?;
            return Ok(self.message(m));
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

    fn message(&self, m: Arrived) -> LinkMessage<Vec<u8>> {
        let reply = (m.checkpoint == Checkpoint::OnReturn).then(|| LinkReply { end: self.end.clone(), call: m.call });
        LinkMessage { value: m.bytes, reply }
    }

    /// `fut`, bounded by the link's time limit.
    async fn timed<R>(&self, fut: impl Future<Output = Result<R>>) -> Result<R> {
        let Some(at) = self.timeout.and_then(crate::runtime::deadline_after) else { return fut.await };
        let mut fut = std::pin::pin!(fut);
        let mut sleep = std::pin::pin!(Sleep::until(&self.end.team, at));
        poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(v);
            }
            sleep.as_mut().poll(cx).map(|()| Err(Error::DeadlineExceeded))
        })
        .await
    }
}

fn decoded<T: DeserializeOwned>(m: LinkMessage<Vec<u8>>) -> Result<LinkMessage<T>> {
    let LinkMessage { value, reply } = m;
    Ok(LinkMessage { value: codec::decode(&value)?, reply })
}

impl Drop for Link {
    fn drop(&mut self) {
        self.end.close();
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({}, side {:?})", self.end.id, self.end.side)
    }
}
