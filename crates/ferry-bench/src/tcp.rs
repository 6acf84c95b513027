//! The TCP suite (`ferry bench tcp`): calls between two nodes, the child
//! being the server. `scripts/bench.sh tcp` runs it across two network
//! namespaces (parent in one, child in the other, through a bridge); run
//! plainly, both ends are on loopback.
//!
//! The latency cases (every one below but the pipelined case and the
//! 64 MiB echoes) time each call on its own ([`Params::measure_each`]),
//! 5,000 calls per pass by default (`--iters` / 4): their figures are
//! per-call p50 and p99. Like every case, they run pinned (parent and
//! child on a CPU each) unless named `.unpinned`.
//!
//! - `floor.tcp`: a blocking TCP ping-pong of 48 bytes each way (what a
//!   null call puts on the wire: a 40-byte frame header and a small body),
//!   `TCP_NODELAY`: what the hardware and kernel cost per round trip.
//! - `floor.tcp.spin`: the same ping-pong with both ends busy-polling
//!   non-blocking sockets (no wake-ups): the floor of a busy-poll mode.
//! - `floor.tcp.unpinned`: `floor.tcp` with both processes free to move
//!   between CPUs.
//! - `ferry.tcp.{null,arg1024}`: a ferry client team (node 1) calling a
//!   server team (node 2) over TCP, default mode (spin 20 µs, then park),
//!   blocking API from the parent's thread.
//! - `ferry.tcp.null.unpinned`: `ferry.tcp.null` with both processes free
//!   to move (beside `floor.tcp.unpinned`).
//! - `ferry.tcp.busypoll.null`: both teams in busy-poll mode
//!   (`TeamBuilder::busy_poll`, and the server's processor spinning): they
//!   never park while a call is out, polling the socket (beside
//!   `floor.tcp.spin`).
//! - `ferry.tcp.pipelined`: 32 calls in flight on one connection; the
//!   figure is ns per call (calls/s = 10^9 / it).
//! - `floor.tcp.echo.64MiB`: a raw store-and-forward echo over a plain TCP
//!   connection: the client writes 64 MiB, the server reads the whole
//!   message into a buffer, then writes it back; the figure is the round
//!   trip (bandwidth: 2 × 64 MiB / it).
//! - `ferry.tcp.echo.64MiB`: the typed RPC echo as a new user writes it
//!   (`async fn echo(&self, data: ByteBuf) -> ByteBuf`, default settings, a
//!   fresh value each call, made outside the timed part); the report gives
//!   its bandwidth's ratio to the floor's (target ≥ 0.70) and the server's
//!   memory: its `VmHWM` minus its `VmRSS` just before the first echo,
//!   minus the 64 MiB it holds itself (the argument it returns), in MiB and
//!   as a multiple of the message (target ≤ 1.0).
//! - `ferry.tcp.echo.vec.64MiB`: the same with a `Vec<u8>` argument and
//!   result, and its ratio to the `ByteBuf` one.
//! - `ferry.tcp.echo.bytes.64MiB`: the same with `ferry::Bytes`, which the
//!   receiver decodes as a view of the buffer the frame was read into (no
//!   decode copy), and its ratio to the floor.
//! - `zmq.tcp.null` (feature `zmq`): ZeroMQ REQ/REP over `tcp://`.
//! - `tonic.tcp.null` (feature `tonic`): a tonic gRPC unary call over TCP.
//! - `tarpc.tcp.null` (feature `tarpc`): a tarpc call over its TCP transport.
//!
//! Addresses: `$FERRY_BENCH_TCP_PARENT` and `$FERRY_BENCH_TCP_CHILD`
//! (default 127.0.0.1 both).

use crate::ferry_rpc::{BenchClient, BenchImpl, BenchServer};
use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::{Cluster, Team};
use serde_bytes::ByteBuf;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bytes each way of the floor's ping-pong.
const FLOOR_BYTES: usize = 48;
/// Bytes of the large echoes.
const ECHO_BYTES: usize = 64 << 20;
/// Calls in flight in `ferry.tcp.pipelined`.
const IN_FLIGHT: usize = 32;
const KEY: &[u8] = b"ferry bench tcp: the cluster's key";

