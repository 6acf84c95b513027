//! The server side: a service endpoint that accepts calls, explicitly or
//! by dispatching each to a new task (implicit receipt).

use super::descriptor::ServiceDescriptor;
use super::envelope::{self, Request};
use super::gate::{Gate, Place};
use super::{HandlerFuture, Never, RpcError};
use crate::cost::{self, Side, Stage};
use crate::error::{Error, Result};
use crate::id::EndpointId;
use crate::port::{RawMessage, RawPort, Responder};
use crate::runtime::out;
use crate::runtime::payload::Payload;
use crate::runtime::{panic_message, CancelGuard, CatchUnwind, JoinHandle, Sleep, Team, TeamInner};
use crate::wire::codec;
use parking_lot::Mutex;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// A handler's response: encoded (see `envelope`), or a large result
/// still to encode, straight where its reply is staged.
pub enum Response {
    /// The response's bytes.
    Bytes(Vec<u8>),
    /// A small response's bytes, held inline: no allocation per reply.
    Inline(InlineBytes),
    /// Sends the reply of the call it is given.
    Value(SendReply),
}

/// [`Response::Value`]'s sender: answers the call it is given, in place.
pub type SendReply = Box<dyn FnOnce(&mut IncomingCall) -> Result<()> + Send>;

impl Response {
    /// A status byte then `value`: encoded now if small, else kept to be
    /// encoded as its reply is sent (a status `CODEC` if it does not encode).
    pub(crate) fn encoded<T: Serialize + Send + 'static>(code: u8, value: T, what: &'static str) -> Response {
        if let Ok(Some((bytes, len))) = out::encode_inline(&[code], &value) {
            return Response::Inline(InlineBytes { bytes, len: len as u8 });
        }
        match out::encode_small(&[code], &value) {
            Ok(Some(bytes)) => Response::Bytes(bytes),
            Ok(None) => Response::Value(Box::new(move |call| call.reply_encoded(code, &value, what))),
            Err(e) => Response::Bytes(envelope::status(envelope::CODEC, &format!("the {what} did not encode: {e}"))),
        }
    }
}

/// Up to [`InlineBytes::CAP`] bytes, held inline.
pub struct InlineBytes {
    bytes: [u8; InlineBytes::CAP],
    len: u8,
}

impl InlineBytes {
    /// Most bytes held (a status byte and a small value).
    pub const CAP: usize = 30;

    /// The bytes held.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl From<Vec<u8>> for Response {
    fn from(bytes: Vec<u8>) -> Response {
        Response::Bytes(bytes)
    }
}

/// The dispatcher a `#[ferry::service]` trait generates (`<Trait>Server`).
pub trait Dispatch: Send + Sync + 'static {
    /// The interface served, checked against each binding client's.
    fn descriptor(&self) -> ServiceDescriptor;
    /// Runs method number `method` on encoded `args` (decoded before the
    /// future starts, which lets their request go).
    fn dispatch(self: Arc<Self>, method: u32, args: Args) -> HandlerFuture;
}

/// A call's encoded arguments, where they arrived: its whole request (in a
/// peer's area, a buffer handed over or read off a socket) and where they
/// start in it. Decoding them consumes them: a large request is let go
/// before the handler runs, not kept beside its decoded value and reply.
pub struct Args {
    payload: Payload,
    at: usize,
}

impl Args {
    /// Decodes them (see `Payload::decode_at`: byte fields are views of a
    /// buffer this process owns, or copied once out of a peer's area).
    pub fn decode<A: DeserializeOwned>(self) -> Result<A> {
        match &self.payload {
            // Small ones (most calls) straight from the bytes they came in.
            Payload::Inline { len, bytes } => codec::decode(bytes[..*len as usize].get(self.at..).unwrap_or_default()),
            _ => self.payload.decode_at(self.at),
        }
    }

    /// Their bytes (copied if they are in a peer's area).
    fn bytes_of(payload: &Payload, at: usize) -> std::borrow::Cow<'_, [u8]> {
        match payload.as_local() {
            Some(b) => std::borrow::Cow::Borrowed(b.get(at..).unwrap_or_default()),
            None => {
                let mut v = Vec::new();
                payload.read_into(&mut v);
                v.drain(..at.min(v.len()));
                std::borrow::Cow::Owned(v)
            }
        }
    }
}

/// Tells a handler its call was cancelled (the caller gave up or the deadline passed).
#[derive(Clone, Default)]
pub struct CancelToken(Arc<CancelState>);

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CancelToken(cancelled: {})", self.is_cancelled())
    }
}

#[derive(Default)]
struct CancelState {
    cancelled: AtomicBool,
    waiters: Mutex<Waiters>,
}

/// The wakers of the `cancelled()` futures waiting on a token: one slot per
/// future, however often it is polled (a handler's is polled on every wake).
#[derive(Default)]
struct Waiters {
    next_key: u64,
    wakers: Vec<(u64, Waker)>,
}

impl CancelToken {
    /// Marks the call cancelled and wakes whoever waits in [`CancelToken::cancelled`].
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        let wakers = std::mem::take(&mut self.0.waiters.lock().wakers);
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Whether the call was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Completes once the call is cancelled.
    pub fn cancelled(&self) -> impl Future<Output = ()> + '_ {
        Cancelled { token: self, key: None }
    }

    /// Wakers held for waiting futures.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.0.waiters.lock().wakers.len()
    }
}

