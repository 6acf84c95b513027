//! Fifos in `ferry bench memory` (issue 19): MBCF's MBFifo between two
//! pinned processes, beside a port ping-pong (`ferry.shm.spin`, the
//! ping-pong suite's case) and `floor.spin.two_line`.
//!
//! * `ferry.shm.fifo` — a round trip: the parent enqueues an 8-byte
//!   counter into the child's fifo, the child dequeues it and enqueues it
//!   into the parent's fifo, the parent dequeues it. Both sides spin on
//!   `try_dequeue` (plain loads: no runtime hop, no system call).
//! * `ferry.shm.fifo.oneway` — the parent enqueues 8-byte elements as fast
//!   as its ring (1,024) takes them, the child drains them: ns per element
//!   (elements/s = 10^9 / it).

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::fifo::{Fifo, FifoRef};
use ferry::memory::Key;
use ferry::Team;
use std::time::{Duration, Instant};

const KEY: Key = Key::from_bytes(*b"ferry-bench-fifo");
const TO_CHILD: &str = "bench.fifo.child";
const TO_PARENT: &str = "bench.fifo.parent";
const STOP: u64 = u64::MAX;
const RING: u64 = 1024;

pub fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = crate::ferry_pingpong::cases().into_iter().filter(|c| c.name == "ferry.shm.spin").collect();
    v.extend([
        Case::new("ferry.shm.fifo", round_trip_parent, echo_child),
        Case::new("ferry.shm.fifo.oneway", oneway_parent, drain_child),
    ]);
    v
}

fn team(run_id: &str) -> Team {
    Team::builder().runtime_dir(run_dir(run_id)).processors(1).start().expect("start team")
}

/// The other side's fifo (waits for it to be made).
fn open(team: &Team, name: &str) -> FifoRef {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match team.open_fifo(name, KEY) {
            Ok(f) => return f,
            Err(ferry::Error::NameNotFound(_)) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("opening {name}: {e}"),
        }
    }
}

/// Enqueues, spinning while the ring is full.
fn push(f: &mut FifoRef, v: u64) {
    while let Err(e) = f.enqueue(&v.to_le_bytes()) {
        assert!(matches!(e, ferry::Error::WouldBlock { .. }), "enqueue: {e}");
        std::hint::spin_loop();
    }
}

/// Spins until an element comes.
fn pop(fifo: &mut Fifo, buf: &mut Vec<u8>) -> u64 {
    while !fifo.try_dequeue_into(buf) {
        std::hint::spin_loop();
    }
    u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"))
}

fn round_trip_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id);
    let mut back = team.fifo_with_key(TO_PARENT, RING, 8, KEY).expect("the parent's fifo");
    let mut to_child = open(&team, TO_CHILD);
    let mut buf = Vec::new();
    let mut v = 0u64;
    let samples = p.measure(p.iters, |rounds| {
        for _ in 0..rounds {
            v += 1;
            push(&mut to_child, v);
            peer.spin_until(|| back.try_dequeue_into(&mut buf));
            assert_eq!(buf, v.to_le_bytes());
        }
    });
    push(&mut to_child, STOP);
    drop((to_child, back));
    team.shutdown();
    samples
}

fn echo_child(ctx: &ChildCtx) {
    let team = team(&ctx.run_id);
    let mut fifo = team.fifo_with_key(TO_CHILD, RING, 8, KEY).expect("the child's fifo");
    let mut back = open(&team, TO_PARENT);
    let mut buf = Vec::new();
    loop {
        let v = pop(&mut fifo, &mut buf);
        if v == STOP {
            break;
        }
        push(&mut back, v);
    }
    drop((back, fifo));
    team.shutdown();
}

fn oneway_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id);
    let mut to_child = open(&team, TO_CHILD);
    let mut v = 0u64;
    let samples = p.measure(p.iters * 10, |n| {
        for _ in 0..n {
            v += 1;
            push(&mut to_child, v);
        }
    });
    push(&mut to_child, STOP);
    drop(to_child);
    team.shutdown();
    samples
}

/// Drains its fifo, checking the elements come in order, until `STOP`.
fn drain_child(ctx: &ChildCtx) {
    let team = team(&ctx.run_id);
    let mut fifo = team.fifo_with_key(TO_CHILD, RING, 8, KEY).expect("the child's fifo");
    let mut buf = Vec::new();
    let mut last = 0;
    loop {
        let v = pop(&mut fifo, &mut buf);
        if v == STOP {
            break;
        }
        assert_eq!(v, last + 1, "an element lost or out of order");
        last = v;
    }
    drop(fifo);
    team.shutdown();
}
