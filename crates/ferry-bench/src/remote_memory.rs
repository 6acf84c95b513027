//! `ferry bench memory`: remote memory on one machine (issue 18) beside the
//! floors it is measured against. Every case is a round trip between two
//! pinned processes in which the parent reaches a line the child last
//! wrote (never an L1 hit); what differs is how it reaches it.
//!
//! * `floor.load.remote` — the parent stores a counter in a word; the
//!   child copies it into another; the parent loads that one until it sees
//!   it. Raw atomics on the harness's shared memory: `floor.spin.two_line`'s
//!   exchange.
//! * `ferry.shm.get.N` (N = 8, 64, 1024) — the same, the child (the
//!   region's owner) writing N bytes (the counter first) and the parent
//!   `get`ting N bytes until it sees them: a checked get against a load.
//! * `ferry.shm.put.N` — the parent `put`s N bytes (the counter first),
//!   the child waits for them and answers in the ack word, which the
//!   parent `load`s: a checked put against `floor.load.remote`'s store.
//! * `floor.atomic.fetch_add` — the two sides take turns to add 1 to one
//!   word (the parent makes it odd, the child even), each waiting with
//!   loads for its turn. Raw atomics.
//! * `ferry.shm.fetch_add`, `ferry.shm.cas` — the same turns through a
//!   region (`fetch_add`, or `compare_and_swap` from the value seen).
//!
//! In the ferry cases the child exports the region and the parent opens it
//! (another process: the memfd handed over its channel); both sides use
//! ferry's checked operations.

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::memory::{Key, RegionRef};
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

pub fn cases() -> Vec<Case> {
    vec![
        // `floor.spin.two_line`'s very exchange, named for what it anchors here.
        Case::new("floor.load.remote", crate::floors::two_line_parent, crate::floors::two_line_child),
        Case::new("ferry.shm.get.8", |p, q| get_parent(p, q, 8), region_echo_child),
        Case::new("ferry.shm.get.64", |p, q| get_parent(p, q, 64), region_echo_child),
        Case::new("ferry.shm.get.1024", |p, q| get_parent(p, q, 1024), region_echo_child),
        Case::new("ferry.shm.put.8", |p, q| put_parent(p, q, 8), region_ack_child),
        Case::new("ferry.shm.put.64", |p, q| put_parent(p, q, 64), region_ack_child),
        Case::new("ferry.shm.put.1024", |p, q| put_parent(p, q, 1024), region_ack_child),
        Case::new("floor.atomic.fetch_add", turns_floor_parent, turns_floor_child),
        Case::new("ferry.shm.fetch_add", |p, q| turns_parent(p, q, false), |c| region_turns_child(c, false)),
        Case::new("ferry.shm.cas", |p, q| turns_parent(p, q, true), |c| region_turns_child(c, true)),
    ]
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

/// The child's region, opened by the parent (waits for it to be exported).
fn open(team: &Team) -> RegionRef {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match team.open_region(NAME, KEY) {
            Ok(r) => return r,
            Err(ferry::Error::NameNotFound(_)) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("opening the child's region: {e}"),
        }
    }
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

fn get_parent(peer: &mut Peer, p: &Params, n: usize) -> Vec<f64> {
    with_region(peer, |r| {
        let mut buf = vec![0u8; n];
        let mut v = 0u64;
        let samples = p.measure(p.iters, |k| {
            for _ in 0..k {
                v += 1;
                r.swap(ACK, v).unwrap();
                peer.spin_until(|| {
                    r.get(DATA, &mut buf).unwrap();
                    buf[..8] == v.to_le_bytes()
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
/// whole data (up to 1024 bytes).
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
        let mut v = 0u64;
        let samples = p.measure(p.iters, |k| {
            for _ in 0..k {
                v += 1;
                data[..8].copy_from_slice(&v.to_le_bytes());
                r.put(DATA, &data).unwrap();
                peer.spin_until(|| r.load(ACK).unwrap() == v);
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
