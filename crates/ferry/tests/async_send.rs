//! Async sends never block their caller's thread: waiting for room and the
//! first bind to a team are awaited. Each test runs a tokio runtime on one
//! thread, so a send that blocked its worker would stop every other task
//! on it: a ticker task counts how often it ran while a send waited.

use ferry::{Checkpoint, Error, RawPort, RawSender, Team, TeamBuilder, TeamId};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(10);
/// Longest a send may take to return its future.
const AT_ONCE: Duration = Duration::from_millis(100);

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

/// A task counting the milliseconds it got to run (inside a runtime).
struct Ticker(Arc<AtomicU64>, tokio::task::JoinHandle<()>);

impl Ticker {
    fn start() -> Ticker {
        let ticks = Arc::new(AtomicU64::new(0));
        let t = ticks.clone();
        Ticker(
            ticks,
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    t.fetch_add(1, Ordering::Relaxed);
                }
            }),
        )
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.1.abort();
    }
}

/// A sending team (it binds, so its 4 KiB ring is the channel's) and a
/// receiving team whose port takes one message and holds one more: past
/// that, the channel fills and stays full until the port is received from.
fn teams(dir: &Path, tx: impl FnOnce(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    let sender = tx(Team::builder().runtime_dir(dir).ring_bytes(4096)).start().unwrap();
    let receiver = Team::builder().runtime_dir(dir).inbox_capacity(1).hold_capacity(1).start().unwrap();
    (sender, receiver)
}

/// Message `i`: its number, then `len - 8` bytes of it.
fn msg(i: u64, len: usize) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.resize(len.max(8), i as u8);
    v
}

fn number(m: &[u8]) -> u64 {
    u64::from_le_bytes(m[..8].try_into().unwrap())
}

/// `got` holds messages 0, 1, 2... of `len` bytes, whole and in order.
fn assert_in_order(got: &[Vec<u8>], len: usize) {
    for (i, m) in got.iter().enumerate() {
        assert!(*m == msg(i as u64, len), "message {i} arrived out of order or damaged (number {})", number(m));
    }
}

/// Sends `Immediate` messages of `len` bytes numbered from `next` until the
/// channel is full (ring, or the sender's payload area for large ones).
fn fill(s: &RawSender, next: &mut u64, len: usize) {
    for _ in 0..2 {
        loop {
            match s.send(&msg(*next, len), Checkpoint::Immediate) {
                Ok(_) => *next += 1,
                Err(Error::WouldBlock { .. }) => break,
                Err(e) => panic!("filling: {e}"),
            }
            assert!(*next < 10_000, "the channel never filled");
        }
        // The receiver takes what its inbox and hold queue allow: fill that room too.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Receives `n` messages on a thread of its own; returns them.
fn drain(port: RawPort, n: u64) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    std::thread::spawn(move || (0..n).map(|_| port.recv_timeout(PATIENCE).unwrap().into_payload()).collect())
}

/// Async sends of `len`-byte messages on a full channel: each future comes
/// back at once and waits while the tokio thread keeps running other tasks;
/// once the receiver drains, they complete, every message in order.
fn sends_waiting_for_room(len: usize, tx: impl FnOnce(TeamBuilder) -> TeamBuilder) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(dir.path(), tx);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id()).with_timeout(PATIENCE);
    let mut next = 0;
    fill(&s, &mut next, len);
    let last = next + 8;
    let got = tokio_runtime().block_on(async {
        let ticker = Ticker::start();
        let t0 = Instant::now();
        let sends: Vec<_> = (next..last).map(|i| s.send_async(&msg(i, len), Checkpoint::OnReceipt)).collect();
        assert!(t0.elapsed() < AT_ONCE, "sending took {:?}: a send waited on the tokio thread", t0.elapsed());
        let waiting = tokio::spawn(async move {
            for d in sends {
                d.await.unwrap();
            }
        });
        let ticks = ticker.now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "the sends completed with the channel full");
        let ran = ticker.now() - ticks;
        assert!(ran >= 20, "the other task ran {ran} times in 200 ms while the sends waited");
        let drained = drain(port, last);
        tokio::time::timeout(PATIENCE, waiting).await.expect("the sends never completed").unwrap();
        drained.join().unwrap()
    });
    assert_eq!(got.len() as u64, last);
    assert_in_order(&got, len);
}

