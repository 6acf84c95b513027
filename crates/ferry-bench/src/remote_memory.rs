//! `ferry bench memory`: remote memory on one machine (issue 18) beside the
//! floors it is measured against. Every case is a round trip between two
//! pinned processes in which the parent reaches a line the child last
//! wrote (never an L1 hit); what differs is how it reaches it.
//!
//! * `floor.load.remote` — the parent stores a counter in a word; the
//!   child copies it into another; the parent loads that one until it sees
//!   it. Raw atomics on the harness's shared memory: `floor.spin.two_line`'s
//!   exchange.
//! * `ferry.shm.get.N` (N = 2, 8, 64, 256, 1024: StarMod's Figure 5-1) —
//!   the same, the child (the region's owner) writing N bytes (the counter
//!   first) and the parent `get`ting N bytes until it sees them: a checked
//!   get against a load.
//! * `ferry.shm.put.N` — the parent `put`s N bytes (the counter first),
//!   the child waits for them and answers in the ack word, which the
//!   parent `load`s: a checked put against `floor.load.remote`'s store.
//! * `floor.atomic.fetch_add` — the two sides take turns to add 1 to one
//!   word (the parent makes it odd, the child even), each waiting with
//!   loads for its turn. Raw atomics.
//! * `ferry.shm.fetch_add`, `ferry.shm.cas` — the same turns through a
//!   region (`fetch_add`, or `compare_and_swap` from the value seen).
//! * `ferry.shm.put_ack.64` — MBCF's remote write with acknowledgement
//!   (Table 3.2): the parent `put_flagged`s 64 bytes, the flag a word of a
//!   region of its own, and loads the flag until it is set.
//! * `ferry.shm.rpc.get.N` — the same N bytes fetched by a call to a port
//!   of the child's, which replies with them (StarMod's remote-to-local
//!   ratio, Figure 6-1: `get.N` against `rpc.get.N`).
//! * `ferry.shm.{get.8,put.8,fetch_add}.cached` — the shape of MPI's cases
//!   (`mpi_peer.rs`, as the OSU one-sided benchmarks): the parent repeats
//!   the operation on a word the child never touches, so the line stays in
//!   the parent's cache; what is measured is the operation's own cost.
//! * Across machines (TCP, the child node 2 of a cluster on loopback, as in
//!   `tcp.rs`): `floor.tcp.spin` and `ferry.tcp.null` (the TCP suite's
//!   cases), `ferry.tcp.get.8` (an 8-byte get the owner's runtime serves),
//!   `ferry.tcp.path3` (a path of 3 steps, then 8 bytes: one round trip),
//!   `ferry.tcp.put_ack.64` (a 64-byte put whose acknowledgement is a
//!   future, waited for). Timed call by call, as the TCP suite's.
//!
//! In the ferry cases the child exports the region and the parent opens it
//! (another process: the memfd handed over its channel); both sides use
//! ferry's checked operations.

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::memory::{Key, RegionRef, Step};
use ferry::Team;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::{Duration, Instant};

/// Where the data and the ack words are (a page apart: no shared line, no
/// adjacent-line prefetch).
const DATA: usize = 0;
const ACK: usize = 4096;
const LEN: usize = 8192;
const STOP: u64 = u64::MAX;
const NAME: &str = "bench.region";
/// A benchmark's own key (both sides know it).
const KEY: Key = Key::from_bytes(*b"ferry-bench-key!");

/// A case per size, `name.N`, of `parent(peer, params, N)` and `child`.
macro_rules! sized {
    ($name:literal, $parent:ident, $child:expr, [$($n:literal),*]) => {
        [$(Case::new(concat!($name, ".", $n), |p, q| $parent(p, q, $n), $child)),*]
    };
}

