//! Shared-memory transport: a pair-wise channel between two teams of one node.
//!
//! The team that sends first (the *connector*) creates one memfd holding two
//! rings and two payload areas (see [`area`]), one of each per direction,
//! and hands it with its doorbell to the other team
//! (the *acceptor*) over the acceptor's Unix socket (SCM_RIGHTS); the acceptor
//! answers with its own doorbell ([`connect`], [`accept_hello`]: the shared-memory
//! flavor of the bind handshake of the transport contract). The socket then
//! stays open and carries nothing; each [`ShmEnd`] owns its side, and its
//! hang-up is how each end learns the other is gone (the end's
//! `liveness_fd`, which the team's reactor watches; closing an end shuts it
//! down, which tells the peer).
//!
//! Segment layout (`cap` = bytes per ring, a power of two; `area` = bytes
//! per payload area, a multiple of 4096):
//!
//! | offset | what |
//! |---|---|
//! | 0 | magic `FERRYSHM`, version u32, cap u32, area u64 |
//! | 128 | ring 0 head (connector → acceptor) |
//! | 256 | ring 0 writer-waiting flag |
//! | 384 | ring 1 head (acceptor → connector) |
//! | 512 | ring 1 writer-waiting flag |
//! | 4096 | ring 0 cells |
//! | 4096 + cap | ring 1 cells |
//! | 4096 + 2 cap | area 0 (written by the connector) |
//! | 4096 + 2 cap + area | area 1 (written by the acceptor) |
//!
//! The areas are sparse: only the pages a payload touched take memory.
//!
//! Each word has 128 bytes to itself: Intel cores fetch cache lines in
//! pairs, so 64 bytes apart would still share traffic.
//!
//! [`ShmEnd`] is generic over where the rings and doorbells live so that
//! the loom models (`loom_models`) run it on heap memory; production uses
//! the defaults, the mapped segment and doorbell pages.

pub mod area;
pub(crate) mod handover;
pub mod ring;

use super::cork;
use super::doorbell::{Bell, Doorbell, DoorbellMemory, DoorbellPage, Line};
use super::{Body, Detached, Liveness, Recv, RecvError, SendError, Staged, Transport};
use crate::error::{Error, HandshakeMessage, Result, Violation};
use crate::id::Addr;
use crate::id::TeamId;
use crate::sync::{fence, AtomicBool, AtomicU32Ops, AtomicU64, Mutex, Ordering};
use crate::sys::{fdpass, shm::Mapping};
use crate::wire::{flags, Header, Kind, HEADER_LEN};
use area::{Allocator, Cooler, Range, PAGE};
use ring::{Consumer, Producer, RingError, RingMem, RingMemory};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, AtomicU64 as SharedU64};
use std::sync::Arc;
use std::time::Duration;

const MAGIC: &[u8; 8] = b"FERRYSHM";
const VERSION: u32 = 3;
const HEADER_AREA: usize = 4096;
/// Magic of a connector's hello (the version is its last byte).
pub const HELLO: &[u8; 8] = b"FERRYHI4";
/// Magic of an acceptor's welcome.
pub const WELCOME: &[u8; 8] = b"FERRYOK4";
/// Bytes of a hello or welcome: magic, node u16, pad u16, team u32,
/// incarnation u32, ring bytes u32, area bytes u64.
const HELLO_LEN: usize = 32;
/// Largest payload area an acceptor maps (virtual: the area is sparse).
pub const MAX_AREA: u64 = 1 << 36;
/// How long either side of a bind waits for the other's message.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Smallest ring: room for a few maximum-size frames of a useful size.
pub const MIN_RING: usize = 4096;

/// Bytes of the segment of a channel with rings of `cap` bytes and payload
/// areas of `area` bytes (most of it sparse).
pub fn segment_len(cap: usize, area: u64) -> usize {
    HEADER_AREA + 2 * cap + 2 * area as usize
}

/// Whether rings of `cap` bytes and payload areas of `area` bytes make a
/// channel this side maps: a ring of a power of two of at least
/// [`MIN_RING`] bytes that a hello's 32 bits carry, an area of whole pages
/// up to [`MAX_AREA`].
pub fn layout_ok(cap: usize, area: u64) -> bool {
    cap.is_power_of_two()
        && cap >= MIN_RING
        && cap <= u32::MAX as usize
        && area.is_multiple_of(PAGE)
        && area <= MAX_AREA
}

/// The rounded size of a payload area that holds `max_message` bytes.
pub fn area_for(max_message: usize) -> u64 {
    (max_message as u64).div_ceil(PAGE) * PAGE
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Connector,
    Acceptor,
}

#[cfg(test)]
thread_local! {
    /// Receive-side calls this thread made through a consumer's lock.
    pub(crate) static CONSUMER_LOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The consumer as a receive holds it: locked, or reached unlocked (see
/// `Transport::try_recv_serialized`).
trait ConsumerRef<M: RingMemory>: std::ops::DerefMut<Target = Consumer<M>> {}

impl<M: RingMemory, C: std::ops::DerefMut<Target = Consumer<M>>> ConsumerRef<M> for C {}

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
    /// Wakes the peer: its state page (read-only) and this channel's line to it.
    peer_bell: Bell<B>,
    /// A corked send published a frame without waking the peer (see
    /// `transport::cork`): the next `flush_pending` or `tidy` does.
    ring_held: AtomicBool,
    /// This channel's line to our team, registered in its epoll set while
    /// the end lives (none for a model's heap rings).
    _line: Option<Line>,
    max_payload: usize,
    /// Sends fail, and a receive that finds the ring empty reports
    /// `PeerGone`: this end was closed, or the peer hung up (`hung_up`).
    closed: AtomicBool,
    /// The peer's end is gone: `check_liveness` saw its socket hang up.
    hung_up: AtomicBool,
    /// `PeerGone` was reported: final, even if a frame still comes.
    ended: AtomicBool,
    /// This end's side of the bind socket: kept for its hang-up, and
    /// carries descriptors handed over after the bind (`handover`); none
    /// for a model's heap rings.
    socket: Option<UnixStream>,
    /// Descriptors asked for and handed over after the bind.
    handovers: handover::Handovers,
    /// Where this end stages large payloads (none for a model's heap rings).
    tx_area: Option<TxArea>,
    /// Where the peer stages its large payloads for us.
    rx_area: Option<RxArea>,
    /// Asks the team's reactor to cool `tx_area` (none outside a team).
    cooler: Option<Arc<Cooler>>,
    /// Ranges of the peer's area we are done with, to send back.
    releases: Arc<Releases>,
    /// Keeps the rings mapped (none for a model's heap rings); declared
    /// last so it is unmapped after the rest.
    _segment: Option<Arc<Mapping>>,
}

/// The memory a channel's payload areas are in: the mapped segment (or, in
/// a fuzz harness, heap memory). Holding it keeps the areas' pointers valid.
pub(crate) trait AreaMemory: Send + Sync {
    /// The file the areas are in, to punch freed pages out of (none for heap memory).
    fn file(&self) -> Option<BorrowedFd<'_>>;
}

impl AreaMemory for Mapping {
    fn file(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd().as_fd())
    }
}

/// This end's payload area: it alone writes it, and keeps its book privately.
struct TxArea {
    base: *mut u8,
    /// Where the area starts in the memfd (to punch freed pages out).
    file_offset: u64,
    alloc: Arc<parking_lot::Mutex<Allocator>>,
    segment: Arc<dyn AreaMemory>,
}