/// (a) Small messages: the sender's ring is full.
#[test]
fn a_send_waiting_for_ring_room_leaves_the_tokio_thread_free() {
    sends_waiting_for_room(100, |b| b);
}

/// (b) Large messages (out of band): the sender's payload area (64 KiB,
/// from its `max_message`) is lent to the receiver in full.
#[test]
fn a_large_send_waiting_for_payload_area_room_leaves_the_tokio_thread_free() {
    sends_waiting_for_room(16 << 10, |b| b.max_message(64 << 10));
}

/// Stands in front of a team's bind socket (moved aside): accepts a
/// connection, waits `delay`, then passes the bind's hello and welcome
/// (with their descriptors) through, and keeps both sockets open (their
/// hang-up would tell the teams the other one died).
struct SlowRelay {
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SlowRelay {
    fn start(at: &Path, real: PathBuf, delay: Duration) -> SlowRelay {
        let listener = UnixListener::bind(at).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (accepted, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut kept = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                a.fetch_add(1, Ordering::SeqCst);
                down.set_nonblocking(false).unwrap();
                std::thread::sleep(delay);
                let up = UnixStream::connect(&real).unwrap();
                pass(&down, &up);
                pass(&up, &down);
                kept.push((down, up));
            }
        });
        SlowRelay { accepted, stop, thread: Some(thread) }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SlowRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.take().unwrap().join();
    }
}

/// Passes one message, with the descriptors it carries, from `from` to `to`.
fn pass(from: &UnixStream, to: &UnixStream) {
    use rustix::net::{
        recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
        SendAncillaryMessage, SendFlags,
    };
    use std::io::{IoSlice, IoSliceMut};
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;
    let mut buf = [0u8; 256];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let n = recvmsg(from, &mut [IoSliceMut::new(&mut buf)], &mut cmsg, RecvFlags::CMSG_CLOEXEC).unwrap().bytes;
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    assert!(cmsg.push(SendAncillaryMessage::ScmRights(&borrowed)));
    sendmsg(to, &[IoSlice::new(&buf[..n])], &mut cmsg, SendFlags::NOSIGNAL).unwrap();
}

/// (c) The first sends to a team whose bind takes 300 ms (a relay holds
/// the handshake up) come back at once, from two senders; the tokio thread
/// keeps running meanwhile; they share one bind and arrive in order.
#[test]
fn the_first_sends_to_a_slow_binding_team_leave_the_tokio_thread_free() {
    let dir = tempfile::tempdir().unwrap();
    let tx = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let rx = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let socket = rx.names().dir().team_socket(rx.id().team);
    let moved = dir.path().join("moved.sock");
    std::fs::rename(&socket, &moved).unwrap();
    let relay = SlowRelay::start(&socket, moved, Duration::from_millis(300));
    tokio_runtime().block_on(async {
        let ticker = Ticker::start();
        let t0 = Instant::now();
        let (s1, s2) = (tx.raw_sender(port.id()), tx.raw_sender(port.id()));
        let sends = vec![
            s1.send_async(&msg(0, 8), Checkpoint::OnReceipt),
            s2.send_async(&msg(1, 8), Checkpoint::OnReceipt),
            s1.send_async(&msg(2, 8), Checkpoint::Immediate),
            s2.send_async(&msg(3, 100 << 10), Checkpoint::OnReceipt),
        ];
        assert!(t0.elapsed() < AT_ONCE, "sending took {:?}: the bind ran on the tokio thread", t0.elapsed());
        let ticks = ticker.now();
        let all = tokio::spawn(async move {
            for d in sends {
                d.await.unwrap();
            }
        });
        tokio::time::timeout(PATIENCE, all).await.expect("the sends never completed").unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300), "the bind was not slow");
        let ran = ticker.now() - ticks;
        assert!(ran >= 30, "the other task ran {ran} times in {:?} while the sends waited", t0.elapsed());
    });
    assert_eq!(relay.accepted(), 1, "the first sends did not share one bind");
    let got: Vec<u64> = drain(port, 4).join().unwrap().iter().map(|m| number(m)).collect();
    assert_eq!(got, [0, 1, 2, 3]);
}

