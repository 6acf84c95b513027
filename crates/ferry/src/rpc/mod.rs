//! RPC (DESIGN §2): a service is a Rust trait marked `#[ferry::service]`;
//! the macro generates a client stub (`<Trait>Client`), a dispatcher
//! (`<Trait>Server`) and a request enum for explicit receipt
//! (`<Trait>Request`) on top of the untyped pieces here.
//!
//! - Call modes: synchronous (`method_blocking`), asynchronous (`method`
//!   returns a [`CallFuture`], a promise), one-way (`method_oneway` with a
//!   checkpoint), batched (`method_batched`, flushed in order by the next
//!   call or [`Client::flush`]).
//! - Receipt: implicit (a task per request that waits, at most
//!   `TeamBuilder::max_running_calls` at once, [`ServiceEndpoint::serve`]) or
//!   explicit ([`ServiceEndpoint::accept`] and reply when you choose); an
//!   accepted call can still be handed to the implicit dispatcher.
//! - Deadlines travel in the frame; a handler still running at its
//!   deadline, or whose caller dropped the call, is cancelled.
//! - The interface is checked when a client binds ([`ServiceDescriptor`]).

mod client;
mod descriptor;
pub(crate) mod envelope;
pub(crate) mod gate;
mod handler_future;
mod server;

pub use client::{CallFuture, Client};
pub use descriptor::{MethodDescriptor, ServiceDescriptor, CODEC};
pub(crate) use gate::Place;
pub use handler_future::HandlerFuture;
pub use server::{
    Args, CancelToken, Dispatch, IncomingCall, Reply, Response, SendReply, ServiceEndpoint, Serving, RETRY_WINDOW,
};

use crate::id::TeamId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The error type of a method that has none: no value of it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Never {}

impl fmt::Display for Never {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

/// Why a call failed. `E` is the handler's own error type.
#[derive(Debug)]
#[non_exhaustive]
pub enum RpcError<E = Never> {
    /// The handler returned its own error.
    Remote(E),
    /// The server's team died or closed the channel.
    PeerGone {
        /// The server's team.
        peer: TeamId,
    },
    /// The call's deadline passed (at the client or at the server).
    DeadlineExceeded,
    /// The call was cancelled.
    Cancelled,
    /// The handler panicked; the server keeps serving. The text is the panic message.
    HandlerPanicked(String),
    /// The server refused the call ([`IncomingCall::refuse`], or a
    /// retryable call dropped unanswered or replaced by a later repeat);
    /// the text is the server's.
    Refused(String),
    /// The server serves another interface than the client's (found at
    /// bind); the text is the server's account of the first difference.
    InterfaceMismatch(String),
    /// The server has no method of this index (a client of another
    /// interface, or a hand-made request).
    NoSuchMethod(u32),
    /// Arguments or result could not be encoded or decoded.
    Codec(String),
    /// Anything else the runtime reports (no such team, shutdown, I/O, a
    /// [`crate::Refusal`] such as a request dropped without its reply).
    Ferry(crate::Error),
}

impl<E: fmt::Debug> fmt::Display for RpcError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::Remote(e) => write!(f, "the handler returned an error: {e:?}"),
            RpcError::PeerGone { peer } => write!(f, "server team {peer} is gone"),
            RpcError::DeadlineExceeded => write!(f, "deadline exceeded"),
            RpcError::Cancelled => write!(f, "cancelled"),
            RpcError::HandlerPanicked(m) => write!(f, "the handler panicked: {m}"),
            RpcError::Refused(m) => write!(f, "refused: {m}"),
            RpcError::InterfaceMismatch(m) => write!(f, "the server serves another interface: {m}"),
            RpcError::NoSuchMethod(m) => write!(f, "the server has no method #{m}"),
            RpcError::Codec(m) => write!(f, "codec: {m}"),
            RpcError::Ferry(e) => write!(f, "{e}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for RpcError<E> {}

impl<E> RpcError<E> {
    /// The same failure with another remote error type (for errors that carry none).
    pub fn map_remote<F>(self, f: impl FnOnce(E) -> F) -> RpcError<F> {
        match self {
            RpcError::Remote(e) => RpcError::Remote(f(e)),
            RpcError::PeerGone { peer } => RpcError::PeerGone { peer },
            RpcError::DeadlineExceeded => RpcError::DeadlineExceeded,
            RpcError::Cancelled => RpcError::Cancelled,
            RpcError::HandlerPanicked(m) => RpcError::HandlerPanicked(m),
            RpcError::Refused(m) => RpcError::Refused(m),
            RpcError::InterfaceMismatch(m) => RpcError::InterfaceMismatch(m),
            RpcError::NoSuchMethod(m) => RpcError::NoSuchMethod(m),
            RpcError::Codec(m) => RpcError::Codec(m),
            RpcError::Ferry(e) => RpcError::Ferry(e),
        }
    }
}

impl RpcError<Never> {
    /// Widens an error that cannot be `Remote` to any remote error type.
    pub fn widen<F>(self) -> RpcError<F> {
        self.map_remote(|n| match n {})
    }
}

/// What generated code calls; not a public API.
#[doc(hidden)]
pub mod __private {
    use super::envelope;
    use super::server::Response;
    use super::HandlerFuture;
    use serde::{de::DeserializeOwned, Serialize};

    /// A result: a large one is encoded where its reply is staged.
    pub fn ok<T: Serialize + Send + 'static>(value: T) -> Response {
        Response::encoded(envelope::OK, value, "result")
    }

    pub fn remote<E: Serialize + Send + 'static>(err: E) -> Response {
        Response::encoded(envelope::REMOTE, err, "error")
    }

