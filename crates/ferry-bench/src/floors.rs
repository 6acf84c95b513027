//! The physical floors of a two-process round trip on this machine: what
//! any shared-memory channel (ferry's included) is compared to.
//!
//! * `floor.spin.one_line` — both sides spin on one shared cache line.
//! * `floor.spin.two_line` — one line per direction; each side spins only
//!   on the line the other writes. ferry's baseline.
//! * `floor.futex` — both sides sleep in FUTEX_WAIT: two wake-ups per trip.
//! * `floor.eventfd` — as `floor.futex`, with the wake-up a parked ferry
//!   thread gets: an `eventfd` write, an edge-triggered `epoll_wait`
//!   (`ferry.shm.parked`'s mechanism, without ferry's work around it).
//! * `floor.uds` — 8 bytes each way over a Unix stream socket, blocking.
//! * `floor.ring.oneway` — one-way messages through a single-producer
//!   single-consumer ring of 48-byte records in shared memory: one publish
//!   per record, one release per record, the consumer spinning (ns per
//!   message; `ferry.shm.oneway`'s floor).

use std::io::{Read, Write};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

use rustix::fd::{AsFd, OwnedFd};
use rustix::io::Errno;
use rustix::thread::futex;

use crate::harness::{Case, ChildCtx, Params, Peer};

/// Offsets of the request and the response word in the shared region. They
/// are 128 bytes apart, not 64: Intel's L2 prefetcher fetches lines in
/// aligned pairs, so adjacent lines would still interfere.
const REQ: usize = 0;
const RESP: usize = 128;

/// Each sleeping case scales `Params::iters` down by this (~8 µs a trip).
const SLOW_DIV: usize = 10;

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("floor.spin.one_line", one_line_parent, one_line_child),
        Case::new("floor.spin.two_line", two_line_parent, two_line_child),
        Case::new("floor.futex", futex_parent, futex_child),
        Case::new("floor.eventfd", eventfd_parent, eventfd_child),
        Case::new("floor.uds", uds_parent, uds_child),
        Case::new("floor.ring.oneway", ring_parent, ring_child),
    ]
}

// --- floor.ring.oneway ---------------------------------------------------
// The producer (parent) writes records of six words (48 bytes, each word
// the record's number) at RING, then publishes its tail; the consumer
// (child) reads each record as the tail passes it, checks it, and
// publishes its head. A round ends when the head catches up, so what is
// timed is messages taken, not written. A tail of u64::MAX stops the child.

/// Where the records start, and how many the ring holds (192 KiB of the region).
const RING: usize = 4096;
const RECORDS: u64 = 4096;
const WORDS: usize = 6;

fn record(at: u64) -> usize {
    RING + (at % RECORDS) as usize * WORDS * 8
}

fn ring_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let (tail_word, head_word) = (peer.shm.atomic_u64(REQ), peer.shm.atomic_u64(RESP));
    let (mut tail, mut head) = (0u64, 0u64);
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            while tail - head >= RECORDS {
                head = head_word.load(Acquire);
            }
            for w in 0..WORDS {
                peer.shm.atomic_u64(record(tail) + w * 8).store(tail, Relaxed);
            }
            tail += 1;
            tail_word.store(tail, Release);
        }
        peer.spin_until(|| head_word.load(Acquire) == tail);
        head = tail;
    });
    tail_word.store(STOP64, Release);
    samples
}

fn ring_child(ctx: &ChildCtx) {
    let (tail_word, head_word) = (ctx.shm.atomic_u64(REQ), ctx.shm.atomic_u64(RESP));
    let mut head = 0u64;
    loop {
        let tail = tail_word.load(Acquire);
        if tail == STOP64 {
            return;
        }
        while head < tail {
            for w in 0..WORDS {
                assert_eq!(ctx.shm.atomic_u64(record(head) + w * 8).load(Relaxed), head, "a torn record");
            }
            head += 1;
            head_word.store(head, Release);
        }
    }
}

// --- floor.spin.one_line -------------------------------------------------
// The parent writes odd values, the child answers with the next even value,
// in the same word. u64::MAX (odd) tells the child to stop.

