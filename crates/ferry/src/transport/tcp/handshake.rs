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
//!    A node's listener also checks that the connector may be the node its
//!    hello claims (its address, or its TLS certificate: see `reactor`),
//!    else answers `FERRYTNN` (`Unauthenticated` on both sides).
//!
//! Each side's nonce makes the other's MAC fresh, so a recorded handshake
//! cannot be replayed. Both sides wait for each message at most their
//! patience (`DeadlineExceeded`). Documented in `docs/WIRE.md`.
//!
//! With TLS (a [`TlsConfig`] in [`TcpBind::tls`]) the same handshake runs
//! inside TLS, after a preamble in the clear (see `tls`): a [`Link`] is
//! either. A side with TLS and a side without both fail with `Tls`.

use super::tls::{self, TlsConfig, UNKNOWN};
use super::{Grant, TcpEnd};
use crate::error::{Error, HandshakeMessage, Result, Violation};
use crate::id::TeamId;
use crate::transport::doorbell::Doorbell;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Magic of a connector's hello (the version is its last byte).
pub const HELLO: &[u8; 8] = b"FERRYTC1";
/// Magic of an acceptor's welcome.
pub const WELCOME: &[u8; 8] = b"FERRYTW1";
pub(crate) const ACCEPTED: &[u8; 8] = b"FERRYTOK";
pub(crate) const NOT_AUTHENTICATED: &[u8; 8] = b"FERRYTNA";
/// The acceptor's verdict on a connector that proved the key but may not be
/// the node its hello claims.
pub(crate) const NOT_THAT_NODE: &[u8; 8] = b"FERRYTNN";
/// Magic of an acceptor's refusal in place of a welcome: a limit of its was
/// reached (its number and value follow; see [`crate::Limit::refusal`]).
pub(crate) const REFUSED: &[u8; 8] = b"FERRYTRF";
/// Magic of a connector's TLS preamble: TLS follows, for the team whose id
/// comes next (12 bytes; team 0: any team of the node, for a name query).
pub const TLS_START: &[u8; 8] = b"FERRYTS1";
/// An acceptor's answer to the preamble: TLS starts.
const TLS_YES: &[u8; 8] = b"FERRYTSY";
/// An acceptor's answer to the preamble: this node does not use TLS.
const TLS_NO: &[u8; 8] = b"FERRYTSN";
/// A TLS node's answer to a connection that opens without TLS.
pub const TLS_REQUIRED: &[u8; 8] = b"FERRYTSR";
pub(crate) const HELLO_LEN: usize = 60;
pub(crate) const WELCOME_LEN: usize = 80;
pub(crate) const MAC_LEN: usize = 32;

/// The smallest and largest frame grant a side accepts from the other.
pub const MIN_GRANT: usize = 4096;
pub(crate) const MAX_GRANT: usize = 1 << 30;
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
    /// TLS: every connection runs in it (a connector's, and those it accepts).
    pub tls: Option<TlsConfig>,
}

/// A connection a bind (or a name query) runs over: the socket as it is,
/// or TLS on it.
pub enum Link {
    /// In the clear.
    Plain(TcpStream),
    /// In TLS (the preamble answered, TLS's handshake done).
    Tls(Box<tls::TlsStream>),
}

impl Link {
    /// The socket.
    pub fn socket(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(t) => tls::socket(t),
        }
    }

    /// The channel's end on this link, once the bind handshake is done.
    fn into_end(self, ours: Grant, theirs: Grant, side: &TcpBind) -> Result<TcpEnd> {
        self.socket().set_read_timeout(None).map_err(Error::io("tcp timeout"))?;
        match self {
            Link::Plain(s) => TcpEnd::new(s, ours, theirs, side.doorbell.clone(), side.peer_timeout),
            Link::Tls(t) => TcpEnd::over_tls(*t, ours, theirs, side.doorbell.clone(), side.peer_timeout),
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.write(buf),
            Link::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Link::Plain(s) => s.flush(),
            Link::Tls(t) => t.flush(),
        }
    }
}

