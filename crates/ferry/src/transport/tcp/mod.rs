//! TCP transport: a channel between two teams over one TCP connection
//! (teams on different nodes, or on one node over loopback).
//!
//! Frames travel as they are (header and payload, `docs/WIRE.md`) on the
//! stream; a large payload travels inline too, in a frame flagged
//! `DETACHED` that the receiver hands out as a [`Detached`] (there is no
//! shared memory to stage it in: staging copies it into a buffer the
//! frame then carries).
//!
//! **Flow control** is ferry's own, in bytes, as for a ring: a writer may
//! have `frames` bytes of frames and `detached` bytes of large payloads in
//! flight, as granted at the handshake ([`Grant`]: each side states one,
//! and both directions run on the smaller, so a peer granting the
//! protocol's bounds gets no more queued for it than it may queue). The reader
//! gives credit back in `Release` frames (16 bytes: frame bytes, payload
//! bytes): for frames it consumed, along with its next frame, or at once
//! when a quarter of the grant is owed or the writer is nearly out of
//! credit (the reader knows: it counts what it granted); for a large
//! payload, when the receiver drops it. So a channel never has more than
//! its credit in the kernel's buffers, a reader never buffers more than it
//! granted (a frame past the credit closes the channel), a writer never
//! queues more than it was granted (credit returned for bytes it never
//! sent closes the channel too), and `Full` means the same as for a ring.
//!
//! **Large payloads** stream through: a `DETACHED` frame of more than
//! `OWN_BUFFER` (64 KiB) is read, once its header is in (its credit
//! checked: a header past the credit closes the channel before anything
//! is allocated), straight into a buffer of its own, of its exact size,
//! which the receiver gets as the [`Received`] (no copy); the read buffer
//! never grows to a large frame's size, so a 64 MiB message is gathered
//! whole once, where the receiver's decode needs it. (Frames are split
//! after every read for that, so a header is seen before the rest of its
//! frame is read.) On the way out a staged payload goes to `writev` as it
//! is, after its header: the kernel copies it from there as the socket
//! takes it, a few MiB a write.
//!
//! **Batching:** frames queue in the end's send buffer while the socket
//! cannot take them and go out together (one `writev`); a read takes
//! everything the kernel holds, up to the credit granted and a read's
//! worth per pump. **Wake-ups:** the socket is watched by the
//! team's sleeping threads (see `doorbell`): data arriving wakes one, as a
//! ring on a `one` line would, so a TCP channel needs no doorbell of its
//! own; while the kernel's send buffer is full, room in it wakes one too.
//! **Liveness:** end of stream or a reset, found by a read, is the peer
//! gone. A peer that goes silent (its machine died, the link was cut) says
//! nothing, so each end has a heartbeat: its liveness descriptor is a
//! timer firing every quarter of `peer_timeout`; at each tick it sends an
//! empty credit frame if it sent nothing since the last tick, and declares
//! the peer gone if it heard nothing (frames or heartbeats) for
//! `peer_timeout`. **Closing** writes out what is still queued first (it
//! fits in the peer's credit, so a live peer takes it; at most
//! `peer_timeout`), then ends the stream: a team that sends and leaves
//! loses nothing it had accepted. A peer that broke the protocol gets no
//! more bytes.
//!
//! **TLS** (see `tls`): an end may carry a TLS session. Then its frames are
//! encrypted on the way out (the batch still goes out in one `writev` of
//! records) and decrypted on the way in (a read still takes all the kernel
//! holds), on the same socket, watched the same way; the plaintext path
//! pays one check for it, in `flush` and in `pump`. A large payload's
//! plaintext goes from rustls's buffer straight into its own buffer too:
//! TLS costs that one copy (the decryption's output) and no more.

use super::cork;
use super::doorbell::{Doorbell, Watch};
use super::{Body, Detached, Liveness, Recv, RecvError, SendError, Staged, Transport};
use crate::error::{Result, Violation};
use crate::id::Addr;
use crate::wire::{flags, Header, Kind, HEADER_LEN};
use parking_lot::Mutex;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod handshake;
pub mod tls;

pub use tls::TlsConfig;

/// Bytes of a credit-returning `Release` frame's payload.
const CREDIT_LEN: usize = 16;
/// Bytes asked of the kernel per read.
const READ: usize = 64 * 1024;
/// Bytes of read buffer a connection keeps however little it needed lately.
/// Above that, the buffer (which grows to hold whole frames, and whatever
/// the kernel had buffered) shrinks back, once empty, to what the reads of
/// the last heartbeat tick or so needed: without that it stayed at its
/// high-water mark, which crept up for as long as the connection lived.
const KEEP: usize = 4 * READ;
/// Small frames share a send buffer up to this size.
const BATCH: usize = 64 * 1024;
/// A large payload of more than this many bytes is read into a buffer of
/// its own, of its exact size, which the receiver is handed (no copy); the
/// read buffer never grows to hold it.
const OWN_BUFFER: usize = READ;

/// What an end grants its peer: bytes it may have in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Frame bytes (headers included).
    pub frames: usize,
    /// Large-payload bytes.
    pub detached: usize,
}

/// A large payload read off a TCP stream. Its credit goes back to the
/// sender when it is dropped (so a receiver that holds large payloads holds
/// the sender up, as a payload area would).
#[derive(Debug)]
pub struct Received {
    bytes: Vec<u8>,
    /// Its credit: the payload's length (0 while its frame is refused).
    credit: usize,
    /// Where given-back credit waits to be returned (the end's `returned`).
    back: Arc<Returned>,
}

/// Large-payload credit given back by dropped [`Received`]s, not yet
/// returned, and the team that returns it.
pub(crate) struct Returned {
    credit: AtomicUsize,
    team: Arc<Doorbell>,
}

impl std::fmt::Debug for Returned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Returned").field("credit", &self.credit).finish_non_exhaustive()
    }
}

impl Received {
    /// The payload.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes themselves, no copy (their credit goes back now).
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        // The first credit waiting: a team all asleep wakes to return it (a
        // writer may wait for it); a polling thread returns it in its turn.
        if self.back.credit.fetch_add(self.credit, Ordering::Release) == 0 && self.credit > 0 {
            self.back.team.ring();
        }
    }
}

