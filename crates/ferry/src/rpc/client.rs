//! The untyped client: what generated stubs call.

use super::descriptor::ServiceDescriptor;
use super::{envelope, RpcError};
use crate::cost::{self, Side, Stage};
use crate::error::{Error, Limit, Result};
use crate::id::EndpointId;
use crate::port::RawSender;
use crate::runtime::out::{self, Out};
use crate::runtime::payload::INLINE;
use crate::runtime::{idle, Delivery, Team, TeamInner};
use crate::wire::{codec, Checkpoint};
use parking_lot::Mutex;
use serde::{de::DeserializeOwned, Serialize};
use std::borrow::Cow;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// How long a bind waits for the server's answer.
const BIND_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound client of one service endpoint.
pub struct Client {
    team: Arc<TeamInner>,
    sender: RawSender,
    descriptor: Arc<ServiceDescriptor>,
    /// One-way calls waiting for the next call or flush.
    batch: Arc<Batch>,
    /// Calls are retryable (see [`Client::retrying`]).
    retry: bool,
}

/// One-way calls waiting for the next call or flush.
#[derive(Default)]
struct Batch {
    /// (encoded batch, count).
    queued: Mutex<(Vec<u8>, u32)>,
    /// Whether `queued` holds calls: changed under its lock, read without,
    /// so a call with nothing queued before it takes no lock.
    any: AtomicBool,
}

impl Batch {
    fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }
}

/// Request ids of retryable calls: unique in this process, so per client
/// team incarnation (the server keys them by the caller's team).
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Clone for Client {
    fn clone(&self) -> Self {
        Client {
            team: self.team.clone(),
            sender: self.sender.clone(),
            descriptor: self.descriptor.clone(),
            batch: self.batch.clone(),
            retry: self.retry,
        }
    }
}

impl Client {
    /// Looks `name` up and binds to the service there.
    pub fn bind(team: &Team, name: &str, descriptor: ServiceDescriptor) -> Result<Client, RpcError> {
        let ep = team.lookup(name)?;
        Client::bind_to(team, ep, descriptor)
    }

    /// [`bind`](Client::bind), waiting up to `limit` for `name` to be
    /// registered (see [`Team::lookup_wait`]).
    pub fn bind_wait(
        team: &Team,
        name: &str,
        descriptor: ServiceDescriptor,
        limit: Duration,
    ) -> Result<Client, RpcError> {
        let ep = team.lookup_wait(name, limit)?;
        Client::bind_to(team, ep, descriptor)
    }

    /// Binds to the service at `ep`: sends this client's descriptor; the
    /// server refuses (naming the first difference) if it serves another interface.
    pub fn bind_to(team: &Team, ep: EndpointId, descriptor: ServiceDescriptor) -> Result<Client, RpcError> {
        team.block_on(Client::connect(team, ep, descriptor))
    }