pub(crate) fn put_id(b: &mut [u8], id: TeamId) {
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

pub(crate) fn grant_ok(g: Grant) -> bool {
    (MIN_GRANT..=MAX_GRANT).contains(&g.frames) && g.detached <= MAX_DETACHED
}

/// The violation of a grant that is not `grant_ok`.
fn out_of_bounds(g: Grant) -> Violation {
    Violation::GrantOutOfBounds { frames: g.frames as u64, detached: g.detached as u64 }
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
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
            );
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
fn read_exact(sock: &mut impl Read, buf: &mut [u8]) -> std::io::Result<()> {
    sock.read_exact(buf)
}

/// What a failed read from `peer` means: TLS's verdict (`Unauthenticated`,
/// `Tls`), silence (`DeadlineExceeded`) or the other side closing (`or`).
pub(crate) fn read_failed(e: std::io::Error, peer: TeamId, or: Error) -> Error {
    if let Some(e) = tls::failure(&e, peer) {
        return e;
    }
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::DeadlineExceeded,
        _ => or,
    }
}

fn write_all(sock: &mut impl Write, bytes: &[u8]) -> Result<()> {
    sock.write_all(bytes).map_err(Error::io("tcp handshake write"))
}

/// The connector's error when the acceptor's node uses TLS and its own does not.
pub(crate) fn tls_required(peer: TeamId) -> Error {
    let what = format!("node {} uses TLS, and this node does not (the cluster files disagree)", peer.node);
    Error::Tls { peer, what }
}

/// Connector side: the link to `to` over a connected `sock`, whose read
/// timeout bounds each wait: the socket as it is, or with `tls` the
/// preamble, its answer and TLS's handshake.
pub(crate) fn open(sock: TcpStream, tls: Option<&TlsConfig>, to: TeamId) -> Result<Link> {
    let Some(cfg) = tls else { return Ok(Link::Plain(sock)) };
    let mut start = [0u8; 20];
    start[..8].copy_from_slice(TLS_START);
    put_id(&mut start[8..], to);
    (&sock).write_all(&start).map_err(|_| Error::NoSuchTeam(to))?;
    let mut answer = [0u8; 8];
    // Closed on without a word, as before a hello: the team is not there.
    (&sock).read_exact(&mut answer).map_err(|e| read_failed(e, to, Error::NoSuchTeam(to)))?;
    match &answer {
        a if a == TLS_YES => Ok(Link::Tls(Box::new(tls::client(sock, cfg, to)?))),
        a if a == REFUSED => Err(read_refusal(&mut &sock, to)),
        a if a == TLS_NO => {
            let what = format!("node {} does not use TLS, and this node does (the cluster files disagree)", to.node);
            Err(Error::Tls { peer: to, what })
        }
        a => Err(Error::Tls { peer: to, what: format!("it answered our TLS preamble with {a:?}") }),
    }
}

/// Acceptor side: reads the rest of a TLS preamble whose magic was read
/// (at most the socket's read timeout): whom the connector means to reach.
pub fn read_tls_start_rest(sock: &mut TcpStream, me: TeamId) -> Result<TeamId> {
    let mut id = [0u8; 12];
    read_exact(sock, &mut id).map_err(|e| read_failed(e, UNKNOWN, closed_early(me, HandshakeMessage::TlsPreamble)))?;
    Ok(get_id(&id))
}

/// Acceptor side: answers a TLS preamble (read whole): TLS starts, if this
/// side has it (its handshake at most `side.patience` per step); else the
/// connector is told that this node does not use TLS (`Tls` on both sides).
pub fn start_tls(mut sock: TcpStream, side: &TcpBind) -> Result<Link> {
    sock.set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    let Some(cfg) = &side.tls else {
        let _ = sock.write_all(TLS_NO);
        let what = "it opened in TLS, and this node does not use TLS (the cluster files disagree)".into();
        return Err(Error::Tls { peer: UNKNOWN, what });
    };
    write_all(&mut sock, TLS_YES)?;
    Ok(Link::Tls(Box::new(tls::server(sock, cfg)?)))
}