/// A `Release` frame giving back `frames` and `detached` bytes of credit
/// (zero of both: a heartbeat).
pub(crate) fn credit_frame(frames: usize, detached: usize) -> Vec<u8> {
    let mut h = Header::new(Kind::Release, Addr::NONE, Addr::NONE, 0);
    h.len = CREDIT_LEN as u32;
    let mut frame = vec![0u8; HEADER_LEN + CREDIT_LEN];
    let (head, body) = frame.split_at_mut(HEADER_LEN);
    h.encode(head.try_into().expect("HEADER_LEN bytes"));
    body[..8].copy_from_slice(&(frames as u64).to_le_bytes());
    body[8..].copy_from_slice(&(detached as u64).to_le_bytes());
    frame
}

/// One end of a TCP channel.
pub struct TcpEnd {
    sock: TcpStream,
    /// The TLS session the frames travel in, if any (innermost lock: taken
    /// under `tx` or `rx`, never the other way round).
    /// Boxed: an end without TLS stays as small as before.
    tls: Option<Box<Mutex<tls::Session>>>,
    tx: Mutex<Tx>,
    /// Bytes wait in `tx` for the socket.
    tx_pending: AtomicBool,
    /// A writer found no credit and asked to be woken when some comes.
    writer_waiting: AtomicBool,
    rx: Mutex<Rx>,
    /// A whole frame waits in `rx` (a hint for `has_frame`).
    rx_ready: AtomicBool,
    /// A probe wanted to read the socket while `rx` was locked: the holder
    /// reads again once it unlocks (the probe may have taken the socket's
    /// edge, the one wake-up the data will get).
    rx_wanted: AtomicBool,
    /// Sends fail; receives report `PeerGone` once drained.
    closed: AtomicBool,
    /// The peer hung up (end of stream or reset) before we closed.
    hung_up: AtomicBool,
    /// The stream was read to its end (or broke): nothing more to read.
    stream_done: AtomicBool,
    /// `PeerGone` was reported.
    ended: AtomicBool,
    /// Largest inline payload: frames of up to half the credit.
    max_payload: usize,
    max_detached: usize,
    /// What the peer granted us: credit it returns never takes ours past
    /// it (credit comes back only for bytes we sent).
    granted: Grant,
    /// Owed credit goes back at once from this much on (a quarter of our grant).
    return_at: usize,
    /// Large-payload credit given back by dropped [`Received`]s, not yet returned.
    returned: Arc<Returned>,
    /// Credit we returned, not yet added back to `rx`'s grant.
    regranted: AtomicUsize,
    regranted_detached: AtomicUsize,
    /// This team's doorbell: credit that comes in wakes its waiting writers.
    team: Arc<Doorbell>,
    /// Room in the kernel's send buffer wakes a sleeping thread while bytes wait.
    out_watch: Mutex<Option<Watch>>,
    /// Ticks every quarter of `peer_timeout` (the liveness descriptor).
    heartbeat: OwnedFd,
    peer_timeout: Duration,
    /// When we last read bytes, and last wrote some (ns on [`clock`]).
    last_heard: AtomicU64,
    last_sent: AtomicU64,
    /// When the read buffer was last cooled ([`Rx::cool`], ns on [`clock`]).
    rx_cooled: AtomicU64,
    /// The team's sleeping threads watch the socket while the end lives.
    _watch: Watch,
}

/// Nanoseconds since the first call in this process (a monotonic clock
/// cheap to store in an atomic).
fn clock() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

struct Tx {
    /// Bytes to write, in order; `out_at` of the first are written.
    out: VecDeque<Vec<u8>>,
    out_at: usize,
    /// What we may still send: frame bytes, and large payloads' bytes.
    credit: usize,
    credit_detached: usize,
    /// What we owe the peer for frames we consumed.
    owed: usize,
}

pub(crate) struct Rx {
    /// Bytes read are `buf[..end]`; the rest is room for the next read.
    buf: Vec<u8>,
    end: usize,
    /// `buf[..at]` is consumed; whole frames start at `at`, parsed up to `parsed`.
    at: usize,
    parsed: usize,
    /// The whole data frames, in order (credit frames are applied when
    /// parsed, never queued).
    frames: VecDeque<Frame>,
    /// A large payload being read into its own buffer: reads go there
    /// until it is whole, then it is queued.
    big: Option<Big>,
    /// Credit returned by the credit frames split, not yet applied (frame
    /// bytes, large-payload bytes).
    credit_in: (usize, usize),
    /// What the peer may still send us: a frame past it is a protocol violation.
    grant: usize,
    grant_detached: usize,
    /// The most bytes buffered past the consumed head before reads stop:
    /// all the credit granted and a read's worth (credit frames need no
    /// credit, so a peer streaming them must not grow the buffer).
    cap: usize,
    /// The last pump stopped at `cap`: the kernel may hold more, and no
    /// new edge will say so.
    pub(crate) capped: bool,
    /// Bytes read into `buf` since the pump began ([`Rx::compact`]): a
    /// pump stops at `cap` of them too, as frames are split after each
    /// read (so credit frames, consumed as they come, never fill `buf`).
    pumped: usize,
    /// The most buffer the reads needed since [`Rx::cool`] last looked.
    peak: usize,
}

/// A whole data frame waiting to be received.
enum Frame {
    /// In `buf`, from this offset (header and payload).
    In(usize),
    /// A large payload read into a buffer of its own; `at` is where the
    /// frames after it start in `buf`.
    Own { at: usize, header: Header, bytes: Vec<u8> },
}

impl Frame {
    /// Where the frame (or, for an `Own`, the frames after it) start in `buf`.
    fn at_mut(&mut self) -> &mut usize {
        match self {
            Frame::In(at) | Frame::Own { at, .. } => at,
        }
    }

    fn at(&self) -> usize {
        match *self {
            Frame::In(at) | Frame::Own { at, .. } => at,
        }
    }
}

/// A large payload being read off the stream into its own buffer.
struct Big {
    header: Header,
    /// Its payload's size (zeroed: a large allocation's pages come zeroed
    /// from the kernel, so that costs nothing up front); `filled` bytes read.
    bytes: Vec<u8>,
    filled: usize,
}

