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