/// Calls a latency case times one by one per pass: 5,000 by default.
pub(crate) fn calls(p: &Params) -> usize {
    p.iters_div(4)
}

fn ip(var: &str) -> IpAddr {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

fn parent_ip() -> IpAddr {
    ip("FERRY_BENCH_TCP_PARENT")
}

pub(crate) fn child_ip() -> IpAddr {
    ip("FERRY_BENCH_TCP_CHILD")
}

/// A free port on `ip` (bound and released).
fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

/// Sends a line to the other side over the harness socket.
pub(crate) fn tell(sock: &std::os::unix::net::UnixStream, line: &str) {
    let mut s = sock;
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
}

/// Reads a line from the other side over the harness socket.
pub(crate) fn hear(sock: &std::os::unix::net::UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    let mut s = sock;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}

// ------------------------------------------------------------ floor.tcp

/// The raw floors' connection, parent side: to the address the child tells
/// (`TCP_NODELAY`, as ferry's).
fn dial(peer: &Peer) -> TcpStream {
    let addr: SocketAddr = hear(&peer.sock).parse().unwrap();
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// The raw floors' connection, child side: tells the parent where to
/// dial and takes its one connection.
fn accept_one(ctx: &ChildCtx) -> TcpStream {
    let l = TcpListener::bind((child_ip(), 0)).unwrap();
    tell(&ctx.sock, &l.local_addr().unwrap().to_string());
    let (s, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn floor_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let mut s = dial(peer);
    let (out, mut back) = ([7u8; FLOOR_BYTES], [0u8; FLOOR_BYTES]);
    let samples = p.measure_each(calls(p), || {
        s.write_all(&out).unwrap();
        s.read_exact(&mut back).unwrap();
    });
    drop(s);
    samples
}

fn floor_child(ctx: &ChildCtx) {
    let mut s = accept_one(ctx);
    let mut buf = [0u8; FLOOR_BYTES];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(&buf).unwrap();
    }
}

// ------------------------------------------------------------ floor.tcp.spin
// As floor.tcp, both ends polling non-blocking sockets until the message is
// there: no end ever sleeps, so no wake-up is paid.

fn spin_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let mut s = dial(peer);
    s.set_nonblocking(true).unwrap();
    let (out, mut back) = ([7u8; FLOOR_BYTES], [0u8; FLOOR_BYTES]);
    let samples = p.measure_each(calls(p), || {
        write_polling(&mut s, &out);
        let mut got = 0;
        // spin_until: fails the case, not hangs it, if the child is gone.
        peer.spin_until(|| {
            got += read_now(&mut s, &mut back[got..]).expect("floor.tcp.spin: the child closed the connection");
            got == FLOOR_BYTES
        });
    });
    drop(s);
    samples
}

fn spin_child(ctx: &ChildCtx) {
    let mut s = accept_one(ctx);
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; FLOOR_BYTES];
    loop {
        let mut got = 0;
        while got < FLOOR_BYTES {
            match read_now(&mut s, &mut buf[got..]) {
                Some(n) => got += n,
                None => return, // the parent closed: done
            }
        }
        write_polling(&mut s, &buf);
    }
}

/// Reads what the socket holds without waiting: the bytes read (0 if none
/// yet), `None` at the end of the stream.
fn read_now(s: &mut TcpStream, buf: &mut [u8]) -> Option<usize> {
    match s.read(buf) {
        Ok(0) => None,
        Ok(n) => Some(n),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Some(0),
        Err(e) => panic!("read: {e}"),
    }
}

/// Writes all of `buf` to a non-blocking socket, retrying while it is full.
fn write_polling(s: &mut TcpStream, buf: &[u8]) {
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => panic!("write: {e}"),
        }
    }
}

// ------------------------------------------------------------ floor.tcp.echo

fn floor_echo_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let mut s = dial(peer);
    let mut back = vec![0u8; ECHO_BYTES];
    let samples = echo_rounds(p, p.rounds, |round| {
        let out = vec![round as u8; ECHO_BYTES];
        let t0 = std::time::Instant::now();
        // The server writes only once it read it all: no deadlock.
        s.write_all(&out).unwrap();
        s.read_exact(&mut back).unwrap();
        let ns = t0.elapsed().as_nanos() as f64;
        assert!(back == out, "the floor's echo came back altered");
        ns
    });
    drop(s);
    samples
}