/// Acceptor side, with TLS: refuses a connection that opened in the clear
/// (its first 8 bytes read), telling the connector why; then waits (at
/// most `patience`) for it to hang up, so that what it sent and we did not
/// read does not reset the connection before it reads the refusal.
pub fn refuse_plain(mut sock: TcpStream, patience: Duration) -> Error {
    if sock.write_all(TLS_REQUIRED).is_ok() && sock.shutdown(std::net::Shutdown::Write).is_ok() {
        let until = std::time::Instant::now() + patience;
        let mut sink = [0u8; 1024];
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()).filter(|d| !d.is_zero()) {
            if sock.set_read_timeout(Some(left)).is_err() || !matches!(sock.read(&mut sink), Ok(n) if n > 0) {
                break;
            }
        }
    }
    let what = "it opened without TLS, and this node uses TLS (the cluster files disagree)".into();
    Error::Tls { peer: UNKNOWN, what }
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
        let violation = Violation::MalformedHandshake { message: HandshakeMessage::Welcome, len: WELCOME_LEN };
        return Err(Error::Protocol { peer: expect, violation });
    }
    if get_id(&welcome[8..20]) != expect {
        // Someone else answers at `expect`'s address: `expect` is not there.
        return Err(Error::NoSuchTeam(expect));
    }
    let theirs = get_grant(&welcome[20..32]);
    let tag = &welcome[WELCOME_LEN - MAC_LEN..];
    if mac(key, b"ferry-tcp-1 welcome", &[hello, &welcome[..48]]).verify_slice(tag).is_err() {
        return Err(Error::Unauthenticated {
            peer: expect,
            what: "its welcome is not signed with our cluster key".into(),
        });
    }
    if !grant_ok(theirs) {
        return Err(Error::Protocol { peer: expect, violation: out_of_bounds(theirs) });
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
        v if v == NOT_THAT_NODE => Err(Error::Unauthenticated {
            peer: expect,
            what: "it does not take us for our node from where we connect (our address, or our TLS certificate, \
                   is not our node's in its cluster file)"
                .into(),
        }),
        v => Err(Error::Protocol {
            peer: expect,
            violation: Violation::MalformedHandshake { message: HandshakeMessage::Verdict, len: v.len() },
        }),
    }
}

/// The acceptor's check of a connector's `hello` (a peer's bytes): magic,
/// a grant within bounds, a real incarnation (else `Protocol`). Returns
/// the connector and what it granted.
pub(crate) fn check_hello(hello: &[u8; HELLO_LEN]) -> Result<(TeamId, Grant)> {
    let peer = get_id(&hello[8..20]);
    if &hello[..8] != HELLO {
        let violation = Violation::MalformedHandshake { message: HandshakeMessage::Hello, len: HELLO_LEN };
        return Err(Error::Protocol { peer, violation });
    }
    let theirs = get_grant(&hello[32..44]);
    if !grant_ok(theirs) {
        return Err(Error::Protocol { peer, violation: out_of_bounds(theirs) });
    }
    if peer.incarnation == 0 {
        return Err(Error::Protocol { peer, violation: Violation::NoIncarnation });
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

/// The team a hello (a peer's bytes) means to reach (`Protocol` if it is no hello).
pub(crate) fn hello_target(hello: &[u8; HELLO_LEN]) -> Result<TeamId> {
    if &hello[..8] != HELLO {
        return Err(Error::Protocol {
            peer: get_id(&hello[8..20]),
            violation: Violation::MalformedHandshake { message: HandshakeMessage::Hello, len: HELLO_LEN },
        });
    }
    Ok(get_id(&hello[20..32]))
}

/// What an acceptor's refusal (a peer's bytes), its magic read, says: the
/// limit it reached (`LimitReached`), else `Protocol` (or the read's failure).
pub(crate) fn read_refusal(sock: &mut impl Read, peer: TeamId) -> Error {
    let mut body = [0u8; 12];
    if let Err(e) = read_exact(sock, &mut body) {
        return read_failed(e, peer, Error::NoSuchTeam(peer));
    }
    let bad = Error::Protocol {
        peer,
        violation: Violation::MalformedHandshake { message: HandshakeMessage::Refusal, len: 20 },
    };
    crate::Limit::refused(&body).unwrap_or(bad)
}

/// Longest pause between two tries of a connection an acceptor refused
/// at its bound of handshakes from our address.
const MAX_BUSY_PAUSE: Duration = Duration::from_millis(50);

/// Runs `attempt` (given the time left before `deadline`, at least 1 ms)
/// and again, after 1, 2, 4 ... 50 ms, while the acceptor refuses it at
/// its bound of handshakes from our address (`LimitReached(Handshakes)`:
/// a burst of this node's teams binding at once, say) and `deadline`
/// allows; then the refusal stands. Honest bursts only wait; a stranger
/// gains nothing, since the acceptor's bound still holds.
pub(crate) fn retry_while_busy<T>(deadline: Instant, mut attempt: impl FnMut(Duration) -> Result<T>) -> Result<T> {
    let mut pause = Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match attempt(left) {
            Err(Error::LimitReached { limit: crate::Limit::Handshakes, .. }) if Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_BUSY_PAUSE);
            }
            r => return r,
        }
    }
}