pub fn cases() -> Vec<Case> {
    let mut v = vec![
        // `floor.spin.two_line`'s very exchange, named for what it anchors
        // here (and under its own name, as the list of floors has it).
        Case::new("floor.load.remote", crate::floors::two_line_parent, crate::floors::two_line_child),
        Case::new("floor.spin.two_line", crate::floors::two_line_parent, crate::floors::two_line_child),
    ];
    v.extend(sized!("ferry.shm.get", get_parent, region_echo_child, [2, 8, 64, 256, 1024]));
    v.extend(sized!("ferry.shm.put", put_parent, region_ack_child, [2, 8, 64, 256, 1024]));
    v.extend(sized!("ferry.shm.rpc.get", rpc_get_parent, rpc_get_child, [2, 8, 64, 256, 1024]));
    v.extend([
        Case::new("floor.atomic.fetch_add", turns_floor_parent, turns_floor_child),
        Case::new("ferry.shm.fetch_add", |p, q| turns_parent(p, q, false), |c| region_turns_child(c, false)),
        Case::new("ferry.shm.cas", |p, q| turns_parent(p, q, true), |c| region_turns_child(c, true)),
        Case::new("ferry.shm.put_ack.64", put_ack_parent, idle_owner_child),
        Case::new("ferry.shm.get.8.cached", |p, q| cached_parent(p, q, Cached::Get), idle_owner_child),
        Case::new("ferry.shm.put.8.cached", |p, q| cached_parent(p, q, Cached::Put), idle_owner_child),
        Case::new("ferry.shm.fetch_add.cached", |p, q| cached_parent(p, q, Cached::FetchAdd), idle_owner_child),
    ]);
    v.extend(crate::tcp::cases().into_iter().filter(|c| ["floor.tcp.spin", "ferry.tcp.null"].contains(&c.name)));
    v.extend([
        Case::new("ferry.tcp.get.8", |p, q| tcp_parent(p, q, Remote::Get), tcp_owner_child),
        Case::new("ferry.tcp.path3", |p, q| tcp_parent(p, q, Remote::Path), tcp_owner_child),
        Case::new("ferry.tcp.put_ack.64", |p, q| tcp_parent(p, q, Remote::PutAck), tcp_owner_child),
    ]);
    v
}

// --- floors ------------------------------------------------------------------

fn turns_floor_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let word = peer.shm.atomic_u64(DATA);
    let mut v = 0;
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            word.fetch_add(1, Release);
            v += 2;
            peer.spin_until(|| word.load(Acquire) == v);
        }
    });
    word.store(STOP, Release);
    samples
}

fn turns_floor_child(ctx: &ChildCtx) {
    let word = ctx.shm.atomic_u64(DATA);
    loop {
        let w = word.load(Acquire);
        if w % 2 == 1 {
            if w == STOP {
                return;
            }
            word.fetch_add(1, Release);
        }
    }
}

// --- ferry -------------------------------------------------------------------

/// The parent's team has no processor: nothing but its measuring thread
/// runs (a region's operations need none). The owner's has one, which
/// answers the opening (its measuring thread never enters ferry's loop),
/// then sleeps.
fn team(run_id: &str, processors: usize) -> Team {
    Team::builder().runtime_dir(run_dir(run_id)).processors(processors).start().expect("start team")
}

/// What `attempt` makes of an object the other process names (a region,
/// a fifo, a handler): tried again while the name is not bound yet, for at
/// most 10 s.
pub(crate) fn once_named<T>(what: &str, mut attempt: impl FnMut() -> ferry::Result<T>) -> T {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt() {
            Ok(v) => return v,
            Err(ferry::Error::NameNotFound(_)) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("opening {what}: {e}"),
        }
    }
}

/// The child's region, opened by the parent (waits for it to be exported).
fn open(team: &Team) -> RegionRef {
    once_named("the child's region", || team.open_region(NAME, KEY))
}

/// Runs the parent's side with the child's region opened.
fn with_region(peer: &Peer, side: impl FnOnce(&RegionRef) -> Vec<f64>) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, 0);
    let region = open(&team);
    let samples = side(&region);
    drop(region);
    team.shutdown();
    samples
}

/// Runs the child's side on the region it exports.
fn exporting(ctx: &ChildCtx, side: impl FnOnce(&RegionRef)) {
    let team = team(&ctx.run_id, 1);
    let region = team.export_with_key(NAME, LEN, KEY).expect("export");
    side(&region);
    drop(region);
    team.shutdown();
}

/// The bytes of `v` a size-`n` case carries (all 8 from 8 bytes on):
/// consecutive values differ in them.
fn mark(v: u64, n: usize) -> u64 {
    match n {
        8.. => v,
        _ => v & ((1 << (8 * n)) - 1),
    }
}