fn floor_echo_child(ctx: &ChildCtx) {
    let mut s = accept_one(ctx);
    let mut buf = vec![0u8; ECHO_BYTES];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(&buf).unwrap();
    }
}

/// `warmup` untimed rounds, then `rounds` timed ones: `round(i)` makes its
/// value, times one echo and checks it, returning the ns of the echo.
fn echo_rounds(p: &Params, rounds: usize, mut round: impl FnMut(usize) -> f64) -> Vec<f64> {
    for i in 0..p.warmup.min(2) {
        round(i);
    }
    (0..rounds).map(|i| round(i + 2)).collect()
}

// ------------------------------------------------------------ ferry.tcp.echo

/// The large echoes' service, as a new user writes it.
#[ferry::service]
pub trait LargeEcho {
    async fn echo(&self, data: ByteBuf) -> ByteBuf;
    async fn echo_vec(&self, data: Vec<u8>) -> Vec<u8>;
    async fn echo_bytes(&self, data: ferry::Bytes) -> ferry::Bytes;
    /// Takes the server's size (`VmRSS`) before the first echo.
    async fn mark(&self);
    async fn stop(&self);
}

struct LargeEchoImpl {
    stopped: Arc<AtomicBool>,
    /// Its `VmRSS` when marked, in bytes.
    before: Arc<std::sync::atomic::AtomicU64>,
}

impl LargeEcho for LargeEchoImpl {
    async fn echo(&self, data: ByteBuf) -> ByteBuf {
        data
    }
    async fn echo_vec(&self, data: Vec<u8>) -> Vec<u8> {
        data
    }
    async fn echo_bytes(&self, data: ferry::Bytes) -> ferry::Bytes {
        data
    }
    async fn mark(&self) {
        self.before.store(status_bytes("VmRSS:"), Ordering::SeqCst);
    }
    async fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// The echo servers' memory, as their children told it: (case, bytes
/// their peak passed their size before the first echo by, less the
/// message they hold).
static SERVER_MEMORY: std::sync::Mutex<Vec<(&'static str, f64)>> = std::sync::Mutex::new(Vec::new());

/// A `/proc/self/status` field, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

/// The echo server: as `serve`, with the large echoes' service; tells the
/// parent, once stopped, its `VmHWM` and its `VmRSS` before the first echo
/// (bound, connected, its first calls served: what is left is the echoes').
fn echo_child(ctx: &ChildCtx) {
    let _dir = RemoveDir(run_dir(&format!("{}-2", ctx.run_id)));
    let theirs: u16 = hear(&ctx.sock).parse().unwrap();
    let ours = free_port(child_ip());
    let team = team(&ctx.run_id, 2, (theirs, ours), false, 1);
    let stopped = Arc::new(AtomicBool::new(false));
    let before = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let service = LargeEchoImpl { stopped: stopped.clone(), before: before.clone() };
    let _serving = LargeEchoServer::serve(&team, "bench.echo", service).unwrap();
    tell(&ctx.sock, &format!("{ours} {}", team.lookup("bench.echo").unwrap()));
    while !stopped.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    tell(&ctx.sock, &format!("{} {}", status_bytes("VmHWM:"), before.load(Ordering::SeqCst)));
    team.shutdown();
}

/// The echo client: as `client_with_team`, with the large echoes' service;
/// records the server's memory under `case`.
fn echo_parent(peer: &mut Peer, case: &'static str, measure: impl FnOnce(&LargeEchoClient) -> Vec<f64>) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&format!("{}-1", peer.run_id)));
    let ours = free_port(parent_ip());
    tell(&peer.sock, &ours.to_string());
    let answer = hear(&peer.sock);
    let (theirs, ep) = answer.split_once(' ').expect("port and endpoint");
    let team = team(&peer.run_id, 1, (ours, theirs.parse().unwrap()), false, 0);
    let c = LargeEchoClient::bind_to(&team, ep.parse().unwrap()).expect("bind over TCP");
    c.mark_blocking().unwrap();
    let samples = measure(&c);
    c.stop_blocking().unwrap();
    let memory = hear(&peer.sock);
    let (hwm, before) = memory.split_once(' ').expect("peak and size before");
    let (hwm, before): (f64, f64) = (hwm.parse().unwrap(), before.parse().unwrap());
    SERVER_MEMORY.lock().unwrap().push((case, hwm - before - ECHO_BYTES as f64));
    drop(c);
    team.shutdown();
    samples
}

fn echo_bytebuf_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    echo_parent(peer, "ferry.tcp.echo.64MiB", |c| timed_echoes(p, c, ByteBuf::from, LargeEchoClient::echo_blocking))
}

fn echo_vec_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    echo_parent(peer, "ferry.tcp.echo.vec.64MiB", |c| timed_echoes(p, c, |v| v, LargeEchoClient::echo_vec_blocking))
}

