//! Ports (DESIGN §1, StarMod §4.2): named, typed queuing points for
//! messages, not bound to a task. A send picks its completion checkpoint.

mod cached_channel;
mod select;

pub use select::Select;

use cached_channel::CachedChannel;

use crate::error::{Error, Result};
use crate::id::EndpointId;
use crate::names::plane::Wait;
use crate::runtime::channel::Channel;
use crate::runtime::channel::Incoming;
use crate::runtime::out::{self, Out};
use crate::runtime::payload::Payload;
use crate::runtime::EndpointInbox as Inbox;
use crate::runtime::Form;
use crate::runtime::{idle, Delivery, Route, Team, TeamInner};
use crate::wire::{flags, Checkpoint, Header, Kind, NackReason};
use serde::{de::DeserializeOwned, Serialize};
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

impl Team {
    /// Opens an unnamed port for messages of type `T`.
    pub fn open_port<T>(&self) -> Result<Port<T>> {
        Ok(Port { raw: self.open_raw_port()?, _t: PhantomData })
    }

    /// Opens a port and binds `name` to it in the team's name plane.
    pub fn open_named_port<T>(&self, name: &str) -> Result<Port<T>> {
        Ok(Port { raw: self.open_named_raw_port(name)?, _t: PhantomData })
    }

    /// Opens an unnamed raw-bytes port (no codec).
    pub fn open_raw_port(&self) -> Result<RawPort> {
        let (id, inbox) = self.inner.open_endpoint()?;
        Ok(RawPort { team: self.inner.clone(), id, inbox, name: None })
    }

    /// Opens a raw-bytes port and binds `name` to it in the team's name plane.
    pub fn open_named_raw_port(&self, name: &str) -> Result<RawPort> {
        let mut port = self.open_raw_port()?;
        self.inner.register_name(name, port.id)?;
        port.name = Some(name.to_string());
        Ok(port)
    }

    /// A sender of `T` messages to the endpoint `to`.
    pub fn sender<T>(&self, to: EndpointId) -> Sender<T> {
        Sender { raw: self.raw_sender(to), _t: PhantomData }
    }

    /// A sender of raw-bytes messages to the endpoint `to`.
    pub fn raw_sender(&self, to: EndpointId) -> RawSender {
        RawSender::of_team(self.inner.clone(), to)
    }

    /// Looks `name` up and returns a sender to it.
    pub fn connect<T>(&self, name: &str) -> Result<Sender<T>> {
        Ok(self.sender(self.lookup(name)?))
    }

    /// [`connect`](Team::connect), waiting up to `limit` for `name` to be
    /// registered (see [`Team::lookup_wait`]).
    pub fn connect_wait<T>(&self, name: &str, limit: Duration) -> Result<Sender<T>> {
        Ok(self.sender(self.lookup_wait(name, limit)?))
    }

    /// Looks `name` up, waiting up to `limit` for it to be registered (a
    /// process started before the one that registers it needs no retry
    /// loop); `NameNotFound` once the limit passes, `Shutdown` if the team
    /// leaves meanwhile. Blocks this thread as other blocking calls do
    /// (driving the team meanwhile); from async code use [`Team::lookup_async`].
    pub fn lookup_wait(&self, name: &str, limit: Duration) -> Result<EndpointId> {
        self.block_on(self.lookup_async(name, limit))
    }

