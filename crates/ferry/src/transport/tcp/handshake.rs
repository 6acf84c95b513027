//! The TCP bind handshake: identities, grants, and an HMAC challenge–
//! response over the cluster's key, before any frame is accepted.
//!
//! 1. The connector sends a *hello* (60 bytes): magic `FERRYTC1`, its team
//!    id, the team id it means to reach, the credit it grants, a fresh
//!    16-byte nonce.
//! 2. The acceptor checks it (magic, grant within bounds; else `Protocol`)
//!    and answers a *welcome* (80 bytes): magic `FERRYTW1`, its own id, its
//!    grant, its nonce, and `HMAC-SHA256(key, "ferry-tcp-1 welcome" ‖ hello
//!    ‖ welcome[..48])`.
//! 3. The connector checks the welcome: magic (`Protocol`), that it names
//!    the team *and incarnation* it meant (`NoSuchTeam`), then the MAC
//!    (`Unauthenticated`: the acceptor does not hold the key); it answers
//!    the *proof*, `HMAC-SHA256(key, "ferry-tcp-1 proof" ‖ hello ‖ welcome)`.
//! 4. The acceptor checks the proof and answers `FERRYTOK`, or `FERRYTNA`
//!    and closes (`Unauthenticated` on both sides). A connector that goes
//!    away before proving its key is `Unauthenticated` for the acceptor.
//!
//! Each side's nonce makes the other's MAC fresh, so a recorded handshake
//! cannot be replayed. Both sides wait for each message at most their
//! patience (`DeadlineExceeded`). Documented in `docs/WIRE.md`.

use super::{Grant, TcpEnd};
use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::transport::doorbell::Doorbell;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// Magic of a connector's hello (the version is its last byte).
pub const HELLO: &[u8; 8] = b"FERRYTC1";
/// Magic of an acceptor's welcome.
pub const WELCOME: &[u8; 8] = b"FERRYTW1";
pub(crate) const ACCEPTED: &[u8; 8] = b"FERRYTOK";
pub(crate) const NOT_AUTHENTICATED: &[u8; 8] = b"FERRYTNA";
pub(crate) const HELLO_LEN: usize = 60;
pub(crate) const WELCOME_LEN: usize = 80;
pub(crate) const MAC_LEN: usize = 32;

/// The smallest and largest frame grant a side accepts from the other.
pub const MIN_GRANT: usize = 4096;
const MAX_GRANT: usize = 1 << 30;
/// The largest large-payload grant.
const MAX_DETACHED: usize = 1 << 36;

/// What one side brings to a TCP bind.
#[derive(Clone)]
pub struct TcpBind {
    /// This team (its hello or welcome names it).
    pub me: TeamId,
    /// This team's doorbell: its sleeping threads watch the socket.
    pub doorbell: Arc<Doorbell>,
    /// The cluster's shared key.
    pub key: Arc<[u8]>,
    /// What this side grants the other.
    pub grant: Grant,
    /// How long it waits for each of the other side's messages.
    pub patience: Duration,
    /// A bound channel's peer silent this long is gone (heartbeats every quarter of it).
    pub peer_timeout: Duration,
    /// The magic of its hello or welcome: `None` for the real one (a test
    /// poses as a peer of another protocol or version).
    pub magic: Option<[u8; 8]>,
}

fn put_id(b: &mut [u8], id: TeamId) {
    b[..2].copy_from_slice(&id.node.to_le_bytes());
    b[4..8].copy_from_slice(&id.team.to_le_bytes());
    b[8..12].copy_from_slice(&id.incarnation.to_le_bytes());
}

pub(crate) fn get_id(b: &[u8]) -> TeamId {
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    TeamId { node: u16::from_le_bytes([b[0], b[1]]), team: word(4), incarnation: word(8) }
}

fn put_grant(b: &mut [u8], g: Grant) {
    b[..4].copy_from_slice(&(g.frames as u32).to_le_bytes());
    b[4..12].copy_from_slice(&(g.detached as u64).to_le_bytes());
}