/// The echo of a `ferry::Bytes`: received over TCP, it is a view of the
/// buffer the frame was read into (no decode copy on either side).
fn echo_bytes_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    echo_parent(peer, "ferry.tcp.echo.bytes.64MiB", |c| {
        timed_echoes(p, c, ferry::Bytes::from, LargeEchoClient::echo_bytes_blocking)
    })
}

/// Echoes of a fresh value each round (`make` of the round's bytes, made
/// outside the timed part), each checked on its way back.
fn timed_echoes<V, R: AsRef<[u8]>, E: std::fmt::Debug>(
    p: &Params,
    c: &LargeEchoClient,
    make: impl Fn(Vec<u8>) -> V,
    echo: impl Fn(&LargeEchoClient, V) -> Result<R, E>,
) -> Vec<f64> {
    echo_rounds(p, p.rounds, |round| {
        let data = make(vec![round as u8; ECHO_BYTES]);
        let t0 = std::time::Instant::now();
        let back = echo(c, data).unwrap();
        let ns = t0.elapsed().as_nanos() as f64;
        let back = back.as_ref();
        assert!(back.len() == ECHO_BYTES && back.iter().all(|&b| b == round as u8), "the echo came back altered");
        ns
    })
}

/// The large echoes' figures for the report: bandwidths, the ratio to the
/// floor and the server's memory, with their targets.
pub fn large_echo_report(report: &crate::Report) -> Option<serde_json::Value> {
    let median = |name: &str| report.get(name).map(|r| r.stats.median);
    let gbps = |ns: f64| 2.0 * ECHO_BYTES as f64 / ns;
    let floor = median("floor.tcp.echo.64MiB");
    let ferry = median("ferry.tcp.echo.64MiB");
    let vec = median("ferry.tcp.echo.vec.64MiB");
    let bytes = median("ferry.tcp.echo.bytes.64MiB");
    if floor.is_none() && ferry.is_none() && vec.is_none() && bytes.is_none() {
        return None;
    }
    let memory = SERVER_MEMORY.lock().unwrap();
    let mem_of = |case: &str| -> Option<f64> {
        let mut v: Vec<f64> = memory.iter().filter(|(c, _)| *c == case).map(|&(_, b)| b).collect();
        v.sort_by(f64::total_cmp);
        v.last().copied()
    };
    let ratio = floor.zip(ferry).map(|(f, t)| f / t);
    let mem = mem_of("ferry.tcp.echo.64MiB");
    let x = mem.map(|m| m / ECHO_BYTES as f64);
    Some(serde_json::json!({
        "message_mib": ECHO_BYTES >> 20,
        "floor_gbps": floor.map(gbps),
        "ferry_gbps": ferry.map(gbps),
        "ferry_vs_floor": ratio,
        "target": 0.70,
        "met": ratio.map(|r| r >= 0.70),
        "vec_gbps": vec.map(gbps),
        "vec_vs_bytebuf": vec.zip(ferry).map(|(v, f)| f / v),
        // ferry::Bytes, a view of the received buffer: no decode copy.
        "bytes_gbps": bytes.map(gbps),
        "bytes_vs_floor": floor.zip(bytes).map(|(f, b)| f / b),
        "bytes_met": floor.zip(bytes).map(|(f, b)| f / b >= 0.70),
        // The most over the passes: peak less size before the first echo, less the message it holds.
        "server_extra_mib": mem.map(|m| m / (1 << 20) as f64),
        "server_extra_x_message": x,
        "server_target_x": 1.0,
        "server_met": x.map(|x| x <= 1.0),
        "server_extra_mib_vec": mem_of("ferry.tcp.echo.vec.64MiB").map(|m| m / (1 << 20) as f64),
    }))
}