    /// [`Team::lookup_wait`] as a future, for any executor. The first look,
    /// at this node's names, is made now; what goes beyond this node (the
    /// cluster's other nodes, or etcd) is asked from the future, on a
    /// blocking thread. With etcd, the future then watches the name;
    /// without, it looks again after 1 ms, 2 ms, 4 ms... at most every
    /// 50 ms, waiting on the team's timers (which its processors fire).
    pub fn lookup_async(
        &self,
        name: &str,
        limit: Duration,
    ) -> impl Future<Output = Result<EndpointId>> + Send + 'static {
        const FIRST: Duration = Duration::from_millis(1);
        const MOST: Duration = Duration::from_millis(50);
        let until = crate::runtime::deadline_after(limit);
        // This node's names now (a few file reads); the rest from the
        // future, on a blocking thread: it may wait on the network.
        let first = self.inner.plane.lookup_here(name);
        // A port of our own, known to nobody: its inbox closes at shutdown,
        // which ends the wait (the team's timers stop firing then).
        let waiting = matches!(first, Err(Error::NameNotFound(_))).then(|| self.open_raw_port());
        let (team, name) = (self.inner.clone(), name.to_string());
        async move {
            let Some(port) = waiting else { return first };
            let port = port?;
            let wait = team.plane.wait();
            // A plane that watches: one watch instead of looking again and again.
            if wait == Wait::Watch {
                drop(port);
                let forever = Duration::from_secs(365 * 24 * 3600);
                let left = until.map_or(forever, |u| u.saturating_duration_since(Instant::now()));
                return team.watch_name(&name, left).await.and_then(|r| r);
            }
            let mut pause = FIRST;
            let remote = wait == Wait::Poll;
            if remote {
                match team.lookup_elsewhere(&name).await {
                    Ok(Err(Error::NameNotFound(_))) => {}
                    Ok(found) => return found,
                    Err(e) => return Err(e),
                }
            }
            loop {
                let left = until.map(|u| u.saturating_duration_since(Instant::now()));
                if left.is_some_and(|l| l.is_zero()) {
                    return Err(Error::NameNotFound(name));
                }
                let nap = left.map_or(pause, |l| l.min(pause));
                match race(port.recv(), crate::runtime::Sleep::new(&team, nap)).await {
                    Err(Error::DeadlineExceeded) | Ok(_) => {}
                    Err(e) => return Err(e),
                }
                let found = match team.plane.lookup_here(&name) {
                    Err(Error::NameNotFound(_)) if remote => team.lookup_elsewhere(&name).await.and_then(|r| r),
                    found => found,
                };
                match found {
                    Err(Error::NameNotFound(_)) => pause = (pause * 2).min(MOST),
                    found => return found,
                }
            }
        }
    }
}

/// A port receiving raw byte messages.
pub struct RawPort {
    team: Arc<TeamInner>,
    id: EndpointId,
    inbox: Arc<Inbox>,
    name: Option<String>,
}

impl RawPort {
    /// The port's endpoint id, for senders.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// The name bound to the port, if it was opened named (unbound when the port drops).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Messages waiting in the port.
    pub fn len(&self) -> usize {
        self.inbox.len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Receives the next message.
    pub fn recv(&self) -> impl Future<Output = Result<RawMessage>> + '_ {
        poll_fn(move |cx| match self.inbox.poll_pop(cx) {
            Poll::Ready(Some(m)) => Poll::Ready(Ok(take(&self.team, m))),
            Poll::Ready(None) => Poll::Ready(Err(Error::Shutdown)),
            Poll::Pending => Poll::Pending,
        })
    }

    /// Receives the next message, blocking this thread (spin, then park).
    /// A plain message is taken straight from its channel (see
    /// `runtime::direct_receive`).
    pub fn recv_blocking(&self) -> Result<RawMessage> {
        self.recv_until(None)
    }

    /// Receives with a time limit: `DeadlineExceeded` when it passes. A limit
    /// too far to end (`Duration::MAX`) waits as long as it takes.
    pub fn recv_timeout(&self, limit: Duration) -> Result<RawMessage> {
        match crate::runtime::deadline_after(limit) {
            Some(at) => self.recv_until(Some(at)),
            None => self.recv_blocking(),
        }
    }

    /// Blocks until a message comes or `until` passes.
    fn recv_until(&self, until: Option<Instant>) -> Result<RawMessage> {
        // A message queued already (the rest of a drained burst) is taken
        // without setting up a wait.
        if !self.inbox.is_empty() {
            if let Poll::Ready(Some(m)) = self.inbox.poll_pop_now() {
                return Ok(take(&self.team, m));
            }
        }
        self.recv_waiting(until)
    }