/// The reading side's bookkeeping: pure (the socket reads go to
/// [`Rx::room`]), so a fuzz harness runs it on bytes of its own.
impl Rx {
    pub(crate) fn new(ours: Grant) -> Rx {
        Rx {
            buf: Vec::new(),
            end: 0,
            at: 0,
            parsed: 0,
            frames: VecDeque::new(),
            big: None,
            credit_in: (0, 0),
            grant: ours.frames,
            grant_detached: ours.detached,
            cap: ours.frames.saturating_add(ours.detached).saturating_add(READ),
            capped: false,
            pumped: 0,
            peak: 0,
        }
    }

    /// Drops the consumed head of the buffer once it is half of what is
    /// buffered (all of it, usually: then nothing moves). A pump begins with it.
    pub(crate) fn compact(&mut self) {
        self.pumped = 0;
        if self.at > 0 && self.at * 2 >= self.end {
            let at = self.at;
            self.buf.copy_within(at..self.end, 0);
            self.end -= at;
            self.frames.iter_mut().for_each(|f| *f.at_mut() -= at);
            self.parsed -= at;
            self.at = 0;
        }
    }

    /// Where the next read goes (the caller says what it read with
    /// [`Rx::filled`]): the rest of a large payload being read into its own
    /// buffer, else at least `READ` bytes after those buffered; `None` once
    /// `cap` bytes are buffered (split them first: credit frames go, data
    /// frames wait for their reader).
    pub(crate) fn room(&mut self) -> Option<&mut [u8]> {
        if self.big.is_some() {
            return self.big_room();
        }
        if self.at_cap() {
            return None;
        }
        self.room_past_cap();
        let (from, to) = (self.end, self.room_end());
        Some(&mut self.buf[from..to])
    }

    /// The rest of the large payload being read, if one is.
    fn big_room(&mut self) -> Option<&mut [u8]> {
        self.big.as_mut().map(|big| &mut big.bytes[big.filled..])
    }

    /// `n` bytes were read into the room given last. A large payload read
    /// whole is queued.
    pub(crate) fn filled(&mut self, n: usize) {
        let Some(big) = &mut self.big else {
            self.end += n;
            self.pumped += n;
            return;
        };
        big.filled += n;
        if big.filled == big.bytes.len() {
            let Big { header, bytes, .. } = self.big.take().expect("checked above");
            // Nothing was read into `buf` since it began: the next frame starts at its end.
            self.frames.push_back(Frame::Own { at: self.end, header, bytes });
        }
    }

    /// Whether `cap` bytes are buffered past the consumed head, or were
    /// read since the pump began (a large payload being read has its room:
    /// its credit was taken).
    pub(crate) fn at_cap(&self) -> bool {
        self.big.is_none() && (self.end - self.at >= self.cap || self.pumped >= self.cap)
    }

    /// At least `READ` bytes of room, whatever is buffered (for bytes that
    /// must go somewhere: what TLS decrypted of a record read before the
    /// cap), or the rest of a large payload being read.
    pub(crate) fn room_past_cap(&mut self) -> &mut [u8] {
        if self.big.is_some() {
            return self.big_room().unwrap_or_default();
        }
        if self.buf.len() - self.end < READ {
            // Zeroed once, when the buffer grows; reads reuse it.
            let grown = self.end + READ;
            self.buf.resize(grown, 0);
        }
        self.peak = self.peak.max(self.end + READ);
        &mut self.buf[self.end..]
    }

    /// Where the room [`Rx::room`] gives ends: the buffer's end, or a
    /// read's worth past the cap. A read that fills it may have left more
    /// in the kernel.
    fn room_end(&self) -> usize {
        self.buf.len().min(self.at.saturating_add(self.cap).saturating_add(READ))
    }

    /// Whether a receive has something to do: a whole frame, or bytes the
    /// last pump left in the kernel.
    fn ready(&self) -> bool {
        !self.frames.is_empty() || self.capped
    }

    /// Gives back the buffer's memory beyond `KEEP` and beyond what the
    /// reads since the last call needed, if nothing is buffered now (else
    /// at a later call). For a slow path: a heartbeat tick.
    pub(crate) fn cool(&mut self) {
        if self.at < self.end || !self.frames.is_empty() {
            // Bytes wait (frames, or part of one): a later look.
            self.peak = self.end + READ;
            return;
        }
        // Everything read was consumed (so no frame is queued): the buffer
        // starts over, its head (touched already) kept.
        (self.at, self.parsed, self.end) = (0, 0, 0);
        let keep = KEEP.max(self.peak);
        if self.buf.len() > keep {
            self.buf.truncate(keep);
            self.buf.shrink_to(keep);
        }
        self.peak = 0;
    }

    /// Splits the whole frames after `parsed`: data frames are queued (each
    /// taking its credit), credit frames summed into `credit_in`. A large
    /// payload (more than `OWN_BUFFER` bytes) not yet read whole moves, with
    /// its credit taken, into a buffer of its own, where the rest of it is
    /// read. A frame past the credit granted, or malformed, is an error,
    /// found from its header alone (before anything is allocated for it).
    pub(crate) fn split(&mut self) -> std::result::Result<(), RecvError> {
        let credit = &mut self.credit_in;
        while self.big.is_none() {
            let rest = &self.buf[self.parsed..self.end];
            if rest.len() < HEADER_LEN {
                break;
            }
            let len = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes")) as usize;
            // Refused before it is buffered whole: no frame may exceed what we
            // granted (its kind and flags say which credit it draws on).
            let bits = u16::from_le_bytes([rest[2], rest[3]]);
            let limit = if rest[1] == Kind::Release.to_u8() {
                CREDIT_LEN
            } else if bits & flags::DETACHED != 0 {
                self.grant_detached
            } else {
                self.grant.saturating_sub(HEADER_LEN)
            };
            if len > limit {
                return Err(RecvError::Corrupt(Violation::PastCredit { len }));
            }
            if rest.len() < HEADER_LEN + len {
                if bits & flags::DETACHED != 0 && len > OWN_BUFFER && rest[1] != Kind::Release.to_u8() {
                    // Its credit checked above: `len` is at most what we granted.
                    let header = Header::decode_head(rest)?;
                    let (f, d) = TcpEnd::cost(&header);
                    if f > self.grant || d > self.grant_detached {
                        return Err(RecvError::Corrupt(Violation::PastCredit { len }));
                    }
                    let part = &rest[HEADER_LEN..];
                    let mut bytes = crate::sys::huge_pages::zeroed(len);
                    bytes[..part.len()].copy_from_slice(part);
                    let filled = part.len();
                    self.grant -= f;
                    self.grant_detached -= d;
                    self.parsed = self.end;
                    self.big = Some(Big { header, bytes, filled });
                }
                break;
            }
            let h = Header::decode(&rest[..HEADER_LEN + len])?;
            if h.kind == Kind::Release {
                if len != CREDIT_LEN {
                    return Err(RecvError::Corrupt(Violation::BadCreditFrame { len }));
                }
                let p = &rest[HEADER_LEN..HEADER_LEN + len];
                credit.0 = credit.0.saturating_add(u64::from_le_bytes(p[..8].try_into().expect("8")) as usize);
                credit.1 = credit.1.saturating_add(u64::from_le_bytes(p[8..].try_into().expect("8")) as usize);
            } else {
                let (f, d) = TcpEnd::cost(&h);
                if f > self.grant || d > self.grant_detached {
                    return Err(RecvError::Corrupt(Violation::PastCredit { len }));
                }
                self.grant -= f;
                self.grant_detached -= d;
                self.frames.push_back(Frame::In(self.parsed));
            }
            self.parsed += HEADER_LEN + len;
        }
        // Credit frames are not data (nor a large payload's head, now in
        // its own buffer): with nothing before them, the consumed head
        // moves past them.
        if self.frames.is_empty() {
            self.at = self.parsed;
        }
        Ok(())
    }

