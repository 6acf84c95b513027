//! Typed values the large-message tests send: a blob with a byte field of
//! each kind, and a value whose encoding changes length between passes.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Blob {
    pub id: u64,
    pub data: Vec<u8>,
    pub chunk: ferry::Bytes,
}

/// A blob of about `len` bytes (`data` below 128 each: one byte each in any encoding).
pub fn blob(id: u64, len: usize) -> Blob {
    let data = (0..len / 2).map(|k| ((k as u64 * 31 + id) % 128) as u8).collect();
    Blob { id, data, chunk: ferry::Bytes::from(vec![id as u8; len / 2]) }
}

/// A large value whose encoding grows (or shrinks) by a byte each time it
/// is encoded (1 MiB, then one more or less): a `Serialize` that differs
/// between its size pass and its encoding. (Deserializable only to be an
/// RPC result type: it never arrives.)
#[derive(Debug, Deserialize)]
pub struct Flaky {
    #[serde(skip)]
    grow: bool,
    #[serde(skip)]
    passes: AtomicUsize,
}

impl Flaky {
    pub fn new(grow: bool) -> Flaky {
        Flaky { grow, passes: AtomicUsize::new(0) }
    }
}

impl Serialize for Flaky {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = self.passes.fetch_add(1, Ordering::Relaxed);
        let len = if self.grow { (1 << 20) + n } else { (1 << 20) - n };
        s.serialize_bytes(&vec![1u8; len])
    }
}