    /// [`RawPort::recv_until`] past its look at the inbox: the wait. (Out
    /// of line: the look stays small, and a change to one leaves the
    /// other's code as it was.)
    #[inline(never)]
    fn recv_waiting(&self, until: Option<Instant>) -> Result<RawMessage> {
        let to = self.id.addr();
        let got = idle::wait_catching(
            &self.team,
            |cx| match cx {
                None => self.inbox.poll_pop_now(),
                Some(cx) => self.inbox.poll_pop(cx),
            },
            |ch| self.team.receive_direct(ch, to, &self.inbox).map(Some),
            until,
        );
        // Not `ok_or(Error::Shutdown)`: that builds (and drops) the error at every receive.
        match got {
            Some(Some(m)) => Ok(take(&self.team, m)),
            Some(None) => Err(Error::Shutdown),
            None => Err(Error::DeadlineExceeded),
        }
    }

    /// Takes a message if one is waiting.
    pub fn try_recv(&self) -> Option<RawMessage> {
        self.inbox.try_pop().map(|m| take(&self.team, m))
    }

    pub(crate) fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    pub(crate) fn team(&self) -> &Arc<TeamInner> {
        &self.team
    }
}

impl Drop for RawPort {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            self.team.unregister_name(name);
        }
        self.team.close_endpoint(self.id);
    }
}

/// Runs `fut` unless `timeout` completes first (then `DeadlineExceeded`).
pub(crate) async fn race<T>(fut: impl Future<Output = Result<T>>, timeout: impl Future<Output = ()>) -> Result<T> {
    let mut fut = std::pin::pin!(fut);
    let mut timeout = std::pin::pin!(timeout);
    poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        timeout.as_mut().poll(cx).map(|()| Err(Error::DeadlineExceeded))
    })
    .await
}

/// Turns a message taken from an inbox into what the receiver sees,
/// acknowledging it if the sender asked for `OnDelivery`.
pub(crate) fn take(team: &Arc<TeamInner>, m: Incoming) -> RawMessage {
    let (from, deadline, arrived) = (m.from(), m.deadline.get(), m.arrived.get());
    let reply = answer_owed(team, &m.header, m.channel);
    RawMessage { payload: m.payload, copied: OnceLock::new(), from, reply, deadline, arrived }
}

/// What a message `header` taken by `team` from `channel` owes its sender:
/// the ack of its delivery, sent now (`OnDelivery`), or a reply, owed by
/// the [`Responder`] returned (`OnReturn`). The part of [`take`] that a
/// message's taker needs when it makes no [`RawMessage`] of it (a served
/// call).
pub(crate) fn answer_owed(team: &Arc<TeamInner>, header: &Header, channel: Option<Arc<Channel>>) -> Option<Responder> {
    crate::link::received_by(team);
    let ch = channel?;
    match header.checkpoint() {
        Checkpoint::OnDelivery => {
            team.ack(&ch, header, Checkpoint::OnDelivery);
            None
        }
        Checkpoint::OnReturn => Some(Responder { team: team.clone(), to: Some((*header, ch)) }),
        _ => None,
    }
}

/// A received raw message.
pub struct RawMessage {
    payload: Payload,
    /// `payload` copied out of a peer's memory, the first time it is asked for as a slice.
    copied: OnceLock<Vec<u8>>,
    from: EndpointId,
    reply: Option<Responder>,
    deadline: Option<Instant>,
    arrived: Option<Instant>,
}

impl RawMessage {
    /// The bytes. A large payload that came out of band from another
    /// process is copied into fresh memory the first time; to receive it
    /// into memory you reuse instead, use [`RawMessage::read_into`].
    pub fn payload(&self) -> &[u8] {
        match self.payload.as_local() {
            Some(b) => b,
            None => self.copied.get_or_init(|| {
                let mut v = Vec::new();
                self.payload.read_into(&mut v);
                v
            }),
        }
    }