fn get_grant(b: &[u8]) -> Grant {
    Grant {
        frames: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize,
        detached: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")) as usize,
    }
}

fn grant_ok(g: Grant) -> bool {
    (MIN_GRANT..=MAX_GRANT).contains(&g.frames) && g.detached <= MAX_DETACHED
}

pub(crate) fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    // SAFETY: `n` is a writable buffer of the length given.
    let got = unsafe { libc::getrandom(n.as_mut_ptr().cast(), n.len(), 0) };
    if got != n.len() as isize {
        // No randomness from the kernel (very old or sandboxed): fall back
        // to the process's hasher seed and the clock, unpredictable enough
        // to keep two handshakes apart, and said so.
        tracing::warn!("getrandom failed; TCP handshake nonce from the hasher seed");
        use std::hash::{BuildHasher, Hasher};
        for half in n.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    n
}

/// HMAC-SHA256 over `label` then `parts`, keyed with the cluster's key
/// (the handshake's and the name queries' signatures).
pub(crate) fn mac(key: &[u8], label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

/// Reads exactly `buf.len()` bytes within the socket's read timeout.
fn read_exact(sock: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    sock.read_exact(buf)
}

/// What a failed read means: silence (`DeadlineExceeded`) or the other side
/// closing (`or`).
fn read_failed(e: std::io::Error, or: Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::DeadlineExceeded,
        _ => or,
    }
}

fn write_all(sock: &mut TcpStream, bytes: &[u8]) -> Result<()> {
    sock.write_all(bytes).map_err(Error::io("tcp handshake write"))
}

/// A connector's hello: `magic`, its id, the team it means to reach, its grant, its nonce.
pub(crate) fn hello_bytes(
    magic: &[u8; 8],
    me: TeamId,
    expect: TeamId,
    grant: Grant,
    nonce: &[u8; 16],
) -> [u8; HELLO_LEN] {
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(magic);
    put_id(&mut hello[8..20], me);
    put_id(&mut hello[20..32], expect);
    put_grant(&mut hello[32..44], grant);
    hello[44..60].copy_from_slice(nonce);
    hello
}

/// An acceptor's welcome answering `hello`, signed with `key`.
pub(crate) fn welcome_bytes(
    key: &[u8],
    hello: &[u8; HELLO_LEN],
    magic: &[u8; 8],
    me: TeamId,
    grant: Grant,
    nonce: &[u8; 16],
) -> [u8; WELCOME_LEN] {
    let mut welcome = [0u8; WELCOME_LEN];
    welcome[..8].copy_from_slice(magic);
    put_id(&mut welcome[8..20], me);
    put_grant(&mut welcome[20..32], grant);
    welcome[32..48].copy_from_slice(nonce);
    let tag = mac(key, b"ferry-tcp-1 welcome", &[hello, &welcome[..48]]).finalize().into_bytes();
    welcome[48..].copy_from_slice(&tag);
    welcome
}

/// The connector's check of the `welcome` answering its `hello` (a peer's
/// bytes): magic (`Protocol`), the team and incarnation it meant to reach
/// (`NoSuchTeam`), the MAC (`Unauthenticated`), the grant (`Protocol`).
/// Returns what the acceptor granted.
pub(crate) fn check_welcome(
    key: &[u8],
    hello: &[u8; HELLO_LEN],
    welcome: &[u8; WELCOME_LEN],
    expect: TeamId,
) -> Result<Grant> {
    if &welcome[..8] != WELCOME {
        return Err(Error::Protocol { peer: expect, what: format!("bad welcome magic {:?}", &welcome[..8]) });
    }
    if get_id(&welcome[8..20]) != expect {
        // Someone else answers at `expect`'s address: `expect` is not there.
        return Err(Error::NoSuchTeam(expect));
    }
    let theirs = get_grant(&welcome[20..32]);
    let tag = &welcome[WELCOME_LEN - MAC_LEN..];
    if mac(key, b"ferry-tcp-1 welcome", &[hello, &welcome[..48]]).verify_slice(tag).is_err() {
        return Err(Error::Unauthenticated { peer: expect, what: "its welcome is not signed with our cluster key".into() });
    }
    if !grant_ok(theirs) {
        return Err(Error::Protocol { peer: expect, what: format!("granted {theirs:?}") });
    }
    Ok(theirs)
}

