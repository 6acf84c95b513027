//! Names: strings bound to endpoints in a name plane.
//!
//! `node` is the embedded default plane of one machine: plain files under a
//! private runtime directory, no daemon. `remote`: a lookup a node's plane
//! cannot answer asks the other nodes of the cluster (no server either).
//! `etcd`: the cluster plane at scale, on an etcd (names under leases).

pub mod etcd;
pub mod node;
pub mod remote;

pub use node::{NodeNames, RuntimeDir, TeamLease};

use crate::error::{Error, Result};

/// Longest name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Checks a name: 1..=200 bytes of `[A-Za-z0-9._-]`, not starting with `.`.
///
/// The rule keeps every name a safe single file name (no `/`, never `.` or
/// `..`), and leaves names starting with `.` free for the planes' own files.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_validate() {
        for good in ["a", "echo", "svc.v2", "A-b_c.9", "a..b", &"x".repeat(MAX_NAME_LEN)] {
            assert!(validate_name(good).is_ok(), "{good:?} should be valid");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", "a\n", "a\0", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(matches!(validate_name(bad), Err(Error::InvalidName(n)) if n == bad), "{bad:?} should be invalid");
        }
    }
}
