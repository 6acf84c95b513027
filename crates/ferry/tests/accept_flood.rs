//! A burst of connections to a team's socket (defect 3): the team takes
//! binds without a thread per connection, real binds pass while silent
//! connections wait, and a silent one is closed after the handshake
//! deadline. Alone in its binary: it counts this process's threads, which
//! other tests running alongside would move.

mod common;

use ferry::{Checkpoint, Team};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Binds `peer` to the team's port "echo" and sends one message it acknowledges; returns how long that took.
fn real_bind(peer: &Team) -> Duration {
    let t = Instant::now();
    let echo = peer.connect::<u32>("echo").unwrap();
    echo.send(&7, Checkpoint::OnReceipt).unwrap();
    t.elapsed()
}

/// Regression: each incoming connection got an OS thread of its own for
/// the handshake (`ferry-bind`), so 200 connections that send nothing made
/// 200 threads, each waiting 5 s for a hello.
#[test]
fn a_burst_of_silent_connections_makes_no_threads_and_real_binds_pass() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let port = team.open_named_port::<u32>("echo").unwrap();
    // The binding teams' own threads are there before counting.
    let peers: Vec<Team> = (0..4).map(|_| Team::builder().runtime_dir(dir.path()).start().unwrap()).collect();
    assert!(real_bind(&peers[0]) < Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(100));
    let threads_before = threads();
    let path = team.names().dir().team_socket(team.id().team);
    let connected = Instant::now();
    let mut silent = Vec::new();
    for (i, peer) in peers[1..].iter().enumerate() {
        silent.extend((0..200 / 3 + 1).map(|_| UnixStream::connect(&path).unwrap()));
        let took = real_bind(peer);
        assert!(took < Duration::from_secs(2), "bind {i} took {took:?} behind {} silent connections", silent.len());
    }
    assert!(silent.len() >= 200);
    std::thread::sleep(Duration::from_millis(200));
    let threads_during = threads();
    eprintln!("threads: {threads_before} before, {threads_during} with {} connections waiting", silent.len());
    assert!(threads_during <= threads_before + 2, "{threads_during} threads, {threads_before} before");
    // The silent connections are closed (the team's ends: we read their end
    // of file) once their hello is 5 s late.
    for (i, s) in silent.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap_or_else(|e| panic!("connection {i}: {e}")), 0, "connection {i}: bytes");
    }
    let closed_after = connected.elapsed();
    assert!(closed_after >= Duration::from_millis(4900), "closed after {closed_after:?}, before the deadline");
    assert!(closed_after < Duration::from_secs(9), "closed after {closed_after:?}");
    // Every message arrived; binds still work.
    for _ in 0..4 {
        assert_eq!(port.recv_timeout(Duration::from_secs(2)).unwrap().value, 7);
    }
    let late = Team::builder().runtime_dir(dir.path()).start().unwrap();
    assert!(real_bind(&late) < Duration::from_secs(2));
}