    /// `bind_to` as a future: for tasks, which must not block their processor.
    pub fn connect(
        team: &Team,
        ep: EndpointId,
        descriptor: ServiceDescriptor,
    ) -> impl Future<Output = Result<Client, RpcError>> + Send + 'static {
        let sender = team.raw_sender(ep);
        let team = team.inner.clone();
        let request = codec::encode(&descriptor).map(|d| [&[envelope::BIND][..], &d].concat());
        async move {
            let reply = sender.clone().with_timeout(BIND_TIMEOUT).send_async(&request?, Checkpoint::OnReturn).await?;
            envelope::decode_response::<(), super::Never>(&reply)?;
            let batch = Arc::new(Batch::default());
            Ok(Client { team, sender, descriptor: Arc::new(descriptor), batch, retry: false })
        }
    }

    /// The service's endpoint.
    pub fn endpoint(&self) -> EndpointId {
        self.sender.to()
    }

    /// The interface this client was bound with.
    pub fn descriptor(&self) -> &ServiceDescriptor {
        &self.descriptor
    }

    /// The same client with a deadline on every call (it travels to the
    /// server); a limit too far to end, like `Duration::MAX`, is none.
    pub fn with_timeout(&self, limit: Duration) -> Client {
        Client { sender: self.sender.clone().with_timeout(limit), ..self.clone() }
    }

    /// The same client, whose calls are retryable: a call that fails with
    /// `PeerGone` before its reply came (the connection was lost: a reset,
    /// a cut link) is sent once more, over a new connection. The server
    /// runs each call at most once: it remembers each retryable call's
    /// reply for [`RETRY_WINDOW`](crate::rpc::RETRY_WINDOW) and answers a
    /// repeat with it (or, if the first run is still going, with its reply
    /// when it ends). For calls that must not run twice; batched one-way
    /// calls stay unretried.
    pub fn retrying(&self) -> Client {
        Client { retry: true, ..self.clone() }
    }

    /// Starts a call; the returned future (a promise) resolves to its result.
    /// Queued batched calls go first, in order, in the same message.
    pub fn call<A: Serialize, R: DeserializeOwned, E: DeserializeOwned>(
        &self,
        method: u32,
        args: &A,
    ) -> CallFuture<R, E> {
        self.start_call(method, args, false)
    }

    /// Starts a call; `blocking` (for `call_blocking`): waits for room on this thread.
    fn start_call<A: Serialize, R: DeserializeOwned, E: DeserializeOwned>(
        &self,
        method: u32,
        args: &A,
        blocking: bool,
    ) -> CallFuture<R, E> {
        thread_local! {
            /// Where requests are encoded: the ring takes a copy, so one buffer serves every call.
            static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let t = cost::start();
        let mut payload = SCRATCH.take();
        payload.clear();
        if !self.retry && !self.batch.any() {
            // A plain call: large arguments are encoded straight where they are staged.
            let mut head = [envelope::CALL, 0, 0, 0, 0];
            head[1..].copy_from_slice(&method.to_le_bytes());
            let small = out::encode_small_into(&head, args, &mut payload);
            let t = cost::record(Side::Client, Stage::Encode, t);
            let sent = match small {
                Ok(true) => Ok(self.sender.start(Out::from(&payload[..]), Checkpoint::OnReturn, blocking)),
                // (Encoded as it is staged: its time counts as the send's.)
                Ok(false) => out::encoded_large(&head, args, |o| self.sender.start(o, Checkpoint::OnReturn, blocking)),
                Err(e) => Err(e),
            };
            SCRATCH.set(payload);
            return match sent {
                Ok(delivery) => self.waiting(delivery, None, t),
                Err(e) => CallFuture::failed(e),
            };
        }
        if let Err(e) = self.encode_request(method, args, &mut payload) {
            return CallFuture::failed(e);
        }
        let t = cost::record(Side::Client, Stage::Encode, t);
        let delivery = self.sender.start(Out::from(&payload[..]), Checkpoint::OnReturn, blocking);
        // A retryable call keeps its request, to send it again.
        let again = self.retry.then(|| Box::new((self.sender.clone(), payload.clone())));
        SCRATCH.set(payload);
        self.waiting(delivery, again, t)
    }

    /// The future of a call sent (`t`: when its send began, for cost accounting).
    fn waiting<R: DeserializeOwned, E: DeserializeOwned>(
        &self,
        delivery: Delivery,
        again: Option<Box<(RawSender, Vec<u8>)>>,
        t: Option<std::time::Instant>,
    ) -> CallFuture<R, E> {
        let t = cost::record(Side::Client, Stage::Send, t);
        CallFuture { delivery: Some(delivery), since: t, again, _r: PhantomData }
    }

    /// A synchronous call: blocks this thread (spinning, then parked) for the result.
    pub fn call_blocking<A: Serialize, R: DeserializeOwned, E: DeserializeOwned>(
        &self,
        method: u32,
        args: &A,
    ) -> Result<R, RpcError<E>> {
        // Waited for on its client's team (no reference to it taken).
        self.start_call(method, args, true).wait_on(&self.team)
    }

    /// A one-way call: no result; returns when `checkpoint` is reached
    /// (`OnReturn` waits until the handler finished). Whatever the method
    /// returns is discarded; with `OnReturn`, the handler's own error `E`
    /// (`Remote`), a panic or a cancel are reported as for a call.
    pub fn send_oneway<A: Serialize, E: DeserializeOwned>(
        &self,
        method: u32,
        args: &A,
        checkpoint: Checkpoint,
    ) -> Result<(), RpcError<E>> {
        let payload = envelope::call(method, args)?;
        // Calls batched earlier go first: one-way calls do not overtake them.
        self.flush().map_err(RpcError::widen)?;
        let reply = self.sender.send(&payload, checkpoint)?;
        if checkpoint == Checkpoint::OnReturn {
            envelope::decode_oneway_response::<E>(&reply)?;
        }
        Ok(())
    }

    /// Queues a one-way call; it is sent, with the others, by the next call
    /// or `flush`. A batch carries a bounded number of calls
    /// ([`Limit::BatchCalls`]): past it, this is `LimitReached` and the
    /// call is not queued (flush, then queue it again).
    pub fn batch<A: Serialize>(&self, method: u32, args: &A) -> Result<(), RpcError> {
        let args = codec::encode(args)?;
        let mut b = self.batch.queued.lock();
        let (buf, count) = &mut *b;
        // Room for this entry and for the call (or flush) that ends the batch.
        let len = buf.len().max(5) + 8 + args.len() + 8;
        let max = envelope::max_batch_calls(len);
        if *count as usize + 2 > max {
            return Err(Error::LimitReached { limit: Limit::BatchCalls, max: max as u64 }.into());
        }
        envelope::push_batch_entry(buf, count, method, &args);
        self.batch.any.store(true, Ordering::Release);
        Ok(())
    }

    /// Sends the queued batch and waits until the server has run all of it.
    pub fn flush(&self) -> Result<(), RpcError> {
        if !self.batch.any() {
            return Ok(());
        }
        self.call_blocking::<(), (), super::Never>(envelope::FLUSH, &())
    }

    /// The request for one call into `out`, behind the batched calls
    /// waiting for it, if any.
    fn encode_request<A: Serialize>(&self, method: u32, args: &A, out: &mut Vec<u8>) -> Result<()> {
        if self.retry {
            let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return envelope::call_once_into(id, method, args, out);
        }
        let mut b = self.batch.queued.lock();
        if b.1 == 0 {
            drop(b);
            return envelope::call_into(method, args, out);
        }
        // Encode first: a call that does not encode leaves the batch queued.
        let args = codec::encode(args)?;
        let (buf, mut count) = std::mem::take(&mut *b);
        self.batch.any.store(false, Ordering::Release);
        drop(b);
        *out = buf;
        envelope::push_batch_entry(out, &mut count, method, &args);
        Ok(())
    }
}

