//! Payload codec: ferry's own serde MessagePack encoder and decoder.
//!
//! Why MessagePack: it is self-describing enough for a dynamic language
//! (Python's `msgpack` package reads and writes it with no schema), compact,
//! and fast in Rust. The encoding is rmp-serde 1.3's default one (structs as
//! arrays of their fields, unit variants as strings, other variants as
//! `{variant: value}`), except that byte sequences (`Vec<u8>`, `[u8]`,
//! `ferry::Bytes`, `bytes::Bytes`, `serde_bytes`) are MessagePack bin, copied
//! with one memcpy each way. `docs/WIRE.md` ("Payload codec") states it
//! exactly. Raw-bytes ports skip the codec entirely.
//!
//! - [`encode`]: the `Serializer`, writing into any [`Sink`].
//! - [`decode`]: the `Deserializer`, over a slice, a `bytes::Bytes` or a
//!   [`Source`] (one Deserializer generic over its input).
//! - [`bytes`]: [`Bytes`], a byte buffer that decodes as a view where it can.

mod bytes;
mod decode;
mod encode;

pub use self::bytes::Bytes;

use crate::error::{Error, Result};
use serde::{de::DeserializeOwned, Serialize};

/// Nesting limit the decoder accepts, in levels of the receiving type: each
/// array, map, enum map, `Some` and newtype struct is one. rmp-serde allows
/// 1024, but a debug build decoding `serde_json::Value` overflows a 2 MiB
/// thread stack (a test thread's, a fuzzer's) before that depth.
pub const MAX_DEPTH: usize = 256;

/// Where encoded bytes go. Implemented for `Vec<u8>` (appends) and by
/// transports for memory they stage a payload in (a shared-memory area range:
/// raw copies, bounded; a `put` past the end is an `Error::Codec`).
pub trait Sink {
    /// Writes `bytes` after what was put before.
    fn put(&mut self, bytes: &[u8]) -> Result<()>;
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// Bytes a value encodes to: a pass that writes nothing (a byte field counts
/// in O(1)), except sequences and maps of unknown length (`#[serde(flatten)]`,
/// iterators), which it buffers to count.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize> {
    let mut counter = encode::Counter(0);
    encode_to(value, &mut counter)?;
    Ok(counter.0)
}

/// Encodes `value` into any sink (`S` may be `dyn Sink`).
pub fn encode_to<T: Serialize + ?Sized, S: Sink + ?Sized>(value: &T, sink: &mut S) -> Result<()> {
    encode::encode(value, sink)
}

/// Encodes `value` into `out` (appending).
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    encode_to(value, out)
}

/// Encodes `value` into a fresh vector.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Bytes to decode that live where a peer can still write them (a
/// shared-memory area): the decoder reads them only by copying (`read`,
/// `append_to`), never by reference.
pub trait Source {
    /// Bytes left.
    fn remaining(&self) -> usize;
    /// Copies the next `out.len()` bytes into `out` and moves past them (`out.len() <= remaining()`).
    fn read(&mut self, out: &mut [u8]);
    /// Appends the next `n` bytes to `out` and moves past them (`n <= remaining()`); a byte
    /// field is decoded with one call of this, straight into its final buffer.
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>);
}

/// Decodes a `T` from `bytes` (all of them); `Codec` if they are not one.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    decode::decode(decode::SliceRead::new(bytes))
}

/// Decodes from bytes this process owns as a `bytes::Bytes`: [`Bytes`]
/// fields become views of it (no copy).
pub fn decode_shared<T: DeserializeOwned>(bytes: &::bytes::Bytes) -> Result<T> {
    let _backing = self::bytes::Backing::set(bytes);
    decode::decode(decode::SliceRead::new(bytes))
}

/// Decodes from a [`Source`] (shared memory): byte fields are copied once,
/// into their own buffer.
pub fn decode_from<T: DeserializeOwned, S: Source + ?Sized>(source: &mut S) -> Result<T> {
    decode::decode(decode::SourceRead::new(source))
}

/// [`decode`] into an existing value with serde's `deserialize_in_place`
/// (a `Vec<u8>` keeps its capacity: bin is copied into memory the caller reuses).
pub fn decode_in_place<T: DeserializeOwned>(bytes: &[u8], place: &mut T) -> Result<()> {
    decode::decode_in_place(decode::SliceRead::new(bytes), place)
}

/// [`decode_from`] into an existing value (as [`decode_in_place`]).
pub fn decode_from_in_place<T: DeserializeOwned, S: Source + ?Sized>(source: &mut S, place: &mut T) -> Result<()> {
    decode::decode_in_place(decode::SourceRead::new(source), place)
}

/// The codec's error inside serde (serde needs its own error type); it
/// becomes `Error::Codec` at the API. Boxed: one word, so that the
/// decoder's many small results (`Result<u64, CodecError>`, …) come back
/// in registers on the path every value takes, not through memory.
#[derive(Debug)]
#[allow(clippy::box_collection)] // One word, not three: the point.
pub(crate) struct CodecError(pub(crate) Box<String>);

impl CodecError {
    #[cold]
    pub(crate) fn new(why: impl Into<String>) -> CodecError {
        CodecError(Box::new(why.into()))
    }
}

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecError {}

impl serde::ser::Error for CodecError {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        CodecError::new(msg.to_string())
    }
}

impl serde::de::Error for CodecError {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        CodecError::new(msg.to_string())
    }
}

impl From<CodecError> for Error {
    fn from(e: CodecError) -> Self {
        Error::Codec(*e.0)
    }
}

#[cfg(test)]
mod tests;