fn get_parent(peer: &mut Peer, p: &Params, n: usize) -> Vec<f64> {
    with_region(peer, |r| {
        let mut buf = vec![0u8; n];
        let k = n.min(8);
        let mut v = 0u64;
        let samples = p.measure(p.iters, |rounds| {
            for _ in 0..rounds {
                v += 1;
                r.swap(ACK, v).unwrap();
                peer.spin_until(|| {
                    r.get(DATA, &mut buf).unwrap();
                    buf[..k] == v.to_le_bytes()[..k]
                });
            }
        });
        r.swap(ACK, STOP).unwrap();
        samples
    })
}

/// Calls `answer` with each new value `read` gives, until `STOP`.
fn answer_each(mut read: impl FnMut() -> u64, mut answer: impl FnMut(u64)) {
    let mut last = 0;
    loop {
        let v = read();
        if v != last {
            if v == STOP {
                return;
            }
            answer(v);
            last = v;
        }
    }
}

/// Echoes the ack word into the data's first 8 bytes, as a write of the
/// whole data (up to 1024 bytes: the parent reads what its case needs).
fn region_echo_child(ctx: &ChildCtx) {
    exporting(ctx, |r| {
        let mut data = vec![7u8; 1024];
        answer_each(
            || r.load(ACK).unwrap(),
            |v| {
                data[..8].copy_from_slice(&v.to_le_bytes());
                r.put(DATA, &data).unwrap();
            },
        )
    })
}

fn put_parent(peer: &mut Peer, p: &Params, n: usize) -> Vec<f64> {
    with_region(peer, |r| {
        let mut data = vec![7u8; n];
        let k = n.min(8);
        let mut v = 0u64;
        let samples = p.measure(p.iters, |rounds| {
            for _ in 0..rounds {
                v += 1;
                data[..k].copy_from_slice(&v.to_le_bytes()[..k]);
                r.put(DATA, &data).unwrap();
                peer.spin_until(|| r.load(ACK).unwrap() == mark(v, n));
            }
        });
        r.swap(DATA, STOP).unwrap();
        samples
    })
}

/// Answers each new data word in the ack word.
fn region_ack_child(ctx: &ChildCtx) {
    exporting(ctx, |r| {
        answer_each(
            || r.load(DATA).unwrap(),
            |v| {
                r.swap(ACK, v).unwrap();
            },
        )
    })
}

fn turns_parent(peer: &mut Peer, p: &Params, cas: bool) -> Vec<f64> {
    with_region(peer, |r| {
        let mut v = 0u64;
        let samples = p.measure(p.iters, |k| {
            for _ in 0..k {
                match cas {
                    true => assert_eq!(r.compare_and_swap(DATA, v, v + 1).unwrap(), v),
                    false => assert_eq!(r.fetch_add(DATA, 1).unwrap(), v),
                }
                v += 2;
                peer.spin_until(|| r.load(DATA).unwrap() == v);
            }
        });
        r.swap(DATA, STOP).unwrap();
        samples
    })
}

/// Takes its turns: adds 1 to every odd value it sees (`fetch_add`, or
/// `compare_and_swap` from the value seen).
fn region_turns_child(ctx: &ChildCtx, cas: bool) {
    exporting(ctx, |r| loop {
        let w = r.load(DATA).unwrap();
        if w % 2 == 1 {
            if w == STOP {
                return;
            }
            match cas {
                true => r.compare_and_swap(DATA, w, w + 1).unwrap(),
                false => r.fetch_add(DATA, 1).unwrap(),
            };
        }
    })
}

// --- acknowledgement, the cached shape, RPC --------------------------------

/// Owns the region and leaves it alone until the parent says stop (in the
/// ack word, a page away from the data).
fn idle_owner_child(ctx: &ChildCtx) {
    exporting(ctx, |r| answer_each(|| r.load(ACK).unwrap(), |_| {}))
}

fn put_ack_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, 0);
    let r = open(&team);
    let flags = team.export("bench.flags", 64).expect("the parent's flag region");
    let mut data = [7u8; 64];
    let mut v = 0u64;
    let samples = p.measure(p.iters, |rounds| {
        for _ in 0..rounds {
            v += 1;
            data[..8].copy_from_slice(&v.to_le_bytes());
            r.put_flagged(DATA, &data, &flags, 0, v).unwrap();
            peer.spin_until(|| flags.load(0).unwrap() == v);
        }
    });
    r.swap(ACK, STOP).unwrap();
    drop((r, flags));
    team.shutdown();
    samples
}

