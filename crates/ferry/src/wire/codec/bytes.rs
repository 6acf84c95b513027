//! `ferry::Bytes`: a cheap-to-clone byte buffer that travels as MessagePack
//! bin and, decoded by `decode_shared`, is a view of the received buffer.
//!
//! How the view is made: `decode_shared` sets the buffer it decodes from as
//! this thread's backing for the call ([`Backing`]); `Bytes`' visitor, given
//! bytes borrowed from the input, makes them a `slice_ref` of the backing when
//! they lie inside it and are [`VIEW_MIN`] bytes or more, and copies them
//! otherwise (every other input).

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::cell::RefCell;

/// Fields shorter than this are copied rather than viewed.
pub const VIEW_MIN: usize = 1024;

/// A byte buffer, cheap to clone (it wraps `bytes::Bytes`), encoded as
/// MessagePack bin; decoded from bin or an array of ints.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(bytes::Bytes);

impl Bytes {
    /// An empty buffer.
    pub const fn new() -> Self {
        Bytes(bytes::Bytes::new())
    }

    /// The bytes as a vector (no copy when this is their only owner).
    pub fn into_vec(self) -> Vec<u8> {
        self.0.into()
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v.into())
    }
}

impl From<bytes::Bytes> for Bytes {
    fn from(b: bytes::Bytes) -> Self {
        Bytes(b)
    }
}

impl From<&'static [u8]> for Bytes {
    fn from(s: &'static [u8]) -> Self {
        Bytes(bytes::Bytes::from_static(s))
    }
}

impl From<Bytes> for bytes::Bytes {
    fn from(b: Bytes) -> Self {
        b.0
    }
}

impl From<Bytes> for Vec<u8> {
    fn from(b: Bytes) -> Self {
        b.into_vec()
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

pub(super) struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bytes (bin or an array of ints 0..=255)")
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
        Ok(Backing::view(v).unwrap_or_else(|| Bytes(bytes::Bytes::copy_from_slice(v))))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes(bytes::Bytes::copy_from_slice(v)))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(v.into())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(v.into())
    }
}

thread_local! {
    static BACKING: RefCell<Option<bytes::Bytes>> = const { RefCell::new(None) };
}

/// The buffer `decode_shared` decodes from, set for the call (restoring what
/// was there before, so a nested `decode_shared` is fine).
pub(super) struct Backing(Option<bytes::Bytes>);

impl Backing {
    pub(super) fn set(b: &bytes::Bytes) -> Backing {
        Backing(BACKING.with(|cell| cell.replace(Some(b.clone()))))
    }

    /// `v` as a view of the backing, if it lies inside it and is not small
    /// (a view keeps the whole message alive: a few bytes kept for long
    /// would pin a large one, and copying them costs nothing).
    fn view(v: &[u8]) -> Option<Bytes> {
        if v.len() < VIEW_MIN {
            return None;
        }
        BACKING.with(|cell| {
            let cell = cell.borrow();
            let b = cell.as_ref()?;
            let (start, end) = (b.as_ptr() as usize, b.as_ptr() as usize + b.len());
            let (vs, ve) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
            (start <= vs && ve <= end && !v.is_empty()).then(|| Bytes(b.slice_ref(v)))
        })
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let previous = self.0.take();
        BACKING.with(|cell| *cell.borrow_mut() = previous);
    }
}
