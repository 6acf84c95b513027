//! Names: strings bound to endpoints in a name plane.
//!
//! A team registers and looks names up through one plane
//! (`plane::NamePlane`), chosen when it starts: etcd's when one is
//! configured (`TeamBuilder::etcd`, `$FERRY_ETCD`), else the embedded one.
//!
//! | | embedded (default) | etcd |
//! |---|---|---|
//! | made of | this node's files (`node`) and, in a cluster, queries to the other nodes (`remote`); no server | etcd (`etcd`), and a copy of this node's names in its files |
//! | a name is unique | on its node: two nodes may bind the same name, and a lookup from a third finds the lowest-numbered node's | in the cluster (etcd's create-only transaction) |
//! | a lookup asks | this node's files, then all the other nodes at once, within one deadline (5 s); a lower-numbered node still silent 200 ms after a higher one found the name is passed over; a node whose key differs refuses, and a lookup every answer of which was a refusal is `Unauthenticated` naming the node | this node's files, then etcd |
//! | a wait | looks again, every 1 ms doubling to 50 ms | watches the key |
//! | a binding ends | when its team unbinds it or leaves, or at once when it dies (the kernel drops its flock; the next look sweeps it) | as embedded on its node; in etcd when its team unbinds it or leaves (lease revoked), or `names_ttl` after it dies or its keep-alives stop reaching etcd (the lease expires) |
//!
//! Under either plane this node's files hold the names of this node's
//! teams: lookups from this machine need no network, other nodes' queries
//! are answered from them, and `ferry names` lists them. So a node on etcd
//! still answers nodes on the embedded plane, but does not ask them: the
//! nodes of a cluster should agree on the plane. A team whose lease
//! expired while it lives (etcd out of reach for `names_ttl`) keeps its
//! names on its node while etcd may give them to another team.
//!
//! A name is `[A-Za-z0-9._-]`, 1..=200 bytes, not starting with `.`
//! ([`validate_name`]).

pub mod etcd;
pub mod node;
pub(crate) mod plane;
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
