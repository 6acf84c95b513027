//! Shared-memory transport: a pair-wise channel between two teams of one node.
//!
//! The team that sends first (the *connector*) creates one memfd holding two
//! rings, one per direction, and hands it with its doorbell to the other team
//! (the *acceptor*) over the acceptor's Unix socket (SCM_RIGHTS); the acceptor
//! answers with its own doorbell. The socket then stays open and carries
//! nothing: its hang-up is how each side learns the other died.
//!
//! Segment layout (`cap` = bytes per ring, a power of two):
//!
//! | offset | what |
//! |---|---|
//! | 0 | magic `FERRYSHM`, version u32, cap u32 |
//! | 128 | ring 0 head (connector → acceptor) |
//! | 256 | ring 0 writer-waiting flag |
//! | 384 | ring 1 head (acceptor → connector) |
//! | 512 | ring 1 writer-waiting flag |
//! | 4096 | ring 0 cells |
//! | 4096 + cap | ring 1 cells |
//!
//! Each word has 128 bytes to itself: Intel cores fetch cache lines in
//! pairs, so 64 bytes apart would still share traffic.
//!
//! [`ShmEnd`] is generic over where the rings and doorbells live so that
//! the loom models (`loom_models`) run it on heap memory; production uses
//! the defaults, the mapped segment and doorbell pages.

pub mod ring;

use super::doorbell::{Doorbell, DoorbellMemory, DoorbellPage};
use super::{Recv, RecvError, SendError, Transport};
use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::sync::{fence, AtomicBool, AtomicU32Ops, AtomicU64, Mutex, Ordering};
use crate::sys::{fdpass, shm::Mapping};
use crate::wire::{Header, HEADER_LEN};
use ring::{Consumer, Producer, RingError, RingMem, RingMemory};
use rustix::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, AtomicU64 as SharedU64};
use std::sync::Arc;
use std::time::Duration;

const MAGIC: &[u8; 8] = b"FERRYSHM";
const VERSION: u32 = 2;
const HEADER_AREA: usize = 4096;
const HELLO: &[u8; 8] = b"FERRYHI2";
const WELCOME: &[u8; 8] = b"FERRYOK2";
/// Bytes of a hello or welcome: magic, node u16, pad u16, team u32, incarnation u32, ring bytes u32.
const HELLO_LEN: usize = 24;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Smallest ring: room for a few maximum-size frames of a useful size.
pub const MIN_RING: usize = 4096;

/// Bytes of shared memory one channel with rings of `cap` bytes takes.
pub fn segment_len(cap: usize) -> usize {
    HEADER_AREA + 2 * cap
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Connector,
    Acceptor,
}

/// One team's end of a shared-memory channel.
pub struct ShmEnd<M: RingMemory = RingMem, B: DoorbellMemory = DoorbellPage> {
    producer: Mutex<Producer<M>>,
    consumer: Mutex<Consumer<M>>,
    /// The producer's ring, readable without its lock (for its writer-waiting word).
    tx_mem: M,
    /// The consumer's ring and next position, readable without its lock (for `has_frame`).
    rx_mem: M,
    rx_next: AtomicU64,
    /// A consumed record waits to be released (see `Consumer`): `has_frame`
    /// says yes so the next idle turn releases it.
    rx_unreleased: AtomicBool,
    peer_doorbell: Doorbell<B>,
    max_payload: usize,
    closed: AtomicBool,
    /// Keeps the rings mapped (none for a model's heap rings); declared
    /// last so it is unmapped after the rest.
    _segment: Option<Mapping>,
}

