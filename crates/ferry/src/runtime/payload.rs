//! A message's bytes: small ones kept inline (no allocation on the hot
//! path of small messages), larger ones in a `Vec`.

/// Bytes a payload holds without allocating.
pub const INLINE: usize = 56;

pub enum Payload {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Vec<u8>),
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

    pub fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Inline { len, bytes } => &bytes[..*len as usize],
            Payload::Heap(v) => v,
        }
    }

    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Payload::Inline { len, bytes } => bytes[..len as usize].to_vec(),
            Payload::Heap(v) => v,
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::Heap(v)
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
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
    fn small_inline_large_heap_same_bytes() {
        for n in [0, 1, INLINE, INLINE + 1, 1000] {
            let v: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let p = Payload::from_slice(&v);
            assert_eq!(matches!(p, Payload::Inline { .. }), n <= INLINE);
            assert_eq!(p.as_slice(), &v[..]);
            assert_eq!(p.into_vec(), v);
        }
    }
}