/// A call in flight. Resolves to the method's result; dropping it before
/// then cancels the call at the server. `W` is the type the result is
/// decoded as, then converted to `R` (a wrapper such as the one that moves
/// `[u8; N]` as bytes; the same type unless a generated stub says otherwise).
///
/// Kept small (it is moved into every `async` block that awaits it): a
/// failure before the send is its delivery's outcome, and the rare parts
/// are boxed.
pub struct CallFuture<R, E = super::Never, W = R> {
    /// The send and its answer; `None` once the answer was taken.
    delivery: Option<Delivery>,
    /// Cost accounting: when the wait for the reply began.
    since: Option<std::time::Instant>,
    /// A retryable call's sender and request, until it was sent again.
    again: Option<Box<(RawSender, Vec<u8>)>>,
    _r: Yields<R, E, W>,
}

/// What a [`CallFuture`] yields (`R` or `E`, decoded as `W`), as a marker.
type Yields<R, E, W> = PhantomData<fn() -> (R, E, W)>;

impl<R, E, W> Unpin for CallFuture<R, E, W> {}

impl<R: DeserializeOwned, E: DeserializeOwned> CallFuture<R, E> {
    fn failed(e: crate::Error) -> Self {
        CallFuture { delivery: Some(Delivery::failed(e)), since: None, again: None, _r: PhantomData }
    }

    /// The same call, whose result (decoded as `R`) is converted to `T`.
    #[doc(hidden)]
    pub fn converted<T>(self) -> CallFuture<T, E, R>
    where
        R: Into<T>,
    {
        let CallFuture { delivery, since, again, _r } = self;
        CallFuture { delivery, since, again, _r: PhantomData }
    }
}