/// The connector's reading of the acceptor's last word.
pub(crate) fn check_verdict(verdict: &[u8; 8], expect: TeamId) -> Result<()> {
    match verdict {
        v if v == ACCEPTED => Ok(()),
        v if v == NOT_AUTHENTICATED => {
            Err(Error::Unauthenticated { peer: expect, what: "it does not take our proof of the cluster key".into() })
        }
        v => Err(Error::Protocol { peer: expect, what: format!("bad verdict {v:?}") }),
    }
}

/// The acceptor's check of a connector's `hello` (a peer's bytes): magic,
/// a grant within bounds, a real incarnation (else `Protocol`). Returns
/// the connector and what it granted.
pub(crate) fn check_hello(hello: &[u8; HELLO_LEN]) -> Result<(TeamId, Grant)> {
    let peer = get_id(&hello[8..20]);
    if &hello[..8] != HELLO {
        return Err(Error::Protocol { peer, what: format!("bad hello magic {:?}", &hello[..8]) });
    }
    let theirs = get_grant(&hello[32..44]);
    if !grant_ok(theirs) || peer.incarnation == 0 {
        return Err(Error::Protocol { peer, what: format!("granted {theirs:?} as {peer}") });
    }
    Ok((peer, theirs))
}

/// The connector's proof that it holds `key`: its HMAC of the exchange.
pub(crate) fn proof_bytes(key: &[u8], hello: &[u8; HELLO_LEN], welcome: &[u8; WELCOME_LEN]) -> [u8; MAC_LEN] {
    mac(key, b"ferry-tcp-1 proof", &[hello, welcome]).finalize().into_bytes().into()
}

/// Whether `proof` (a peer's bytes) is the connector's HMAC of the exchange under `key`.
pub(crate) fn proof_ok(
    key: &[u8],
    hello: &[u8; HELLO_LEN],
    welcome: &[u8; WELCOME_LEN],
    proof: &[u8; MAC_LEN],
) -> bool {
    mac(key, b"ferry-tcp-1 proof", &[hello, welcome]).verify_slice(proof).is_ok()
}

/// Connector side: binds over a connected `sock` to the team `expect`.
pub fn connect(mut sock: TcpStream, side: &TcpBind, expect: TeamId) -> Result<TcpEnd> {
    sock.set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    sock.set_nodelay(true).map_err(Error::io("tcp nodelay"))?;
    let hello = hello_bytes(side.magic.as_ref().unwrap_or(HELLO), side.me, expect, side.grant, &nonce());
    // The acceptor closing on us at any point before the welcome: it is not
    // (or no longer) there, or refused us and says why in its log.
    write_all(&mut sock, &hello).map_err(|_| Error::NoSuchTeam(expect))?;
    let mut welcome = [0u8; WELCOME_LEN];
    read_exact(&mut sock, &mut welcome).map_err(|e| read_failed(e, Error::NoSuchTeam(expect)))?;
    let theirs = check_welcome(&side.key, &hello, &welcome, expect)?;
    write_all(&mut sock, &proof_bytes(&side.key, &hello, &welcome))?;
    let mut verdict = [0u8; 8];
    read_exact(&mut sock, &mut verdict).map_err(|e| read_failed(e, Error::NoSuchTeam(expect)))?;
    check_verdict(&verdict, expect)?;
    sock.set_read_timeout(None).map_err(Error::io("tcp timeout"))?;
    TcpEnd::new(sock, side.grant, theirs, side.doorbell.clone(), side.peer_timeout)
}