// ------------------------------------------------------------ ferry.tcp.*

/// The two nodes' cluster: the parent is node 1, the child node 2.
fn cluster(node: u16, ports: (u16, u16)) -> Cluster {
    let a = SocketAddr::new(parent_ip(), ports.0);
    let b = SocketAddr::new(child_ip(), ports.1);
    let (listen, peer) = if node == 1 { (a, (2, b)) } else { (b, (1, a)) };
    Cluster {
        node,
        listen,
        peers: [peer].into_iter().collect(),
        key: Arc::from(KEY),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    }
}

fn team(run_id: &str, node: u16, ports: (u16, u16), busy: bool, processors: usize) -> Team {
    let b = Team::builder().runtime_dir(run_dir(&format!("{run_id}-{node}"))).processors(processors);
    // Busy-poll: the client's waits never park, the server's processor spins.
    let b = if busy { b.busy_poll().spin(Duration::from_secs(5)) } else { b };
    b.cluster(cluster(node, ports)).start().expect("start team")
}

/// Node 1 of a two-node cluster with the child (node 2, [`child_node`]):
/// the two sides trade their listening ports over the harness socket.
/// Removes its runtime dir when dropped with the guard.
pub(crate) fn parent_node(peer: &Peer, busy: bool, processors: usize) -> (Team, RemoveDir) {
    let dir = RemoveDir(run_dir(&format!("{}-1", peer.run_id)));
    let ours = free_port(parent_ip());
    tell(&peer.sock, &ours.to_string());
    let theirs: u16 = hear(&peer.sock).parse().unwrap();
    (team(&peer.run_id, 1, (ours, theirs), busy, processors), dir)
}

/// Node 2 (see [`parent_node`]).
pub(crate) fn child_node(ctx: &ChildCtx, busy: bool, processors: usize) -> (Team, RemoveDir) {
    let dir = RemoveDir(run_dir(&format!("{}-2", ctx.run_id)));
    let theirs: u16 = hear(&ctx.sock).parse().unwrap();
    let ours = free_port(child_ip());
    tell(&ctx.sock, &ours.to_string());
    (team(&ctx.run_id, 2, (theirs, ours), busy, processors), dir)
}

/// The server: trades its node's port with the client's (each side can
/// only bind its own address), says its endpoint, then serves `Bench`
/// until told to stop.
fn serve(ctx: &ChildCtx, busy: bool) {
    serve_with(ctx, busy, |_| ())
}

/// [`serve`], with what `also` makes of the team (a region) kept meanwhile.
pub(crate) fn serve_with<T>(ctx: &ChildCtx, busy: bool, also: impl FnOnce(&Team) -> T) {
    let (team, _dir) = child_node(ctx, busy, 1);
    let _also = also(&team);
    let stopped = Arc::new(AtomicBool::new(false));
    let _serving = BenchServer::serve(&team, "bench.tcp", BenchImpl::new(stopped.clone())).unwrap();
    tell(&ctx.sock, &team.lookup("bench.tcp").unwrap().to_string());
    while !stopped.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    team.shutdown();
}

/// The client: trades its node's port with the child's, hears the
/// service's endpoint, binds, measures.
fn client(peer: &mut Peer, busy: bool, measure: impl FnOnce(&BenchClient) -> Vec<f64>) -> Vec<f64> {
    client_with_team(peer, busy, |c, _| measure(c))
}

pub(crate) fn client_with_team(
    peer: &mut Peer,
    busy: bool,
    measure: impl FnOnce(&BenchClient, &Team) -> Vec<f64>,
) -> Vec<f64> {
    let (team, _dir) = parent_node(peer, busy, 0);
    let c = BenchClient::bind_to(&team, hear(&peer.sock).parse().unwrap()).expect("bind over TCP");
    let samples = measure(&c, &team);
    c.stop_blocking().unwrap();
    drop(c);
    team.shutdown();
    samples
}

