//! ferry's own ping-pong cases: a port round trip between two teams over
//! shared memory (both sides spinning, or both parked between messages),
//! and between two threads or two tasks of one team; and crossbeam-channel
//! between two threads, what such threads use otherwise.

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::{Checkpoint, RawPort, RawSender, Team};
use std::time::Duration;

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("ferry.shm.spin", spin_parent, spin_child),
        Case::new("ferry.shm.parked", parked_parent, parked_child),
        Case::new("ferry.inproc", inproc_threads, no_child),
        Case::new("ferry.inproc.tasks", inproc_tasks, no_child),
        Case::new("crossbeam.pingpong", crossbeam_threads, no_child),
        Case::new("ferry.shm.oneway", oneway_parent, oneway_child),
    ]
}

/// `ferry.shm.oneway`: 8-byte `Immediate` messages one way, as fast as the
/// receiver takes them (ns per message; `floor.ring.oneway` is its floor).
/// The child counts what it took in the shared region; a round ends when
/// it took all.
fn oneway_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = start_team(&peer.run_id, true);
    let (port, to) = rendezvous(&team, "bench.ping", "bench.pong");
    let taken = peer.shm.atomic_u64(0);
    let msg = [7u8; 8];
    let mut sent = 0u64;
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            // A full ring: wait for room (the receiver keeps taking).
            while let Err(ferry::Error::WouldBlock { .. }) = to.send(&msg, Checkpoint::Immediate) {
                std::hint::spin_loop();
            }
        }
        sent += n as u64;
        peer.spin_until(|| taken.load(std::sync::atomic::Ordering::Acquire) == sent);
    });
    to.send(STOP, Checkpoint::Immediate).unwrap();
    drop(port);
    team.shutdown();
    samples
}

fn oneway_child(ctx: &ChildCtx) {
    let team = start_team(&ctx.run_id, true);
    let (port, _to) = rendezvous(&team, "bench.pong", "bench.ping");
    let taken = ctx.shm.atomic_u64(0);
    let mut n = 0;
    while port.recv_blocking().unwrap().payload() != STOP {
        n += 1;
        taken.store(n, std::sync::atomic::Ordering::Release);
    }
    drop(port);
    team.shutdown();
}

/// `crossbeam.pingpong`: what two threads of one process pay with the
/// channel Rust programs pick for it (crossbeam-channel, one bounded
/// channel each way, blocking receives: they spin, then park), pinned as
/// `ferry.inproc` is.
fn crossbeam_threads(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let (to_b, b) = crossbeam_channel::bounded::<u64>(1);
    let (to_a, a) = crossbeam_channel::bounded::<u64>(1);
    let cpu = peer.child_cpu;
    let echo = std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            crate::pin_current_thread(cpu);
        }
        while let Ok(v) = b.recv() {
            if to_a.send(v).is_err() {
                break;
            }
        }
    });
    let mut v = 0;
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            v += 1;
            to_b.send(v).unwrap();
            assert_eq!(a.recv().unwrap(), v);
        }
    });
    drop(to_b);
    echo.join().unwrap();
    samples
}

const STOP: &[u8] = b"";

fn start_team(run_id: &str, spin: bool) -> Team {
    // No processors: the measuring thread itself drives the channel (spin
    // then park), so nothing else competes for the two cores.
    let b = Team::builder().runtime_dir(run_dir(run_id)).processors(0);
    let b = if spin { b.spin(Duration::from_secs(5)) } else { b.blocking().park_timeout(Duration::from_secs(5)) };
    b.start().expect("start team")
}

/// Opens our port under `mine` and finds the other side's port `theirs`.
fn rendezvous(team: &Team, mine: &str, theirs: &str) -> (RawPort, RawSender) {
    let port = team.open_named_raw_port(mine).expect("open port");
    let to = team
        .lookup_wait(theirs, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("peer never registered {theirs}: {e}"));
    (port, team.raw_sender(to))
}