    /// Takes the bytes out, where they are (the message keeps none).
    pub(crate) fn take_payload(&mut self) -> Payload {
        let payload = std::mem::replace(&mut self.payload, Payload::Heap(Vec::new()));
        match self.copied.take() {
            Some(v) => Payload::Heap(v),
            None => payload,
        }
    }

    /// Copies the first bytes into `out` (as many as fit) without copying
    /// a large payload in; returns how many.
    pub(crate) fn read_head(&self, out: &mut [u8]) -> usize {
        match self.copied.get() {
            Some(b) => {
                let n = out.len().min(b.len());
                out[..n].copy_from_slice(&b[..n]);
                n
            }
            None => self.payload.read_head(out),
        }
    }

    /// Copies the bytes into `out`, replacing its contents and reusing its
    /// capacity: a large message lands in memory already touched (the
    /// first touch of fresh memory costs more than the copy).
    pub fn read_into(&self, out: &mut Vec<u8>) {
        self.payload.read_into(out)
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, taken (no copy when they were handed over in process).
    pub fn into_payload(self) -> Vec<u8> {
        match self.copied.into_inner() {
            Some(v) => v,
            None => self.payload.into_vec(),
        }
    }
    /// The sending endpoint.
    pub fn from(&self) -> EndpointId {
        self.from
    }
    /// Cost accounting: when the message reached its port (only while recording).
    pub(crate) fn arrived(&self) -> Option<Instant> {
        self.arrived
    }

    /// The sender's deadline for this message, if it set one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the sender waits for a reply (`OnReturn`).
    pub fn wants_reply(&self) -> bool {
        self.reply.is_some()
    }
    /// Takes the reply handle, to answer later or from elsewhere.
    pub fn responder(&mut self) -> Option<Responder> {
        self.reply.take()
    }
    /// Replies to an `OnReturn` send; a no-op for other checkpoints.
    pub fn reply(self, bytes: &[u8]) -> Result<()> {
        self.reply_out(Out::from(bytes))
    }

    /// Replies with `out` (see [`RawMessage::reply`]).
    pub(crate) fn reply_out(mut self, out: Out<'_>) -> Result<()> {
        // A reply that did not encode leaves the responder armed: dropped
        // with this message, it tells the sender (it never waits forever).
        self.reply.as_mut().map_or(Ok(()), |r| r.reply_out(out))
    }
}

/// The obligation to answer an `OnReturn` send. Dropping it unanswered
/// tells the sender (`Refused`), so it never waits forever.
pub struct Responder {
    team: Arc<TeamInner>,
    to: Option<(Header, Arc<Channel>)>,
}

impl Responder {
    pub(crate) fn new(team: Arc<TeamInner>, header: Header, ch: Arc<Channel>) -> Responder {
        Responder { team, to: Some((header, ch)) }
    }

    /// The team answering.
    pub(crate) fn team(&self) -> &Arc<TeamInner> {
        &self.team
    }

    /// The message being answered and the channel it came on.
    pub(crate) fn key(&self) -> (&Header, &Arc<Channel>) {
        let (h, ch) = self.to.as_ref().unwrap();
        (h, ch)
    }

    /// Sends `bytes` as the reply. It never waits for room: if the
    /// caller's channel is full it waits there, in order, until the caller
    /// reads (see `TeamInner::reply`); `Err` if the caller is gone.
    pub fn reply(mut self, bytes: &[u8]) -> Result<()> {
        let (h, ch) = self.to.take().unwrap();
        self.team.reply(&ch, &h, bytes)
    }

    /// Sends `out` as the reply (a typed value encoded as it is sent). If
    /// it did not encode (`Codec`), nothing was sent and this still owes the
    /// answer: answer otherwise, or drop it (the sender is told).
    pub(crate) fn reply_out(&mut self, out: Out<'_>) -> Result<()> {
        let Some((h, ch)) = &self.to else { return Ok(()) };
        let sent = self.team.reply_out(ch, h, out);
        if !matches!(sent, Err(Error::Codec(_))) {
            self.to = None;
        }
        sent
    }