/// A bind that fails fails every send that waited for it, with the bind's
/// error, and was made once.
#[test]
fn a_failed_bind_fails_every_send_that_waited_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let tx = Team::builder().runtime_dir(dir.path()).start().unwrap();
    // A team number no team has (above every pid and every extra team of a
    // process), whose socket accepts and then closes without a word.
    let nobody = TeamId { node: tx.id().node, team: ferry::id::MAX_TEAM - 7, incarnation: 1 };
    let listener = UnixListener::bind(tx.names().dir().team_socket(nobody.team)).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let a = accepted.clone();
    let acceptor = std::thread::spawn(move || {
        let (c, _) = listener.accept().unwrap();
        a.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        drop(c);
        listener.set_nonblocking(true).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        while listener.accept().is_ok() {
            a.fetch_add(1, Ordering::SeqCst);
        }
    });
    let to = nobody.endpoint(1).unwrap();
    let results = tokio_runtime().block_on(async {
        let t0 = Instant::now();
        let sends: Vec<_> = (0..3).map(|i| tx.raw_sender(to).send_async(&msg(i, 8), Checkpoint::OnReceipt)).collect();
        assert!(t0.elapsed() < AT_ONCE, "sending took {:?}: the bind ran on the tokio thread", t0.elapsed());
        let mut results = Vec::new();
        for d in sends {
            results.push(tokio::time::timeout(PATIENCE, d).await.expect("a send never failed"));
        }
        results
    });
    for r in results {
        assert!(matches!(r, Err(Error::NoSuchTeam(t)) if t == nobody), "got {r:?}");
    }
    acceptor.join().unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the sends did not share one bind");
}

/// (d) An async `Immediate` send on a full channel fails with `WouldBlock`
/// at once, whether the channel's ring is full or other sends wait for
/// room there (it never overtakes them); and it is never sent.
#[test]
fn an_async_immediate_send_on_a_full_channel_would_block_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(dir.path(), |b| b);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id()).with_timeout(PATIENCE);
    let mut next = 0;
    fill(&s, &mut next, 100);
    let filled = next;
    let got = tokio_runtime().block_on(async {
        let t0 = Instant::now();
        let mut d = s.send_async(&msg(u64::MAX, 100), Checkpoint::Immediate);
        assert!(matches!(d.take_ready(), Some(Err(Error::WouldBlock { .. }))), "the ring is full");
        let waits = s.send_async(&msg(filled, 100), Checkpoint::OnReceipt);
        let mut d = s.send_async(&msg(u64::MAX, 100), Checkpoint::Immediate);
        assert!(matches!(d.take_ready(), Some(Err(Error::WouldBlock { .. }))), "a send waits for room before it");
        assert!(t0.elapsed() < AT_ONCE, "took {:?}", t0.elapsed());
        let drained = drain(port, filled + 1);
        tokio::time::timeout(PATIENCE, waits).await.expect("the waiting send never completed").unwrap();
        drained.join().unwrap()
    });
    let got: Vec<u64> = got.iter().map(|m| number(m)).collect();
    assert_eq!(got, (0..=filled).collect::<Vec<_>>());
}

/// (e) An async send waiting for room fails with `DeadlineExceeded` at its
/// deadline (the tokio thread running meanwhile), and is never sent.
#[test]
fn an_async_send_waiting_for_room_fails_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(dir.path(), |b| b);
    let port = rx.open_raw_port().unwrap();
    let limit = Duration::from_millis(300);
    let s = tx.raw_sender(port.id()).with_timeout(limit);
    let mut next = 0;
    fill(&s, &mut next, 100);
    tokio_runtime().block_on(async {
        let ticker = Ticker::start();
        let t0 = Instant::now();
        let d = s.send_async(&msg(next, 100), Checkpoint::OnReceipt);
        assert!(t0.elapsed() < AT_ONCE, "sending took {:?}: the send waited on the tokio thread", t0.elapsed());
        let ticks = ticker.now();
        let r = tokio::time::timeout(PATIENCE, d).await.expect("the deadline never came");
        let took = t0.elapsed();
        assert!(matches!(r, Err(Error::DeadlineExceeded)), "got {r:?}");
        assert!(took >= limit && took < limit + Duration::from_secs(2), "failed after {took:?}");
        let ran = ticker.now() - ticks;
        assert!(ran >= 30, "the other task ran {ran} times in {took:?} while the send waited");
    });
    let got: Vec<u64> = (0..next).map(|_| number(port.recv_timeout(PATIENCE).unwrap().payload())).collect();
    assert_eq!(got, (0..next).collect::<Vec<_>>());
    // The expired message was withdrawn: nothing follows the others.
    let r = port.recv_timeout(Duration::from_millis(200));
    assert!(matches!(r, Err(Error::DeadlineExceeded)), "got message {:?}", r.map(|m| number(m.payload())));
}