/// See [`CancelToken::cancelled`].
struct Cancelled<'a> {
    token: &'a CancelToken,
    /// This future's slot in the token's `Waiters`, once it has waited.
    key: Option<u64>,
}

impl Future for Cancelled<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let token = self.token;
        if token.is_cancelled() {
            return Poll::Ready(());
        }
        let mut waiters = token.0.waiters.lock();
        let mut old = None;
        match self.key.and_then(|k| waiters.wakers.iter_mut().find(|(key, _)| *key == k)) {
            Some((_, w)) => {
                if !w.will_wake(cx.waker()) {
                    old = Some(std::mem::replace(w, cx.waker().clone()));
                }
            }
            None => {
                let key = waiters.next_key;
                waiters.next_key += 1;
                waiters.wakers.push((key, cx.waker().clone()));
                self.key = Some(key);
            }
        }
        drop(waiters);
        // Dropped unlocked: a waker may own a task that holds this token.
        drop(old);
        if token.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        let Some(k) = self.key else { return };
        let mut waiters = self.token.0.waiters.lock();
        let gone = waiters.wakers.iter().position(|(key, _)| *key == k).map(|i| waiters.wakers.swap_remove(i));
        drop(waiters);
        drop(gone);
    }
}

/// One call as the server receives it.
pub struct IncomingCall {
    method: u32,
    /// Where the arguments start in `args` (kept here, beside `method`: an
    /// `Args` would make every call 8 bytes larger).
    args_at: u32,
    /// The call's request (see `Args`).
    args: Payload,
    from: EndpointId,
    deadline: Option<Instant>,
    responder: Option<Responder>,
    /// Made with the cancel hook, when the call first needs them (an
    /// accepted call's when its token is first asked for).
    cancel: OnceLock<CancelToken>,
    /// Cost accounting: when the request reached the endpoint.
    arrived: Option<Instant>,
    /// Keeps the "peer cancelled this call" hook registered while the call
    /// lives; made when the call first needs it (see `hooked_token`).
    hook: OnceLock<CancelGuard>,
    /// Explicit receipt: cancels the token at the caller's deadline.
    deadline_watch: Option<DeadlineWatch>,
    /// For [`IncomingCall::method_name`]: set when the call is accepted
    /// (explicit receipt). A call served implicitly never shows it, and
    /// would pay a shared count's two locked instructions for it.
    service: Option<Arc<ServiceDescriptor>>,
    /// A retryable call: where its reply is remembered, under which key.
    once: Option<(Arc<Once>, OnceKey)>,
}

/// How long a server remembers the reply of a retryable call (see
/// [`Client::retrying`](super::Client::retrying)): a retry that comes later
/// runs the call again.
pub const RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
/// Most replies of retryable calls a service remembers, and their bytes;
/// past either, the oldest are forgotten first.
const ONCE_ENTRIES: usize = 4096;
const ONCE_BYTES: usize = 16 << 20;
/// Most repeats of one running retryable call that wait for its reply;
/// past it, the oldest is refused (a repeat comes over a new connection:
/// the older ones' callers have most likely gone).
const ONCE_REPEATS: usize = 8;

/// A retryable call: the caller's team (incarnation included) and its request id.
type OnceKey = (crate::id::TeamId, u64);

/// The retryable calls a service has seen: each runs at most once; a
/// repeat gets the first run's reply (at once if it is done, else when it
/// ends). Bounded by [`RETRY_WINDOW`], `ONCE_ENTRIES` and `ONCE_BYTES`.
#[derive(Default)]
pub(crate) struct Once {
    state: Mutex<OnceState>,
}

#[derive(Default)]
struct OnceState {
    entries: std::collections::HashMap<OnceKey, OnceEntry>,
    /// Finished calls, oldest first, to forget them in order.
    done: VecDeque<(OnceKey, Instant)>,
    bytes: usize,
}

enum OnceEntry {
    /// Running; these repeats wait for its reply.
    Running(Vec<Responder>),
    Done(Vec<u8>),
}

impl Once {
    /// A retryable call arrives: its responder back if it is to run now;
    /// `None` if a run of it is done (answered now) or under way (this
    /// repeat is answered when it ends).
    fn begin(&self, key: OnceKey, responder: Option<Responder>) -> Option<Option<Responder>> {
        let mut superseded = None;
        let r = self.begin_locked(key, responder, &mut superseded);
        if let Some(old) = superseded {
            let _ = old.reply(&envelope::status(envelope::REFUSED, "a later repeat of this call replaced this one"));
        }
        r
    }