    /// Whether the answer is still owed.
    pub(crate) fn is_pending(&self) -> bool {
        self.to.is_some()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some((h, ch)) = self.to.take() {
            self.team.nack(&ch, &h, NackReason::NoReply, b"message dropped without a reply");
        }
    }
}

/// Sends raw bytes to one endpoint.
pub struct RawSender {
    pub(crate) team: Arc<TeamInner>,
    to: EndpointId,
    timeout: Option<Duration>,
    /// The channel to `to`'s team, found on first use, and found again
    /// (binding a new one) when it dies. Held weakly: the team owns its
    /// channels, and a sender kept after its peer died (a program keeps its
    /// senders and clients) must not keep the dead channel's shared memory,
    /// doorbell and socket once the team has reclaimed it (it did, until
    /// the crash matrix found it).
    pub(crate) channel: Arc<CachedChannel>,
    /// What its frames are: `Data`, or a primitive's served kind (see `crate::extend`).
    pub(crate) form: Form,
}

impl Clone for RawSender {
    fn clone(&self) -> Self {
        RawSender {
            team: self.team.clone(),
            to: self.to,
            timeout: self.timeout,
            channel: self.channel.clone(),
            form: self.form,
        }
    }
}

impl RawSender {
    /// A sender of `team`'s (which it does not keep alive) to `to`.
    pub(crate) fn of_team(team: Arc<TeamInner>, to: EndpointId) -> RawSender {
        RawSender { team, to, timeout: None, channel: Arc::new(CachedChannel::new()), form: Form::DATA }
    }

    /// The cached channel, while it lives and its peer is not gone. (An
    /// upgrade per send: non-`Immediate` sends clone the channel anyway.)
    #[inline]
    pub(crate) fn cached(&self) -> Option<Arc<Channel>> {
        self.channel.get()
    }

    /// The destination endpoint.
    pub fn to(&self) -> EndpointId {
        self.to
    }

    /// The same sender, with a time limit on every send that waits for a
    /// checkpoint (a limit too far to end, like `Duration::MAX`, is none).
    pub fn with_timeout(mut self, limit: Duration) -> RawSender {
        self.timeout = Some(limit);
        self
    }

    /// Sends now; the returned future resolves at `checkpoint` (for
    /// `OnReturn`, to the reply). An `Immediate` send on a full channel
    /// fails with `WouldBlock`.
    ///
    /// Never waits on this thread: a message that finds its channel full
    /// waits in the future (copied, unless it is large and was staged out
    /// of band already) and goes out once the receiver makes room, bounded
    /// by the sender's deadline; so does the bind on the first send to a
    /// team (made on one of the team's blocking threads). Messages go out
    /// in order: while async sends wait on a channel, later sends on it go
    /// behind them (an `Immediate` one fails with `WouldBlock` unless they
    /// go out first). Dropping the future before its message went out
    /// withdraws it (see [`Delivery`]). The team's processors (or a thread
    /// in a blocking call) move waiting messages on: with `processors(0)`
    /// and no such thread, they wait.
    pub fn send_async(&self, bytes: &[u8], checkpoint: Checkpoint) -> Delivery {
        self.start(Out::from(bytes), checkpoint, false)
    }

    /// Starts a send. `blocking` (for a blocking call, which waits anyway):
    /// waits for room, and binds, on this thread; else never waits.
    pub(crate) fn start(&self, bytes: Out<'_>, checkpoint: Checkpoint, blocking: bool) -> Delivery {
        let src = self.team.id.endpoint(0).unwrap();
        let deadline = self.timeout.and_then(crate::runtime::deadline_after);
        if let Some(ch) = self.cached() {
            return self.team.send_on(&ch, self.form, src, self.to, bytes, checkpoint, deadline, blocking);
        }
        // First use, or the channel died: the team finds (or binds) the
        // current one, and it is cached for the next sends. A blocking send with no deadline binds on this
        // thread (the handshake's own timeouts bound it); one with a
        // deadline waits for the bind no longer than that.
        self.team.route_lookups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.uncached_route(blocking && deadline.is_none()) {
            Ok(Route::Ready(ch)) => {
                self.team.send_on(&ch, self.form, src, self.to, bytes, checkpoint, deadline, blocking)
            }
            Ok(Route::Binding(bind)) => {
                self.team.send_when_bound(&bind, self.form, src, self.to, bytes, checkpoint, deadline)
            }
            Err(e) => Delivery::failed(e),
        }
    }