impl ShmEnd {
    fn new(segment: Mapping, cap: usize, side: Side, peer_doorbell: Doorbell) -> ShmEnd {
        let base = segment.as_ptr();
        // SAFETY: the segment is segment_len(cap) bytes (checked at map time),
        // page-aligned, so every offset below is in bounds and suitably
        // aligned; `_segment` keeps it mapped as long as the end (and so
        // its copies of the RingMems) lives.
        let (ring0, ring1) = unsafe {
            (
                RingMem::new(
                    base.add(HEADER_AREA),
                    cap,
                    base.add(128) as *const SharedU64,
                    base.add(256) as *const AtomicU32,
                ),
                RingMem::new(
                    base.add(HEADER_AREA + cap),
                    cap,
                    base.add(384) as *const SharedU64,
                    base.add(512) as *const AtomicU32,
                ),
            )
        };
        let (tx, rx) = match side {
            Side::Connector => (ring0, ring1),
            Side::Acceptor => (ring1, ring0),
        };
        ShmEnd::from_parts(tx, rx, peer_doorbell, Some(segment))
    }
}

impl<M: RingMemory, B: DoorbellMemory> ShmEnd<M, B> {
    /// An end writing `tx`, reading `rx`, ringing the peer's doorbell.
    pub(crate) fn from_parts(tx: M, rx: M, peer_doorbell: Doorbell<B>, segment: Option<Mapping>) -> ShmEnd<M, B> {
        ShmEnd {
            producer: Mutex::new(Producer::new(tx.clone())),
            consumer: Mutex::new(Consumer::new(rx.clone())),
            max_payload: RingMem::max_body(tx.cap()) - HEADER_LEN,
            tx_mem: tx,
            rx_mem: rx,
            rx_next: AtomicU64::new(0),
            rx_unreleased: AtomicBool::new(false),
            peer_doorbell,
            closed: AtomicBool::new(false),
            _segment: segment,
        }
    }

    /// After releasing ring space: wakes the writers if one waits for room.
    ///
    /// Only the reader clears the writer-waiting word, and before it rings:
    /// a wait that sets it again after the clear is rung by a later release.
    /// A writer never clears it: with several writers on this channel, one
    /// that found room would erase the wait of one that did not, which
    /// would then sleep a whole park timeout.
    fn wake_waiting_writer(&self) {
        // Dekker with the writer's want_space → fence → retry → park.
        fence(Ordering::SeqCst);
        let waiting = self.rx_mem.writer_waiting();
        // The swap (a locked instruction) only when somebody waits. Acquire:
        // the writer's ticket, taken before its wait, then cannot see our ring.
        if waiting.load(Ordering::Relaxed) != 0 && waiting.swap(0, Ordering::AcqRel) != 0 {
            self.peer_doorbell.ring_now();
        }
    }
}

impl<M: RingMemory, B: DoorbellMemory> Transport for ShmEnd<M, B> {
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    #[inline]
    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError> {
        if payload.len() > self.max_payload {
            return Err(SendError::TooLarge);
        }
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        let mut h = *header;
        h.len = payload.len() as u32;
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        match self.producer.lock().push(&[&head, payload]) {
            // The writer-waiting word is left alone: another writer may be waiting.
            Ok(()) => {}
            Err(RingError::Full) => return Err(SendError::Full),
            Err(RingError::Corrupt(what)) => {
                tracing::warn!(what, "shared-memory channel corrupted by peer; closing it");
                self.close();
                return Err(SendError::Closed);
            }
        }
        self.peer_doorbell.ring();
        Ok(())
    }

    fn want_space(&self) {
        // SeqCst (so Release): the reader's swap that takes it then orders
        // our park ticket, taken before, ahead of its ring.
        self.tx_mem.writer_waiting().store(1, Ordering::SeqCst);
        // Dekker with the consumer's head store → fence → flag load.
        fence(Ordering::SeqCst);
    }

    #[inline]
    fn has_frame(&self) -> bool {
        Consumer::probe(&self.rx_mem, self.rx_next.load(Ordering::Relaxed))
    }

    #[inline]
    fn needs_tidy(&self) -> bool {
        self.rx_unreleased.load(Ordering::Relaxed)
    }

    fn tidy(&self) {
        let mut consumer = self.consumer.lock();
        if consumer.release() {
            self.rx_unreleased.store(false, Ordering::Relaxed);
            drop(consumer);
            self.wake_waiting_writer();
        }
    }