/// Connector side: binds over a connected `sock` to the team `expect`.
pub fn connect(sock: TcpStream, side: &TcpBind, expect: TeamId) -> Result<TcpEnd> {
    sock.set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    sock.set_nodelay(true).map_err(Error::io("tcp nodelay"))?;
    let mut sock = open(sock, side.tls.as_ref(), expect)?;
    let hello = hello_bytes(side.magic.as_ref().unwrap_or(HELLO), side.me, expect, side.grant, &nonce());
    // The acceptor closing on us at any point before the welcome: it is not
    // (or no longer) there, or refused us and says why in its log.
    write_all(&mut sock, &hello).map_err(|_| Error::NoSuchTeam(expect))?;
    let mut welcome = [0u8; WELCOME_LEN];
    read_exact(&mut sock, &mut welcome[..8]).map_err(|e| read_failed(e, expect, Error::NoSuchTeam(expect)))?;
    if &welcome[..8] == TLS_REQUIRED {
        return Err(tls_required(expect));
    }
    if &welcome[..8] == REFUSED {
        return Err(read_refusal(&mut sock, expect));
    }
    read_exact(&mut sock, &mut welcome[8..]).map_err(|e| read_failed(e, expect, Error::NoSuchTeam(expect)))?;
    let theirs = check_welcome(&side.key, &hello, &welcome, expect)?;
    write_all(&mut sock, &proof_bytes(&side.key, &hello, &welcome))?;
    let mut verdict = [0u8; 8];
    read_exact(&mut sock, &mut verdict).map_err(|e| read_failed(e, expect, Error::NoSuchTeam(expect)))?;
    check_verdict(&verdict, expect)?;
    sock.into_end(side.grant, theirs, side)
}

/// Bytes of a hello.
pub const HELLO_BYTES: usize = HELLO_LEN;

fn closed_early(me: TeamId, message: HandshakeMessage) -> Error {
    Error::Protocol {
        peer: TeamId { node: me.node, team: 0, incarnation: 0 },
        violation: Violation::ClosedBefore(message),
    }
}

/// Acceptor side: reads the rest of the connector's hello once its first 8
/// bytes (`magic`) were read (a node's listener reads them to tell a bind
/// from a name query or TLS), at most `patience`; says whom it means to
/// reach (the caller hands the connection over to that team if it is
/// another one).
pub fn read_hello_rest(
    sock: &mut Link,
    magic: [u8; 8],
    patience: Duration,
    me: TeamId,
) -> Result<([u8; HELLO_LEN], TeamId)> {
    sock.socket().set_read_timeout(Some(patience)).map_err(Error::io("tcp timeout"))?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&magic);
    read_exact(sock, &mut hello[8..])
        .map_err(|e| read_failed(e, UNKNOWN, closed_early(me, HandshakeMessage::Hello)))?;
    Ok((hello, hello_target(&hello)?))
}