    /// Where a send goes with no channel cached: where this sender's
    /// earlier sends went if they joined a bind (they keep their order:
    /// see `cached_channel`); else the team's route, binding on this thread
    /// if `bind_here` (or joining a bind a blocking thread runs). The
    /// channel found is cached, the bind joined remembered.
    pub(crate) fn uncached_route(&self, bind_here: bool) -> Result<Route> {
        let route = match self.channel.joined_route() {
            Some(route) => route,
            None if bind_here => Route::Ready(self.team.channel_to(self.to.team_id())?),
            None => self.team.route_async(self.to.team_id())?,
        };
        match &route {
            Route::Ready(ch) => self.channel.set(ch),
            Route::Binding(bind) => self.channel.join(bind),
        }
        Ok(route)
    }

    /// Starts `fut` as a task of the sender's team (a primitive's follow-up
    /// to a send: holds no owner handle of the team).
    pub(crate) fn spawn<F>(&self, fut: F) -> crate::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.team.exec.spawn(fut)
    }

    /// The same sender, whose frames are of `kind` (a served kind: see `Team::frame_sender`).
    pub(crate) fn of_kind(self, kind: Kind) -> RawSender {
        RawSender { form: Form { kind, ..self.form }, ..self }
    }

    /// An `OnReturn` send whose answer may bring descriptors: shared-memory
    /// segments a primitive's handler hands over after the bind
    /// ([`ServedFrame::reply_with_descriptors`](crate::extend::ServedFrame::reply_with_descriptors)).
    /// Blocks for the reply and them (none if the handler sent none). Only
    /// over shared memory: elsewhere (one team, another node) this is
    /// `InvalidArgument`, and the primitive shares memory its own way.
    pub fn call_for_descriptors(&self, bytes: &[u8]) -> Result<(Vec<u8>, Vec<rustix::fd::OwnedFd>)> {
        let ch = match self.cached() {
            Some(ch) => ch,
            None => {
                // Bound here: the handover is asked on the very channel the call goes out on.
                let ch = self.team.channel_to(self.to.team_id())?;
                self.channel.set(&ch);
                ch
            }
        };
        let src = self.team.id.endpoint(0).unwrap();
        let deadline = self.timeout.and_then(crate::runtime::deadline_after);
        let form = Form { flags: flags::HANDOVER, ..self.form };
        let mut d = self.team.send_on(&ch, form, src, self.to, Out::from(bytes), Checkpoint::OnReturn, deadline, true);
        match d.take_ready() {
            Some(r) => Ok((r?, Vec::new())),
            None => d.wait_here_for_descriptors(&self.team).map(|(p, fds)| (p.into_vec(), fds)),
        }
    }

    /// Sends and blocks until `checkpoint`; returns the reply for `OnReturn`.
    pub fn send(&self, bytes: &[u8], checkpoint: Checkpoint) -> Result<Vec<u8>> {
        if checkpoint == Checkpoint::Immediate && self.timeout.is_none() {
            if let Some(ch) = self.cached() {
                let h = Header::new(self.form.kind, self.team.id.endpoint(0).unwrap().addr(), self.to.addr(), 0);
                return self.team.send_immediate(&ch, h, bytes).map(|()| Vec::new());
            }
        }
        self.send_out(Out::from(bytes), checkpoint)
    }

    /// [`RawSender::send`] of `bytes` made or encoded (a typed value).
    pub(crate) fn send_out(&self, bytes: Out<'_>, checkpoint: Checkpoint) -> Result<Vec<u8>> {
        let mut d = self.start(bytes, checkpoint, true);
        match d.take_ready() {
            Some(r) => r,
            None => d.wait_here(&self.team).map(Payload::into_vec),
        }
    }