/// Bytes of a hello.
pub const HELLO_BYTES: usize = HELLO_LEN;

/// Acceptor side, first step: reads the connector's hello from a freshly
/// accepted `sock` (at most `patience`), and says whom it means to reach
/// (the caller hands the connection to that team if it is another one).
#[cfg(any(test, feature = "testing"))]
pub fn read_hello(sock: &mut TcpStream, patience: Duration, me: TeamId) -> Result<([u8; HELLO_LEN], TeamId)> {
    let mut magic = [0u8; 8];
    sock.set_read_timeout(Some(patience)).map_err(Error::io("tcp timeout"))?;
    read_exact(sock, &mut magic).map_err(|e| read_failed(e, closed_early(me)))?;
    read_hello_rest(sock, magic, patience, me)
}

fn closed_early(me: TeamId) -> Error {
    Error::Protocol { peer: TeamId { node: me.node, team: 0, incarnation: 0 }, what: "closed before its hello was whole".into() }
}

/// [`read_hello`] once its first 8 bytes (`magic`) were read (a node's
/// listener reads them to tell a bind from a name query).
pub fn read_hello_rest(
    sock: &mut TcpStream,
    magic: [u8; 8],
    patience: Duration,
    me: TeamId,
) -> Result<([u8; HELLO_LEN], TeamId)> {
    sock.set_read_timeout(Some(patience)).map_err(Error::io("tcp timeout"))?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&magic);
    read_exact(sock, &mut hello[8..]).map_err(|e| read_failed(e, closed_early(me)))?;
    Ok((hello, hello_target(&hello)?))
}

/// The team a hello (a peer's bytes) means to reach (`Protocol` if it is no hello).
pub(crate) fn hello_target(hello: &[u8; HELLO_LEN]) -> Result<TeamId> {
    if &hello[..8] != HELLO {
        return Err(Error::Protocol { peer: get_id(&hello[8..20]), what: format!("bad hello magic {:?}", &hello[..8]) });
    }
    Ok(get_id(&hello[20..32]))
}

/// Acceptor side: takes a bind on a freshly accepted `sock`; returns this
/// end and the connector's id. Waits for each message at most
/// `side.patience` (a team runs it off its progress loop).
#[cfg(any(test, feature = "testing"))]
pub fn accept(mut sock: TcpStream, side: &TcpBind) -> Result<(TcpEnd, TeamId)> {
    let (hello, _) = read_hello(&mut sock, side.patience, side.me)?;
    accept_hello(sock, hello, side)
}

/// Acceptor side, after [`read_hello`] (here or in the team that handed
/// the connection over): answers the welcome and checks the proof.
pub fn accept_hello(mut sock: TcpStream, hello: [u8; HELLO_LEN], side: &TcpBind) -> Result<(TcpEnd, TeamId)> {
    sock.set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    sock.set_nodelay(true).map_err(Error::io("tcp nodelay"))?;
    let (peer, theirs) = check_hello(&hello)?;
    let welcome =
        welcome_bytes(&side.key, &hello, side.magic.as_ref().unwrap_or(WELCOME), side.me, side.grant, &nonce());
    write_all(&mut sock, &welcome)?;
    let not_proven = |what: &str| Error::Unauthenticated { peer, what: what.into() };
    let mut proof = [0u8; MAC_LEN];
    read_exact(&mut sock, &mut proof)
        .map_err(|e| read_failed(e, not_proven("it went away before proving it holds the cluster key")))?;
    if !proof_ok(&side.key, &hello, &welcome, &proof) {
        let _ = sock.write_all(NOT_AUTHENTICATED);
        return Err(not_proven("its proof is not signed with our cluster key"));
    }
    write_all(&mut sock, ACCEPTED)?;
    sock.set_read_timeout(None).map_err(Error::io("tcp timeout"))?;
    Ok((TcpEnd::new(sock, side.grant, theirs, side.doorbell.clone(), side.peer_timeout)?, peer))
}