    #[inline]
    fn try_recv(&self, accept: &mut dyn FnMut(&Header, &[u8]) -> bool) -> Result<Recv, RecvError> {
        let mut bad = None;
        let mut consumer = self.consumer.lock();
        if consumer.release() {
            self.wake_waiting_writer();
        }
        let got = consumer.pop(&mut |body| match Header::decode(body) {
            Ok(h) => accept(&h, &body[HEADER_LEN..]),
            Err(e) => {
                bad = Some(e);
                false
            }
        });
        self.rx_next.store(consumer.next(), Ordering::Relaxed);
        self.rx_unreleased.store(consumer.has_unreleased(), Ordering::Relaxed);
        drop(consumer);
        if let Some(e) = bad {
            self.close();
            return Err(e.into());
        }
        match got {
            Ok(None) => Ok(Recv::Empty),
            Ok(Some(false)) => Ok(Recv::Kept),
            Ok(Some(true)) => Ok(Recv::Consumed),
            Err(RingError::Corrupt(what)) => {
                self.close();
                Err(RecvError::Corrupt(what.to_string()))
            }
            Err(RingError::Full) => unreachable!("the consumer never reports Full"),
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Settings both sides of a bind need.
#[derive(Clone)]
pub struct BindConfig {
    pub me: TeamId,
    pub doorbell: Arc<Doorbell>,
    /// Ring size the connector asks for.
    pub ring_bytes: usize,
    /// Largest ring an acceptor agrees to map.
    pub max_ring_bytes: usize,
}

fn hello_bytes(magic: &[u8; 8], me: TeamId, cap: u32) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&me.node.to_le_bytes());
    b[12..16].copy_from_slice(&me.team.to_le_bytes());
    b[16..20].copy_from_slice(&me.incarnation.to_le_bytes());
    b[20..24].copy_from_slice(&cap.to_le_bytes());
    b
}

fn parse_hello(b: &[u8], magic: &[u8; 8]) -> Option<(TeamId, u32)> {
    if b.len() != HELLO_LEN || &b[..8] != magic {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let node = u16::from_le_bytes([b[8], b[9]]);
    let (team, incarnation, cap) = (word(12), word(16), word(20));
    if incarnation == 0 {
        return None;
    }
    Some((TeamId { node, team, incarnation }, cap))
}

/// The process on the other end broke the bind protocol.
fn refused(peer: TeamId, what: String) -> Error {
    Error::Protocol { peer, what }
}

/// What a failed exchange with the acceptor means for the connector: the
/// team went away (it reset or closed the socket while exiting) or did not
/// answer in time. Neither is a local I/O failure.
fn acceptor_failed(expect: TeamId) -> impl FnOnce(Error) -> Error {
    move |e| match e {
        Error::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            Error::DeadlineExceeded
        }
        Error::Io { .. } => Error::NoSuchTeam(expect),
        other => other,
    }
}

/// The peer's process id as the kernel reports it.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream).ok().map(|c| c.pid.as_raw_nonzero().get() as u32)
}

/// Connector side: creates the channel and hands it to the team listening on `stream`.
pub fn connect(stream: &UnixStream, cfg: &BindConfig, expect: TeamId) -> Result<ShmEnd> {
    let cap = cfg.ring_bytes;
    assert!(cap.is_power_of_two() && cap >= MIN_RING, "ring_bytes must be a power of two >= {MIN_RING}");
    let segment = Mapping::create("ferry-channel", segment_len(cap))?;
    // SAFETY: fresh private segment of segment_len(cap) >= 4096 bytes; nobody else maps it yet.
    unsafe {
        let p = segment.as_ptr();
        std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), p, 8);
        (p.add(8) as *mut u32).write(VERSION);
        (p.add(12) as *mut u32).write(cap as u32);
    }
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(Error::io("socket timeout"))?;
    let hello = hello_bytes(HELLO, cfg.me, cap as u32);
    fdpass::send(stream.as_fd(), &hello, &[segment.fd().as_fd(), cfg.doorbell.fd().as_fd()])
        .map_err(acceptor_failed(expect))?;
    let mut buf = [0u8; 64];
    let (n, mut fds) = fdpass::recv(stream, &mut buf).map_err(acceptor_failed(expect))?;
    if n == 0 {
        // Closed without a word: the team exited (or refused us and is logging why).
        return Err(Error::NoSuchTeam(expect));
    }
    let Some((peer, _)) = parse_hello(&buf[..n], WELCOME) else {
        return Err(refused(expect, format!("bad welcome ({n} bytes)")));
    };
    if peer != expect {
        // The socket at `expect`'s path belongs to someone else: `expect` is not there.
        return Err(Error::NoSuchTeam(expect));
    }
    if fds.len() != 1 {
        return Err(refused(expect, format!("welcome carried {} descriptors, want 1", fds.len())));
    }
    let peer_doorbell = Doorbell::open(fds.pop().unwrap())?;
    Ok(ShmEnd::new(segment, cap, Side::Connector, peer_doorbell))
}