fn null_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    client(peer, false, |c| p.measure_each(calls(p), || c.null_blocking().unwrap()))
}

fn arg1024_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let data = ByteBuf::from(crate::rpc_peers::argument(1024));
    let want = crate::rpc_peers::answer(&data);
    client(peer, false, |c| p.measure_each(calls(p), || assert_eq!(c.arg_blocking(data.clone()).unwrap(), want)))
}

fn busypoll_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    client(peer, true, |c| p.measure_each(calls(p), || c.null_blocking().unwrap()))
}

fn pipelined_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    client_with_team(peer, true, |c, t| {
        p.measure(p.iters_div(4), |n| {
            // 32 in flight, refilled 16 at a time in one write (`Team::batch`).
            let mut flying = std::collections::VecDeque::with_capacity(IN_FLIGHT);
            let mut issued = 0;
            while issued < n || !flying.is_empty() {
                if flying.len() > IN_FLIGHT / 2 || issued == n {
                    let f: ferry::rpc::CallFuture<()> = flying.pop_front().unwrap();
                    f.wait().unwrap();
                    continue;
                }
                let k = (IN_FLIGHT - flying.len()).min(n - issued);
                t.batch(|| (0..k).for_each(|_| flying.push_back(c.null())));
                issued += k;
            }
        })
    })
}

fn default_child(ctx: &ChildCtx) {
    serve(ctx, false)
}

fn busy_child(ctx: &ChildCtx) {
    serve(ctx, true)
}

/// The suite's cases.
pub fn cases() -> Vec<Case> {
    #[allow(unused_mut)]
    let mut v = vec![
        Case::new("floor.tcp", floor_parent, floor_child),
        Case::new("floor.tcp.spin", spin_parent, spin_child),
        Case::unpinned("floor.tcp.unpinned", floor_parent, floor_child),
        Case::new("ferry.tcp.null", null_parent, default_child),
        Case::unpinned("ferry.tcp.null.unpinned", null_parent, default_child),
        Case::new("ferry.tcp.arg1024", arg1024_parent, default_child),
        Case::new("ferry.tcp.busypoll.null", busypoll_parent, busy_child),
        Case::new("ferry.tcp.pipelined", pipelined_parent, busy_child),
        Case::new("floor.tcp.echo.64MiB", floor_echo_parent, floor_echo_child),
        Case::new("ferry.tcp.echo.64MiB", echo_bytebuf_parent, echo_child),
        Case::new("ferry.tcp.echo.vec.64MiB", echo_vec_parent, echo_child),
        Case::new("ferry.tcp.echo.bytes.64MiB", echo_bytes_parent, echo_child),
    ];
    #[cfg(feature = "zmq")]
    v.push(zmq_tcp::case());
    #[cfg(feature = "tonic")]
    v.push(crate::rpc_peers::tonic_tcp_case());
    #[cfg(feature = "tarpc")]
    v.push(crate::tarpc_peer::case());
    v
}

#[cfg(feature = "zmq")]
mod zmq_tcp {
    use super::*;

    pub fn case() -> Case {
        Case::new("zmq.tcp.null", parent, child)
    }

    fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
        let addr = hear(&peer.sock);
        let ctx = zmq::Context::new();
        let req = ctx.socket(zmq::REQ).unwrap();
        req.connect(&format!("tcp://{addr}")).unwrap();
        let samples = p.measure_each(calls(p), || {
            req.send(&[][..], 0).unwrap();
            req.recv_bytes(0).unwrap();
        });
        req.send(&b"stop"[..], 0).unwrap();
        let _ = req.recv_bytes(0);
        samples
    }

    fn child(ctx: &ChildCtx) {
        let z = zmq::Context::new();
        let rep = z.socket(zmq::REP).unwrap();
        let port = free_port(child_ip());
        let addr = SocketAddr::new(child_ip(), port);
        rep.bind(&format!("tcp://{addr}")).unwrap();
        tell(&ctx.sock, &addr.to_string());
        loop {
            let m = rep.recv_bytes(0).unwrap();
            rep.send(&[][..], 0).unwrap();
            if m == b"stop" {
                return;
            }
        }
    }
}
