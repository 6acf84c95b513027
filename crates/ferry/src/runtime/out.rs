//! A message's bytes on their way out: bytes already made, or a typed
//! value encoded as it is sent. A large value is encoded straight into
//! where its transport stages it (`Transport::stage_with`: the payload
//! area, or the buffer handed over or written to the socket), so the sender
//! copies its bytes once; a small one is encoded into a vector as always,
//! and the frame copies it.

use crate::error::{Error, Result};
use crate::transport::{self, SendError, Staged, Transport};
use crate::wire::codec::{self, Sink};
use serde::Serialize;
use std::borrow::Cow;

/// Encoded sizes up to this go into a vector first (today's path for small
/// messages, whose frames copy them); a larger value is counted, then
/// encoded where it is staged. At least a frame of most channels' rings.
pub const ENCODE_IN_PLACE_ABOVE: usize = 64 << 10;

/// Writes a value's encoding into a sink.
pub type Write<'a> = dyn Fn(&mut dyn Sink) -> Result<()> + 'a;

/// A message to send.
pub enum Out<'a> {
    Bytes(Cow<'a, [u8]>),
    /// The `len` bytes `write` puts into a sink (checked: a writer that
    /// writes another length is an `Error::Codec`).
    Encoded {
        len: usize,
        write: &'a Write<'a>,
    },
}

impl<'a> From<&'a [u8]> for Out<'a> {
    fn from(b: &'a [u8]) -> Out<'a> {
        Out::Bytes(Cow::Borrowed(b))
    }
}

impl<'a> Out<'a> {
    pub fn len(&self) -> usize {
        match self {
            Out::Bytes(b) => b.len(),
            Out::Encoded { len, .. } => *len,
        }
    }

    /// The bytes, made if they are not yet (a send that waits in an
    /// outbox, or one that fits a frame after all).
    pub fn into_vec(self) -> Result<Vec<u8>> {
        match self {
            Out::Bytes(b) => Ok(b.into_owned()),
            encoded => encoded.to_vec(),
        }
    }

    /// [`Out::into_vec`], by reference (copying bytes already made).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        match self {
            Out::Bytes(b) => Ok(b.to_vec()),
            // `len` was checked against `max_message` before.
            Out::Encoded { len, write } => transport::write_vec(*len, &mut |sink| write(sink)).map_err(|e| match e {
                SendError::Unwritten(why) => Error::Codec(*why),
                other => Error::Codec(other.to_string()),
            }),
        }
    }

    /// As bytes if it fits a frame of `max_payload` (made now if encoded:
    /// only large messages are staged as they are encoded).
    pub fn framed(self, max_payload: usize) -> Result<Out<'a>> {
        match self {
            Out::Encoded { len, .. } if len <= max_payload => Ok(Out::Bytes(Cow::Owned(self.into_vec()?))),
            out => Ok(out),
        }
    }

    /// Stages it on `transport` (encoded straight into the staged place).
    pub fn stage(&self, transport: &dyn Transport) -> std::result::Result<Staged, SendError> {
        match self {
            Out::Bytes(b) => transport.stage(b),
            Out::Encoded { len, write } => transport.stage_with(*len, &mut |sink| write(sink)),
        }
    }
}