/// Acceptor side: takes a channel offered on a freshly accepted `stream`.
/// `is_peer(team, pid)` checks that the process on the other end (its pid, as
/// the kernel reports it) is the team it claims to be.
pub fn accept(
    stream: &UnixStream,
    cfg: &BindConfig,
    is_peer: impl Fn(TeamId, u32) -> bool,
) -> Result<(ShmEnd, TeamId)> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(Error::io("socket timeout"))?;
    let mut buf = [0u8; 64];
    let (n, mut fds) = fdpass::recv(stream, &mut buf)?;
    let Some((peer, cap)) = parse_hello(&buf[..n], HELLO) else {
        return Err(refused(TeamId { node: cfg.me.node, team: 0, incarnation: 0 }, format!("bad hello ({n} bytes)")));
    };
    let cap = cap as usize;
    if !cap.is_power_of_two() || cap < MIN_RING || cap > cfg.max_ring_bytes {
        return Err(refused(peer, format!("asked for a {cap}-byte ring")));
    }
    if peer.node != cfg.me.node || !peer_pid(stream).is_some_and(|pid| is_peer(peer, pid)) {
        return Err(refused(peer, "is not the process on the other end".into()));
    }
    if fds.len() != 2 {
        return Err(refused(peer, format!("sent {} descriptors, want 2", fds.len())));
    }
    let doorbell_fd = fds.pop().unwrap();
    let segment = Mapping::open(fds.pop().unwrap(), segment_len(cap))?;
    // SAFETY: the segment is at least 4096 bytes; we read 16 header bytes by copy.
    let (magic, version, seg_cap) = unsafe {
        let p = segment.as_ptr();
        (
            std::ptr::read_volatile(p as *const [u8; 8]),
            std::ptr::read_volatile(p.add(8) as *const u32),
            std::ptr::read_volatile(p.add(12) as *const u32),
        )
    };
    if &magic != MAGIC || version != VERSION || seg_cap as usize != cap {
        return Err(refused(peer, "sent a segment of another version".into()));
    }
    let peer_doorbell = Doorbell::open(doorbell_fd)?;
    let welcome = hello_bytes(WELCOME, cfg.me, cap as u32);
    fdpass::send(stream.as_fd(), &welcome, &[cfg.doorbell.fd().as_fd()])?;
    Ok((ShmEnd::new(segment, cap, Side::Acceptor, peer_doorbell), peer))
}

/// A connected pair in one process, for the transport conformance suite.
#[doc(hidden)]
pub fn pair_for_tests(cap: usize, a: Arc<Doorbell>, b: Arc<Doorbell>) -> Result<(ShmEnd, ShmEnd)> {
    let segment = Mapping::create("ferry-channel", segment_len(cap))?;
    let fd = rustix::io::dup(segment.fd()).map_err(|e| Error::io("dup")(e.into()))?;
    let other = Mapping::open(fd, segment_len(cap))?;
    let da = rustix::io::dup(a.fd()).map_err(|e| Error::io("dup")(e.into()))?;
    let db = rustix::io::dup(b.fd()).map_err(|e| Error::io("dup")(e.into()))?;
    Ok((
        ShmEnd::new(segment, cap, Side::Connector, Doorbell::open(db)?),
        ShmEnd::new(other, cap, Side::Acceptor, Doorbell::open(da)?),
    ))
}