/// A blocking send made while an earlier async send of the same sender
/// waits for room (a future nobody polls) sends that one first, then its
/// own: neither overtakes nor waits for the future's owner. For a large
/// message, the blocking send copies the waiting one out of band itself.
fn blocking_send_behind_an_unpolled_waiting_send(len: usize, tx: impl FnOnce(TeamBuilder) -> TeamBuilder) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(dir.path(), tx);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id()).with_timeout(PATIENCE);
    let mut next = 0;
    fill(&s, &mut next, len);
    let waiting = s.send_async(&msg(next, len), Checkpoint::OnReceipt);
    let drained = drain(port, next + 2);
    s.send(&msg(next + 1, len), Checkpoint::OnReceipt).unwrap();
    tx.block_on(waiting).unwrap();
    let got = drained.join().unwrap();
    assert_in_order(&got, len);
}

#[test]
fn a_blocking_send_goes_behind_an_unpolled_waiting_send() {
    blocking_send_behind_an_unpolled_waiting_send(100, |b| b);
}

#[test]
fn a_blocking_send_stages_an_unpolled_waiting_large_send_first() {
    blocking_send_behind_an_unpolled_waiting_send(16 << 10, |b| b.max_message(64 << 10));
}

/// Dropping an async send that waits for room withdraws its message.
#[test]
fn dropping_a_waiting_send_withdraws_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(dir.path(), |b| b);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id()).with_timeout(PATIENCE);
    let mut next = 0;
    fill(&s, &mut next, 100);
    drop(s.send_async(&msg(u64::MAX, 100), Checkpoint::OnReceipt));
    let after = s.send_async(&msg(next, 100), Checkpoint::OnReceipt);
    let drained = drain(port, next + 1);
    tx.block_on(after).unwrap();
    let got: Vec<u64> = drained.join().unwrap().iter().map(|m| number(m)).collect();
    assert_eq!(got, (0..=next).collect::<Vec<_>>());
}

#[ferry::service]
pub trait Adder {
    async fn add(&self, a: i32, b: i32) -> i32;
}

struct AdderImpl;

impl Adder for AdderImpl {
    async fn add(&self, a: i32, b: i32) -> i32 {
        a + b
    }
}

/// RPC, the same way: connecting a client to a team whose bind takes
/// 300 ms, then a promise, leave the tokio thread free.
#[test]
fn an_rpc_client_connecting_to_a_slow_binding_team_leaves_the_tokio_thread_free() {
    let dir = tempfile::tempdir().unwrap();
    let tx = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let rx = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let _serving = AdderServer::serve(&rx, "adder", AdderImpl).unwrap();
    let endpoint = tx.lookup("adder").unwrap();
    let socket = rx.names().dir().team_socket(rx.id().team);
    let moved = dir.path().join("moved.sock");
    std::fs::rename(&socket, &moved).unwrap();
    let _relay = SlowRelay::start(&socket, moved, Duration::from_millis(300));
    tokio_runtime().block_on(async {
        let ticker = Ticker::start();
        let t0 = Instant::now();
        let ticks = ticker.now();
        let adder = tokio::time::timeout(PATIENCE, AdderClient::connect(&tx, endpoint)).await.unwrap().unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300), "the bind was not slow");
        let ran = ticker.now() - ticks;
        assert!(ran >= 30, "the other task ran {ran} times in {:?} while the client connected", t0.elapsed());
        assert_eq!(tokio::time::timeout(PATIENCE, adder.add(2, 3)).await.unwrap().unwrap(), 5);
    });
}