/// Runs `send` on `value`'s encoding: bytes if it encodes to at most
/// [`ENCODE_IN_PLACE_ABOVE`], else its length and its encoder.
pub fn encoded<T: Serialize + ?Sized, R>(value: &T, send: impl FnOnce(Out<'_>) -> R) -> Result<R> {
    let mut buf = Vec::new();
    encoded_after(&[], value, &mut buf, send)
}

/// [`encoded`] of `head` then `value` (an envelope's header, then the
/// arguments), a small one encoded into `buf` (its contents replaced).
pub fn encoded_after<T: Serialize + ?Sized, R>(
    head: &[u8],
    value: &T,
    buf: &mut Vec<u8>,
    send: impl FnOnce(Out<'_>) -> R,
) -> Result<R> {
    match encode_small_into(head, value, buf)? {
        true => Ok(send(Out::Bytes(Cow::Borrowed(&buf[..])))),
        false => encoded_large(head, value, send),
    }
}

/// Replaces `buf`'s contents with `head` then `value`'s encoding if that
/// is at most [`ENCODE_IN_PLACE_ABOVE`] bytes (true); else leaves it
/// empty (false: send it with [`encoded_large`]).
pub fn encode_small_into<T: Serialize + ?Sized>(head: &[u8], value: &T, buf: &mut Vec<u8>) -> Result<bool> {
    buf.clear();
    buf.extend_from_slice(head);
    let mut small = Limited { out: buf, over: false };
    match codec::encode_to(value, &mut small) {
        Ok(()) => Ok(true),
        Err(_) if small.over => {
            buf.clear();
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Runs `send` on `head` then `value`, counted, to be encoded where it is staged.
pub fn encoded_large<T: Serialize + ?Sized, R>(head: &[u8], value: &T, send: impl FnOnce(Out<'_>) -> R) -> Result<R> {
    let len = head.len() + codec::encoded_len(value)?;
    let write = |sink: &mut dyn Sink| {
        sink.put(head)?;
        codec::encode_to(value, sink)
    };
    Ok(send(Out::Encoded { len, write: &write }))
}

/// `head` then `value`'s encoding in a vector, if it is at most
/// [`ENCODE_IN_PLACE_ABOVE`] bytes; `None` if larger (encode it where it is
/// staged: [`encoded_after`]).
pub fn encode_small<T: Serialize + ?Sized>(head: &[u8], value: &T) -> Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(32);
    Ok(encode_small_into(head, value, &mut buf)?.then_some(buf))
}

/// `head` then `value`'s encoding in an array, if it fits in `N` bytes
/// (the length used); `None` if not (nothing allocated either way).
pub fn encode_inline<const N: usize, T: Serialize + ?Sized>(
    head: &[u8],
    value: &T,
) -> Result<Option<([u8; N], usize)>> {
    let mut fixed = Fixed { bytes: [0; N], len: 0, over: false };
    match fixed.put(head).and_then(|()| codec::encode_to(value, &mut fixed)) {
        Ok(()) => Ok(Some((fixed.bytes, fixed.len))),
        Err(_) if fixed.over => Ok(None),
        Err(e) => Err(e),
    }
}

/// An array that refuses bytes past its end.
struct Fixed<const N: usize> {
    bytes: [u8; N],
    len: usize,
    over: bool,
}

impl<const N: usize> Sink for Fixed<N> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(to) = self.bytes.get_mut(self.len..self.len + bytes.len()) else {
            self.over = true;
            return Err(Error::Codec("does not fit inline".into()));
        };
        to.copy_from_slice(bytes);
        self.len += bytes.len();
        Ok(())
    }
}

/// A vector that refuses to grow past [`ENCODE_IN_PLACE_ABOVE`].
struct Limited<'a> {
    out: &'a mut Vec<u8>,
    over: bool,
}

impl Sink for Limited<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        if self.out.len() + bytes.len() > ENCODE_IN_PLACE_ABOVE {
            self.over = true;
            return Err(Error::Codec("large: encoded where it is staged".into()));
        }
        self.out.extend_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fits the array is encoded there, exactly as in a vector; one
    /// byte more is `None`; a value that cannot encode is an error.
    #[test]
    fn encode_inline_fits_or_says_so() {
        // A 6-byte string is 7 bytes encoded: 8 with the head.
        let v = "abcdef";
        let (bytes, len) = encode_inline::<8, _>(&[9], v).unwrap().unwrap();
        assert_eq!(&bytes[..len], &encode_small(&[9], v).unwrap().unwrap()[..]);
        assert!(encode_inline::<7, _>(&[9], v).unwrap().is_none());
        assert!(encode_inline::<0, _>(&[9], v).unwrap().is_none());
        struct Fails;
        impl Serialize for Fails {
            fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        assert!(matches!(encode_inline::<8, _>(&[9], &Fails), Err(Error::Codec(_))));
    }
}