fn parent(peer: &mut Peer, p: &Params, spin: bool) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = start_team(&peer.run_id, spin);
    let (port, to) = rendezvous(&team, "bench.ping", "bench.pong");
    let msg = [7u8; 8];
    let iters = if spin { p.iters } else { p.iters_div(10) };
    let samples = p.measure(iters, |n| {
        for _ in 0..n {
            to.send(&msg, Checkpoint::Immediate).unwrap();
            port.recv_blocking().unwrap();
        }
    });
    to.send(STOP, Checkpoint::Immediate).unwrap();
    drop(port);
    team.shutdown();
    samples
}

fn child(ctx: &ChildCtx, spin: bool) {
    let team = start_team(&ctx.run_id, spin);
    let (port, to) = rendezvous(&team, "bench.pong", "bench.ping");
    loop {
        let m = port.recv_blocking().unwrap();
        if m.payload() == STOP {
            break;
        }
        to.send(m.payload(), Checkpoint::Immediate).unwrap();
    }
    drop(port);
    team.shutdown();
}

fn spin_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    parent(peer, p, true)
}
fn spin_child(ctx: &ChildCtx) {
    child(ctx, true)
}
fn parked_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    parent(peer, p, false)
}
fn parked_child(ctx: &ChildCtx) {
    child(ctx, false)
}
fn no_child(_: &ChildCtx) {}

/// Two threads of one team, each blocked in a receive, bounce a message.
fn inproc_threads(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team =
        Team::builder().runtime_dir(run_dir(&peer.run_id)).processors(0).spin(Duration::from_secs(5)).start().unwrap();
    let (a, b) = (team.open_raw_port().unwrap(), team.open_raw_port().unwrap());
    let (to_a, to_b) = (team.raw_sender(a.id()), team.raw_sender(b.id()));
    let cpu = peer.child_cpu;
    let echo = std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            crate::pin_current_thread(cpu);
        }
        loop {
            let m = b.recv_blocking().unwrap();
            if m.payload() == STOP {
                break;
            }
            to_a.send(m.payload(), Checkpoint::Immediate).unwrap();
        }
    });
    let msg = [7u8; 8];
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            to_b.send(&msg, Checkpoint::Immediate).unwrap();
            a.recv_blocking().unwrap();
        }
    });
    to_b.send(STOP, Checkpoint::Immediate).unwrap();
    echo.join().unwrap();
    team.shutdown();
    samples
}

/// Two tasks on one processor bounce a message: pure task hand-off.
fn inproc_tasks(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team =
        Team::builder().runtime_dir(run_dir(&peer.run_id)).processors(1).spin(Duration::from_secs(5)).start().unwrap();
    let (a, b) = (team.open_raw_port().unwrap(), team.open_raw_port().unwrap());
    let (to_a, to_b) = (team.raw_sender(a.id()), team.raw_sender(b.id()));
    let echo = team.spawn(async move {
        loop {
            let m = b.recv().await.unwrap();
            if m.payload() == STOP {
                break;
            }
            to_a.send_async(m.payload(), Checkpoint::Immediate).await.unwrap();
        }
    });
    let a = std::sync::Arc::new(a);
    // Each round is one task on the processor, beside the echo task; this
    // thread only waits for the round's end (in the kernel, once a round).
    let samples = p.measure(p.iters, |n| {
        let (a, to_b) = (a.clone(), to_b.clone());
        let (done, wait) = std::sync::mpsc::channel();
        team.spawn(async move {
            let msg = [7u8; 8];
            for _ in 0..n {
                to_b.send_async(&msg, Checkpoint::Immediate).await.unwrap();
                a.recv().await.unwrap();
            }
            done.send(()).unwrap();
        });
        wait.recv().unwrap();
    });
    to_b.send(STOP, Checkpoint::Immediate).unwrap();
    team.block_on(echo).unwrap();
    team.shutdown();
    samples
}