    /// `OnReturn` send: blocks for the reply.
    pub fn call(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        self.send(bytes, Checkpoint::OnReturn)
    }
}

/// A port receiving messages of type `T` (MessagePack-encoded).
pub struct Port<T> {
    raw: RawPort,
    _t: PhantomData<fn() -> T>,
}

/// A received typed message.
pub struct Message<T> {
    /// The decoded message.
    pub value: T,
    raw: RawMessage,
}

impl<T> Message<T> {
    /// The sending endpoint.
    pub fn from(&self) -> EndpointId {
        self.raw.from
    }
    /// Whether the sender waits for a reply (`OnReturn`).
    pub fn wants_reply(&self) -> bool {
        self.raw.wants_reply()
    }
    /// Replies to an `OnReturn` send with any serializable value.
    pub fn reply<R: Serialize>(self, value: &R) -> Result<()> {
        out::encoded(value, |o| self.raw.reply_out(o))?
    }
    /// The value, dropping the rest (an `OnReturn` sender is told `Refused`).
    pub fn into_value(self) -> T {
        self.value
    }
}

impl<T: DeserializeOwned> Port<T> {
    /// The port's endpoint id, for senders.
    pub fn id(&self) -> EndpointId {
        self.raw.id
    }
    /// The untyped port underneath.
    pub fn as_raw(&self) -> &RawPort {
        &self.raw
    }
    /// Messages waiting in the port.
    pub fn len(&self) -> usize {
        self.raw.len()
    }
    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Decodes a raw message received from this port (e.g. through [`Select`]).
    /// A message that does not decode is a `Codec` error here; a sender
    /// waiting for `OnReturn` is told (`Refused`), others are not.
    ///
    /// Decoded where it arrived (no copy of the bytes first; see
    /// `Payload::decode_at`), and its bytes are let go then: a large
    /// message's space goes back to its sender before the value is used.
    pub fn decode(mut raw: RawMessage) -> Result<Message<T>> {
        let value = raw.take_payload().decode_at(0)?;
        Ok(Message { value, raw })
    }

    /// Decodes a received message into `place` (through serde's
    /// `deserialize_in_place`: a `Vec<u8>` message lands in `place`'s own
    /// capacity, with one copy out of a peer's area and none before), and
    /// gives the rest of the message (sender, reply) as a `Message<()>`.
    fn decode_into(mut raw: RawMessage, place: &mut T) -> Result<Message<()>> {
        raw.take_payload().decode_in_place(place)?;
        Ok(Message { value: (), raw })
    }

    /// Receives the next message into `place`, a value the caller reuses
    /// (see [`Port::recv`]): a `Port<Vec<u8>>` receives into the buffer's
    /// capacity, warm memory, rather than a fresh vector per message. A
    /// message that does not decode leaves `place` in some valid state.
    pub async fn recv_into(&self, place: &mut T) -> Result<Message<()>> {
        Self::decode_into(self.raw.recv().await?, place)
    }

    /// [`Port::recv_into`], blocking this thread (see [`RawPort::recv_blocking`]).
    pub fn recv_into_blocking(&self, place: &mut T) -> Result<Message<()>> {
        Self::decode_into(self.raw.recv_blocking()?, place)
    }

    /// Receives the next message.
    pub async fn recv(&self) -> Result<Message<T>> {
        Self::decode(self.raw.recv().await?)
    }
    /// Receives the next message, blocking this thread (see [`RawPort::recv_blocking`]).
    pub fn recv_blocking(&self) -> Result<Message<T>> {
        Self::decode(self.raw.recv_blocking()?)
    }
    /// Receives with a time limit (see [`RawPort::recv_timeout`]).
    pub fn recv_timeout(&self, limit: Duration) -> Result<Message<T>> {
        Self::decode(self.raw.recv_timeout(limit)?)
    }
    /// Takes a message if one is waiting.
    pub fn try_recv(&self) -> Option<Result<Message<T>>> {
        self.raw.try_recv().map(Self::decode)
    }
}