impl<R, E: DeserializeOwned, W: DeserializeOwned + Into<R>> CallFuture<R, E, W> {
    /// Blocks this thread until the result is there.
    pub fn wait(self) -> Result<R, RpcError<E>> {
        match self.delivery.as_ref().and_then(Delivery::team).cloned() {
            Some(team) => self.wait_on(&team),
            None => self.wait_on_nothing(),
        }
    }

    /// [`CallFuture::wait`] driving `team`, the team that made the call.
    fn wait_on(mut self, team: &TeamInner) -> Result<R, RpcError<E>> {
        let Some(d) = self.delivery.as_mut().filter(|d| d.team().is_some()) else { return self.wait_on_nothing() };
        // Its deadline ends the wait: no timer (see `Delivery::wait_here`).
        let until = d.waited_on_this_thread();
        // Polled where it is (it is `Unpin`): a move would copy it.
        idle::block_on_until(team, &mut self, until)
    }

    /// The outcome of a call that waits for no answer (it failed before it
    /// went out): there already.
    fn wait_on_nothing(mut self) -> Result<R, RpcError<E>> {
        match Pin::new(&mut self).poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(RpcError::Cancelled),
        }
    }
}

impl<R, E: DeserializeOwned, W: DeserializeOwned + Into<R>> Future for CallFuture<R, E, W> {
    type Output = Result<R, RpcError<E>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(d) = self.delivery.as_mut() else { return Poll::Ready(Err(RpcError::Cancelled)) };
        match d.poll_payload(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(crate::Error::PeerGone { .. })) if self.again.is_some() => {
                // The connection went before the reply: once more, over a new one.
                let (sender, request) = *self.again.take().expect("checked");
                self.delivery = Some(sender.start(Out::Bytes(Cow::Owned(request)), Checkpoint::OnReturn, false));
                self.poll(cx)
            }
            Poll::Ready(r) => {
                self.delivery = None;
                let t = cost::record(Side::Client, Stage::Poll, self.since);
                let result = match r {
                    Ok(payload) => match payload.as_local() {
                        // Small (most answers): from the bytes, as they are.
                        Some(b) if b.len() <= INLINE => envelope::decode_response::<W, E>(b).map(Into::into),
                        // A result is decoded where it arrived; other answers are short.
                        _ => {
                            let mut status = [0u8];
                            match payload.read_head(&mut status) == 1 && status[0] == envelope::OK {
                                true => payload.decode_at::<W>(1).map(Into::into).map_err(RpcError::from),
                                false => payload.with_bytes(envelope::decode_response::<W, E>).map(Into::into),
                            }
                        }
                    },
                    Err(e) => Err(e.into()),
                };
                cost::record(Side::Client, Stage::Receive, t);
                Poll::Ready(result)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::descriptor::{MethodDescriptor, CODEC};
    use crate::rpc::server::ServiceEndpoint;

    /// A call's future is moved into every `async` block that awaits it
    /// (a `memcpy` a call: 304 bytes when it held its failure, its retry
    /// state and a second reference to the team).
    #[test]
    fn a_call_future_stays_small() {
        let size = std::mem::size_of::<CallFuture<()>>();
        assert!(size <= 160, "CallFuture is {size} bytes");
    }

    /// `with_timeout(Duration::MAX)` is a client with no deadline, not an
    /// `Instant` overflow at the next call.
    #[test]
    fn huge_timeout_means_no_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let method = MethodDescriptor { name: "seven".into(), args: Vec::new(), ret: "u32".into() };
        let descriptor = ServiceDescriptor { name: "Huge".into(), codec: CODEC.into(), methods: vec![method] };
        let endpoint = ServiceEndpoint::open_unnamed(&team, descriptor.clone()).unwrap();
        let id = endpoint.id();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let call = endpoint.accept_blocking().unwrap();
                assert_eq!(call.deadline(), None);
                call.reply_ok(&7u32).unwrap();
            }
        });
        let client = Client::bind_to(&team, id, descriptor).unwrap();
        // 2^62 s fits an Instant, but not the u64 nanoseconds a deadline travels as.
        for limit in [Duration::MAX, Duration::from_secs(1 << 62)] {
            let seven: u32 = client.with_timeout(limit).call_blocking::<_, _, super::super::Never>(0, &()).unwrap();
            assert_eq!(seven, 7);
        }
        server.join().unwrap();
    }
}