/// The peer's payload area: read only by copy, at ranges it names.
struct RxArea {
    base: *const u8,
    size: u64,
    segment: Arc<dyn AreaMemory>,
}

// SAFETY: the areas' pointers point into `segment`, which their owner keeps
// mapped; the bytes there are only written by the staging copy (ranges this
// end owns exclusively until sent) and read by raw copies.
unsafe impl Send for TxArea {}
unsafe impl Sync for TxArea {}
unsafe impl Send for RxArea {}
unsafe impl Sync for RxArea {}

/// Ranges of the peer's area this end is done with, waiting to go back in
/// `Release` frames (sent at the next receive or tidy).
#[derive(Default)]
struct Releases {
    queue: parking_lot::Mutex<Vec<Range>>,
    pending: std::sync::atomic::AtomicBool,
    /// Our team's doorbell, once bound: it wakes the team to send them.
    team: Option<Arc<Doorbell>>,
}

/// A payload staged in this end's area, not sent yet: freed if dropped so.
#[derive(Debug)]
pub struct StagedRange {
    range: Range,
    alloc: Arc<parking_lot::Mutex<Allocator>>,
    sent: bool,
}

impl Drop for StagedRange {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.alloc.lock().release(self.range);
        }
    }
}

/// Writes a payload into a range of this end's area: raw copies, never
/// past its end.
pub struct RangeSink {
    ptr: *mut u8,
    len: usize,
    /// Bytes written so far.
    at: usize,
}

impl RangeSink {
    /// # Safety
    /// `ptr..ptr + len` must be writable memory that nothing else writes
    /// or reads through a reference while this sink lives (a staged range:
    /// ours alone until sent; the peer may write it too, which only spoils
    /// the message it is being sent).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RangeSink {
        RangeSink { ptr, len, at: 0 }
    }
}

impl crate::wire::codec::Sink for RangeSink {
    fn put(&mut self, bytes: &[u8]) -> crate::Result<()> {
        if bytes.len() > self.len - self.at {
            return Err(crate::Error::Codec(format!("the encoder wrote past the {} bytes it counted", self.len)));
        }
        // SAFETY: `at + bytes.len() <= len` (checked above), inside the
        // range `new` was given; only copied into.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(self.at), bytes.len()) };
        self.at += bytes.len();
        Ok(())
    }
}

/// A payload the peer lent us in its area. Read by copy only: the peer can
/// still write those bytes. Dropping it gives the range back.
pub struct Lent {
    ptr: *const u8,
    range: Range,
    releases: Arc<Releases>,
    armed: bool,
    /// Keeps the bytes mapped.
    _segment: Arc<dyn AreaMemory>,
}

// SAFETY: `ptr` points into `_segment`, kept mapped by this value, and is
// only ever read by raw copy.
unsafe impl Send for Lent {}
unsafe impl Sync for Lent {}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lent({:?})", self.range)
    }
}

impl Lent {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.range.len as usize
    }

    /// Whether the payload is empty.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.range.len == 0
    }

    /// Replaces `out`'s contents with the bytes, reusing its capacity.
    pub fn read_into(&self, out: &mut Vec<u8>) {
        let len = self.len();
        out.clear();
        out.reserve(len);
        // SAFETY: the range was checked to lie inside the peer's area, which
        // `_segment` keeps mapped; `out` has room for `len` bytes. The peer
        // may change the bytes meanwhile, so they are only copied (no
        // reference into shared memory is ever made).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), len);
            out.set_len(len);
        }
    }
}

/// The bytes of a [`Lent`] as a decoder's [`Source`](crate::wire::codec::Source):
/// read only by raw copies (the peer can still write them).
pub struct LentSource<'a> {
    lent: &'a Lent,
    at: usize,
}

impl crate::wire::codec::Source for LentSource<'_> {
    fn remaining(&self) -> usize {
        self.lent.len() - self.at
    }

    fn read(&mut self, out: &mut [u8]) {
        // A decoder asks for no more than `remaining` (clamped all the same:
        // past the range is no memory of ours).
        let n = out.len().min(self.remaining());
        // SAFETY: `at + n <= len`: inside the checked range, which the
        // `Lent` keeps mapped; only copied.
        unsafe { std::ptr::copy_nonoverlapping(self.lent.ptr.add(self.at), out.as_mut_ptr(), n) };
        out[n..].fill(0);
        self.at += n;
    }

    fn append_to(&mut self, n: usize, out: &mut Vec<u8>) {
        let n = n.min(self.remaining());
        out.reserve(n);
        // SAFETY: as in `read`; `out` has room for `n` more bytes, which the
        // copy initializes before `set_len` counts them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.lent.ptr.add(self.at), out.as_mut_ptr().add(out.len()), n);
            out.set_len(out.len() + n);
        }
        self.at += n;
    }
}

impl Lent {
    /// The bytes as a decoder's source, read by copy.
    pub fn source(&self) -> LentSource<'_> {
        LentSource { lent: self, at: 0 }
    }

    /// Copies the first bytes into `out` (as many as fit); returns how many.
    pub fn read_head(&self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len());
        // SAFETY: as in `read_into`: the first `n` bytes of the checked range,
        // only copied.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), n) };
        n
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.armed {
            self.releases.queue.lock().push(self.range);
            // The first one waiting: a team all asleep wakes to send it
            // (the peer's memory waits for it); a polling thread sends it
            // in its turn.
            if !self.releases.pending.swap(true, Ordering::AcqRel) {
                if let Some(team) = &self.releases.team {
                    team.ring();
                }
            }
        }
    }
}

impl ShmEnd {
    /// An end on `segment`; it stages at most `tx_limit` bytes at once in
    /// the area it writes (however large the connector made it).
    fn new(
        segment: Mapping,
        (cap, area, tx_limit): (usize, u64, u64),
        side: Side,
        wake: (Bell, Line),
        socket: UnixStream,
    ) -> ShmEnd {
        let segment = Arc::new(segment);
        let base = segment.as_ptr();
        // SAFETY: the segment is segment_len(cap, area) bytes (checked at map time),
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
        let area0 = (HEADER_AREA + 2 * cap) as u64;
        let (tx_at, rx_at) = match side {
            Side::Connector => (area0, area0 + area),
            Side::Acceptor => (area0 + area, area0),
        };
        let (peer_bell, line) = wake;
        let mut end = ShmEnd::from_parts(tx, rx, peer_bell, Some(segment.clone()));
        end.socket = Some(socket);
        end._line = Some(line);
        // SAFETY: both areas lie inside the segment (segment_len(cap, area)
        // bytes, checked at map time).
        let (tx_base, rx_base) = unsafe { (base.add(tx_at as usize), base.add(rx_at as usize)) };
        // SAFETY: as above; the segment stays mapped while the end (or a
        // `Lent` of it) holds it.
        unsafe { end.set_areas(segment, (tx_base, tx_at), rx_base, area, tx_limit) };
        end
    }
}

impl<M: RingMemory, B: DoorbellMemory> ShmEnd<M, B> {
    /// Records the peer's hang-up (see `check_liveness`).
    fn hang_up(&self) -> Liveness {
        self.hung_up.store(true, Ordering::Release);
        self.closed.store(true, Ordering::Release);
        // The owner wakes whoever must learn it, once it did what comes
        // first (the runtime sweeps the dead team's files).
        Liveness::Gone
    }