    /// The first whole data frame's header.
    #[inline]
    pub(crate) fn front(&self) -> Option<Header> {
        self.frames.front().map(|f| self.header_of(f))
    }

    /// A queued frame's header.
    fn header_of(&self, frame: &Frame) -> Header {
        match *frame {
            Frame::In(at) => Header::decode(&self.buf[at..at + HEADER_LEN + self.len_at(at)]).expect("parsed before"),
            Frame::Own { header, .. } => header,
        }
    }

    /// The payload length of the frame in `buf` at `at` (parsed before).
    fn len_at(&self, at: usize) -> usize {
        u32::from_le_bytes(self.buf[at + 4..at + 8].try_into().expect("4 bytes")) as usize
    }

    /// The first whole data frame's payload (empty if there is none, or
    /// while [`Rx::take_front`] has it).
    #[inline]
    pub(crate) fn front_payload(&self) -> &[u8] {
        match self.frames.front() {
            Some(&Frame::In(at)) => &self.buf[at + HEADER_LEN..at + HEADER_LEN + self.len_at(at)],
            Some(Frame::Own { bytes, .. }) => bytes,
            None => &[],
        }
    }

    /// The first frame's payload as a buffer of its own: the one it was
    /// read into (no copy) if it has one, else a copy. Until the frame is
    /// popped, [`Rx::put_back`] returns it.
    pub(crate) fn take_front(&mut self) -> Vec<u8> {
        match self.frames.front_mut() {
            Some(Frame::Own { bytes, .. }) => std::mem::take(bytes),
            _ => self.front_payload().to_vec(),
        }
    }

    /// A payload [`Rx::take_front`] gave, back (its frame was kept).
    pub(crate) fn put_back(&mut self, payload: Vec<u8>) {
        if let Some(Frame::Own { bytes, .. }) = self.frames.front_mut() {
            *bytes = payload;
        }
    }

    /// The first data frame was taken.
    #[inline]
    pub(crate) fn pop_front(&mut self) {
        self.frames.pop_front();
        self.at = self.frames.front().map_or(self.parsed, Frame::at);
    }
}

/// What a fuzz harness needs beyond the reading side's own steps.
#[cfg(any(test, feature = "testing"))]
impl Rx {
    /// A read off the socket that returned `bytes` (as many as fit in
    /// [`Rx::room`]); returns how many were taken.
    pub(crate) fn read(&mut self, bytes: &[u8]) -> usize {
        let Some(room) = self.room() else { return 0 };
        let n = room.len().min(bytes.len());
        room[..n].copy_from_slice(&bytes[..n]);
        self.filled(n);
        n
    }

    /// What the frames waiting in the queue cost, of each credit.
    pub(crate) fn queued(&self) -> (usize, usize) {
        let mut sum = (0, 0);
        for frame in &self.frames {
            let h = self.header_of(frame);
            let (f, d) = TcpEnd::cost(&h);
            sum = (sum.0 + f, sum.1 + d);
        }
        // A large payload being read took its credit already.
        if let Some(big) = &self.big {
            let (f, d) = TcpEnd::cost(&big.header);
            sum = (sum.0 + f, sum.1 + d);
        }
        sum
    }

    /// The buffer's size (for tests of its bound).
    pub(crate) fn buffer_len(&self) -> usize {
        self.buf.len()
    }

    /// Credit returned to the peer (as `TcpEnd::parse` adds it).
    pub(crate) fn regrant(&mut self, frames: usize, detached: usize) {
        self.grant += frames;
        self.grant_detached += detached;
    }

    /// Checks the bookkeeping's invariants: consumed ≤ parsed ≤ read ≤
    /// buffer; queued frames in order, between the consumed head and the
    /// parsed part. Returns the bytes buffered.
    pub(crate) fn check(&self) -> usize {
        assert!(self.at <= self.parsed && self.parsed <= self.end && self.end <= self.buf.len());
        // Reads stop at the cap; the last one may pass it by a read's worth.
        assert!(
            self.end - self.at <= self.cap + READ,
            "{} bytes buffered past a cap of {}",
            self.end - self.at,
            self.cap
        );
        let mut last = self.at;
        for f in &self.frames {
            let (at, past) = match f {
                Frame::In(at) => (*at, *at + HEADER_LEN),
                Frame::Own { at, header, bytes } => {
                    assert!(bytes.is_empty() || bytes.len() == header.len as usize);
                    (*at, *at)
                }
            };
            assert!(at >= last && past <= self.parsed, "a queued frame outside the parsed bytes");
            last = past;
        }
        if let Some(big) = &self.big {
            assert!(big.filled < big.bytes.len() && big.bytes.len() == big.header.len as usize);
            assert!(self.parsed == self.end, "bytes read into the buffer while a large payload was");
        }
        self.end
    }
}

