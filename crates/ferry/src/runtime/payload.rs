//! A message's bytes: small ones kept inline (no allocation on the hot
//! path of small messages), larger ones in a `Vec`, large ones where they
//! travelled out of band (the peer's payload area), copied out only when
//! the receiver asks — into memory it reuses, if it likes.

use crate::error::{Error, Result};
use crate::transport::Detached;
use crate::wire::codec::{self, Source};

/// Bytes a payload holds without allocating (so that a `Payload` is 56
/// bytes and an `Incoming` fits in 128).
pub const INLINE: usize = 48;

pub enum Payload {
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Vec<u8>),
    /// Out of band; its space goes back to the sender when this is dropped.
    Detached(Detached),
}

impl Payload {
    pub fn from_slice(s: &[u8]) -> Payload {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s);
            Payload::Inline { len: s.len() as u8, bytes }
        } else {
            Payload::Heap(s.to_vec())
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Payload::Inline { len, .. } => *len as usize,
            Payload::Heap(v) => v.len(),
            Payload::Detached(d) => d.len(),
        }
    }

    /// The bytes, if they are in this process's own memory already.
    pub fn as_local(&self) -> Option<&[u8]> {
        match self {
            Payload::Inline { len, bytes } => Some(&bytes[..*len as usize]),
            Payload::Heap(v) => Some(v),
            Payload::Detached(Detached::Inproc(h)) => Some(h.bytes()),
            Payload::Detached(Detached::Shm(_)) => None,
            Payload::Detached(Detached::Received(r)) => Some(r.bytes()),
        }
    }

    /// Runs `f` on the bytes. Bytes in a peer's area are copied first into
    /// a buffer this thread reuses (warm memory: no page faults), so a
    /// decoder never reads memory the peer can still write.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self.as_local() {
            Some(b) => f(b),
            None => with_scratch(|buf| self.read_into(buf), f),
        }
    }

    /// The first `N` bytes (fewer if it is shorter: how many is the
    /// second value), as [`Payload::read_head`] reads them; a small
    /// payload's with a copy of fixed size (a few moves, not a call of
    /// `memcpy`: a served call reads its head twice).
    #[inline]
    pub fn head<const N: usize>(&self) -> ([u8; N], usize) {
        let mut out = [0u8; N];
        if let Payload::Inline { len, bytes } = self {
            if N <= INLINE {
                out.copy_from_slice(&bytes[..N]);
                return (out, N.min(*len as usize));
            }
        }
        let n = self.read_head(&mut out);
        (out, n)
    }

    /// Copies the first bytes into `out` (as many as fit), without copying
    /// the rest out of a peer's area; returns how many.
    pub fn read_head(&self, out: &mut [u8]) -> usize {
        match (self.as_local(), self) {
            (Some(b), _) => {
                let n = out.len().min(b.len());
                out[..n].copy_from_slice(&b[..n]);
                n
            }
            (None, Payload::Detached(Detached::Shm(l))) => l.read_head(out),
            (None, _) => unreachable!("only a peer's area is not local"),
        }
    }

    /// Replaces `out`'s contents with the bytes, reusing its capacity.
    pub fn read_into(&self, out: &mut Vec<u8>) {
        match (self.as_local(), self) {
            (Some(b), _) => {
                out.clear();
                out.extend_from_slice(b);
            }
            (None, Payload::Detached(d)) => d.read_into(out),
            (None, _) => unreachable!("only a peer's area is not local"),
        }
    }

    /// Decodes a `T` from the bytes past the first `skip` where they
    /// arrived, with no copy of them first: in this process's memory
    /// through `codec::decode_shared` (byte fields become views of it), in
    /// a peer's area through a `Source` (byte fields copied once, into
    /// their own buffers). The bytes are gone with `self` once decoded.
    pub fn decode_at<T: serde::de::DeserializeOwned>(self, skip: usize) -> Result<T> {
        let short = || Error::Codec("a payload shorter than its header".into());
        let shared = |v: Vec<u8>| match skip <= v.len() {
            // A small one is decoded from the slice: copying its byte fields
            // costs less than a shared buffer's bookkeeping (an allocation).
            true if v.len() <= SHARE_ABOVE => codec::decode(&v[skip..]),
            true => codec::decode_shared(&bytes::Bytes::from(v).slice(skip..)),
            false => Err(short()),
        };
        match self {
            Payload::Inline { len, bytes } => codec::decode(bytes[..len as usize].get(skip..).ok_or_else(short)?),
            Payload::Heap(v) => shared(v),
            Payload::Detached(Detached::Shm(l)) => {
                let mut source = l.source();
                if source.remaining() < skip {
                    return Err(short());
                }
                source.read(&mut vec![0; skip]);
                codec::decode_from(&mut source)
            }
            Payload::Detached(d) => shared(d.into_vec()),
        }
    }

    /// Decodes the bytes into `place`, reusing what it holds (a `Vec<u8>`
    /// its capacity): one copy out of a peer's area, none before.
    pub fn decode_in_place<T: serde::de::DeserializeOwned>(&self, place: &mut T) -> Result<()> {
        match (self.as_local(), self) {
            (Some(b), _) => codec::decode_in_place(b, place),
            (None, Payload::Detached(Detached::Shm(l))) => codec::decode_from_in_place(&mut l.source(), place),
            (None, _) => Err(Error::Codec("a payload neither local nor lent".into())),
        }
    }

    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Payload::Inline { len, bytes } => bytes[..len as usize].to_vec(),
            Payload::Heap(v) => v,
            Payload::Detached(d) => d.into_vec(),
        }
    }
}

/// Payloads of this process up to this size are decoded from a slice;
/// larger ones through a shared buffer (`ferry::Bytes` fields become views).
const SHARE_ABOVE: usize = 64 << 10;

/// Largest scratch buffer a thread keeps between payloads (a larger one is
/// freed after use, so one huge message does not pin its size forever).
const MAX_SCRATCH: usize = 256 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on what `fill` writes into this thread's scratch buffer
/// (kept warm: no page faults), taken out while in use (`f` may decode
/// another payload meanwhile).
fn with_scratch<R>(fill: impl FnOnce(&mut Vec<u8>), f: impl FnOnce(&[u8]) -> R) -> R {
    let mut buf = SCRATCH.take();
    fill(&mut buf);
    let r = f(&buf);
    if buf.capacity() <= MAX_SCRATCH {
        SCRATCH.set(buf);
    }
    r
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::Heap(v)
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_its_first_bytes_whatever_the_size() {
        for n in [0, 3, 5, 6, INLINE, INLINE + 1, 1000] {
            let v: Vec<u8> = (1..=n).map(|i| i as u8).collect();
            let (head, got) = Payload::from_slice(&v).head::<5>();
            assert_eq!(got, n.min(5));
            assert_eq!(&head[..got], &v[..got]);
        }
    }

    #[test]
    fn small_inline_large_heap_same_bytes() {
        for n in [0, 1, INLINE, INLINE + 1, 1000] {
            let v: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let p = Payload::from_slice(&v);
            assert_eq!(matches!(p, Payload::Inline { .. }), n <= INLINE);
            assert_eq!(p.as_local().unwrap(), &v[..]);
            assert_eq!(p.with_bytes(|b| b.to_vec()), v);
            assert_eq!(p.into_vec(), v);
        }
    }
}
