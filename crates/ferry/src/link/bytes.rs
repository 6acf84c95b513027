//! A link message's bytes ([`LinkBytes`]): small ones inline, so that a
//! small message costs no allocation (nor a free) on its way to its
//! receiver, as a port's `RawMessage` keeps its payload.

use std::ops::Deref;

/// Bytes a [`LinkBytes`] holds without allocating.
const INLINE: usize = 48;

/// A link message's bytes, as [`Link::recv_bytes`](super::Link::recv_bytes)
/// gives them: a byte slice (`Deref<Target = [u8]>`) kept inline up to 48
/// bytes, in a vector past that.
#[derive(Clone)]
pub struct LinkBytes(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Vec<u8>),
}

impl LinkBytes {
    pub(crate) fn from_slice(s: &[u8]) -> LinkBytes {
        if s.len() > INLINE {
            return LinkBytes(Repr::Heap(s.to_vec()));
        }
        let mut bytes = [0u8; INLINE];
        bytes[..s.len()].copy_from_slice(s);
        LinkBytes(Repr::Inline { len: s.len() as u8, bytes })
    }

    /// The bytes as a vector (no copy if they are in one already).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Repr::Inline { len, bytes } => bytes[..usize::from(len)].to_vec(),
            Repr::Heap(v) => v,
        }
    }
}

impl From<Vec<u8>> for LinkBytes {
    fn from(v: Vec<u8>) -> LinkBytes {
        LinkBytes(Repr::Heap(v))
    }
}

impl Deref for LinkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }
}

impl AsRef<[u8]> for LinkBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for LinkBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for LinkBytes {
    fn eq(&self, other: &LinkBytes) -> bool {
        **self == **other
    }
}

impl Eq for LinkBytes {}

impl PartialEq<[u8]> for LinkBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for LinkBytes {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for LinkBytes {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for LinkBytes {
    fn eq(&self, other: &&[u8; N]) -> bool {
        **self == other[..]
    }
}

impl PartialEq<Vec<u8>> for LinkBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::LinkBytes;

    #[test]
    fn small_and_large_bytes_read_back_as_they_were() {
        for len in [0, 1, 47, 48, 49, 1000] {
            let v: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let b = LinkBytes::from_slice(&v);
            assert_eq!(&*b, &v[..]);
            assert_eq!(b, v);
            assert_eq!(b.clone().into_vec(), v);
            assert_eq!(LinkBytes::from(v.clone()), b);
        }
        assert_eq!(LinkBytes::from_slice(b"ab"), b"ab");
        assert_eq!(LinkBytes::from_slice(b"ab"), [b'a', b'b']);
        assert_eq!(format!("{:?}", LinkBytes::from_slice(&[1, 2])), "[1, 2]");
    }
}