enum Cached {
    Get,
    Put,
    FetchAdd,
}

fn cached_parent(peer: &mut Peer, p: &Params, op: Cached) -> Vec<f64> {
    with_region(peer, |r| {
        let mut buf = [0u8; 8];
        let samples = p.measure(p.iters, |rounds| {
            for i in 0..rounds as u64 {
                match op {
                    Cached::Get => r.get(DATA, &mut buf).unwrap(),
                    Cached::Put => r.put(DATA, &i.to_le_bytes()).unwrap(),
                    Cached::FetchAdd => buf = r.fetch_add(DATA, 1).unwrap().to_le_bytes(),
                }
                std::hint::black_box(&buf);
            }
        });
        r.swap(ACK, STOP).unwrap();
        samples
    })
}

/// The name of the child's port that answers with N bytes.
const RPC_PORT: &str = "bench.rpc.get";

/// Calls the child's port for N bytes (the request says how many, as a
/// u16) until it answers; each call a round trip.
fn rpc_get_parent(peer: &mut Peer, p: &Params, n: usize) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, 0);
    let port = team.lookup_wait(RPC_PORT, Duration::from_secs(10)).expect("the child's port");
    let sender = team.raw_sender(port);
    let ask = (n as u16).to_le_bytes();
    let samples = p.measure(p.iters_div(4), |rounds| {
        for _ in 0..rounds {
            assert_eq!(sender.call(&ask).unwrap().len(), n);
        }
    });
    let _ = sender.send(b"stop", ferry::Checkpoint::OnReceipt);
    team.shutdown();
    samples
}

/// Answers each call with the first N bytes of its memory, on its one
/// processor (a task: a port's ordinary server).
fn rpc_get_child(ctx: &ChildCtx) {
    let team = team(&ctx.run_id, 1);
    let port = team.open_named_raw_port(RPC_PORT).expect("the port");
    let memory = vec![7u8; 1024];
    while let Ok(m) = port.recv_blocking() {
        let Ok(ask) = <[u8; 2]>::try_from(m.payload()) else { break };
        m.reply(&memory[..usize::from(u16::from_le_bytes(ask))]).unwrap();
    }
    team.shutdown();
}

// --- across machines ---------------------------------------------------------

/// Where the path of `ferry.tcp.path3` leads: word 0 points to record 64,
/// whose field 8 points to the data at 256.
const PATH: [Step; 3] = [Step::Indirect, Step::Field(8), Step::Indirect];
const PATH_DATA: usize = 256;

/// Node 2: serves the TCP suite's `Bench` (for `ferry.tcp.null`) and
/// exports the region, its path laid out.
fn tcp_owner_child(ctx: &ChildCtx) {
    crate::tcp::serve_with(ctx, false, |team| {
        let r = team.export_with_key(NAME, LEN, KEY).expect("export");
        r.put(0, &64u64.to_le_bytes()).unwrap();
        r.put(64 + 8, &(PATH_DATA as u64).to_le_bytes()).unwrap();
        r.put(PATH_DATA, &[9u8; 8]).unwrap();
        r
    })
}

enum Remote {
    Get,
    Path,
    PutAck,
}

/// Node 1, no processor: opens the region of node 2 (served) and times
/// each operation.
fn tcp_parent(peer: &mut Peer, p: &Params, op: Remote) -> Vec<f64> {
    crate::tcp::client_with_team(peer, false, |_, team| {
        let r = open(team);
        assert!(!r.is_mapped(), "a region of another node is served");
        let mut out = [0u8; 8];
        let data = [7u8; 64];
        p.measure_each(crate::tcp::calls(p), || match op {
            Remote::Get => r.get(PATH_DATA, &mut out).unwrap(),
            Remote::Path => {
                r.get_path(0, &PATH, &mut out).unwrap();
                assert_eq!(out, [9u8; 8]);
            }
            Remote::PutAck => team.block_on(r.put_async(DATA, &data)).unwrap(),
        })
    })
}