    /// An end writing `tx`, reading `rx`, ringing the peer's bell.
    pub(crate) fn from_parts(tx: M, rx: M, peer_bell: Bell<B>, segment: Option<Arc<Mapping>>) -> ShmEnd<M, B> {
        ShmEnd {
            producer: Mutex::new(Producer::new(tx.clone())),
            consumer: Mutex::new(Consumer::new(rx.clone())),
            max_payload: RingMem::max_body(tx.cap()) - HEADER_LEN,
            tx_mem: tx,
            rx_mem: rx,
            rx_next: AtomicU64::new(0),
            rx_unreleased: AtomicBool::new(false),
            peer_bell,
            ring_held: AtomicBool::new(false),
            _line: None,
            closed: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            socket: None,
            handovers: Default::default(),
            tx_area: None,
            rx_area: None,
            cooler: None,
            releases: Arc::default(),
            _segment: segment,
        }
    }

    /// Gives this end its payload area (`area` bytes at `tx.0`, at offset
    /// `tx.1` of `memory`'s file, of which it lends at most `tx_limit`) and
    /// the peer's (`area` bytes at `rx`).
    ///
    /// # Safety
    /// Both areas lie inside `memory`, whose bytes stay where they are while
    /// it is held; only this end writes its own area.
    pub(crate) unsafe fn set_areas(
        &mut self,
        memory: Arc<dyn AreaMemory>,
        tx: (*mut u8, u64),
        rx: *const u8,
        area: u64,
        tx_limit: u64,
    ) {
        self.tx_area = Some(TxArea {
            base: tx.0,
            file_offset: tx.1,
            // Lends at most `tx_limit` of it (what the peer accepts).
            alloc: Arc::new(parking_lot::Mutex::new(Allocator::new(area.min(tx_limit)))),
            segment: memory.clone(),
        });
        self.rx_area = Some(RxArea { base: rx, size: area, segment: memory });
    }