    /// Decodes arguments, or gives the handler future that answers "codec error".
    pub fn decode<A: DeserializeOwned>(args: super::Args) -> Result<A, HandlerFuture> {
        args.decode().map_err(|e| {
            let response = envelope::status(envelope::CODEC, &format!("arguments: {e}"));
            HandlerFuture::new(async move { Response::Bytes(response) })
        })
    }

    /// Decodes a response as a client does (for tests that craft requests by hand).
    pub fn decode_response<R: DeserializeOwned, E: DeserializeOwned>(p: &[u8]) -> Result<R, super::RpcError<E>> {
        envelope::decode_response(p)
    }

    pub fn no_such_method(method: u32) -> HandlerFuture {
        let response = envelope::no_such_method(method);
        HandlerFuture::new(async move { Response::Bytes(response) })
    }

    /// Refuses an accepted call of a method the service lacks (explicit receipt).
    pub fn refuse_no_such_method(call: super::IncomingCall) -> super::RpcError {
        let method = call.method();
        let _ = call.reply_raw(&envelope::no_such_method(method));
        super::RpcError::NoSuchMethod(method)
    }

    pub use super::bytes_arg::{ByteArray, BytesRef};
}

/// How the service macro moves a `[u8; N]` argument or result: as bytes
/// (MessagePack bin), not as an array of N integers.
mod bytes_arg {
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};
    use serde::{Deserialize, Serialize, Serializer};
    use std::fmt;

    /// Serializes borrowed bytes with `serialize_bytes`.
    pub struct BytesRef<'a>(pub &'a [u8]);

    impl Serialize for BytesRef<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// A `[u8; N]` as bytes: decoded from exactly N bytes (or, as serde
    /// writes an array, a sequence of N integers; any other length is a
    /// codec error), encoded with `serialize_bytes` (a result, owned).
    pub struct ByteArray<const N: usize>(pub [u8; N]);

    impl<const N: usize> Serialize for ByteArray<N> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    impl<const N: usize> From<ByteArray<N>> for [u8; N] {
        fn from(a: ByteArray<N>) -> [u8; N] {
            a.0
        }
    }

    impl<'de, const N: usize> Deserialize<'de> for ByteArray<N> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_bytes(ArrayVisitor::<N>)
        }
    }

    struct ArrayVisitor<const N: usize>;

    impl<'de, const N: usize> Visitor<'de> for ArrayVisitor<N> {
        type Value = ByteArray<N>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{N} bytes")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Self::Value, E> {
            <[u8; N]>::try_from(v).map(ByteArray).map_err(|_| E::invalid_length(v.len(), &self))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = [0u8; N];
            for (i, b) in out.iter_mut().enumerate() {
                *b = seq.next_element()?.ok_or_else(|| A::Error::invalid_length(i, &self))?;
            }
            // One more element is a wrong length too, not a value cut short.
            if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                return Err(A::Error::invalid_length(N + 1, &self));
            }
            Ok(ByteArray(out))
        }
    }
}
