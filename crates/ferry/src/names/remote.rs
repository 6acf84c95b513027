//! Names across nodes, with no server: a name a team registered lives in
//! its node's plane (`node`); a lookup that does not find it there asks the
//! other nodes of the cluster, all at once, and takes the lowest-numbered
//! node's that holds it (see `plane`). Any team of the asked node answers from that node's plane,
//! on the node's TCP address (where binds arrive too; the first 8 bytes
//! tell a query from a bind).
//!
//! Both ways are signed with the cluster's key (HMAC-SHA256): the query
//! carries a fresh nonce, the answer's MAC covers it, so an answer cannot
//! be forged or replayed to another query. In a cluster with TLS the query
//! runs in TLS, as a bind does (its preamble names team 0: any team of the
//! node answers).
//!
//! | query (asker → node) | |
//! |---|---|
//! | 8 | `FERRYNQ1` |
//! | 16 | nonce |
//! | 2 | name length n (1..=200) |
//! | n | name |
//! | 32 | HMAC(key, `ferry-names-1 query` ‖ all the above) |
//!
//! | answer | |
//! |---|---|
//! | 8 | `FERRYNA1` |
//! | 1 | 0 found, 1 not found |
//! | 8 + 4 | the endpoint: address bits u64, incarnation u32 |
//! | 32 | HMAC(key, `ferry-names-1 answer` ‖ query ‖ all the above) |
//!
//! A node that finds a query not signed with its key answers `FERRYNR1`
//! alone (unsigned: it has no key in common with the asker to sign with)
//! and closes; the asker gets `Unauthenticated` naming the node, as a bind
//! would, rather than a name that seems not to be there.

use crate::error::{Error, Result};
use crate::id::{Addr, EndpointId, TeamId};
use crate::names::{validate_name, NodeNames};
use crate::runtime::Cluster;
use crate::transport::tcp::handshake::{self, mac, Link};
use hmac::Mac;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Magic of a name query: what a node's listener reads first.
pub const QUERY: &[u8; 8] = b"FERRYNQ1";
const ANSWER: &[u8; 8] = b"FERRYNA1";
/// A node's refusal of a query not signed with its key.
pub(crate) const REFUSED: &[u8; 8] = b"FERRYNR1";
pub(crate) const MAC_LEN: usize = 32;
pub(crate) const ANSWER_LEN: usize = 8 + 1 + 12 + MAC_LEN;

/// Asks node `node`, at `addr`, for `name`: `Ok(None)` if it has no such
/// name. Fails if the node cannot be reached in `patience`, answers without
/// our key (`Unauthenticated`), or one of us uses TLS and the other does
/// not (`Tls`).
pub fn ask(
    addr: SocketAddr,
    node: u16,
    cluster: &Cluster,
    name: &str,
    patience: Duration,
) -> Result<Option<EndpointId>> {
    validate_name(name)?;
    let key = &cluster.key;
    let peer = TeamId { node, team: 0, incarnation: 0 };
    let unreachable = |e: std::io::Error| Error::Io { context: "name query", source: e };
    // A node at its bound of handshakes from our address (other teams of
    // this node asking or binding at once) is asked again within `patience`.
    handshake::retry_while_busy(Instant::now() + patience, |left| {
        let sock = TcpStream::connect_timeout(&addr, left).map_err(unreachable)?;
        sock.set_read_timeout(Some(left)).map_err(unreachable)?;
        sock.set_nodelay(true).map_err(unreachable)?;
        let mut sock = handshake::open(sock, cluster.tls.as_ref(), peer)?;
        let query = query_bytes(key, &handshake::nonce(), name);
        sock.write_all(&query).map_err(unreachable)?;
        read_answer(&mut sock, key, &query[..query.len() - MAC_LEN], node)
    })
}

/// Reads and checks the answer (a peer's bytes) of node `node` to `query`
/// (its signed part): a refusal (`Unauthenticated`: the node does not hold
/// our key), a TLS node's answer to a query in the clear (`Tls`), else
/// as [`check_answer`] says.
pub(crate) fn read_answer(r: &mut impl Read, key: &[u8], query: &[u8], node: u16) -> Result<Option<EndpointId>> {
    let peer = TeamId { node, team: 0, incarnation: 0 };
    let failed = |e: std::io::Error| {
        crate::transport::tcp::tls::failure(&e, peer).unwrap_or(Error::Io { context: "name query", source: e })
    };
    let mut answer = [0u8; ANSWER_LEN];
    r.read_exact(&mut answer[..8]).map_err(failed)?;
    match &answer[..8] {
        m if m == handshake::TLS_REQUIRED => return Err(handshake::tls_required(peer)),
        m if m == REFUSED => {
            let what = "it refused our name query: not signed with its cluster key (the keys differ)".into();
            return Err(Error::Unauthenticated { peer, what });
        }
        // At one of its limits (handshakes from our address).
        m if m == handshake::REFUSED => return Err(handshake::read_refusal(r, peer)),
        _ => {}
    }
    r.read_exact(&mut answer[8..]).map_err(failed)?;
    check_answer(key, query, &answer, node)
}

