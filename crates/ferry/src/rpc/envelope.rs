//! How requests and responses are laid out inside a message payload.
//!
//! Request: one op byte, then
//! - `BIND`: MessagePack `ServiceDescriptor` of the client;
//! - `CALL`: method index (u32 LE), then the MessagePack tuple of arguments;
//! - `BATCH`: count n (u32 LE), then n entries `method u32, len u32, args`,
//!   run in order; the last entry is the synchronous call that is answered
//!   (method `FLUSH` when the batch was flushed with no call of its own);
//! - `CALL_ONCE`: a retryable call: request id (u64 LE, unique per client
//!   team incarnation), method index (u32 LE), then the arguments. The
//!   server runs an id at most once and answers a repeat with the first
//!   run's reply (see `server::Once`).
//!
//! Response: one status byte, then MessagePack of the value (`OK`,
//! `REMOTE`), a limit's number (u32 LE) and value (u64 LE) (`LIMIT`), a
//! method index (u32 LE) (`NO_METHOD`), or UTF-8 text (the other statuses).

use super::RpcError;
use crate::error::{Error, Limit, Result};
use crate::wire::codec;
use serde::{de::DeserializeOwned, Serialize};

pub const BIND: u8 = 1;
pub const CALL: u8 = 2;
pub const BATCH: u8 = 3;
pub const CALL_ONCE: u8 = 4;
/// The method index of "do nothing, answer `()`" (ends a flushed batch).
pub const FLUSH: u32 = u32::MAX;

pub const OK: u8 = 0;
pub const REMOTE: u8 = 1;
pub const PANICKED: u8 = 2;
pub const CANCELLED: u8 = 3;
pub const DEADLINE: u8 = 4;
pub const REFUSED: u8 = 5;
pub const CODEC: u8 = 6;
/// The request was refused by a limit: `Error::LimitReached` at the caller.
pub const LIMIT: u8 = 7;
/// The client's interface differs from the server's (at bind): UTF-8 text, the first difference.
pub const MISMATCH: u8 = 8;
/// The server has no method of the index that follows (u32 LE).
pub const NO_METHOD: u8 = 9;

/// Most calls one batch may carry.
pub const MAX_BATCH_CALLS: usize = 65_536;
/// What a server holds per call of a batch it runs (the call's state and
/// its place in the batch; arguments past a few bytes are counted by the
/// message's own bytes). Checked against `IncomingCall` by a test.
pub const CALL_COST: usize = 320;
/// The calls of any batch may cost the server this much; past it, at most
/// twice the batch's own bytes.
const BATCH_ALLOWANCE: usize = 4 << 20;

/// Most calls a batch of `len` bytes may carry: what the server holds for
/// them stays within max(`BATCH_ALLOWANCE`, 2 × `len`) (an empty entry is
/// 8 bytes, its call ~40 times that), and at most `MAX_BATCH_CALLS`.
pub fn max_batch_calls(len: usize) -> usize {
    (BATCH_ALLOWANCE.max(len.saturating_mul(2)) / CALL_COST).min(MAX_BATCH_CALLS)
}

pub fn call<A: Serialize + ?Sized>(method: u32, args: &A) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(32);
    call_into(method, args, &mut out)?;
    Ok(out)
}

/// `call`, written at the end of `out`.
pub fn call_into<A: Serialize + ?Sized>(method: u32, args: &A, out: &mut Vec<u8>) -> Result<()> {
    out.push(CALL);
    out.extend_from_slice(&method.to_le_bytes());
    codec::encode_into(args, out)
}

/// `call` as a retryable call with request id `id`, written at the end of `out`.
pub fn call_once_into<A: Serialize + ?Sized>(id: u64, method: u32, args: &A, out: &mut Vec<u8>) -> Result<()> {
    out.push(CALL_ONCE);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&method.to_le_bytes());
    codec::encode_into(args, out)
}

/// A call's or retryable call's method, request id and where its
/// arguments start, from the request's first bytes (`head`, up to 13):
/// the server reads no more before it decodes the arguments.
pub fn call_head(head: &[u8]) -> Option<(u32, Option<u64>, usize)> {
    match head.first() {
        Some(&CALL) => Some((u32_at(head, 1)?, None, 5)),
        Some(&CALL_ONCE) => {
            let id = u64::from_le_bytes(head.get(1..9)?.try_into().ok()?);
            Some((u32_at(head, 9)?, Some(id), 13))
        }
        _ => None,
    }
}