const STOP64: u64 = u64::MAX;

fn one_line_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let line = peer.shm.atomic_u64(REQ);
    let mut v = 1;
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            line.store(v, Release);
            peer.spin_until(|| line.load(Acquire) == v + 1);
            v += 2;
        }
    });
    line.store(STOP64, Release);
    samples
}

fn one_line_child(ctx: &ChildCtx) {
    let line = ctx.shm.atomic_u64(REQ);
    loop {
        let v = line.load(Acquire);
        if v % 2 == 1 {
            if v == STOP64 {
                return;
            }
            line.store(v + 1, Release);
        }
    }
}

// --- floor.spin.two_line -------------------------------------------------
// The parent bumps the request counter; the child copies it into the
// response counter. Each side reads only the line the other writes.

pub(crate) fn two_line_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let (req, resp) = (peer.shm.atomic_u64(REQ), peer.shm.atomic_u64(RESP));
    let mut v = 0;
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            v += 1;
            req.store(v, Release);
            peer.spin_until(|| resp.load(Acquire) == v);
        }
    });
    req.store(STOP64, Release);
    samples
}

pub(crate) fn two_line_child(ctx: &ChildCtx) {
    let (req, resp) = (ctx.shm.atomic_u64(REQ), ctx.shm.atomic_u64(RESP));
    let mut last = 0;
    loop {
        let v = req.load(Acquire);
        if v != last {
            if v == STOP64 {
                return;
            }
            resp.store(v, Release);
            last = v;
        }
    }
}

// --- floor.futex and floor.eventfd --------------------------------------
// As two_line, but each side sleeps until the word the other writes moves,
// and the writer wakes it: with FUTEX_WAIT and FUTEX_WAKE (`floor.futex`;
// shared, not PRIVATE, futexes, as the words live in memory shared
// between processes), or in `epoll_wait` on an eventfd of its own that
// the writer writes 1 to (`floor.eventfd`: edge-triggered, exclusive,
// never read, as ferry's wake-up lines in `transport::doorbell`; the
// parent makes both eventfds and sends them to the child).

const STOP32: u32 = u32::MAX;

/// How long the parent sleeps at most before checking that the child is
/// alive. (The parent's death kills the child, PDEATHSIG: it never times out.)
const TICK: futex::Timespec = futex::Timespec { tv_sec: 0, tv_nsec: 100_000_000 };

/// The parent's side of a sleeping floor: `wake(word)` after writing a
/// word; `sleep(word, seen, tick)` while the word still reads `seen`, for
/// at most [`TICK`] if `tick`, returning whether that passed.
fn sleeping_parent(
    peer: &mut Peer,
    p: &Params,
    wake: impl Fn(&AtomicU32),
    sleep: impl Fn(&AtomicU32, u32, bool) -> bool,
) -> Vec<f64> {
    let (req, resp) = (peer.shm.atomic_u32(REQ), peer.shm.atomic_u32(RESP));
    let mut v = 0;
    let samples = p.measure(p.iters_div(SLOW_DIV), |n| {
        for _ in 0..n {
            v += 1;
            req.store(v, Release);
            wake(req);
            let mut started = None;
            loop {
                let seen = resp.load(Acquire);
                if seen == v {
                    break;
                }
                if sleep(resp, seen, true) {
                    peer.check_progress(&mut started);
                }
            }
        }
    });
    req.store(STOP32, Release);
    wake(req);
    samples
}

/// The child's side of a sleeping floor (see [`sleeping_parent`]).
fn sleeping_child(ctx: &ChildCtx, wake: impl Fn(&AtomicU32), sleep: impl Fn(&AtomicU32, u32, bool) -> bool) {
    let (req, resp) = (ctx.shm.atomic_u32(REQ), ctx.shm.atomic_u32(RESP));
    let mut last = 0;
    loop {
        let v = req.load(Acquire);
        if v == last {
            let _ = sleep(req, last, false);
            continue;
        }
        if v == STOP32 {
            return;
        }
        resp.store(v, Release);
        wake(resp);
        last = v;
    }
}