    /// The same end, reading its ring from `pos` (absolute bytes, cell
    /// aligned) on, as if that much had passed (the ring's `head` must say
    /// so too).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn reading_from(self, pos: u64) -> Self {
        *self.consumer.lock() = Consumer::starting_at(self.rx_mem.clone(), pos);
        self.rx_next.store(pos, Ordering::Relaxed);
        self
    }

    /// Writes one frame (its payload at most `max_payload`), as is.
    #[inline]
    fn push_frame<const K: usize>(&self, mut h: Header, payload: [&[u8]; K]) -> Result<(), SendError> {
        let len = payload.iter().map(|p| p.len()).sum::<usize>();
        if len > self.max_payload {
            return Err(SendError::TooLarge);
        }
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        h.len = len as u32;
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        match self.producer.lock().push(&head, payload) {
            // The writer-waiting word is left alone: another writer may be waiting.
            Ok(()) => {}
            Err(RingError::Full) => {
                // Room comes only once the peer drains: it must know of the
                // frames held back (a corked sender may retry in a loop).
                self.ring_held_back();
                return Err(SendError::Full);
            }
            Err(RingError::Corrupt(fault)) => {
                tracing::warn!(%fault, "shared-memory channel corrupted by peer; closing it");
                self.close();
                return Err(SendError::Closed);
            }
        }
        if cork::batched() {
            // One wake-up check (a full fence and a read of the peer's
            // state page) for the batch, when it ends. (Not for a
            // processor's burst: see `transport::cork`.)
            // Release: a thread that rings for it (`tidy`) orders the frame
            // before its wake-up check as if it had published it.
            self.ring_held.store(true, Ordering::Release);
            cork::held_back();
        } else {
            self.peer_bell.ring();
        }
        Ok(())
    }

    /// Wakes the peer for frames corked sends published, if any.
    #[inline]
    fn ring_held_back(&self) {
        if self.ring_held.load(Ordering::Relaxed) && self.ring_held.swap(false, Ordering::AcqRel) {
            self.peer_bell.ring();
        }
    }

    /// Sends the ranges of the peer's area we are done with back to it, as
    /// far as the ring takes them; then wakes the peer if it waits for room.
    #[inline]
    fn flush_releases(&self) {
        if self.releases.pending.load(Ordering::Acquire) {
            self.flush_releases_now();
        }
    }

    #[inline(never)]
    fn flush_releases_now(&self) {
        let mut queue = self.releases.queue.lock();
        if self.closed.load(Ordering::Relaxed) {
            // Nobody will take them back: the peer is gone or we hung up on it.
            queue.clear();
            self.releases.pending.store(false, Ordering::Release);
            return;
        }
        let mut sent = 0;
        {
            let mut producer = self.producer.lock();
            let h = Header::new(Kind::Release, Addr::NONE, Addr::NONE, 0);
            for r in queue.iter() {
                let mut head = [0u8; HEADER_LEN];
                let mut h = h;
                h.len = area::DESCRIPTOR_LEN as u32;
                h.encode(&mut head);
                if producer.push(&head, [&r.encode()]).is_err() {
                    // Full: be woken when the peer makes room (Corrupt: the next send closes).
                    self.want_space();
                    break;
                }
                sent += 1;
            }
        }
        queue.drain(..sent);
        self.releases.pending.store(!queue.is_empty(), Ordering::Release);
        drop(queue);
        if sent > 0 {
            self.peer_bell.ring();
            // The peer may be waiting for these ranges (it asked with `want_space`).
            self.wake_waiting_writer();
        }
    }

    /// A receive's first steps: whether the peer had closed, read before
    /// the ring (a peer that wrote a last frame and then hung up must not
    /// be seen as drained before and gone after); the consumer, as
    /// `reach` gives it (locked, or reached unlocked by a caller that
    /// serializes the receives); and whether the record consumed last was
    /// released now (the caller then looks for a writer waiting for room).
    /// `None` once the stream has ended.
    #[inline(always)]
    fn begin_recv<C: ConsumerRef<M>>(&self, reach: impl FnOnce() -> C) -> Option<(bool, C, bool)> {
        let closed = self.closed.load(Ordering::Acquire);
        if closed && self.ended.load(Ordering::Relaxed) {
            return None;
        }
        self.flush_releases();
        let mut consumer = reach();
        let released = consumer.release();
        Some((closed, consumer, released))
    }

    /// What a receive found, as the transport says it (the consumer
    /// unlocked, a protocol breach closing the end).
    #[inline(always)]
    fn received(
        &self,
        consumer: impl ConsumerRef<M>,
        got: Result<Option<bool>, RingError>,
        closed: bool,
        bad: Option<RecvError>,
    ) -> Result<Recv, RecvError> {
        self.rx_next.store(consumer.next(), Ordering::Relaxed);
        self.rx_unreleased.store(consumer.has_unreleased(), Ordering::Relaxed);
        drop(consumer);
        if let Some(e) = bad {
            self.close();
            return Err(e);
        }
        match got {
            Ok(None) if closed => {
                self.ended.store(true, Ordering::Relaxed);
                Ok(Recv::PeerGone)
            }
            Ok(None) => Ok(Recv::Empty),
            Ok(Some(false)) => Ok(Recv::Kept),
            Ok(Some(true)) => Ok(Recv::Consumed),
            Err(RingError::Corrupt(fault)) => {
                self.close();
                Err(RecvError::Corrupt(Violation::Ring(fault)))
            }
            Err(RingError::Full) => unreachable!("the consumer never reports Full"),
        }
    }

    /// The consumer, locked: for the safe receive-side calls (the runtime
    /// makes the `_serialized` ones).
    #[inline(always)]
    fn locked_consumer(&self) -> crate::sync::MutexGuard<'_, Consumer<M>> {
        #[cfg(test)]
        CONSUMER_LOCKS.set(CONSUMER_LOCKS.get() + 1);
        self.consumer.lock()
    }

    /// The consumer, reached without its lock: for the `_serialized`
    /// receive-side calls.
    ///
    /// # Safety
    /// No other receive-side call runs meanwhile (their contract); only
    /// those reach the consumer.
    #[inline(always)]
    unsafe fn serialized_consumer(&self) -> crate::sync::Unlocked<'_, Consumer<M>> {
        // SAFETY: this function's contract.
        unsafe { crate::sync::unlocked(&self.consumer) }
    }

    /// `tidy` with the consumer as `reach` gives it.
    #[inline(always)]
    fn tidy_with<C: ConsumerRef<M>>(&self, reach: impl FnOnce() -> C) {
        let mut consumer = reach();
        let released = consumer.release();
        drop(consumer);
        if released {
            self.rx_unreleased.store(false, Ordering::Relaxed);
            self.wake_waiting_writer();
        }
        self.flush_releases();
        self.ring_held_back();
    }

    /// `try_recv` with the consumer as `reach` gives it.
    #[inline(always)]
    fn recv_one<C: ConsumerRef<M>>(
        &self,
        reach: impl FnOnce() -> C,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<Recv, RecvError> {
        let Some((closed, mut consumer, released)) = self.begin_recv(reach) else { return Ok(Recv::PeerGone) };
        if released {
            self.wake_waiting_writer();
        }
        let mut bad: Option<RecvError> = None;
        let got = consumer.pop(&mut |body| self.offer_record(body, accept, &mut bad));
        self.received(consumer, got, closed, bad)
    }

    /// `try_recv_many` with the consumer as `reach` gives it: the records
    /// one after the other, and one look for a writer waiting for room (a
    /// full fence) after the last.
    #[inline(always)]
    fn recv_many<C: ConsumerRef<M>>(
        &self,
        reach: impl FnOnce() -> C,
        max: usize,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<(usize, Recv), RecvError> {
        let Some((closed, mut consumer, mut released)) = self.begin_recv(reach) else { return Ok((0, Recv::PeerGone)) };
        let mut bad: Option<RecvError> = None;
        let mut taken = 0;
        let got = loop {
            let got = consumer.pop(&mut |body| self.offer_record(body, accept, &mut bad));
            if matches!(got, Ok(Some(true))) {
                taken += 1;
                // Another pop only if a record waits: it releases this one
                // first, which the last of a burst leaves for the next
                // receive (off the path from a request to its reply).
                if taken < max && consumer.has_next() {
                    released = true;
                    continue;
                }
            }
            break got;
        };
        let last = self.received(consumer, got, closed, bad);
        if released {
            self.wake_waiting_writer();
        }
        Ok((taken, last?))
    }

    /// Offers the record `body` (copied out of the ring) to `accept` as a
    /// frame; a release of payload ranges is taken here. Whether it was
    /// taken; a record that breaks the protocol is refused and `bad` says why.
    #[inline(always)]
    fn offer_record(
        &self,
        body: &[u8],
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
        bad: &mut Option<RecvError>,
    ) -> bool {
        let h = match Header::decode(body) {
            Ok(h) => h,
            Err(e) => {
                *bad = Some(e.into());
                return false;
            }
        };
        let payload = &body[HEADER_LEN..];
        if h.kind == Kind::Release {
            return match self.take_back(payload) {
                Ok(()) => true,
                Err(violation) => {
                    *bad = Some(RecvError::Corrupt(violation));
                    false
                }
            };
        }
        if !h.detached() {
            return accept(&h, Body::Inline(payload));
        }
        let lent = self.rx_area.as_ref().and_then(|area| {
            let range = Range::decode(payload, area.size)?;
            Some(Lent {
                // SAFETY: `decode` checked the range lies inside the area.
                ptr: unsafe { area.base.add(range.offset as usize) },
                range,
                releases: self.releases.clone(),
                armed: true,
                _segment: area.segment.clone(),
            })
        });
        let Some(lent) = lent else {
            *bad = Some(RecvError::Corrupt(outside_area(payload)));
            return false;
        };
        let mut slot = Some(Detached::Shm(Box::new(lent)));
        let taken = accept(&h, Body::Detached(&mut slot));
        if let Some(Detached::Shm(mut refused)) = slot {
            // Still ours: the frame stays, and the range is not given back.
            refused.armed = false;
        }
        taken
    }

    /// The peer gave a range of our area back.
    fn take_back(&self, payload: &[u8]) -> std::result::Result<(), Violation> {
        let Some(area) = &self.tx_area else { return Err(not_lent(payload)) };
        let mut alloc = area.alloc.lock();
        let r = Range::decode(payload, alloc.size()).ok_or_else(|| not_lent(payload))?;
        alloc.release(r).map_err(|e| Violation::ReleaseNotLent { offset: e.0.offset, len: e.0.len })?;
        if alloc.is_warm_above() {
            drop(alloc);
            // Pages above the warm part: the reactor comes to give back
            // those that stay unused (a load, once it is coming).
            if let Some(c) = &self.cooler {
                c.arm();
            }
        }
        Ok(())
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
        // the writer counted itself as sleeping before it asked, so our
        // ring counts it among the sleepers to wake.
        if waiting.load(Ordering::Relaxed) != 0 && waiting.swap(0, Ordering::AcqRel) != 0 {
            self.peer_bell.ring_now();
        }
    }
}

impl ShmEnd {
    /// Joins the team `cfg` binds for: its reactor cools the area this end
    /// writes, and its doorbell wakes it to give back what it took from
    /// the peer's area.
    fn join_team(&mut self, cfg: &BindConfig) {
        self.cooler = cfg.cooler.clone();
        self.wakes(cfg.doorbell.clone());
    }

    /// `team`'s doorbell wakes it to give back what this end took from the
    /// peer's area (no message lent yet: nothing else holds `releases`).
    fn wakes(&mut self, team: Arc<Doorbell>) {
        self.releases = Arc::new(Releases { team: Some(team), ..Releases::default() });
    }

    /// What the bind handshake gave this end to wake its peer: the peer's
    /// doorbell state page and this channel's two lines (what a test posing as
    /// a misbehaving peer tries to abuse).
    #[cfg(any(test, feature = "testing"))]
    pub fn peer_wake_fds(&self) -> [&rustix::fd::OwnedFd; 3] {
        self.peer_bell.fds()
    }
}

impl<M: RingMemory, B: DoorbellMemory> Transport for ShmEnd<M, B> {
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn peer_activity(&self) -> Option<super::doorbell::Activity> {
        Some(self.peer_bell.activity())
    }

    fn max_detached(&self) -> usize {
        self.tx_area.as_ref().map_or(0, |a| a.alloc.lock().size() as usize)
    }

    fn stage(&self, payload: &[u8]) -> Result<Staged, SendError> {
        self.stage_with(payload.len(), &mut |sink| sink.put(payload))
    }

    fn stage_with(&self, len: usize, write: &mut crate::transport::Writer<'_>) -> Result<Staged, SendError> {
        let Some(area) = &self.tx_area else { return Err(SendError::TooLarge) };
        if self.closed.load(Ordering::Relaxed) {
            return Err(SendError::Closed);
        }
        let range = {
            let mut alloc = area.alloc.lock();
            if len as u64 > alloc.size() {
                return Err(SendError::TooLarge);
            }
            alloc.lend(len as u64).ok_or(SendError::Full)?
        };
        // Freed again if the writer fails (dropped unsent).
        let staged = StagedRange { range, alloc: area.alloc.clone(), sent: false };
        // SAFETY (for `RangeSink`): the range lies inside our area (the
        // allocator hands out only ranges of it), which `segment` keeps
        // mapped, and is ours alone until sent.
        let mut sink = unsafe { RangeSink::new(area.base.add(range.offset as usize), len) };
        write(&mut sink).map_err(SendError::unwritten)?;
        crate::transport::check_written(len, sink.at)?;
        Ok(Staged::Shm(staged))
    }

    fn try_send_staged(&self, header: &Header, staged: &mut Option<Staged>) -> Result<(), SendError> {
        let Some(Staged::Shm(range)) = staged.as_mut() else {
            panic!("a payload staged by another transport");
        };
        let mut h = *header;
        h.flags |= flags::DETACHED;
        self.push_frame(h, [&range.range.encode()])?;
        range.sent = true;
        *staged = None;
        Ok(())
    }

    #[inline]
    fn try_send(&self, header: &Header, payload: &[u8]) -> Result<(), SendError> {
        let mut h = *header;
        // Only `try_send_staged` says a payload is a descriptor.
        h.flags &= !flags::DETACHED;
        self.push_frame(h, [payload])
    }

    #[inline]
    fn try_send_parts(&self, header: &Header, prefix: &[u8], rest: &[u8]) -> Result<(), SendError> {
        let mut h = *header;
        h.flags &= !flags::DETACHED;
        self.push_frame(h, [prefix, rest])
    }
    fn want_space(&self) {
        // SeqCst (so Release): the reader's swap that takes it then sees
        // us counted as sleeping (done before) when it rings.
        self.tx_mem.writer_waiting().store(1, Ordering::SeqCst);
        // Dekker with the consumer's head store → fence → flag load.
        fence(Ordering::SeqCst);
    }

    #[inline]
    fn wants_space(&self) -> bool {
        self.tx_mem.writer_waiting().load(Ordering::Acquire) != 0
    }

    #[inline]
    fn has_frame(&self) -> bool {
        Consumer::probe(&self.rx_mem, self.rx_next.load(Ordering::Relaxed))
    }

    #[inline]
    fn needs_tidy(&self) -> bool {
        self.rx_unreleased.load(Ordering::Relaxed)
            || self.releases.pending.load(Ordering::Relaxed)
            || self.ring_held.load(Ordering::Relaxed)
    }

    fn flush_pending(&self) {
        self.ring_held_back();
    }

    fn tidy(&self) {
        self.tidy_with(|| self.locked_consumer());
    }

    unsafe fn tidy_serialized(&self) {
        // SAFETY: this function's contract is `serialized_consumer`'s.
        self.tidy_with(|| unsafe { self.serialized_consumer() });
    }

    fn cool(&self, now: std::time::Instant) -> bool {
        let Some(area) = &self.tx_area else { return false };
        let mut alloc = area.alloc.lock();
        if let (Some(r), Some(file)) = (alloc.cool(now), area.segment.file()) {
            // Free pages nothing needed lately go back to the kernel (for
            // the peer's mapping too), best effort. Under the book's lock:
            // a range lent meanwhile could reach them.
            let _ = rustix::fs::fallocate(
                file,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                area.file_offset + r.offset,
                r.len,
            );
        }
        alloc.is_warm_above()
    }

    #[inline]
    fn try_recv(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        self.recv_one(|| self.locked_consumer(), accept)
    }

    fn try_recv_many(
        &self,
        max: usize,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<(usize, Recv), RecvError> {
        self.recv_many(|| self.locked_consumer(), max, accept)
    }

    #[inline]
    unsafe fn try_recv_serialized(&self, accept: &mut dyn FnMut(&Header, Body<'_>) -> bool) -> Result<Recv, RecvError> {
        // SAFETY: this function's contract is `serialized_consumer`'s.
        self.recv_one(|| unsafe { self.serialized_consumer() }, accept)
    }

    unsafe fn try_recv_many_serialized(
        &self,
        max: usize,
        accept: &mut dyn FnMut(&Header, Body<'_>) -> bool,
    ) -> Result<(usize, Recv), RecvError> {
        // SAFETY: this function's contract is `serialized_consumer`'s.
        self.recv_many(|| unsafe { self.serialized_consumer() }, max, accept)
    }

    fn liveness_fd(&self) -> Option<BorrowedFd<'_>> {
        self.socket.as_ref().map(|s| s.as_fd())
    }

    fn ask_handover(&self, tag: u64) -> crate::Result<()> {
        match &self.socket {
            Some(_) => self.handovers.ask(tag),
            None => Err(super::no_handover()),
        }
    }

    fn unask_handover(&self, tag: u64) {
        self.handovers.unask(tag);
    }

    fn hand_over(&self, tag: u64, fds: &[BorrowedFd<'_>]) -> crate::Result<()> {
        let Some(sock) = &self.socket else {
            return Err(super::no_handover());
        };
        if fds.is_empty() || fds.len() > fdpass::MAX_FDS {
            return Err(crate::Error::InvalidArgument(format!(
                "a handover carries 1 to {} descriptors, not {}",
                fdpass::MAX_FDS,
                fds.len()
            )));
        }
        fdpass::send(sock.as_fd(), &tag.to_le_bytes(), fds)
    }

    fn take_handover(&self, tag: u64) -> Result<Vec<rustix::fd::OwnedFd>, Violation> {
        match &self.socket {
            Some(sock) => self.handovers.take(tag, sock),
            None => Err(Violation::UnaskedHandover { tag }),
        }
    }

    /// The bind socket carries only handovers we asked for after the
    /// handshake: readable otherwise means the peer hung up (or, if a byte
    /// came, broke the protocol: closed).
    fn check_liveness(&self) -> Liveness {
        if self.closed.load(Ordering::Acquire) {
            return if self.hung_up.load(Ordering::Acquire) { Liveness::Gone } else { Liveness::Closed };
        }
        let Some(sock) = &self.socket else { return Liveness::Alive };
        if let Err(v) = self.handovers.receive(sock) {
            tracing::warn!(violation = %v, "peer handed over descriptors unasked; closing the channel");
            self.close();
            return Liveness::Closed;
        }
        if self.handovers.any_asked() {
            // What is left is a handover not sent whole yet, or the hang-up.
            let mut b = [0u8; 1];
            return match rustix::net::recv(
                sock.as_fd(),
                &mut b,
                rustix::net::RecvFlags::DONTWAIT | rustix::net::RecvFlags::PEEK,
            ) {
                Ok((0, _)) => self.hang_up(),
                _ => Liveness::Alive,
            };
        }
        let mut b = [0u8; 1];
        match rustix::net::recv(sock.as_fd(), &mut b, rustix::net::RecvFlags::DONTWAIT) {
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Liveness::Alive,
            Ok((1, _)) => {
                tracing::warn!("peer wrote on its bind socket; closing the channel");
                self.close();
                Liveness::Closed
            }
            _ => self.hang_up(),
        }
    }

    #[inline]
    fn is_peer_gone(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(s) = &self.socket {
            // Tells the peer (its end sees the hang-up), also while this end
            // is still referenced (by messages that name its channel).
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// Settings both sides of a bind need.
#[derive(Clone)]
pub struct BindConfig {
    /// This team (its hello or welcome names it).
    pub me: TeamId,
    /// This team's doorbell: its state page and a new line go to the peer.
    pub doorbell: Arc<Doorbell>,
    /// Ring size the connector asks for.
    pub ring_bytes: usize,
    /// Largest ring an acceptor agrees to map.
    pub max_ring_bytes: usize,
    /// Bytes of each payload area the connector makes (see [`area_for`]);
    /// an acceptor stages at most this much at once in the area it writes,
    /// however large the connector made it.
    pub area_bytes: u64,
    /// How long the connector waits for the welcome ([`HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// The team's reactor's, which cools the payload area this end writes
    /// (see [`area`]); without one the area keeps what it touched.
    pub cooler: Option<Arc<Cooler>>,
    /// The connector's team lock file, sent with the hello: it proves the
    /// team's identity whatever PID namespace the acceptor is in (without
    /// it, the acceptor checks the connector's pid).
    pub lease: Option<Arc<std::fs::File>>,
}

pub(crate) fn hello_bytes(magic: &[u8; 8], me: TeamId, cap: u32, area: u64) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&me.node.to_le_bytes());
    b[12..16].copy_from_slice(&me.team.to_le_bytes());
    b[16..20].copy_from_slice(&me.incarnation.to_le_bytes());
    b[20..24].copy_from_slice(&cap.to_le_bytes());
    b[24..32].copy_from_slice(&area.to_le_bytes());
    b
}

fn parse_hello(b: &[u8], magic: &[u8; 8]) -> Option<(TeamId, u32, u64)> {
    if b.len() != HELLO_LEN || &b[..8] != magic {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let node = u16::from_le_bytes([b[8], b[9]]);
    let (team, incarnation, cap) = (word(12), word(16), word(20));
    let area = u64::from_le_bytes(b[24..32].try_into().unwrap());
    if incarnation == 0 {
        return None;
    }
    Some((TeamId { node, team, incarnation }, cap, area))
}

/// The acceptor's check of a hello (a peer's bytes) before it looks at the
/// descriptors: its magic and layout, a ring of a power of two of at least
/// [`MIN_RING`] bytes, an area of whole pages up to [`MAX_AREA`] (else
/// `Protocol`), a ring of at most `max_ring` bytes (else `LimitReached`). `node` is this team's (the claimed
/// identity is checked against the process after this). Returns the
/// connector, the ring's and the area's bytes.
pub(crate) fn check_hello(b: &[u8], node: u16, max_ring: usize) -> Result<(TeamId, usize, u64)> {
    let Some((peer, cap, area)) = parse_hello(b, HELLO) else {
        let peer = TeamId { node, team: 0, incarnation: 0 };
        return Err(refused(peer, Violation::MalformedHandshake { message: HandshakeMessage::Hello, len: b.len() }));
    };
    let cap = cap as usize;
    if cap.is_power_of_two() && cap > max_ring {
        return Err(Error::LimitReached { limit: crate::Limit::RingBytes, max: max_ring as u64 });
    }
    if !cap.is_power_of_two() || cap < MIN_RING {
        return Err(refused(peer, Violation::RingSize(cap as u64)));
    }
    if !area.is_multiple_of(PAGE) || area > MAX_AREA {
        return Err(refused(peer, Violation::AreaSize(area)));
    }
    Ok((peer, cap, area))
}

/// The connector's check of a welcome (a peer's bytes): a refusal
/// (`LimitReached`), its magic and layout (else `Protocol`), and that it
/// names the team and incarnation `expect` (else `NoSuchTeam`).
pub(crate) fn check_welcome(b: &[u8], expect: TeamId) -> Result<()> {
    if b.len() == 20 && &b[..8] == REFUSED {
        // The acceptor's refusal: one of its limits.
        return Err(crate::Limit::refused(&b[8..20]).unwrap_or_else(|| {
            refused(expect, Violation::MalformedHandshake { message: HandshakeMessage::Refusal, len: b.len() })
        }));
    }
    let Some((peer, _, _)) = parse_hello(b, WELCOME) else {
        return Err(refused(
            expect,
            Violation::MalformedHandshake { message: HandshakeMessage::Welcome, len: b.len() },
        ));
    };
    if peer != expect {
        // The socket at `expect`'s path belongs to someone else: `expect` is not there.
        return Err(Error::NoSuchTeam(expect));
    }
    Ok(())
}

/// Bytes of a segment's header: magic, version u32, cap u32, area u64.
pub(crate) const SEGMENT_HEADER: usize = 24;

/// The header of a segment with rings of `cap` and areas of `area` bytes
/// (integers in the machine's order: both sides are on this machine).
pub(crate) fn segment_header(cap: usize, area: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_ne_bytes());
    h[12..16].copy_from_slice(&(cap as u32).to_ne_bytes());
    h[16..24].copy_from_slice(&area.to_ne_bytes());
    h
}

/// Whether a segment's header (the connector's bytes) is this version's,
/// for rings of `cap` and areas of `area` bytes.
pub(crate) fn segment_header_ok(h: &[u8; SEGMENT_HEADER], cap: usize, area: u64) -> bool {
    let word = |i: usize| u32::from_ne_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let seg_area = u64::from_ne_bytes(h[16..24].try_into().expect("8 bytes"));
    &h[..8] == MAGIC && word(8) == VERSION && word(12) as usize == cap && seg_area == area
}

/// The process on the other end broke the bind protocol.
fn refused(peer: TeamId, violation: Violation) -> Error {
    Error::Protocol { peer, violation }
}

/// What a range (descriptor `b`, a peer's bytes) that does not decode inside the area is.
fn outside_area(b: &[u8]) -> Violation {
    match <[u8; 16]>::try_from(b) {
        Ok(b) => Violation::DescriptorOutsideArea {
            offset: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
        },
        Err(_) => Violation::DescriptorLength(b.len()),
    }
}

/// A release (descriptor `b`) of a range this side never lent.
fn not_lent(b: &[u8]) -> Violation {
    match outside_area(b) {
        Violation::DescriptorOutsideArea { offset, len } => Violation::ReleaseNotLent { offset, len },
        other => other,
    }
}

/// A peer's doorbell descriptors that `Bell::open` refused (why is logged).
fn bad_doorbell(peer: TeamId) -> impl FnOnce(Error) -> Error {
    move |e| {
        tracing::debug!(%peer, error = %e, "refused a peer's doorbell");
        refused(peer, Violation::BadDoorbell)
    }
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

/// Connector side of the bind: creates the channel and hands it to the team
/// `expect` listening on `stream`, waiting for its welcome at most
/// `cfg.handshake_timeout`. The end keeps `stream` (for its hang-up).
pub fn connect(stream: UnixStream, cfg: &BindConfig, expect: TeamId) -> Result<ShmEnd> {
    connect_with(stream, cfg, expect, HELLO)
}

/// [`connect`] with the hello's magic given (a test poses as a peer of
/// another protocol or version).
pub(crate) fn connect_with(stream: UnixStream, cfg: &BindConfig, expect: TeamId, magic: &[u8; 8]) -> Result<ShmEnd> {
    let (cap, area) = (cfg.ring_bytes, cfg.area_bytes);
    if !layout_ok(cap, area) {
        // `TeamBuilder::start` checked the settings these come from.
        return Err(Error::InvalidArgument(format!("a {cap}-byte ring and a {area}-byte payload area")));
    }
    let segment = create_segment(cap, area)?;
    stream.set_read_timeout(Some(cfg.handshake_timeout)).map_err(Error::io("socket timeout"))?;
    let hello = hello_bytes(magic, cfg.me, cap as u32, area);
    let line = cfg.doorbell.new_line()?;
    let (one, all) = line.fds();
    let mut fds = vec![segment.fd().as_fd(), cfg.doorbell.page_fd().as_fd(), one.as_fd(), all.as_fd()];
    fds.extend(cfg.lease.as_ref().map(|l| l.as_fd()));
    fdpass::send(stream.as_fd(), &hello, &fds).map_err(acceptor_failed(expect))?;
    let mut buf = [0u8; 64];
    let (n, fds) = fdpass::recv(&stream, &mut buf).map_err(acceptor_failed(expect))?;
    if n == 0 {
        // Closed without a word: the team exited (or refused us and is logging why).
        return Err(Error::NoSuchTeam(expect));
    }
    check_welcome(&buf[..n], expect)?;
    let [page, one, all] =
        <[_; 3]>::try_from(fds).map_err(|fds| refused(expect, Violation::Descriptors { got: fds.len(), want: 3 }))?;
    let bell = Bell::open(page, one, all).map_err(bad_doorbell(expect))?;
    let mut end = ShmEnd::new(segment, (cap, area, area), Side::Connector, (bell, line), stream);
    end.join_team(cfg);
    Ok(end)
}

/// A fresh channel segment with its header written.
fn create_segment(cap: usize, area: u64) -> Result<Mapping> {
    let segment = Mapping::create("ferry-channel", segment_len(cap, area))?;
    // SAFETY: fresh private segment of segment_len(cap, area) >= 4096 bytes; nobody else maps it yet.
    unsafe { std::ptr::copy_nonoverlapping(segment_header(cap, area).as_ptr(), segment.as_ptr(), SEGMENT_HEADER) };
    Ok(segment)
}

/// Magic of an acceptor's refusal: a limit of its was reached (its number
/// and value follow; see [`crate::Limit::refusal`]).
pub const REFUSED: &[u8; 8] = b"FERRYSRF";

/// Acceptor side: refuses a bind on `stream` because `limit` (of value
/// `max`) was reached; the connector gets `LimitReached`.
pub fn refuse(stream: &UnixStream, limit: crate::Limit, max: u64) {
    // A fresh socket's buffer has room for these 20 bytes: this does not wait.
    let _ = rustix::net::send(stream, &limit.refusal(REFUSED, max), rustix::net::SendFlags::DONTWAIT);
}

/// How far an [`accept_with`] got.
#[cfg(any(test, feature = "testing"))]
pub enum Accepted {
    /// The connector's hello has not come: the connection, to try again
    /// when it is readable.
    Waiting(UnixStream),
    /// Bound: this team's end (it keeps the connection) and the connector.
    /// (Boxed: the end goes on the heap behind a channel anyway.)
    Bound(Box<ShmEnd>, TeamId),
}

/// Acceptor side of the bind, for tests: takes a channel offered on a
/// freshly accepted `stream`, without waiting: [`Accepted::Waiting`] while
/// the connector's hello has not come (the reactor reads it itself: see
/// [`accept_hello`]); the welcome's magic given (a test poses as a peer of
/// another protocol or version).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn accept_with(
    stream: UnixStream,
    cfg: &BindConfig,
    is_peer: impl Fn(TeamId, u32, Option<&std::fs::File>) -> bool,
    welcome_magic: &[u8; 8],
) -> Result<Accepted> {
    let mut buf = [0u8; 64];
    let received = match fdpass::try_recv(&stream, &mut buf) {
        Ok(Some(got)) => got,
        Ok(None) => return Ok(Accepted::Waiting(stream)),
        Err(e) => return Err(refusing(&stream, e)),
    };
    let (end, peer) = accept_hello_with(stream, &buf[..received.0], received.1, cfg, is_peer, welcome_magic)?;
    Ok(Accepted::Bound(end, peer))
}

/// Acceptor side of the bind, once the connector's message (`msg`, with
/// the descriptors `fds` that came with it) was read from `stream`: checks
/// it as a hello and answers. The hello is one message, so it comes whole.
/// `is_peer(team, pid, lease)` checks that the process on the other end is
/// the team it claims to be: by the team lock file the hello carried
/// (`lease`), or else by its pid as the kernel reports it (0 if this PID
/// namespace does not see it). A refused connection is closed.
pub fn accept_hello(
    stream: UnixStream,
    msg: &[u8],
    fds: Vec<OwnedFd>,
    cfg: &BindConfig,
    is_peer: impl Fn(TeamId, u32, Option<&std::fs::File>) -> bool,
) -> Result<(Box<ShmEnd>, TeamId)> {
    accept_hello_with(stream, msg, fds, cfg, is_peer, WELCOME)
}

fn accept_hello_with(
    stream: UnixStream,
    msg: &[u8],
    fds: Vec<OwnedFd>,
    cfg: &BindConfig,
    is_peer: impl Fn(TeamId, u32, Option<&std::fs::File>) -> bool,
    welcome_magic: &[u8; 8],
) -> Result<(Box<ShmEnd>, TeamId)> {
    match take_hello(&stream, msg, fds, cfg, is_peer, welcome_magic) {
        Ok((segment, sizes, bell, line, peer)) => {
            let mut end = ShmEnd::new(segment, sizes, Side::Acceptor, (bell, line), stream);
            end.join_team(cfg);
            Ok((Box::new(end), peer))
        }
        Err(e) => Err(refusing(&stream, e)),
    }
}

/// `e`, the acceptor's failure; out of a resource of ours (descriptors,
/// most often), the connector is told which (`LimitReached`) rather than
/// left to think we are gone.
fn refusing(stream: &UnixStream, e: Error) -> Error {
    if let Error::LimitReached { limit, max } = e {
        refuse(stream, limit, max);
    }
    e
}

/// What the acceptor makes of a bind: its segment, ring and area sizes, the
/// connector's bell, this side's line, and the connector.
type Taken = (Mapping, (usize, u64, u64), Bell, Line, TeamId);

/// The acceptor's work on the connector's hello `msg` (read from `stream`
/// with `fds`): checked, and the welcome sent.
fn take_hello(
    stream: &UnixStream,
    msg: &[u8],
    fds: Vec<OwnedFd>,
    cfg: &BindConfig,
    is_peer: impl Fn(TeamId, u32, Option<&std::fs::File>) -> bool,
    welcome_magic: &[u8; 8],
) -> Result<Taken> {
    let (peer, cap, area) = check_hello(msg, cfg.me.node, cfg.max_ring_bytes)?;
    let mut fds = fds;
    // The fifth, if any: the connector's team lock file.
    let lease = if fds.len() == 5 { fds.pop().map(std::fs::File::from) } else { None };
    let pid = peer_pid(stream).unwrap_or(0);
    if peer.node != cfg.me.node || !is_peer(peer, pid, lease.as_ref()) {
        return Err(refused(peer, Violation::NotThatProcess));
    }
    // Closed now: held, it would keep the connector's lock after its death.
    drop(lease);
    let [segment, page, one, all] =
        <[_; 4]>::try_from(fds).map_err(|fds| refused(peer, Violation::Descriptors { got: fds.len(), want: 4 }))?;
    let segment = Mapping::open(segment, segment_len(cap, area))?;
    // SAFETY: the segment is at least 4096 bytes; we read its 24 header bytes by copy.
    let header = unsafe { std::ptr::read_volatile(segment.as_ptr() as *const [u8; SEGMENT_HEADER]) };
    if !segment_header_ok(&header, cap, area) {
        return Err(refused(peer, Violation::SegmentMismatch));
    }
    let bell = Bell::open(page, one, all).map_err(bad_doorbell(peer))?;
    let line = cfg.doorbell.new_line()?;
    let welcome = hello_bytes(welcome_magic, cfg.me, cap as u32, area);
    let (one, all) = line.fds();
    // A fresh socket's buffer has room for these 32 bytes: this does not wait.
    fdpass::send(stream.as_fd(), &welcome, &[cfg.doorbell.page_fd().as_fd(), one.as_fd(), all.as_fd()])?;
    // The connector sized the areas; this side stages at most what its own
    // settings say in the one it writes (the peer's word does not size our memory).
    Ok((segment, (cap, area, cfg.area_bytes), bell, line, peer))
}

/// A connected pair in one process, for the transport conformance suite
/// (`testing::shm_pair`): what a bind makes, without the hello (each end
/// owns one side of a socket pair for its liveness). Checks the sizes as a
/// bind does: the rings are built on them.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn pair_for_tests(cap: usize, area: u64, a: Arc<Doorbell>, b: Arc<Doorbell>) -> Result<(ShmEnd, ShmEnd)> {
    if !layout_ok(cap, area) {
        return Err(Error::InvalidArgument(format!("a {cap}-byte ring and a {area}-byte payload area")));
    }
    let segment = create_segment(cap, area)?;
    let fd = rustix::io::dup(segment.fd()).map_err(|e| Error::io("dup")(e.into()))?;
    let other = Mapping::open(fd, segment_len(cap, area))?;
    // Each end keeps its own team's line and rings the other team's.
    let (la, lb) = (a.new_line()?, b.new_line()?);
    let dup = |fd: &rustix::fd::OwnedFd| rustix::io::dup(fd).map_err(|e| Error::io("dup")(e.into()));
    let bell = |d: &Doorbell, l: &Line| Bell::open(dup(d.page_fd())?, dup(l.fds().0)?, dup(l.fds().1)?);
    let (bell_of_b, bell_of_a) = (bell(&b, &lb)?, bell(&a, &la)?);
    let (sa, sb) = UnixStream::pair().map_err(Error::io("socketpair"))?;
    let mut x = ShmEnd::new(segment, (cap, area, area), Side::Connector, (bell_of_b, la), sa);
    let mut y = ShmEnd::new(other, (cap, area, area), Side::Acceptor, (bell_of_a, lb), sb);
    x.wakes(a);
    y.wakes(b);
    Ok((x, y))
}

#[cfg(test)]
mod tests {
    use super::area::{COOL_AFTER, WARM_BYTES};
    use super::*;
    use std::time::Instant;

    /// A hello that breaks the layout comes back as the typed violation
    /// naming it (it was text), and reads as well.
    #[test]
    fn a_bad_hello_is_a_typed_violation() {
        let me = TeamId { node: 1, team: 7, incarnation: 9 };
        let bad = |b: &[u8]| match check_hello(b, 1, 1 << 20) {
            Err(Error::Protocol { violation, .. }) => violation,
            other => panic!("{other:?}"),
        };
        assert_eq!(bad(&[0; 5]), Violation::MalformedHandshake { message: HandshakeMessage::Hello, len: 5 });
        assert_eq!(bad(&hello_bytes(HELLO, me, 4095, 0)), Violation::RingSize(4095));
        assert_eq!(bad(&hello_bytes(HELLO, me, 4096, 100)), Violation::AreaSize(100));
        let e = Error::Protocol { peer: me, violation: bad(&hello_bytes(WELCOME, me, 4096, 0)) };
        assert_eq!(
            e.to_string(),
            format!("protocol violation by {me}: a malformed hello (wrong magic or layout, {HELLO_LEN} bytes)")
        );
    }

    /// Bytes the segment's memfd has allocated.
    fn allocated(end: &ShmEnd) -> u64 {
        let seg = end._segment.as_ref().expect("a mapped segment");
        rustix::fs::fstat(seg.fd()).unwrap().st_blocks as u64 * 512
    }

    /// Sends `len` bytes out of band from `a` to `b`; `b` takes it and
    /// gives it back (the range returns to `a`'s book).
    fn one_large(a: &ShmEnd, b: &ShmEnd, len: usize) {
        let mut staged = Some(a.stage(&vec![7; len]).unwrap());
        a.try_send_staged(&Header::new(Kind::Data, Addr::NONE, Addr::NONE, 0), &mut staged).unwrap();
        let mut got = None;
        let r = b.try_recv(&mut |_, body| match body {
            Body::Detached(slot) => {
                got = slot.take();
                true
            }
            Body::Inline(_) => false,
        });
        assert!(matches!(r, Ok(Recv::Consumed)), "{r:?}");
        assert_eq!(got.as_ref().map(|d| d.len()), Some(len));
        drop(got);
        b.tidy();
        assert!(matches!(a.try_recv(&mut |_, _| panic!("only the release comes back")), Ok(Recv::Consumed)));
    }

    /// The payload area gives back, after a spell without use, the pages
    /// above its warm part that large messages touched (the soak saw
    /// areas keep them for good); it keeps them while messages come.
    #[test]
    fn an_area_gives_back_the_pages_it_stopped_using() {
        let (d1, d2) = (Arc::new(Doorbell::create().unwrap()), Arc::new(Doorbell::create().unwrap()));
        let (a, b) = pair_for_tests(MIN_RING, 64 << 20, d1, d2).unwrap();
        let base = allocated(&a);
        let t0 = Instant::now();
        let at = |n: u32| t0 + COOL_AFTER * n;
        one_large(&a, &b, 16 << 20);
        assert!(allocated(&a) >= base + (16 << 20));
        assert!(a.cool(at(0)), "pages above the warm part: come back");
        // Used in every spell: kept.
        for n in 1..=3 {
            one_large(&a, &b, 16 << 20);
            assert!(a.cool(at(n)));
            assert!(allocated(&a) >= base + (16 << 20), "spell {n}");
        }
        // A spell without: back to the warm part.
        assert!(!a.cool(at(4)), "nothing above the warm part any more");
        // (Plus the rings' pages, touched since `base`.)
        let after = allocated(&a);
        assert!(after <= base + WARM_BYTES + 2 * MIN_RING as u64, "{base} -> {after}");
        // The warm part stays, and the area still works.
        one_large(&a, &b, 16 << 20);
        assert!(allocated(&a) >= base + (16 << 20));
    }
}