    fn begin_locked(
        &self,
        key: OnceKey,
        responder: Option<Responder>,
        superseded: &mut Option<Responder>,
    ) -> Option<Option<Responder>> {
        let mut st = self.state.lock();
        let now = Instant::now();
        while let Some(&(k, at)) = st.done.front() {
            let over = st.done.len() > ONCE_ENTRIES || st.bytes > ONCE_BYTES;
            if !over && now.duration_since(at) < RETRY_WINDOW {
                break;
            }
            st.done.pop_front();
            if let Some(OnceEntry::Done(r)) = st.entries.remove(&k) {
                st.bytes -= r.len();
            }
        }
        match st.entries.get_mut(&key) {
            Some(OnceEntry::Done(response)) => {
                if let Some(r) = responder {
                    let _ = r.reply(response);
                }
                None
            }
            Some(OnceEntry::Running(waiting)) => {
                if responder.is_some() && waiting.len() >= ONCE_REPEATS {
                    *superseded = Some(waiting.remove(0));
                }
                waiting.extend(responder);
                None
            }
            None => {
                st.entries.insert(key, OnceEntry::Running(Vec::new()));
                Some(responder)
            }
        }
    }

    /// A run ended with `response`: remembered; the repeats that waited get it.
    fn finish(&self, key: OnceKey, response: &[u8]) {
        let waiting = {
            let mut st = self.state.lock();
            let old = st.entries.insert(key, OnceEntry::Done(response.to_vec()));
            st.bytes += response.len();
            st.done.push_back((key, Instant::now()));
            match old {
                Some(OnceEntry::Running(w)) => w,
                _ => Vec::new(),
            }
        };
        for r in waiting {
            let _ = r.reply(response);
        }
    }
}

impl Drop for IncomingCall {
    fn drop(&mut self) {
        // A retryable call dropped unanswered: its repeats are refused too.
        if let Some((once, key)) = self.once.take() {
            once.finish(key, &envelope::status(envelope::REFUSED, "dropped without a reply"));
        }
    }
}

impl IncomingCall {
    /// The method's number: its index in the service's declaration order.
    pub fn method(&self) -> u32 {
        self.method
    }

    /// The method's name (`"?"` for a number the service does not have).
    pub fn method_name(&self) -> &str {
        let method = self.service.as_ref().and_then(|s| s.methods.get(self.method as usize));
        method.map_or("?", |m| m.name.as_str())
    }

