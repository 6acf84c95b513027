//! Payload codec: MessagePack through `rmp-serde`.
//!
//! Why MessagePack: it is self-describing enough for a dynamic language
//! (Python's `msgpack` package reads and writes it with no schema), compact,
//! and fast in Rust. Structs travel as arrays of their fields in declaration
//! order (the compact form), enums as `{variant: value}` maps or plain strings
//! for unit variants. Raw-bytes ports skip the codec entirely.

use crate::error::{Error, Result};
use serde::{de::DeserializeOwned, Serialize};

/// Encodes `value` into `out` (appending).
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    rmp_serde::encode::write(out, value).map_err(|e| Error::Codec(e.to_string()))
}

/// Encodes `value` into a fresh vector.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Decodes a `T` from `bytes`; `Codec` if they are not one.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    rmp_serde::from_slice(bytes).map_err(|e| Error::Codec(e.to_string()))
}

// TEMPORARY until branch codec lands: the interface the lead fixed for it
// (`Sink`, `Source`, `encoded_len`, `encode_to`, `decode_shared`,
// `decode_from`, `decode_in_place`, `decode_from_in_place`), on rmp-serde.

/// Where encoded bytes go: a `Vec<u8>` (appends), or memory a transport
/// stages a payload in (a `put` past its end is an `Error::Codec`).
pub trait Sink {
    /// Writes `bytes` next.
    fn put(&mut self, bytes: &[u8]) -> Result<()>;
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// Bytes a value encodes to (a pass that writes nothing).
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    rmp_serde::encode::write(&mut c, value).map_err(|e| Error::Codec(e.to_string()))?;
    Ok(c.0)
}

/// Encodes `value` into any sink.
pub fn encode_to<T: Serialize + ?Sized, S: Sink + ?Sized>(value: &T, sink: &mut S) -> Result<()> {
    struct W<'a, S: ?Sized>(&'a mut S, Option<Error>);
    impl<S: Sink + ?Sized> std::io::Write for W<'_, S> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            match self.0.put(b) {
                Ok(()) => Ok(b.len()),
                Err(e) => {
                    self.1 = Some(e);
                    Err(std::io::Error::other("sink refused"))
                }
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = W(sink, None);
    let r = rmp_serde::encode::write(&mut w, value);
    match (r, w.1) {
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(Error::Codec(e.to_string())),
        (Ok(()), None) => Ok(()),
    }
}

/// Bytes to decode that a peer can still write: read only by copying.
pub trait Source {
    /// Bytes left.
    fn remaining(&self) -> usize;
    /// Copies the next `out.len()` bytes into `out` and moves past them.
    fn read(&mut self, out: &mut [u8]);
    /// Appends the next `n` bytes to `out` and moves past them.
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>);
}

/// Decodes from bytes this process owns as a `bytes::Bytes`.
pub fn decode_shared<T: DeserializeOwned>(bytes: &bytes::Bytes) -> Result<T> {
    decode(bytes)
}

/// Decodes from a `Source` (shared memory).
pub fn decode_from<T: DeserializeOwned, S: Source + ?Sized>(source: &mut S) -> Result<T> {
    let mut v = Vec::new();
    source.append_to(source.remaining(), &mut v);
    decode(&v)
}

/// Decodes into an existing value (serde's `deserialize_in_place`).
pub fn decode_in_place<T: DeserializeOwned>(bytes: &[u8], place: &mut T) -> Result<()> {
    let mut de = rmp_serde::Deserializer::new(bytes);
    T::deserialize_in_place(&mut de, place).map_err(|e| Error::Codec(e.to_string()))
}

/// Decodes from a `Source` into an existing value.
pub fn decode_from_in_place<T: DeserializeOwned, S: Source + ?Sized>(source: &mut S, place: &mut T) -> Result<()> {
    let mut v = Vec::new();
    source.append_to(source.remaining(), &mut v);
    decode_in_place(&v, place)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Point {
        x: i32,
        label: String,
    }

    #[test]
    fn structs_round_trip_as_arrays() {
        let p = Point { x: -3, label: "a".into() };
        let bytes = encode(&p).unwrap();
        // fixarray of 2: [-3, "a"] — what Python's msgpack.unpackb returns as [-3, 'a'].
        assert_eq!(bytes, vec![0x92, 0xfd, 0xa1, b'a']);
        assert_eq!(decode::<Point>(&bytes).unwrap(), p);
    }

    #[test]
    fn garbage_is_a_codec_error() {
        assert!(matches!(decode::<Point>(&[0xc1]), Err(Error::Codec(_))));
    }
}