/// Sends messages of type `T` to one endpoint.
pub struct Sender<T> {
    raw: RawSender,
    _t: PhantomData<fn(T)>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender { raw: self.raw.clone(), _t: PhantomData }
    }
}

impl<T: Serialize> Sender<T> {
    /// The destination endpoint.
    pub fn to(&self) -> EndpointId {
        self.raw.to
    }
    /// The untyped sender underneath.
    pub fn as_raw(&self) -> &RawSender {
        &self.raw
    }
    /// The same sender with a time limit on every send (see [`RawSender::with_timeout`]).
    pub fn with_timeout(self, limit: Duration) -> Sender<T> {
        Sender { raw: self.raw.with_timeout(limit), _t: PhantomData }
    }

    /// Sends and blocks until `checkpoint` is reached.
    pub fn send(&self, value: &T, checkpoint: Checkpoint) -> Result<()> {
        out::encoded(value, |o| self.raw.send_out(o, checkpoint))?.map(drop)
    }

    /// Sends now; the future resolves at `checkpoint` (see [`RawSender::send_async`]).
    pub fn send_async(&self, value: &T, checkpoint: Checkpoint) -> impl Future<Output = Result<()>> {
        let d = out::encoded(value, |o| self.raw.start(o, checkpoint, false));
        async move { d?.await.map(drop) }
    }

    /// `OnReturn` send decoding the reply as `R` (where it arrived), blocking.
    pub fn call<R: DeserializeOwned>(&self, value: &T) -> Result<R> {
        let d = out::encoded(value, |o| self.raw.start(o, Checkpoint::OnReturn, true))?;
        d.wait_here(&self.raw.team)?.decode_at(0)
    }

    /// `OnReturn` send; the future resolves to the decoded reply.
    pub fn call_async<R: DeserializeOwned>(&self, value: &T) -> impl Future<Output = Result<R>> {
        let d = out::encoded(value, |o| self.raw.start(o, Checkpoint::OnReturn, false));
        async move {
            let mut d = d?;
            poll_fn(|cx| d.poll_payload(cx)).await?.decode_at(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Duration::MAX` (and anything too far to end) is "no deadline", at
    /// every entry point that takes a limit, never an `Instant` overflow.
    #[test]
    fn huge_limits_mean_no_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let port = team.open_port::<u32>().unwrap();
        let raw = team.open_raw_port().unwrap();
        // 2^62 s fits an Instant, but not the u64 nanoseconds a deadline travels as.
        for limit in [Duration::MAX, Duration::from_secs(1 << 62)] {
            team.sender::<u32>(port.id()).with_timeout(limit).send(&5, Checkpoint::OnReceipt).unwrap();
            let m = port.recv_timeout(limit).unwrap();
            assert_eq!((m.value, m.raw.deadline()), (5, None));
            // Waiting for a message that comes later.
            let to = team.raw_sender(raw.id()).with_timeout(limit);
            let late = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                to.send(b"late", Checkpoint::OnReceipt).unwrap();
            });
            let m = raw.recv_timeout(limit).unwrap();
            assert_eq!((m.payload(), m.deadline()), (&b"late"[..], None));
            late.join().unwrap();
            // A call waiting for its reply.
            let to = team.raw_sender(raw.id()).with_timeout(limit);
            let call = std::thread::spawn(move || to.call(b"q"));
            raw.recv_timeout(limit).unwrap().reply(b"a").unwrap();
            assert_eq!(call.join().unwrap().unwrap(), b"a");
            // A sleep that never ends: a shorter race partner wins.
            let never = async {
                team.sleep(limit).await;
                Ok(())
            };
            let woke = team.block_on(race(never, team.sleep(Duration::from_millis(5))));
            assert!(matches!(woke, Err(Error::DeadlineExceeded)), "{woke:?}");
        }
    }
}