#[cfg(any(test, feature = "testing"))]
impl TcpEnd {
    /// The size of the reading side's buffer (for tests of its bound).
    pub fn rx_buffer_len(&self) -> usize {
        self.rx.lock().buffer_len()
    }
}

impl TcpEnd {
    /// An end on a connected `sock` (handshake done): `ours` is what we
    /// grant the peer, `theirs` what it granted us. The socket is made
    /// non-blocking, `TCP_NODELAY`, and watched by `team`'s sleeping
    /// threads; a peer silent for `peer_timeout` is gone.
    pub fn new(
        sock: TcpStream,
        ours: Grant,
        theirs: Grant,
        team: Arc<Doorbell>,
        peer_timeout: Duration,
    ) -> Result<TcpEnd> {
        TcpEnd::make(sock, None, ours, theirs, team, peer_timeout)
    }

    /// [`TcpEnd::new`], with the frames in `tls` (see `tls::TcpEnd::over_tls`).
    fn make(
        sock: TcpStream,
        tls: Option<tls::Session>,
        ours: Grant,
        theirs: Grant,
        team: Arc<Doorbell>,
        peer_timeout: Duration,
    ) -> Result<TcpEnd> {
        use rustix::time::{
            timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
        };
        // Both directions run on the smaller of the two grants (each side
        // knows both from the handshake, so they agree): a peer may grant up
        // to the protocol's bounds (1 GiB of frames, 64 GiB of large
        // payloads) and read nothing, and we queue for it no more than we
        // let it queue for us. The reader must count the same grant as the
        // writer: it returns credit by what it believes the writer holds.
        let both = Grant { frames: theirs.frames.min(ours.frames), detached: theirs.detached.min(ours.detached) };
        let (ours, theirs) = (both, both);
        sock.set_nonblocking(true).map_err(crate::Error::io("tcp nonblocking"))?;
        sock.set_nodelay(true).map_err(crate::Error::io("tcp nodelay"))?;
        let watch = team.watch_socket(&sock, false)?;
        let heartbeat = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK)?;
        let tick = rustix::time::Timespec::try_from((peer_timeout / 4).max(Duration::from_millis(1)))
            .map_err(|_| crate::Error::InvalidArgument(format!("peer timeout {peer_timeout:?}")))?;
        timerfd_settime(&heartbeat, TimerfdTimerFlags::empty(), &Itimerspec { it_interval: tick, it_value: tick })?;
        Ok(TcpEnd {
            tx: Mutex::new(Tx {
                out: VecDeque::new(),
                out_at: 0,
                credit: theirs.frames,
                credit_detached: theirs.detached,
                owed: 0,
            }),
            tx_pending: AtomicBool::new(false),
            writer_waiting: AtomicBool::new(false),
            rx: Mutex::new(Rx::new(ours)),
            rx_ready: AtomicBool::new(false),
            rx_wanted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
            stream_done: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            max_payload: (theirs.frames / 2).saturating_sub(HEADER_LEN),
            max_detached: theirs.detached,
            granted: theirs,
            return_at: ours.frames / 4,
            returned: Arc::new(Returned { credit: AtomicUsize::new(0), team: team.clone() }),
            regranted: AtomicUsize::new(0),
            regranted_detached: AtomicUsize::new(0),
            team,
            sock,
            tls: tls.map(|s| Box::new(Mutex::new(s))),
            out_watch: Mutex::new(None),
            heartbeat,
            peer_timeout,
            last_heard: AtomicU64::new(clock()),
            last_sent: AtomicU64::new(clock()),
            rx_cooled: AtomicU64::new(clock()),
            _watch: watch,
        })
    }

    /// What a frame costs of each credit.
    pub(crate) fn cost(h: &Header) -> (usize, usize) {
        if h.detached() {
            (HEADER_LEN, h.len as usize)
        } else {
            (HEADER_LEN + h.len as usize, 0)
        }
    }

    /// Queues one frame (taking its credit) and writes what the socket
    /// takes. A large payload comes in `owned` (taken only on success).
    fn send_frame(&self, h: &Header, payload: &[&[u8]], owned: &mut Option<Vec<u8>>) -> Result<(), SendError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        let (frame, detached) = Self::cost(h);
        let mut tx = self.tx.lock();
        if tx.credit < frame || tx.credit_detached < detached {
            // Credit may be waiting in the socket, unread: look once.
            drop(tx);
            self.pump_credit();
            tx = self.tx.lock();
            if tx.credit < frame || tx.credit_detached < detached {
                return Err(SendError::Full);
            }
        }
        tx.credit -= frame;
        tx.credit_detached -= detached;
        // What we owe the peer rides along.
        self.queue_credit(&mut tx);
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        match owned.take() {
            Some(big) => {
                tx.out.push_back(head.to_vec());
                tx.out.push_back(big);
            }
            None => match tx.out.back_mut() {
                // Small frames share a buffer, so a burst goes out in one write.
                Some(last) if last.len() < BATCH => {
                    last.extend_from_slice(&head);
                    payload.iter().for_each(|p| last.extend_from_slice(p));
                }
                _ => {
                    let mut v = Vec::with_capacity(HEADER_LEN + h.len as usize);
                    v.extend_from_slice(&head);
                    payload.iter().for_each(|p| v.extend_from_slice(p));
                    tx.out.push_back(v);
                }
            },
        }
        if cork::corked() {
            // Written with the burst's other frames, by the corking thread.
            self.tx_pending.store(true, Ordering::Release);
            cork::held_back();
        } else {
            self.flush(&mut tx);
        }
        Ok(())
    }

    /// Queues a `Release` frame returning what we owe, if anything.
    fn queue_credit(&self, tx: &mut Tx) {
        let detached = self.returned.credit.swap(0, Ordering::Acquire);
        if tx.owed == 0 && detached == 0 {
            return;
        }
        tx.out.push_back(credit_frame(tx.owed, detached));
        // The peer may send this much more: our bound grows with it.
        self.regranted.fetch_add(tx.owed, Ordering::Release);
        self.regranted_detached.fetch_add(detached, Ordering::Release);
        tx.owed = 0;
    }

    /// Writes what the socket takes of the queue (several frames per call);
    /// whether bytes still wait.
    fn flush(&self, tx: &mut Tx) -> bool {
        let waiting = match &self.tls {
            None => {
                self.write_plain(tx);
                let waiting = !tx.out.is_empty();
                self.tx_pending.store(waiting, Ordering::Release);
                waiting
            }
            // Sets `tx_pending` itself, under the session's lock.
            Some(session) => self.write_tls(tx, session),
        };
        // While the kernel cannot take more, room in it must wake someone.
        let mut out_watch = self.out_watch.lock();
        if waiting && out_watch.is_none() {
            *out_watch = self.team.watch_socket(&self.sock, true).ok();
        } else if !waiting && out_watch.is_some() {
            *out_watch = None;
        }
        waiting
    }

    /// The first 64 buffers of the queue, the first from where it was left.
    #[inline]
    fn out_slices(tx: &Tx) -> Vec<IoSlice<'_>> {
        tx.out
            .iter()
            .enumerate()
            .take(64)
            .map(|(i, b)| IoSlice::new(if i == 0 { &b[tx.out_at..] } else { b }))
            .collect()
    }

    /// Drops the first `n` bytes of the queue (written).
    #[inline]
    fn written(tx: &mut Tx, mut n: usize) {
        while n > 0 {
            let left = tx.out[0].len() - tx.out_at;
            if n >= left {
                n -= left;
                tx.out.pop_front();
                tx.out_at = 0;
            } else {
                tx.out_at += n;
                n = 0;
            }
        }
    }

    /// Writes the queue to the socket as it is, until it is empty or the
    /// kernel takes no more.
    #[inline]
    fn write_plain(&self, tx: &mut Tx) {
        while !tx.out.is_empty() {
            let slices = Self::out_slices(tx);
            match (&self.sock).write_vectored(&slices) {
                Ok(n) => {
                    self.last_sent.store(clock(), Ordering::Relaxed);
                    Self::written(tx, n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // Reset or broken: the peer is gone.
                    tx.out.clear();
                    self.hang_up();
                    break;
                }
            }
        }
    }

    /// Reads what the socket holds (unless a receive is under way, which
    /// does it), applying credit frames. Data frames it read wake a
    /// sleeping thread if nobody polls: a writer short of credit or the
    /// liveness look may have read them (taking the socket's edge, their
    /// one wake-up), and neither receives them.
    fn pump_credit(&self) {
        self.read_for_credit();
        if self.rx_ready.load(Ordering::Relaxed) {
            self.team.ring();
        }
    }

    fn read_for_credit(&self) {
        // Twice at most: once more if a probe found `rx` locked meanwhile.
        for _ in 0..2 {
            // Said before trying (Dekker with the holder's unlock → look):
            // either the lock is free, or its holder sees that we wanted in.
            self.rx_wanted.store(true, Ordering::SeqCst);
            let Some(mut rx) = self.rx.try_lock() else { return };
            self.rx_wanted.store(false, Ordering::Relaxed);
            if let Err(e) = self.pump(&mut rx) {
                tracing::warn!(%e, "closing a TCP channel: the peer broke the protocol");
                drop(rx);
                self.abort();
                return;
            }
            drop(rx);
            if !self.rx_wanted.swap(false, Ordering::SeqCst) {
                return;
            }
        }
    }

    /// One receive (see `Transport::try_recv`).
    fn try_recv_once(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        let closed = self.closed.load(Ordering::Acquire);
        if closed && self.ended.load(Ordering::Relaxed) {
            return Ok(Recv::PeerGone);
        }
        let mut rx = self.rx.lock();
        if rx.frames.is_empty() {
            if let Err(e) = self.pump(&mut rx) {
                drop(rx);
                self.abort();
                return Err(e);
            }
        }
        let Some(h) = rx.front() else {
            return if closed || self.stream_done.load(Ordering::Acquire) {
                self.ended.store(true, Ordering::Relaxed);
                Ok(Recv::PeerGone)
            } else {
                Ok(Recv::Empty)
            };
        };
        let len = h.len as usize;
        let taken = if h.detached() {
            let back = self.returned.clone();
            // A large payload read into its own buffer is handed out as it is.
            let bytes = rx.take_front();
            let mut slot = Some(Detached::Received(Received { bytes, credit: len, back }));
            let taken = accept(&h, Body::Detached(&mut slot));
            if let Some(Detached::Received(mut refused)) = slot {
                // Still ours: the frame stays, its credit is not given back.
                refused.credit = 0;
                rx.put_back(std::mem::take(&mut refused.bytes));
            }
            taken
        } else {
            accept(&h, Body::Inline(rx.front_payload()))
        };
        if !taken {
            return Ok(Recv::Kept);
        }
        rx.pop_front();
        self.rx_ready.store(rx.ready(), Ordering::Release);
        // The writer may be nearly out of credit: then it gets it back now.
        let writer_low = rx.grant < self.return_at;
        drop(rx);
        // A large payload's credit comes back when its `Received` goes.
        let mut tx = self.tx.lock();
        tx.owed += HEADER_LEN + if h.detached() { 0 } else { len };
        if writer_low || tx.owed >= self.return_at {
            self.queue_credit(&mut tx);
            self.flush(&mut tx);
        }
        Ok(Recv::Consumed)
    }

    /// Reads what the kernel holds into `rx`, up to its cap, and parses
    /// whole frames: data frames are queued, credit frames applied. The
    /// buffer stays bounded: the peer cannot send past the credit we
    /// granted, and a pump stops at the cap (`capped`: the next receive
    /// pumps again, after the frames it holds are taken).
    fn pump(&self, rx: &mut Rx) -> std::result::Result<(), RecvError> {
        if self.stream_done.load(Ordering::Relaxed) {
            rx.capped = false;
            return Ok(());
        }
        rx.compact();
        rx.grant += self.regranted.swap(0, Ordering::Acquire);
        rx.grant_detached += self.regranted_detached.swap(0, Ordering::Acquire);
        rx.capped = match &self.tls {
            None => self.read_plain(rx)?,
            Some(session) => self.read_tls(rx, session)?,
        };
        rx.split()?;
        self.parse(rx)?;
        self.rx_ready.store(rx.ready(), Ordering::Release);
        Ok(())
    }

    /// Reads what the kernel holds into `rx` as it is; true if it stopped
    /// at `rx`'s cap. Splits after each read, so a large payload's header
    /// is seen before the rest of it is read: that goes into its own buffer.
    #[inline]
    fn read_plain(&self, rx: &mut Rx) -> std::result::Result<bool, RecvError> {
        loop {
            let Some(room) = rx.room() else { return Ok(true) };
            let asked = room.len();
            match (&self.sock).read(room) {
                Ok(n) => {
                    rx.filled(n);
                    self.last_heard.store(clock(), Ordering::Relaxed);
                    if n == 0 {
                        self.hang_up();
                        return Ok(false);
                    }
                    rx.split()?;
                    if n < asked {
                        return Ok(false);
                    }
                }
                Err(e) => match e.kind() {
                    std::io::ErrorKind::WouldBlock => return Ok(false),
                    std::io::ErrorKind::Interrupted => {}
                    _ => {
                        self.hang_up();
                        return Ok(false);
                    }
                },
            }
        }
    }

    /// Applies the credit frames `rx` split (`pump` split the rest).
    fn parse(&self, rx: &mut Rx) -> std::result::Result<(), RecvError> {
        let credit = std::mem::take(&mut rx.credit_in);
        if credit != (0, 0) {
            let mut tx = self.tx.lock();
            let frames = tx.credit.saturating_add(credit.0);
            let detached = tx.credit_detached.saturating_add(credit.1);
            if frames > self.granted.frames || detached > self.granted.detached {
                // Credit for bytes we never sent: believed, it would let us
                // queue without bound for a peer that reads nothing.
                return Err(RecvError::Corrupt(Violation::CreditPastGrant {
                    frames: frames as u64,
                    granted_frames: self.granted.frames as u64,
                    detached: detached as u64,
                    granted_detached: self.granted.detached as u64,
                }));
            }
            tx.credit = frames;
            tx.credit_detached = detached;
            drop(tx);
            // Dekker with a writer's want_space → fence → retry.
            fence(Ordering::SeqCst);
            if self.writer_waiting.swap(false, Ordering::AcqRel) {
                self.team.ring_now();
            }
        }
        Ok(())
    }

    /// Closes at once, dropping what waits to be written: the peer broke
    /// the protocol, nothing more is owed to it.
    fn abort(&self) {
        self.tx.lock().out.clear();
        self.close();
    }

    /// Writes out what is queued, waiting for the socket to take it at most
    /// `limit`. Closing does this first, so frames accepted for sending are
    /// not lost with the end: they fit in the credit the peer granted, and a
    /// live peer reads them (one that reads nothing for its timeout is gone).
    fn write_out(&self, limit: Duration) {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let until = Instant::now() + limit;
        loop {
            let mut tx = self.tx.lock();
            let waiting = self.flush(&mut tx);
            let left = until.saturating_duration_since(Instant::now());
            if !waiting || left.is_zero() {
                return;
            }
            drop(tx);
            let mut fds = [PollFd::new(&self.sock, PollFlags::OUT)];
            let _ = poll(&mut fds, Timespec::try_from(left).ok().as_ref());
        }
    }

    /// The stream ended or broke: the peer is gone, unless we closed first.
    fn hang_up(&self) {
        if !self.closed.load(Ordering::Acquire) {
            self.hung_up.store(true, Ordering::Release);
        }
        self.closed.store(true, Ordering::Release);
        self.stream_done.store(true, Ordering::Release);
    }
}