/// One request as the server sees it. (The server takes calls by
/// `call_head`, without a look at their arguments; the fuzz targets and
/// tests parse them whole.)
#[allow(dead_code)]
pub enum Request<'a> {
    Bind(&'a [u8]),
    Call { method: u32, args: &'a [u8] },
    CallOnce { id: u64, method: u32, args: &'a [u8] },
    Batch(Vec<(u32, &'a [u8])>),
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Why a request was not parsed.
#[derive(Debug)]
pub enum Refusal {
    /// It breaks the layout above.
    Malformed(String),
    /// A batch with more calls than [`max_batch_calls`] allows for its size.
    TooManyCalls {
        /// The most its size allows.
        max: usize,
    },
}

impl From<&str> for Refusal {
    fn from(what: &str) -> Refusal {
        Refusal::Malformed(what.into())
    }
}

impl Refusal {
    /// The response that tells the caller.
    pub fn response(&self) -> Vec<u8> {
        match self {
            Refusal::Malformed(what) => status(CODEC, what),
            Refusal::TooManyCalls { max } => limit(Limit::BatchCalls, *max as u64),
        }
    }
}

/// A batch's count of calls from its first 5 bytes (`head`) and its size
/// `len`: refused if past what the size allows. The server checks it before
/// it copies a large batch in, and `parse` again.
pub fn batch_count(head: &[u8], len: usize) -> std::result::Result<usize, Refusal> {
    let n = u32_at(head, 1).ok_or("short batch")? as usize;
    let max = max_batch_calls(len);
    if n > max {
        return Err(Refusal::TooManyCalls { max });
    }
    Ok(n)
}

/// Parses a request; every length is checked against what arrived, and a
/// batch's count against what its size allows before anything is made of it.
pub fn parse(p: &[u8]) -> std::result::Result<Request<'_>, Refusal> {
    match p.first() {
        Some(&BIND) => Ok(Request::Bind(&p[1..])),
        Some(&CALL) => {
            let method = u32_at(p, 1).ok_or("short call request")?;
            Ok(Request::Call { method, args: &p[5..] })
        }
        Some(&CALL_ONCE) => {
            let id = p.get(1..9).ok_or("short call request")?;
            let method = u32_at(p, 9).ok_or("short call request")?;
            Ok(Request::CallOnce { id: u64::from_le_bytes(id.try_into().expect("8 bytes")), method, args: &p[13..] })
        }
        Some(&BATCH) => {
            let n = batch_count(&p[..p.len().min(5)], p.len())?;
            let mut at = 5;
            let mut entries = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let method = u32_at(p, at).ok_or("short batch entry")?;
                let len = u32_at(p, at + 4).ok_or("short batch entry")? as usize;
                let args = p.get(at + 8..at + 8 + len).ok_or("batch entry longer than the message")?;
                entries.push((method, args));
                at += 8 + len;
            }
            if at != p.len() || entries.is_empty() {
                return Err("malformed batch".into());
            }
            Ok(Request::Batch(entries))
        }
        other => Err(Refusal::Malformed(format!("unknown request op {other:?}"))),
    }
}

/// Appends one entry to a batch being built (`buf` starts empty).
pub fn push_batch_entry(buf: &mut Vec<u8>, count: &mut u32, method: u32, args: &[u8]) {
    if buf.is_empty() {
        buf.push(BATCH);
        buf.extend_from_slice(&0u32.to_le_bytes());
    }
    buf.extend_from_slice(&method.to_le_bytes());
    buf.extend_from_slice(&(args.len() as u32).to_le_bytes());
    buf.extend_from_slice(args);
    *count += 1;
    buf[1..5].copy_from_slice(&count.to_le_bytes());
}

pub fn ok<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    encoded(OK, value, "result")
}

/// A status byte then `value` in MessagePack (or a CODEC status if it does not encode).
pub fn encoded<T: Serialize + ?Sized>(code: u8, value: &T, what: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.push(code);
    match codec::encode_into(value, &mut out) {
        Ok(()) => out,
        Err(e) => status(CODEC, &format!("the {what} did not encode: {e}")),
    }
}

/// A `LIMIT` response: `limit` (at most `max`) refused the request.
pub fn limit(limit: Limit, max: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(13);
    out.push(LIMIT);
    out.extend_from_slice(&limit.code().to_le_bytes());
    out.extend_from_slice(&max.to_le_bytes());
    out
}

/// A `NO_METHOD` response: the server has no method `method`.
pub fn no_such_method(method: u32) -> Vec<u8> {
    let mut out = vec![NO_METHOD];
    out.extend_from_slice(&method.to_le_bytes());
    out
}

pub fn status(code: u8, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + text.len());
    out.push(code);
    out.extend_from_slice(text.as_bytes());
    out
}

/// Decodes a response into the caller's result.
pub fn decode_response<R: DeserializeOwned, E: DeserializeOwned>(p: &[u8]) -> std::result::Result<R, RpcError<E>> {
    let text = || String::from_utf8_lossy(&p[1..]).into_owned();
    match p.first() {
        Some(&OK) => codec::decode(&p[1..]).map_err(RpcError::from),
        Some(&REMOTE) => Err(codec::decode(&p[1..]).map_or_else(RpcError::from, RpcError::Remote)),
        Some(&PANICKED) => Err(RpcError::HandlerPanicked(text())),
        Some(&CANCELLED) => Err(RpcError::Cancelled),
        Some(&DEADLINE) => Err(RpcError::DeadlineExceeded),
        Some(&REFUSED) => Err(RpcError::Refused(text())),
        Some(&MISMATCH) => Err(RpcError::InterfaceMismatch(text())),
        Some(&NO_METHOD) => {
            Err(u32_at(p, 1).map_or_else(|| RpcError::Codec("malformed response".into()), RpcError::NoSuchMethod))
        }
        Some(&CODEC) => Err(RpcError::Codec(text())),
        Some(&LIMIT) => Err(Limit::refused(&p[1..]).map_or_else(|| RpcError::Codec(text()), RpcError::Ferry)),
        _ => Err(RpcError::Codec("malformed response".into())),
    }
}

/// Decodes the response to a one-way call: its value, of whatever type, is
/// not decoded (the caller discards it); any other status is the call's error.
pub fn decode_oneway_response<E: DeserializeOwned>(p: &[u8]) -> std::result::Result<(), RpcError<E>> {
    match p.first() {
        Some(&OK) => Ok(()),
        _ => decode_response::<serde::de::IgnoredAny, E>(p).map(|_| ()),
    }
}

impl<E> From<Error> for RpcError<E> {
    fn from(e: Error) -> Self {
        match e {
            Error::PeerGone { peer } => RpcError::PeerGone { peer },
            Error::DeadlineExceeded => RpcError::DeadlineExceeded,
            Error::Cancelled => RpcError::Cancelled,
            Error::Codec(s) => RpcError::Codec(s),
            Error::Panicked(s) => RpcError::HandlerPanicked(s),
            other => RpcError::Ferry(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::Never;
    use crate::testing::Rng;

    #[test]
    fn batches_round_trip() {
        let mut buf = Vec::new();
        let mut n = 0;
        push_batch_entry(&mut buf, &mut n, 3, b"abc");
        push_batch_entry(&mut buf, &mut n, 9, b"");
        match parse(&buf).unwrap() {
            Request::Batch(e) => assert_eq!(e, vec![(3, &b"abc"[..]), (9, &b""[..])]),
            _ => panic!("not a batch"),
        }
        match parse(&call(5, &(1u8, "x")).unwrap()).unwrap() {
            Request::Call { method, args } => {
                assert_eq!(method, 5);
                assert_eq!(codec::decode::<(u8, String)>(args).unwrap(), (1, "x".to_string()));
            }
            _ => panic!("not a call"),
        }
    }

    /// A batch may not ask for more calls than its size allows: a count
    /// past it is refused before anything is made of the entries, and the
    /// caller gets `LimitReached` (regression: 8-byte entries became calls
    /// of ~300 bytes each, 30 times the message).
    #[test]
    fn batches_with_more_calls_than_their_size_allows_are_refused() {
        let mut buf = Vec::new();
        let mut n = 0;
        let fits = max_batch_calls(5 + 8 * MAX_BATCH_CALLS);
        assert_eq!(fits, (BATCH_ALLOWANCE / CALL_COST), "empty entries: the allowance decides");
        for _ in 0..fits {
            push_batch_entry(&mut buf, &mut n, 1, b"");
        }
        assert!(matches!(parse(&buf), Ok(Request::Batch(e)) if e.len() == fits));
        push_batch_entry(&mut buf, &mut n, 1, b"");
        let refusal = match parse(&buf) {
            Err(r @ Refusal::TooManyCalls { max }) if max == fits => r,
            other => panic!("want TooManyCalls, got {:?}", other.err()),
        };
        match decode_response::<(), Never>(&refusal.response()) {
            Err(RpcError::Ferry(Error::LimitReached { limit: Limit::BatchCalls, max })) => {
                assert_eq!(max, fits as u64)
            }
            other => panic!("want LimitReached, got {other:?}"),
        }
        // A count that lies (larger than the entries) is refused the same.
        let mut lie = call(1, &()).unwrap();
        lie[0] = BATCH;
        lie.splice(1..5, u32::MAX.to_le_bytes());
        assert!(matches!(parse(&lie), Err(Refusal::TooManyCalls { .. })));
        // Large entries: up to the absolute cap.
        assert_eq!(max_batch_calls(1 << 30), MAX_BATCH_CALLS);
        assert_eq!(max_batch_calls(usize::MAX), MAX_BATCH_CALLS);
    }

    /// Peer input: requests and responses of any shape never panic, and a
    /// parsed batch never points outside the message.
    #[test]
    fn parse_survives_random_and_mutated_input() {
        let mut rng = Rng::new(2);
        let mut batch = Vec::new();
        let mut n = 0;
        push_batch_entry(&mut batch, &mut n, 1, b"hello");
        push_batch_entry(&mut batch, &mut n, 2, b"world!");
        let seeds = [
            batch,
            call(7, &(1u32, "two", [3u8; 4])).unwrap(),
            ok(&(1, "a")),
            encoded(REMOTE, &"e", "error"),
            status(REFUSED, "x"),
        ];
        for i in 0..100_000 {
            let input = if i % 3 == 0 {
                rng.bytes(48)
            } else {
                let seed = rng.below(seeds.len());
                rng.mutate(&seeds[seed])
            };
            if let Ok(Request::Batch(entries)) = parse(&input) {
                let total: usize = entries.iter().map(|(_, a)| 8 + a.len()).sum();
                assert_eq!(total + 5, input.len());
            }
            let _ = decode_response::<(u32, String), String>(&input);
            let _ = codec::decode::<super::super::ServiceDescriptor>(&input);
        }
    }
}