    /// The encoded arguments (generated clients send a tuple of them):
    /// copied if large ones came in a peer's area. Empty once taken
    /// ([`IncomingCall::take_args`]).
    pub fn args(&self) -> std::borrow::Cow<'_, [u8]> {
        Args::bytes_of(&self.args, self.args_at as usize)
    }

    /// The arguments, decoded as `A` (the request stays: see [`IncomingCall::take_args`]).
    pub fn decode_args<A: DeserializeOwned>(&self) -> Result<A, RpcError> {
        Ok(codec::decode(&self.args())?)
    }

    /// The arguments, decoded as `A` where they arrived; the request goes
    /// then (a large one does not stay beside its value). Later calls find
    /// no arguments.
    pub fn take_args<A: DeserializeOwned>(&mut self) -> Result<A, RpcError> {
        Ok(self.take_request().decode()?)
    }

    /// The arguments with their request, taken (the call keeps none).
    fn take_request(&mut self) -> Args {
        Args { payload: std::mem::replace(&mut self.args, Payload::Heap(Vec::new())), at: self.args_at as usize }
    }

    /// The caller's endpoint.
    pub fn from(&self) -> EndpointId {
        self.from
    }

    /// The caller's deadline, if it set one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Cancelled when the caller gives up on the call or its deadline
    /// passes (calls from `accept` and handlers that wait have one; a call
    /// answered at once does not).
    pub fn cancel_token(&self) -> Option<&CancelToken> {
        match self.service {
            // Accepted: made the first time it is asked for (a cancel that
            // came before is kept for it: `Calls::early_cancels`).
            Some(_) => Some(self.cancel.get_or_init(|| self.hooked_token())),
            None => self.cancel.get(),
        }
    }

    /// Makes the caller's cancel (a `Cancel` frame) reach the cancel token.
    /// Done lazily: a call answered at once never needs it.
    fn watch_cancel(&self) -> CancelToken {
        self.cancel.get_or_init(|| self.hooked_token()).clone()
    }

    /// A new cancel token that the caller's cancel reaches (its hook kept
    /// registered while the call lives).
    fn hooked_token(&self) -> CancelToken {
        let token = CancelToken::default();
        if let Some(r) = &self.responder {
            let (h, ch) = r.key();
            let t = token.clone();
            // Set once: only this function sets it, and only from `cancel`'s initialiser.
            let _ = self.hook.set(r.team().on_cancel(ch, h.call_id, Box::new(move || t.cancel())));
        }
        token
    }

    /// Whether the caller waits for an answer (one-way calls do not).
    pub fn wants_reply(&self) -> bool {
        self.responder.is_some()
    }

    /// Answers with an encoded response (see `envelope`); a no-op for one-way calls.
    ///
    /// Never waits for room: a caller that reads nothing must not hold up
    /// the service for the others. A reply its channel cannot take now
    /// waits in the channel and goes once the caller reads (or is dropped
    /// with the channel); past a bound of waiting replies, the team takes
    /// no more calls from that caller until it reads.
    pub fn reply_raw(mut self, response: &[u8]) -> Result<()> {
        self.reply_now(response)
    }

    /// [`IncomingCall::reply_raw`] in place: the call is answered (dropping
    /// it afterwards sends nothing more).
    fn reply_now(&mut self, response: &[u8]) -> Result<()> {
        if let Some((once, key)) = self.once.take() {
            once.finish(key, response);
        }
        match self.responder.take() {
            Some(r) => r.reply(response),
            None => Ok(()),
        }
    }

    /// Answers with a result (a large one encoded straight where its
    /// reply is staged).
    pub fn reply_ok<R: Serialize + ?Sized>(mut self, value: &R) -> Result<()> {
        self.reply_encoded(envelope::OK, value, "result")
    }

    /// Answers with the handler's own error (`RpcError::Remote` at the caller).
    pub fn reply_err<E: Serialize + ?Sized>(mut self, err: &E) -> Result<()> {
        self.reply_encoded(envelope::REMOTE, err, "error")
    }

    /// Answers with a handler's response.
    pub fn respond(mut self, response: Response) -> Result<()> {
        self.respond_now(response)
    }

    /// [`IncomingCall::respond`] in place (the call is large: each move of
    /// it is a copy on every call's path).
    fn respond_now(&mut self, response: Response) -> Result<()> {
        match response {
            Response::Bytes(b) => self.reply_now(&b),
            Response::Inline(b) => self.reply_now(b.as_slice()),
            Response::Value(send) => send(self),
        }
    }

    /// Answers with status `code` then `value`, encoded where the reply is
    /// staged; a value that does not encode is answered `CODEC`.
    fn reply_encoded<T: Serialize + ?Sized>(&mut self, code: u8, value: &T, what: &str) -> Result<()> {
        if self.once.is_some() || self.responder.is_none() {
            // Remembered for repeats (or not sent at all): as bytes.
            return self.reply_now(&envelope::encoded(code, value, what));
        }
        let Some(mut responder) = self.responder.take() else { return Ok(()) };
        match out::encoded_after(&[code], value, &mut Vec::new(), |o| responder.reply_out(o)).and_then(|r| r) {
            // Not sent: it did not encode (before or as it was staged).
            Err(Error::Codec(e)) if responder.is_pending() => {
                responder.reply(&envelope::status(envelope::CODEC, &format!("the {what} did not encode: {e}")))
            }
            sent => sent,
        }
    }

    /// Refuses the call; the caller gets `RpcError::Refused(why)`.
    pub fn refuse(self, why: &str) -> Result<()> {
        self.reply_raw(&envelope::status(envelope::REFUSED, why))
    }

    /// Hands the call to the implicit dispatcher: a new task runs it.
    pub fn dispatch<D: Dispatch>(mut self, team: &Team, handler: &Arc<D>) -> JoinHandle<()> {
        // The dispatcher enforces the deadline itself (and answers `DEADLINE`).
        self.deadline_watch = None;
        team.spawn(run_call(team.inner.clone(), handler.clone(), self))
    }

    /// Explicit receipt: the cancel token fires at the caller's deadline, so
    /// code holding the call sees it expire as an implicit handler would.
    fn watch_deadline(&mut self, team: &Arc<TeamInner>) {
        let (Some(at), Some(token)) = (self.deadline, self.cancel.get().cloned()) else { return };
        let inner = team.clone();
        let task = team.exec.spawn(async move {
            Sleep::until(&inner, at).await;
            token.cancel();
        });
        self.deadline_watch = Some(DeadlineWatch(task.abort_handle()));
    }
}

/// Stops a call's deadline watch when the call is answered or dropped.
struct DeadlineWatch(crate::runtime::AbortHandle<()>);

impl Drop for DeadlineWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A typed reply handle for explicit receipt (generated request enums carry one).
pub struct Reply<T, E = Never> {
    call: IncomingCall,
    _t: PhantomData<fn(T, E)>,
}

impl<T: Serialize, E: Serialize> Reply<T, E> {
    /// The typed handle of `call`, whose result is a `T` or an error `E`.
    pub fn new(call: IncomingCall) -> Self {
        Reply { call, _t: PhantomData }
    }
    /// The call being answered.
    pub fn call(&self) -> &IncomingCall {
        &self.call
    }
    /// Answers with a result.
    pub fn ok(self, value: &T) -> Result<()> {
        self.call.reply_ok(value)
    }
    /// Answers with the handler's own error.
    pub fn err(self, err: &E) -> Result<()> {
        self.call.reply_err(err)
    }
    /// Answers with either.
    pub fn send(self, r: std::result::Result<T, E>) -> Result<()> {
        match r {
            Ok(v) => self.ok(&v),
            Err(e) => self.err(&e),
        }
    }
}

// Moved once per call, never stored: boxing `One` would allocate per call.
#[allow(clippy::large_enum_variant)]
enum Received {
    One(IncomingCall),
    /// Calls to run in order; only the last may want a reply.
    Batch(Vec<IncomingCall>),
}

/// An endpoint serving one service.
pub struct ServiceEndpoint {
    /// Not a `Team`: the endpoint, and the serving task and handlers that
    /// hold it, must not keep the team alive (see `Team`).
    team: Arc<TeamInner>,
    port: RawPort,
    descriptor: Arc<ServiceDescriptor>,
    /// Calls of a batch not yet handed out by `accept`.
    queued: Mutex<VecDeque<IncomingCall>>,
    /// Retryable calls seen, and their replies.
    once: Arc<Once>,
}