impl TcpEnd {
    /// Whether `len` bytes may be staged now.
    fn check_stage(&self, len: usize) -> Result<(), SendError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        if len > self.max_detached {
            return Err(SendError::TooLarge);
        }
        // Full while the receiver holds the credit (its large payloads).
        if self.tx.lock().credit_detached < len {
            self.pump_credit();
            if self.tx.lock().credit_detached < len {
                return Err(SendError::Full);
            }
        }
        Ok(())
    }
}

impl Transport for TcpEnd {
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn max_detached(&self) -> usize {
        self.max_detached
    }

    fn stage(&self, payload: &[u8]) -> Result<Staged, SendError> {
        self.check_stage(payload.len())?;
        Ok(Staged::Owned(payload.to_vec()))
    }

    fn stage_with(&self, len: usize, write: &mut crate::transport::Writer<'_>) -> Result<Staged, SendError> {
        // Written straight into the buffer the frame goes to the socket from.
        self.check_stage(len)?;
        crate::transport::stage_vec(len, write)
    }

    fn try_send_staged(&self, header: &Header, staged: &mut Option<Staged>) -> Result<(), SendError> {
        let Some(Staged::Owned(bytes)) = staged.take() else {
            panic!("a TCP end sends only what it staged");
        };
        let mut h = *header;
        h.flags |= flags::DETACHED;
        h.len = bytes.len() as u32;
        let mut owned = Some(bytes);
        let sent = self.send_frame(&h, &[], &mut owned);
        if let Some(bytes) = owned {
            *staged = Some(Staged::Owned(bytes));
        }
        sent
    }

    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError> {
        self.try_send_parts(header, &[], payload)
    }