fn futex_wake(word: &AtomicU32) {
    futex::wake(word, futex::Flags::empty(), 1).expect("FUTEX_WAKE");
}

fn futex_sleep(word: &AtomicU32, seen: u32, tick: bool) -> bool {
    match futex::wait(word, futex::Flags::empty(), seen, tick.then_some(&TICK)) {
        Err(Errno::TIMEDOUT) => true,
        Ok(()) | Err(Errno::AGAIN | Errno::INTR) => false,
        Err(e) => panic!("FUTEX_WAIT: {e}"),
    }
}

fn futex_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    sleeping_parent(peer, p, futex_wake, futex_sleep)
}

fn futex_child(ctx: &ChildCtx) {
    sleeping_child(ctx, futex_wake, futex_sleep)
}

/// An epoll set watching `line` as ferry's sleeping threads watch a line.
fn eventfd_sleep_set(line: &OwnedFd) -> OwnedFd {
    use rustix::event::epoll;
    let set = epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll_create");
    let flags = epoll::EventFlags::IN | epoll::EventFlags::ET | epoll::EventFlags::EXCLUSIVE;
    epoll::add(&set, line, epoll::EventData::new_u64(0), flags).expect("epoll_ctl");
    set
}

/// Sleeps on `set` until it is rung, or [`TICK`] passes if `tick`: whether it passed.
fn eventfd_sleep(set: &OwnedFd, tick: bool) -> bool {
    let mut events = [std::mem::MaybeUninit::uninit(); 4];
    match rustix::event::epoll::wait(set, &mut events[..], tick.then_some(&TICK)) {
        Ok((ready, _)) => ready.is_empty(),
        Err(Errno::INTR) => false,
        Err(e) => panic!("epoll_wait: {e}"),
    }
}

fn eventfd_ring(line: &OwnedFd) {
    rustix::io::write(line, &1u64.to_ne_bytes()).expect("eventfd write");
}

fn eventfd_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    use rustix::event::{eventfd, EventfdFlags};
    let flags = EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK;
    let (to_child, to_parent) = (eventfd(0, flags).expect("eventfd"), eventfd(0, flags).expect("eventfd"));
    peer.send_fd(to_child.as_fd()).expect("send the child's line");
    peer.send_fd(to_parent.as_fd()).expect("send the parent's line");
    let set = eventfd_sleep_set(&to_parent);
    sleeping_parent(peer, p, |_| eventfd_ring(&to_child), |_, _, tick| eventfd_sleep(&set, tick))
}

fn eventfd_child(ctx: &ChildCtx) {
    let mine = ctx.recv_fd().expect("the child's line");
    let to_parent = ctx.recv_fd().expect("the parent's line");
    let set = eventfd_sleep_set(&mine);
    sleeping_child(ctx, |_| eventfd_ring(&to_parent), |_, _, tick| eventfd_sleep(&set, tick))
}

// --- floor.uds -----------------------------------------------------------
// 8-byte request, 8-byte response (request + 1), blocking reads on a Unix
// stream socketpair. Request u64::MAX asks the child to stop.

fn uds_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    // A hung child fails the read instead of hanging the suite.
    peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
    let mut sock = &peer.sock;
    let mut v: u64 = 0;
    let samples = p.measure(p.iters_div(SLOW_DIV), |n| {
        for _ in 0..n {
            v += 1;
            sock.write_all(&v.to_ne_bytes()).expect("uds write");
            let mut buf = [0u8; 8];
            sock.read_exact(&mut buf).expect("uds read");
            assert_eq!(u64::from_ne_bytes(buf), v + 1, "uds: wrong response");
        }
    });
    sock.write_all(&STOP64.to_ne_bytes()).expect("uds write");
    samples
}

fn uds_child(ctx: &ChildCtx) {
    let mut sock = &ctx.sock;
    let mut buf = [0u8; 8];
    // An error or EOF means the parent is gone: nothing left to do.
    while sock.read_exact(&mut buf).is_ok() {
        let v = u64::from_ne_bytes(buf);
        if v == STOP64 {
            return;
        }
        if sock.write_all(&(v + 1).to_ne_bytes()).is_err() {
            return;
        }
    }
}