impl ServiceEndpoint {
    /// Opens the endpoint and binds `name` to it in the node name plane.
    pub fn open(team: &Team, name: &str, descriptor: ServiceDescriptor) -> Result<ServiceEndpoint> {
        Ok(Self::with_port(team, team.open_named_raw_port(name)?, descriptor))
    }

    /// Opens an endpoint with no name (hand its id to clients, e.g. as a callback).
    pub fn open_unnamed(team: &Team, descriptor: ServiceDescriptor) -> Result<ServiceEndpoint> {
        Ok(Self::with_port(team, team.open_raw_port()?, descriptor))
    }

    fn with_port(team: &Team, port: RawPort, descriptor: ServiceDescriptor) -> ServiceEndpoint {
        ServiceEndpoint {
            team: team.inner.clone(),
            port,
            descriptor: Arc::new(descriptor),
            queued: Mutex::new(VecDeque::new()),
            once: Arc::default(),
        }
    }

    /// The endpoint's id, for clients (`bind_to`).
    pub fn id(&self) -> EndpointId {
        self.port.id()
    }

    /// Explicit receipt: the next call (binds and flushes are answered here).
    pub async fn accept(&self) -> Result<IncomingCall> {
        loop {
            if let Some(c) = self.next_queued()? {
                return Ok(c);
            }
            let r = self.next_request().await?;
            if let Some(c) = self.hand_out(r)? {
                return Ok(c);
            }
        }
    }

    /// [`ServiceEndpoint::accept`], blocking this thread. It waits as a
    /// blocked port does: a call at the head of its channel is taken
    /// straight from there (see `direct_receive`), not through the inbox
    /// and a waker.
    pub fn accept_blocking(&self) -> Result<IncomingCall> {
        loop {
            if let Some(c) = self.next_queued()? {
                return Ok(c);
            }
            let Some(r) = self.parse(self.port.recv_blocking()?) else { continue };
            if let Some(c) = self.hand_out(r)? {
                return Ok(c);
            }
        }
    }