    fn try_send_parts(&self, header: &Header, prefix: &[u8], rest: &[u8]) -> Result<(), SendError> {
        let len = prefix.len() + rest.len();
        if len > self.max_payload {
            return Err(SendError::TooLarge);
        }
        let mut h = *header;
        h.flags &= !flags::DETACHED;
        h.len = len as u32;
        self.send_frame(&h, &[prefix, rest], &mut None)
    }

    fn want_space(&self) {
        // The reader returns credit by itself once we run low: nothing to tell it.
        self.writer_waiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    fn wants_space(&self) -> bool {
        self.writer_waiting.load(Ordering::Acquire)
    }

    fn more_at_hand(&self) -> bool {
        self.rx_ready.load(Ordering::Acquire) || self.is_peer_gone()
    }

    fn has_frame(&self) -> bool {
        if self.rx_ready.load(Ordering::Acquire) {
            return true;
        }
        // No way to know without asking the kernel: a read (a system call
        // per probe while idle threads spin; a sleeping team is woken by
        // the socket instead).
        self.pump_credit();
        self.rx_ready.load(Ordering::Acquire)
    }

    fn flush_pending(&self) {
        if self.tx_pending.load(Ordering::Acquire) {
            self.flush(&mut self.tx.lock());
        }
    }

    fn needs_tidy(&self) -> bool {
        self.tx_pending.load(Ordering::Acquire) || self.returned.credit.load(Ordering::Relaxed) != 0
    }

    fn tidy(&self) {
        if !self.needs_tidy() {
            return;
        }
        let mut tx = self.tx.lock();
        // Large-payload credit goes back at once: a writer may wait for it.
        if self.returned.credit.load(Ordering::Acquire) != 0 {
            self.queue_credit(&mut tx);
        }
        self.flush(&mut tx);
    }

    fn try_recv(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        match self.try_recv_once(accept)? {
            // A probe that found `rx` locked may have taken the socket's
            // edge: read once more, or its data would wait for the next one.
            // (Once: a writer short of credit probes in a loop, and a
            // receive must end to give credit back.)
            Recv::Empty if self.rx_wanted.swap(false, Ordering::SeqCst) => self.try_recv_once(accept),
            r => Ok(r),
        }
    }

    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.heartbeat.as_fd())
    }

    /// A heartbeat tick (or a look): reads what came, then sends a
    /// heartbeat if we were quiet, or gives the peer up if it was.
    fn check_liveness(&self) -> Liveness {
        let _ = rustix::io::read(&self.heartbeat, &mut [0u8; 8]);
        let now = clock();
        // The read buffer gives back what it did not need lately: at most
        // once per COOL_AFTER (however short the ticks), and not while a
        // receive holds it. Before `pump_credit`, which then reads for a
        // probe that found the buffer locked meanwhile (`rx_wanted`).
        let cool_after = crate::transport::shm::area::COOL_AFTER.as_nanos() as u64;
        if now.saturating_sub(self.rx_cooled.load(Ordering::Relaxed)) >= cool_after {
            if let Some(mut rx) = self.rx.try_lock() {
                self.rx_cooled.store(now, Ordering::Relaxed);
                rx.cool();
            }
        }
        self.pump_credit();
        let tick = (self.peer_timeout / 4).as_nanos() as u64;
        if !self.closed.load(Ordering::Acquire) {
            let heard = self.last_heard.load(Ordering::Relaxed);
            if now.saturating_sub(heard) > self.peer_timeout.as_nanos() as u64 {
                tracing::warn!(timeout = ?self.peer_timeout, "TCP peer silent: giving it up");
                self.hang_up();
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
            } else if now.saturating_sub(self.last_sent.load(Ordering::Relaxed)) >= tick {
                // An empty credit frame: tells the peer we are here.
                let mut tx = self.tx.lock();
                tx.out.push_back(credit_frame(0, 0));
                self.flush(&mut tx);
            }
        }
        if self.hung_up.load(Ordering::Acquire) {
            Liveness::Gone
        } else if self.closed.load(Ordering::Acquire) {
            Liveness::Closed
        } else {
            Liveness::Alive
        }
    }

    fn is_peer_gone(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.write_out(self.peer_timeout);
        if let Some(session) = &self.tls {
            // TLS's own end of stream first (if the socket takes it).
            self.close_tls(session);
        }
        // Our end of the stream: the peer reads it after our last frame.
        let _ = self.sock.shutdown(std::net::Shutdown::Write);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Drop for TcpEnd {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Addr;

    /// A data frame of `len` payload bytes, flagged detached when large.
    fn frame(len: usize) -> Vec<u8> {
        let mut h = Header::new(Kind::Data, Addr::NONE, Addr::NONE, 0);
        h.len = len as u32;
        if len > READ {
            h.flags |= flags::DETACHED;
        }
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        let mut f = head.to_vec();
        f.resize(HEADER_LEN + len, 7);
        f
    }

    /// Reads `bytes` into `rx` as the socket would (all before the
    /// receiver looks: the buffer holds them all at once), and consumes
    /// every frame.
    fn receive(rx: &mut Rx, bytes: &[u8]) {
        rx.compact();
        let mut at = 0;
        while at < bytes.len() {
            at += rx.read(&bytes[at..]);
        }
        rx.split().unwrap();
        while let Some(h) = rx.front() {
            assert_eq!(rx.front_payload().len(), h.len as usize);
            let (f, d) = TcpEnd::cost(&h);
            rx.pop_front();
            rx.regrant(f, d);
        }
        rx.check();
    }

    /// Soak finding: the read buffer stayed as large as the most the
    /// connection ever buffered (several 1 MiB frames at once, now and
    /// then), for good. Now it shrinks back once a look finds it empty and
    /// no read since the look before needed that much.
    #[test]
    fn the_read_buffer_shrinks_back_after_a_spell_without_large_frames() {
        let mut rx = Rx::new(Grant { frames: 1 << 20, detached: 1 << 30 });
        // Three 1 MiB frames buffered at once.
        let big: Vec<u8> = (0..3).flat_map(|_| frame(1 << 20)).collect();
        receive(&mut rx, &big);
        assert!(rx.buf.len() >= 3 << 20);
        rx.cool();
        assert!(rx.buf.len() >= 3 << 20, "needed since the last look: kept");
        // Small frames only, then a look: back to KEEP.
        receive(&mut rx, &frame(100));
        rx.cool();
        assert_eq!(rx.buf.len(), KEEP);
        assert!(rx.buf.capacity() < 2 * KEEP, "{}", rx.buf.capacity());
        // It still reads whole frames, small and large.
        receive(&mut rx, &frame(100));
        receive(&mut rx, &frame(1 << 20));
        rx.cool();
        receive(&mut rx, &frame(5));
        rx.cool();
        assert_eq!(rx.buf.len(), KEEP);
    }

    /// A look while frames wait leaves them alone.
    #[test]
    fn the_read_buffer_is_not_shrunk_under_queued_frames() {
        let mut rx = Rx::new(Grant { frames: 1 << 20, detached: 1 << 30 });
        let big = frame(1 << 20);
        let mut at = 0;
        while at < big.len() {
            rx.compact();
            at += rx.read(&big[at..]);
        }
        rx.split().unwrap();
        rx.cool();
        rx.cool();
        let h = rx.front().expect("the frame is still queued");
        assert_eq!(h.len, 1 << 20);
        assert!(rx.front_payload().iter().all(|&b| b == 7));
        rx.pop_front();
        rx.check();
    }
}