/// A signed query for `name` (at most `MAX_NAME_LEN` bytes) with `nonce`.
pub(crate) fn query_bytes(key: &[u8], nonce: &[u8; 16], name: &str) -> Vec<u8> {
    let mut query = Vec::with_capacity(8 + 16 + 2 + name.len() + MAC_LEN);
    query.extend_from_slice(QUERY);
    query.extend_from_slice(nonce);
    query.extend_from_slice(&(name.len() as u16).to_le_bytes());
    query.extend_from_slice(name.as_bytes());
    let tag = mac(key, b"ferry-names-1 query", &[&query]).finalize().into_bytes();
    query.extend_from_slice(&tag);
    query
}

/// The asker's check of the `answer` (a peer's bytes) from node `node` to
/// its `query` (signed part): the MAC (`Unauthenticated`), the magic
/// (`Protocol`); then the endpoint, or `None` if the node has no such name.
pub(crate) fn check_answer(
    key: &[u8],
    query: &[u8],
    answer: &[u8; ANSWER_LEN],
    node: u16,
) -> Result<Option<EndpointId>> {
    let peer = TeamId { node, team: 0, incarnation: 0 };
    let body = &answer[..ANSWER_LEN - MAC_LEN];
    if mac(key, b"ferry-names-1 answer", &[query, body]).verify_slice(&answer[ANSWER_LEN - MAC_LEN..]).is_err() {
        return Err(Error::Unauthenticated { peer, what: "its name answer is not signed with our cluster key".into() });
    }
    if &answer[..8] != ANSWER {
        let violation = crate::error::Violation::MalformedHandshake {
            message: crate::error::HandshakeMessage::NameAnswer,
            len: ANSWER_LEN,
        };
        return Err(Error::Protocol { peer, violation });
    }
    if answer[8] != 0 {
        return Ok(None);
    }
    let bits = u64::from_le_bytes(answer[9..17].try_into().expect("8 bytes"));
    let incarnation = u32::from_le_bytes(answer[17..21].try_into().expect("4 bytes"));
    Ok(Some(EndpointId::at(Addr::from_bits(bits), incarnation)))
}

/// Answers one query on `sock` (in TLS or not), whose first 8 bytes
/// (`QUERY`) were read, from this node's plane. A query not signed with our
/// key is refused (`REFUSED`).
pub fn answer(mut sock: Link, key: &[u8], names: &NodeNames, patience: Duration) -> Result<()> {
    let io = |e: std::io::Error| Error::Io { context: "name query", source: e };
    sock.socket().set_read_timeout(Some(patience)).map_err(io)?;
    let (query, name) = match read_query(&mut sock, key) {
        Ok(got) => got,
        Err(e @ Error::Unauthenticated { .. }) => {
            // The query was read whole: the asker reads this before our close.
            let _ = sock.write_all(REFUSED);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let found = match names.lookup(&name) {
        Ok(ep) => Some(ep),
        Err(Error::NameNotFound(_)) | Err(Error::InvalidName(_)) => None,
        Err(e) => return Err(e),
    };
    sock.write_all(&answer_bytes(key, &query, found)).map_err(io)
}

/// Reads the rest of a query (a peer's bytes) whose magic was read from
/// `r`, and checks it: the name's length (`InvalidName`), the MAC
/// (`Unauthenticated`), UTF-8 (`InvalidName`). Returns the signed part of
/// the query (which the answer's MAC covers) and the name.
pub(crate) fn read_query(r: &mut impl Read, key: &[u8]) -> Result<(Vec<u8>, String)> {
    let io = |e: std::io::Error| Error::Io { context: "name query", source: e };
    let mut query = QUERY.to_vec();
    let mut head = [0u8; 18];
    r.read_exact(&mut head).map_err(io)?;
    query.extend_from_slice(&head);
    let len = u16::from_le_bytes([head[16], head[17]]) as usize;
    if len == 0 || len > crate::names::MAX_NAME_LEN {
        return Err(Error::InvalidName(format!("a {len}-byte name in a query")));
    }
    let mut rest = vec![0u8; len + MAC_LEN];
    r.read_exact(&mut rest).map_err(io)?;
    query.extend_from_slice(&rest[..len]);
    let who = TeamId { node: 0, team: 0, incarnation: 0 };
    if mac(key, b"ferry-names-1 query", &[&query]).verify_slice(&rest[len..]).is_err() {
        return Err(Error::Unauthenticated { peer: who, what: "a name query not signed with our cluster key".into() });
    }
    let name = std::str::from_utf8(&rest[..len]).map_err(|_| Error::InvalidName("not UTF-8".into()))?;
    Ok((query, name.to_string()))
}

/// The signed answer to `query` (its signed part): `found`, or not found.
pub(crate) fn answer_bytes(key: &[u8], query: &[u8], found: Option<EndpointId>) -> [u8; ANSWER_LEN] {
    let mut answer = [0u8; ANSWER_LEN];
    answer[..8].copy_from_slice(ANSWER);
    answer[8] = u8::from(found.is_none());
    if let Some(ep) = found {
        answer[9..17].copy_from_slice(&ep.addr().bits().to_le_bytes());
        answer[17..21].copy_from_slice(&ep.incarnation().to_le_bytes());
    }
    let tag = mac(key, b"ferry-names-1 answer", &[query, &answer[..ANSWER_LEN - MAC_LEN]]).finalize().into_bytes();
    answer[ANSWER_LEN - MAC_LEN..].copy_from_slice(&tag);
    answer
}