/// Acceptor side: takes a bind on a freshly accepted `sock` (in TLS or
/// not, as its first bytes and `side.tls` say); returns this end and the
/// connector's id. Waits for each message at most `side.patience` (a team
/// runs it off its progress loop).
#[cfg(any(test, feature = "testing"))]
pub fn accept(mut sock: TcpStream, side: &TcpBind) -> Result<(TcpEnd, TeamId)> {
    let mut magic = [0u8; 8];
    sock.set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    read_exact(&mut sock, &mut magic)
        .map_err(|e| read_failed(e, UNKNOWN, closed_early(side.me, HandshakeMessage::Opening)))?;
    let mut link = if &magic == TLS_START {
        read_tls_start_rest(&mut sock, side.me)?;
        let mut link = start_tls(sock, side)?;
        read_exact(&mut link, &mut magic)
            .map_err(|e| read_failed(e, UNKNOWN, closed_early(side.me, HandshakeMessage::Opening)))?;
        link
    } else if side.tls.is_some() {
        return Err(refuse_plain(sock, side.patience));
    } else {
        Link::Plain(sock)
    };
    let (hello, _) = read_hello_rest(&mut link, magic, side.patience, side.me)?;
    accept_hello(link, hello, side)
}

/// Acceptor side, after [`read_hello_rest`]: refuses the bind because
/// `limit` (of value `max`) was reached; the connector gets `LimitReached`.
pub fn refuse(mut sock: Link, limit: crate::Limit, max: u64) {
    let _ = sock.write_all(&limit.refusal(REFUSED, max));
}

/// Acceptor side, after [`read_hello_rest`] (here or in the team that
/// handed the connection over): answers the welcome and checks the proof.
#[cfg(any(test, feature = "testing"))]
pub fn accept_hello(sock: Link, hello: [u8; HELLO_LEN], side: &TcpBind) -> Result<(TcpEnd, TeamId)> {
    accept_hello_from(sock, hello, side, |_| Ok(()))
}

/// The acceptor's last steps (after [`read_hello_rest`], here or in the
/// team that handed the connection over): answers the welcome and checks
/// the proof; `may_be` says (once the key is proven) whether
/// the connector may be the team its hello claims (else why not: it is
/// refused with `Unauthenticated`, and told so).
pub(crate) fn accept_hello_from(
    mut sock: Link,
    hello: [u8; HELLO_LEN],
    side: &TcpBind,
    may_be: impl FnOnce(TeamId) -> std::result::Result<(), String>,
) -> Result<(TcpEnd, TeamId)> {
    sock.socket().set_read_timeout(Some(side.patience)).map_err(Error::io("tcp timeout"))?;
    sock.socket().set_nodelay(true).map_err(Error::io("tcp nodelay"))?;
    let (peer, theirs) = check_hello(&hello)?;
    let welcome =
        welcome_bytes(&side.key, &hello, side.magic.as_ref().unwrap_or(WELCOME), side.me, side.grant, &nonce());
    write_all(&mut sock, &welcome)?;
    let not_proven = |what: &str| Error::Unauthenticated { peer, what: what.into() };
    let mut proof = [0u8; MAC_LEN];
    read_exact(&mut sock, &mut proof)
        .map_err(|e| read_failed(e, peer, not_proven("it went away before proving it holds the cluster key")))?;
    if !proof_ok(&side.key, &hello, &welcome, &proof) {
        let _ = sock.write_all(NOT_AUTHENTICATED);
        return Err(not_proven("its proof is not signed with our cluster key"));
    }
    if let Err(why) = may_be(peer) {
        let _ = sock.write_all(NOT_THAT_NODE);
        return Err(Error::Unauthenticated { peer, what: why });
    }
    write_all(&mut sock, ACCEPTED)?;
    Ok((sock.into_end(side.grant, theirs, side)?, peer))
}
