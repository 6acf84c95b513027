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
//! * `ferry.shm.signal` — a signal round trip: the parent signals the
//!   child's `EveryTime` handler with a counter (accepted by the child's
//!   runtime), the handler (a task of the child's) writes it into a region
//!   of the parent's, which the parent loads until it sees it; beside
//!   `ferry.shm.null` (the RPC suite's null call).
//! * `ferry.shm.fifo_rpc`, `ferry.tcp.fifo_rpc` — RPC over a pair of fifos
//!   (MBCF Table 5.1's RPC/MBFifo): the client enqueues a request into the
//!   server's fifo and waits for the reply in its own, both sides with the
//!   blocking dequeue (spin, then park), as an RPC server's loop; over
//!   shared memory, and between two nodes on loopback (the server node 2)
//!   beside `ferry.tcp.null`.

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::fifo::{Fifo, FifoRef};
use ferry::memory::Key;
use ferry::Team;
use std::time::Duration;

const KEY: Key = Key::from_bytes(*b"ferry-bench-fifo");
const TO_CHILD: &str = "bench.fifo.child";
const TO_PARENT: &str = "bench.fifo.parent";
const STOP: u64 = u64::MAX;
const RING: u64 = 1024;

pub fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = crate::ferry_pingpong::cases().into_iter().filter(|c| c.name == "ferry.shm.spin").collect();
    v.extend(crate::ferry_rpc::cases().into_iter().filter(|c| c.name == "ferry.shm.null"));
    v.extend([
        Case::new("ferry.shm.fifo", round_trip_parent, echo_child),
        Case::new("ferry.shm.fifo.oneway", oneway_parent, drain_child),
        Case::new("ferry.shm.signal", signal_parent, signal_child),
        Case::new("ferry.shm.fifo_rpc", fifo_rpc_parent, fifo_rpc_child),
        Case::new("ferry.tcp.fifo_rpc", tcp_fifo_rpc_parent, tcp_fifo_rpc_child),
    ]);
    v
}

fn team(run_id: &str) -> Team {
    Team::builder().runtime_dir(run_dir(run_id)).processors(1).start().expect("start team")
}

/// The other side's fifo (waits for it to be made).
fn open(team: &Team, name: &str) -> FifoRef {
    crate::remote_memory::once_named(name, || team.open_fifo(name, KEY))
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

// --- signals ---------------------------------------------------------------

const SIGNAL: &str = "bench.signal";
const FLAGS: &str = "bench.signal.flags";

fn signal_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = Team::builder().runtime_dir(run_dir(&peer.run_id)).processors(0).start().expect("start team");
    let flags = team.export_with_key(FLAGS, 64, KEY).expect("the parent's flags");
    let signaller = crate::remote_memory::once_named(SIGNAL, || team.signaller(SIGNAL));
    // The first run opens our flags: waited for here, where this thread
    // (our team has no processor) answers the opening.
    team.block_on(signaller.signal_done(&0u64.to_le_bytes())).unwrap();
    let mut v = 0u64;
    let samples = p.measure(p.iters_div(4), |rounds| {
        for _ in 0..rounds {
            v += 1;
            signaller.signal(&v.to_le_bytes()).unwrap();
            peer.spin_until(|| flags.load(0).unwrap() == v);
        }
    });
    signaller.signal(&STOP.to_le_bytes()).unwrap();
    drop(flags);
    team.shutdown();
    samples
}

/// Its handler writes each counter into the parent's flags (opened once).
fn signal_child(ctx: &ChildCtx) {
    let team = team(&ctx.run_id);
    let (stop_tx, stop) = std::sync::mpsc::channel();
    let flags = std::sync::Mutex::new(None::<ferry::memory::RegionRef>);
    let t = team.clone();
    let _handler = team
        .on_signal(SIGNAL, ferry::signal::Mode::EveryTime, move |args| {
            let v = u64::from_le_bytes(args.try_into().expect("8 bytes"));
            if v == STOP {
                let _ = stop_tx.send(());
                return;
            }
            let mut flags = flags.lock().unwrap();
            let r = flags.get_or_insert_with(|| t.open_region(FLAGS, KEY).expect("the parent's flags"));
            r.swap(0, v).unwrap();
        })
        .expect("the handler");
    let _ = stop.recv_timeout(Duration::from_secs(600));
    team.shutdown();
}

// --- RPC over fifos ----------------------------------------------------------

const REQUESTS: &str = "bench.rpc.requests";
const REPLIES: &str = "bench.rpc.replies";

/// The client's calls: a request (a counter) into the server's fifo, the
/// reply out of its own; each call a round trip.
fn fifo_calls(team: &Team, p: &Params, timed_each: bool) -> Vec<f64> {
    let mut replies = team.fifo_with_key(REPLIES, 64, 8, KEY).expect("the client's fifo");
    let mut requests = open(team, REQUESTS);
    let mut v = 0u64;
    let mut call = || {
        v += 1;
        requests.enqueue_timeout(&v.to_le_bytes(), Duration::from_secs(10)).unwrap();
        assert_eq!(replies.dequeue_timeout(Duration::from_secs(10)).unwrap(), v.to_le_bytes());
    };
    let samples = match timed_each {
        true => p.measure_each(crate::tcp::calls(p), call),
        false => p.measure(p.iters_div(4), |rounds| (0..rounds).for_each(|_| call())),
    };
    requests.enqueue_timeout(&STOP.to_le_bytes(), Duration::from_secs(10)).unwrap();
    samples
}

/// The server's loop: each request's reply into the client's fifo.
fn fifo_serve(team: &Team) {
    let mut requests = team.fifo_with_key(REQUESTS, 64, 8, KEY).expect("the server's fifo");
    let mut replies = None;
    loop {
        let request = requests.dequeue_timeout(Duration::from_secs(600)).expect("a request");
        if request == STOP.to_le_bytes() {
            return;
        }
        let replies = replies.get_or_insert_with(|| open(team, REPLIES));
        replies.enqueue_timeout(&request, Duration::from_secs(10)).unwrap();
    }
}

fn fifo_rpc_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id);
    let samples = fifo_calls(&team, p, false);
    team.shutdown();
    samples
}

fn fifo_rpc_child(ctx: &ChildCtx) {
    let team = team(&ctx.run_id);
    fifo_serve(&team);
    team.shutdown();
}

fn tcp_fifo_rpc_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    crate::tcp::client_with_team(peer, false, |_, team| fifo_calls(team, p, true))
}

fn tcp_fifo_rpc_child(ctx: &ChildCtx) {
    crate::tcp::serve_with(ctx, false, |team| {
        let team = team.clone();
        std::thread::spawn(move || fifo_serve(&team))
    })
}