    /// The next call of a batch that `accept` has not handed out yet.
    fn next_queued(&self) -> Result<Option<IncomingCall>> {
        while let Some(c) = self.queued.lock().pop_front() {
            if let Some(c) = self.ready(c)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// A request `accept` received: its call, or a batch's first (the
    /// rest are queued for the next accepts).
    fn hand_out(&self, r: Received) -> Result<Option<IncomingCall>> {
        match r {
            // A single call is handed out as it is, not through the queue.
            Received::One(c) => self.ready(c),
            Received::Batch(v) => {
                self.queued.lock().extend(v);
                self.next_queued()
            }
        }
    }

    /// A call made ready to hand out: `None` if it was answered here (a
    /// flush, or a call whose deadline passed: nobody waits for it).
    fn ready(&self, mut c: IncomingCall) -> Result<Option<IncomingCall>> {
        if c.method == envelope::FLUSH {
            c.reply_ok(&())?;
            return Ok(None);
        }
        if c.deadline.is_some_and(|d| Instant::now() >= d) {
            let _ = c.reply_raw(&envelope::status(envelope::DEADLINE, ""));
            return Ok(None);
        }
        c.service = Some(self.descriptor.clone());
        // The cancel hook waits until the token is asked for; a deadline
        // needs the token now, to fire it.
        if c.deadline.is_some() {
            c.watch_cancel();
            c.watch_deadline(&self.team);
        }
        Ok(Some(c))
    }

    /// Implicit receipt: every call runs as a task of its own (a batch in
    /// one task, in order). The handler is first polled by the processor
    /// that received the call, and gets its task only if it has to wait:
    /// handlers that finish at once cost no task and no wake-up, but work
    /// done before a handler's first `await` delays what that processor
    /// does next (hand long computations and blocking calls to
    /// [`Team::spawn_blocking`] and await it).
    /// Serving stops when the returned handle is dropped.
    ///
    /// At most [`TeamBuilder::max_running_calls`](crate::TeamBuilder::max_running_calls)
    /// calls run at once (a batch of n calls counts as n, or as the bound if
    /// n is larger, until it has run to its end); calls past it wait in the
    /// endpoint's inbox, whose bounds push back on the callers.
    pub fn serve<D: Dispatch>(self, handler: Arc<D>) -> Serving {
        let endpoint = Arc::new(self);
        let gate = Gate::new(endpoint.team.cfg.max_running_calls);
        let inbox = endpoint.port.inbox().clone();
        // A call received by a thread that runs this team's tasks is handled
        // right there (no queue, no wake-up of the accepting task); the task
        // takes the calls other threads received.
        let direct = DirectCalls { endpoint: endpoint.clone(), handler: handler.clone(), gate: gate.clone() };
        inbox.set_direct(Some(Arc::new(direct)));
        let team = endpoint.team.clone();
        let g = gate.clone();
        let task = team.exec.spawn(async move {
            while let Ok((r, place)) = endpoint.next_call(&g).await {
                endpoint.handle(&handler, &mut Some(r), place);
            }
        });
        Serving { task, inbox, gate }
    }

    /// Implicit receipt of one request (or batch), which holds `place` until
    /// it is answered. A single call is run where it lies, and is moved only
    /// if its handler has to wait (it is large: each move of it is a copy on
    /// every call's path).
    fn handle<D: Dispatch>(&self, handler: &Arc<D>, r: &mut Option<Received>, place: Place) {
        if let Some(Received::One(call)) = r {
            let Some((work, t)) = run_now(&self.team, handler, call) else { return };
            if let Some(Received::One(call)) = r.take() {
                let finish = finish_call(self.team.clone(), call, work, t);
                drop(self.team.exec.spawn(async move {
                    finish.await;
                    drop(place);
                }));
            }
            return;
        }
        match r.take() {
            None | Some(Received::One(_)) => {}
            Some(Received::Batch(v)) => {
                let (inner, h) = (self.team.clone(), handler.clone());
                drop(self.team.exec.spawn(async move {
                    for c in v {
                        run_call(inner.clone(), h.clone(), c).await;
                    }
                    drop(place);
                }))
            }
        }
    }

    /// The serving task's next request, once a place is free for it (with
    /// none free, requests stay in the inbox), and for a batch once all the
    /// places it takes are (see `places_for`).
    async fn next_call(&self, gate: &Arc<Gate>) -> Result<(Received, Place)> {
        loop {
            let (msg, mut place) = poll_fn(|cx| {
                let Poll::Ready(place) = gate.poll_enter(cx) else { return Poll::Pending };
                match self.port.inbox().poll_pop(cx) {
                    Poll::Ready(Some(m)) => Poll::Ready(Ok((crate::port::take(&self.team, m), place))),
                    Poll::Ready(None) => Poll::Ready(Err(crate::Error::Shutdown)),
                    // The place is freed: a call taken directly may use it meanwhile.
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
            let mut head = [0u8; 5];
            let n = msg.read_head(&mut head);
            // Places are gathered as they are freed (this task is the
            // gate's one waiter): each is kept, so the batch's turn comes.
            while place.count() < places_for(&head[..n], msg.len()).min(gate.max()) {
                place.join(poll_fn(|cx| gate.poll_enter(cx)).await);
            }
            if let Some(r) = self.parse(msg) {
                return Ok((r, place));
            }
        }
    }

    async fn next_request(&self) -> Result<Received> {
        loop {
            let msg = self.port.recv().await?;
            if let Some(r) = self.parse(msg) {
                return Ok(r);
            }
        }
    }

    /// [`ServiceEndpoint::parse`] of a message straight from its channel
    /// (a direct taker's): a plain call, the common case, becomes its
    /// `IncomingCall` without a `RawMessage` between (a move of the
    /// payload and a drop less on every call's path).
    fn parse_incoming(&self, m: crate::runtime::channel::Incoming) -> Option<Received> {
        let (head, n) = m.payload.head::<5>();
        let Some((method, None, at)) = envelope::call_head(&head[..n]) else {
            return self.parse(crate::port::take(&self.team, m));
        };
        let (from, deadline, arrived) = (m.from(), m.deadline.get(), m.arrived.get());
        let responder = crate::port::answer_owed(&self.team, &m.header, m.channel);
        let mut call = self.incoming(method, Args { payload: m.payload, at }, from, deadline, responder);
        call.arrived = arrived;
        Some(Received::One(call))
    }

    /// Turns a message into calls; answers binds and malformed requests itself.
    fn parse(&self, mut msg: RawMessage) -> Option<Received> {
        let responder = msg.responder();
        let deadline = msg.deadline();
        let arrived = msg.arrived();
        let answer = |r: Option<Responder>, response: Vec<u8>| {
            if let Some(r) = r {
                let _ = r.reply(&response);
            }
        };
        // A batch past its bound is refused before a large one is copied in.
        let mut head = [0u8; 13];
        let got = msg.read_head(&mut head);
        if got >= 5 && head[0] == envelope::BATCH {
            if let Err(refusal) = envelope::batch_count(&head[..5], msg.len()) {
                answer(responder, refusal.response());
                return None;
            }
        }
        // A call keeps its whole request, not copied: its arguments are
        // decoded from where they arrived (see `Args`).
        if let Some((method, id, at)) = envelope::call_head(&head[..got]) {
            let args = Args { payload: msg.take_payload(), at };
            let from = msg.from();
            let once_key = id.map(|id| (from.team_id(), id));
            let responder = match once_key {
                // A repeat of a call run (or running) already is answered from its first run.
                Some(key) => self.once.begin(key, responder)?,
                None => responder,
            };
            let mut call = self.incoming(method, args, from, deadline, responder);
            call.arrived = arrived;
            call.once = once_key.map(|key| (self.once.clone(), key));
            return Some(Received::One(call));
        }
        match envelope::parse(msg.payload()) {
            Err(refusal) => answer(responder, refusal.response()),
            Ok(Request::Bind(d)) => {
                let response = match codec::decode::<ServiceDescriptor>(d) {
                    Err(e) => envelope::status(envelope::CODEC, &format!("bad descriptor: {e}")),
                    Ok(client) => match self.descriptor.first_difference(&client) {
                        None => envelope::ok(&()),
                        Some(diff) => envelope::status(envelope::MISMATCH, &diff),
                    },
                };
                answer(responder, response);
            }
            Ok(Request::Call { .. } | Request::CallOnce { .. }) => {
                answer(responder, envelope::status(envelope::CODEC, "short call request"));
            }
            Ok(Request::Batch(entries)) => {
                let last = entries.len() - 1;
                let mut responder = responder;
                let calls = entries
                    .into_iter()
                    .enumerate()
                    .map(|(i, (m, a))| {
                        let r = if i == last { responder.take() } else { None };
                        let args = Args { payload: Payload::from_slice(a), at: 0 };
                        self.incoming(m, args, msg.from(), deadline, r)
                    })
                    .collect();
                return Some(Received::Batch(calls));
            }
        }
        None
    }

    fn incoming(
        &self,
        method: u32,
        args: Args,
        from: EndpointId,
        deadline: Option<Instant>,
        responder: Option<Responder>,
    ) -> IncomingCall {
        IncomingCall {
            method,
            // At most 13 (`envelope::call_head`).
            args_at: args.at as u32,
            args: args.payload,
            from,
            deadline,
            responder,
            cancel: OnceLock::new(),
            arrived: None,
            hook: OnceLock::new(),
            deadline_watch: None,
            service: None,
            once: None,
        }
    }
}

/// The direct taker of a served endpoint: runs a call on the thread that
/// received it, if a place is free.
struct DirectCalls<D> {
    endpoint: Arc<ServiceEndpoint>,
    handler: Arc<D>,
    gate: Arc<Gate>,
}

impl<D: Dispatch> crate::runtime::inbox::Taker<crate::runtime::channel::Incoming> for DirectCalls<D> {
    fn admit(&self, m: &crate::runtime::channel::Incoming) -> Option<Place> {
        let (head, n) = m.payload.head::<5>();
        self.gate.try_enter(places_for(&head[..n], m.payload.len()))
    }

    fn take(&self, m: crate::runtime::channel::Incoming, place: Place) {
        let e = &self.endpoint;
        let mut r = e.parse_incoming(m);
        e.handle(&self.handler, &mut r, place);
    }
}

/// The places in the running-calls gate a request of `len` bytes that
/// starts with `head` takes: one, or n for a batch of n calls (the gate
/// takes at most its bound), so that many small batches cannot each hold
/// as many calls as one large one may. A batch refused by its bound takes one.
fn places_for(head: &[u8], len: usize) -> usize {
    match head.first() {
        Some(&envelope::BATCH) => envelope::batch_count(head, len).map_or(1, |n| n.max(1)),
        _ => 1,
    }
}

/// A service being served implicitly; dropping it stops accepting calls.
pub struct Serving {
    task: JoinHandle<()>,
    inbox: Arc<crate::runtime::EndpointInbox>,
    gate: Arc<Gate>,
}

impl Serving {
    /// Calls running now: handlers not finished yet, and the calls of
    /// batches not run to their end (a batch larger than the bound counts
    /// as the bound). Never more than [`Serving::max_running`].
    pub fn running(&self) -> usize {
        self.gate.running()
    }

    /// Most calls run at once ([`TeamBuilder::max_running_calls`](crate::TeamBuilder::max_running_calls)).
    pub fn max_running(&self) -> usize {
        self.gate.max()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.inbox.set_direct(None);
        self.task.abort();
    }
}

/// Implicit receipt without paying for a task when none is needed: starts
/// the call and polls its handler once, and answers it if that is enough;
/// else gives back the handler's work, for a task of its own to finish
/// (with the cancel and deadline watch that go with it).
fn run_now<D: Dispatch>(
    team: &Arc<TeamInner>,
    handler: &Arc<D>,
    call: &mut IncomingCall,
) -> Option<(Work, Option<Instant>)> {
    let (mut work, t) = start(team, handler, call)?;
    // A no-op waker: if the handler is not done, its task polls it again at
    // once with a real waker, and futures must use the latest one.
    let mut cx = std::task::Context::from_waker(Waker::noop());
    match Pin::new(&mut work).poll(&mut cx) {
        Poll::Ready(r) => {
            let response = handler_response(r);
            let t = cost::record(Side::Server, Stage::Handler, t);
            let _ = call.respond_now(response);
            cost::record(Side::Server, Stage::Reply, t);
            None
        }
        Poll::Pending => Some((work, t)),
    }
}

/// Starts a call's handler. `None` if the call is answered already: a
/// flush, or a call whose deadline passed while it waited in the queue.
/// The call stays where it is (it is large: moving it in and out again
/// costs two copies per call).
fn start<D: Dispatch>(
    team: &Arc<TeamInner>,
    handler: &Arc<D>,
    call: &mut IncomingCall,
) -> Option<(Work, Option<Instant>)> {
    // A link end among the arguments becomes this team's (`docs/LINK.md`).
    crate::link::received_by(team);
    let answered = if call.method == envelope::FLUSH {
        Some(envelope::ok(&()))
    } else if call.deadline.is_some_and(|d| Instant::now() >= d) {
        Some(envelope::status(envelope::DEADLINE, ""))
    } else {
        None
    };
    if let Some(response) = answered {
        let _ = call.reply_now(&response);
        return None;
    }
    let t = cost::record(Side::Server, Stage::Dispatch, call.arrived);
    // The arguments are decoded in `dispatch`, before the handler's future
    // is made: their request goes then.
    let args = call.take_request();
    let work: Work = CatchUnwind(AssertUnwindSafe(handler.clone().dispatch(call.method, args)));
    Some((work, t))
}

type Work = CatchUnwind<HandlerFuture>;

fn handler_response(r: std::thread::Result<Response>) -> Response {
    match r {
        Ok(response) => response,
        Err(p) => Response::Bytes(envelope::status(envelope::PANICKED, &panic_message(&*p))),
    }
}

/// Runs one call to the end in its own task.
async fn run_call<D: Dispatch>(team: Arc<TeamInner>, handler: Arc<D>, mut call: IncomingCall) {
    if let Some((work, t)) = start(&team, &handler, &mut call) {
        finish_call(team, call, work, t).await
    }
}

/// Drives a handler to the end unless it panics (the caller gets
/// `HandlerPanicked`), is cancelled by the caller, or outlives its deadline
/// — then its future is dropped, which stops it at its next await.
async fn finish_call(team: Arc<TeamInner>, mut call: IncomingCall, mut work: Work, t: Option<Instant>) {
    let token = call.watch_cancel();
    let mut deadline = call.deadline.map(|d| Sleep::until(&team, d));
    let response = {
        let cancelled = token.cancelled();
        let mut cancelled = std::pin::pin!(cancelled);
        poll_fn(|cx| {
            if let Poll::Ready(r) = Pin::new(&mut work).poll(cx) {
                return Poll::Ready(handler_response(r));
            }
            if cancelled.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Response::Bytes(envelope::status(envelope::CANCELLED, "")));
            }
            if let Some(d) = deadline.as_mut() {
                if Pin::new(d).poll(cx).is_ready() {
                    return Poll::Ready(Response::Bytes(envelope::status(envelope::DEADLINE, "")));
                }
            }
            Poll::Pending
        })
        .await
    };
    drop(work);
    let t = cost::record(Side::Server, Stage::Handler, t);
    let _ = call.respond_now(response);
    cost::record(Side::Server, Stage::Reply, t);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::counting_waker as counter;

    /// A handler's `cancelled()` is polled on every wake of the handler: it
    /// must hold one waker, not one per poll.
    #[test]
    fn cancelled_future_polled_often_holds_one_waker() {
        let token = CancelToken::default();
        let (first, w1) = counter();
        let (last, w2) = counter();
        let mut fut = std::pin::pin!(token.cancelled());
        let mut other = std::pin::pin!(token.cancelled());
        assert!(other.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        for _ in 0..10_000 {
            assert!(fut.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        }
        assert_eq!(token.waiting(), 2);
        // Another waker replaces the future's own, not the other future's.
        assert!(fut.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
        assert_eq!(token.waiting(), 2);
        token.cancel();
        assert_eq!((first.0.load(Ordering::SeqCst), last.0.load(Ordering::SeqCst)), (1, 1));
        assert!(fut.as_mut().poll(&mut Context::from_waker(&w1)).is_ready());
        assert!(other.as_mut().poll(&mut Context::from_waker(&w1)).is_ready());
        assert_eq!(token.waiting(), 0);
    }

    /// The replies of retryable calls a service remembers are bounded:
    /// past `ONCE_ENTRIES` (or `ONCE_BYTES`) the oldest are forgotten.
    #[test]
    fn remembered_replies_are_bounded() {
        let once = Once::default();
        let team = crate::id::TeamId { node: 1, team: 2, incarnation: 3 };
        for id in 0..(ONCE_ENTRIES as u64 + 1000) {
            assert!(once.begin((team, id), None).is_some(), "a new id runs");
            once.finish((team, id), &[0u8; 100]);
        }
        // A repeat of a remembered id does not run again; a forgotten one does.
        let last = ONCE_ENTRIES as u64 + 999;
        assert!(once.begin((team, last), None).is_none());
        assert!(once.begin((team, 0), None).is_some());
        let st = once.state.lock();
        assert!(st.entries.len() <= ONCE_ENTRIES + 2, "{} replies kept", st.entries.len());
        assert!(st.bytes <= ONCE_BYTES);
    }

    /// What a batch's calls may cost (`envelope::max_batch_calls`) is
    /// counted with `CALL_COST` per call: a call and its place in the
    /// parsed batch must fit in it.
    #[test]
    fn a_batch_call_costs_at_most_call_cost() {
        let per_call = std::mem::size_of::<IncomingCall>() + std::mem::size_of::<(u32, &[u8])>();
        assert!(per_call <= envelope::CALL_COST, "{per_call} bytes per call");
    }

    #[test]
    fn dropped_cancelled_future_leaves_no_waker() {
        let token = CancelToken::default();
        let (count, w) = counter();
        {
            let mut fut = std::pin::pin!(token.cancelled());
            assert!(fut.as_mut().poll(&mut Context::from_waker(&w)).is_pending());
            assert_eq!(token.waiting(), 1);
        }
        assert_eq!(token.waiting(), 0);
        token.cancel();
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }
}
