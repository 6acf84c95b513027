//! Hostile peers (issue 9, item 2): a peer that scribbles on the shared
//! memory of its channel, or sends malformed frames over TCP, hurts only
//! itself. The victim team — a process of its own, serving an echo port and
//! an RPC service — never dies, never spins, never grows without bound; it
//! closes the hostile's channel; and an honest peer calling it all along
//! (over shared memory and over TCP, from another process) sees every call
//! answered in time.
//!
//! The hostile runs in the test process:
//! - over shared memory it binds as a real team (the victim checks the
//!   process on the other end of the socket), maps the channel's segment
//!   through `/proc/self/fd`, and writes random bytes (seeded: set
//!   `FERRY_HOSTILE_SEED` to replay a run) over both rings' control words
//!   and cells and both payload areas while it keeps sending, round after
//!   round for about a second;
//! - over TCP it is a node of the victim's cluster (it holds the key), so it
//!   completes the handshake, then sends what no honest end sends: random
//!   bytes, lying lengths, frames past its credit, a huge length, frames
//!   naming other teams, bad credit frames, a length it never completes...
//!
//! The other tests here are the regression tests of the defects this one
//! found (see `docs/RELIABILITY.md`, "Hostile peers").

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};
use common::segment::Segment;
use common::Child;
use ferry::testing::{
    flags, segment_len, shm_connect, tcp_connect, Doorbell, Grant, Header, Kind, Liveness, SendError, ShmBind, ShmEnd,
    TcpBind, TcpEnd, Transport, HEADER_LEN,
};
use ferry::{Checkpoint, Cluster, EndpointId, Team, TeamId};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: &[u8] = b"the hostile test's cluster key, long enough";
const START: Duration = Duration::from_secs(30);
/// The victim's and the honest peer's TCP peer timeout: a silent TCP peer
/// (one that announced a frame and never finished it) is given up after it.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the victim may take to close a channel that broke the protocol.
const CLOSE_BOUND: Duration = Duration::from_secs(5);
/// The honest peer's deadline per call, and the worst latency it may see.
const CALL_DEADLINE: Duration = Duration::from_secs(3);
const WORST_LATENCY: Duration = Duration::from_secs(1);
/// How long the hostile scribbles (shm), and sends garbage (TCP), at least.
const ATTACK: Duration = Duration::from_millis(1200);

/// The hostile's rings and payload areas: sizes no other channel has.
const CAP: usize = 16 << 10;
const AREA: u64 = 64 << 10;
/// Where things are in a channel segment (see `transport::shm`).
const RING0: usize = 4096;
const RING1: usize = RING0 + CAP;
const AREA0: usize = RING0 + 2 * CAP;
const AREA1: usize = AREA0 + AREA as usize;
const CONTROL_WORDS: [usize; 4] = [128, 256, 384, 512];
const CELL: usize = 64;

// ---------------------------------------------------------------- the processes

fn addr_env(name: &str) -> SocketAddr {
    std::env::var(name).unwrap().parse().unwrap()
}

/// Node `node` (1 or 2) of the two-node cluster on loopback.
fn cluster(node: u16) -> Cluster {
    let addrs = [addr_env("HOSTILE_ADDR1"), addr_env("HOSTILE_ADDR2")];
    let peers: BTreeMap<u16, SocketAddr> = [(3 - node, addrs[2 - node as usize])].into_iter().collect();
    Cluster {
        node,
        listen: addrs[node as usize - 1],
        peers,
        key: Arc::from(KEY),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    }
}

/// CPU time (user + system) of this process, in µs.
fn cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    match role.as_str() {
        // Node 2: an echo port (served by a few threads) and the calc service.
        "victim" => {
            let team =
                Team::builder().runtime_dir(&dir).cluster(cluster(2)).peer_timeout(PEER_TIMEOUT).start().unwrap();
            let echo = Arc::new(team.open_named_raw_port("echo").unwrap());
            let _calc = CalcServer::serve(&team, "calc", CalcImpl).unwrap();
            for _ in 0..3 {
                let echo = echo.clone();
                std::thread::spawn(move || loop {
                    match echo.recv_blocking() {
                        Ok(m) => {
                            let back = m.payload().to_vec();
                            // A reply to a peer that went away fails: that is fine.
                            let _ = m.reply(&back);
                        }
                        Err(ferry::Error::Shutdown) => return,
                        Err(e) => panic!("echo: {e}"),
                    }
                });
            }
            common::say(format!("ready {} {}", echo.id(), team.lookup("calc").unwrap()));
            while let Some(line) = common::hear() {
                match line.as_str() {
                    "stats" => common::say(format!(
                        "stats {} {} {} {}",
                        cpu_us(),
                        rss_kib(),
                        count_dir("/proc/self/fd"),
                        count_dir("/proc/self/task")
                    )),
                    "exit" => break,
                    other => panic!("victim: unknown command {other}"),
                }
            }
            team.shutdown();
        }
        // Calls the victim all along, every few ms, from a team of node 2
        // (shared memory) and a team of node 1 (TCP); reports what it saw.
        "honest" => {
            let echo: EndpointId = std::env::var("HOSTILE_ECHO").unwrap().parse().unwrap();
            let calc: EndpointId = std::env::var("HOSTILE_CALC").unwrap().parse().unwrap();
            let shm = Team::builder().runtime_dir(&dir).node(2).start().unwrap();
            let dir1 = std::env::var("HOSTILE_DIR1").unwrap();
            let tcp =
                Team::builder().runtime_dir(&dir1).cluster(cluster(1)).peer_timeout(PEER_TIMEOUT).start().unwrap();
            let stats = Arc::new(Honest::default());
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut loops = Vec::new();
            for (path, team) in [("shm", &shm), ("tcp", &tcp)] {
                let to_echo = team.raw_sender(echo).with_timeout(CALL_DEADLINE);
                let to_calc = CalcClient::bind_to(team, calc).unwrap().with_timeout(CALL_DEADLINE);
                // Bound before the counting starts.
                assert_eq!(to_echo.call(b"warm").unwrap(), b"warm");
                assert_eq!(to_calc.add_blocking(1, 2).unwrap(), 3);
                let (s, halt) = (stats.clone(), stop.clone());
                loops.push(std::thread::spawn(move || {
                    let mut i = 0i32;
                    while !halt.load(Ordering::Relaxed) {
                        i = i.wrapping_add(1);
                        let msg = common::pattern(i as u64, 16 + (i as usize * 7) % 200);
                        let t0 = Instant::now();
                        let r = to_echo.call(&msg);
                        s.record(
                            path,
                            "echo",
                            t0.elapsed(),
                            match r {
                                Ok(back) if back == msg => None,
                                Ok(_) => Some("echo came back changed".to_string()),
                                Err(e) => Some(e.to_string()),
                            },
                        );
                        let t0 = Instant::now();
                        let r = to_calc.add_blocking(i, 1);
                        s.record(
                            path,
                            "calc",
                            t0.elapsed(),
                            match r {
                                Ok(v) if v == i.wrapping_add(1) => None,
                                Ok(v) => Some(format!("calc said {v}")),
                                Err(e) => Some(e.to_string()),
                            },
                        );
                        std::thread::sleep(Duration::from_millis(3));
                    }
                }));
            }
            common::say("ready");
            while let Some(line) = common::hear() {
                match line.as_str() {
                    "report" => common::say(format!("report {}", stats.report())),
                    "reset" => stats.reset(),
                    "stop" => {
                        stop.store(true, Ordering::Relaxed);
                        for l in loops.drain(..) {
                            l.join().unwrap();
                        }
                        common::say("stopped");
                    }
                    "exit" => break,
                    other => panic!("honest: unknown command {other}"),
                }
            }
            drop((shm, tcp));
        }
        other => panic!("unknown role {other}"),
    }
}

/// What the honest peer saw: calls per path, failures, the worst latency.
#[derive(Default)]
struct Honest {
    state: Mutex<HonestState>,
}

#[derive(Default)]
struct HonestState {
    calls: BTreeMap<&'static str, u64>,
    failures: u64,
    first_failures: Vec<String>,
    worst: Duration,
    worst_what: String,
}

impl Honest {
    fn record(&self, path: &'static str, what: &str, took: Duration, failure: Option<String>) {
        let mut s = self.state.lock().unwrap();
        *s.calls.entry(path).or_default() += 1;
        if took > s.worst {
            s.worst = took;
            s.worst_what = format!("{path} {what}");
        }
        if let Some(f) = failure {
            s.failures += 1;
            if s.first_failures.len() < 5 {
                s.first_failures.push(format!("{path} {what}: {f}"));
            }
        }
    }

    fn reset(&self) {
        *self.state.lock().unwrap() = HonestState::default();
    }

    /// `shm=N tcp=N failures=N worst_us=N (what) [first failures]`.
    fn report(&self) -> String {
        let s = self.state.lock().unwrap();
        format!(
            "shm={} tcp={} failures={} worst_us={} ({}) {:?}",
            s.calls.get("shm").copied().unwrap_or(0),
            s.calls.get("tcp").copied().unwrap_or(0),
            s.failures,
            s.worst.as_micros(),
            s.worst_what,
            s.first_failures
        )
    }
}

/// The parsed report of the honest peer.
#[derive(Debug)]
struct Report {
    shm: u64,
    tcp: u64,
    failures: u64,
    worst: Duration,
    line: String,
}

fn parse_report(line: &str) -> Report {
    let field = |name: &str| -> u64 {
        let at = line.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {line:?}")) + name.len() + 1;
        line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    Report {
        shm: field("shm"),
        tcp: field("tcp"),
        failures: field("failures"),
        worst: Duration::from_micros(field("worst_us")),
        line: line.to_string(),
    }
}

/// The victim's CPU time (µs), RSS (KiB), descriptors and threads.
#[derive(Debug, Clone, Copy)]
struct Stats {
    cpu_us: u64,
    rss_kib: u64,
    fds: usize,
    threads: usize,
}

fn victim_stats(victim: &mut Child) -> Stats {
    victim.tell("stats");
    let line = victim.expect("stats", Duration::from_secs(10));
    let v: Vec<u64> = line.split_whitespace().map(|x| x.parse().unwrap()).collect();
    Stats { cpu_us: v[0], rss_kib: v[1], fds: v[2] as usize, threads: v[3] as usize }
}

fn honest_report(honest: &mut Child) -> Report {
    honest.tell("report");
    parse_report(&honest.expect("report", Duration::from_secs(10)))
}

/// The victim's stderr, collected as it comes (a panic would show there).
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let mut err = child.proc.stderr.take().expect("piped stderr");
    let t = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                return;
            }
            t.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

// ---------------------------------------------------------------- randomness

/// xorshift64*: the same bytes for the same seed, every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    /// Fewer than `max` random bytes (at least `min`).
    fn some_bytes(&mut self, min: usize, max: usize) -> Vec<u8> {
        let n = min + self.below(max - min);
        self.bytes(n)
    }
}

fn seed() -> u64 {
    let seed = std::env::var("FERRY_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("hostile: seed {seed} (FERRY_HOSTILE_SEED={seed} replays it)");
    seed
}

// ---------------------------------------------------------------- the shared-memory hostile

/// Random words over `[from, to)` of `seg` (8-byte aligned).
fn fill(seg: &Segment, rng: &mut Rng, from: usize, to: usize) {
    for off in (from & !7..to.min(seg.len()) & !7).step_by(8) {
        seg.word(off).store(rng.next(), Ordering::Relaxed);
    }
}

/// Maps the channel segment of this process whose ring 0 carries `marker`
/// in its first frame (the one the hostile sent first).
fn find_segment(marker: &[u8; 16]) -> Option<Segment> {
    // The first record: stamp, header, then the payload (its first 16
    // bytes are in the first cell, whose payload the reader leaves alone).
    Segment::find(segment_len(CAP, AREA), |seg| seg.read(RING0 + 8 + HEADER_LEN, 16) == marker)
}

/// What the hostile aims at in one round.
#[derive(Clone, Copy, Debug)]
enum Aim {
    /// Anything anywhere: control words, both rings, both areas.
    Everything,
    /// Only the payload areas (while it sends large messages both ways).
    Areas,
    /// Only the header page: magic, heads, writer-waiting words.
    ControlWords,
    /// Records that look right (stamp of the right lap, a header) but lie.
    Forgeries,
    /// The ring the victim writes (its replies to us), and its head.
    VictimsRing,
}

const AIMS: [Aim; 5] = [Aim::Everything, Aim::Areas, Aim::ControlWords, Aim::Forgeries, Aim::VictimsRing];

/// One scribble of `aim` on `seg`.
fn scribble(seg: &Segment, rng: &mut Rng, aim: Aim, targets: &Targets) {
    let total = seg.len();
    match aim {
        Aim::Everything => match rng.below(6) {
            0 => fill(seg, rng, 0, total),
            1 => {
                let from = rng.below(total);
                let words = rng.below(512);
                fill(seg, rng, from, from + 8 * words);
            }
            2 => seg.word(CONTROL_WORDS[rng.below(4)]).store(rng.next(), Ordering::Relaxed),
            3 => forge(seg, rng, targets),
            4 => {
                let from = rng.below(total);
                let len = rng.below(4096).min(total - from);
                seg.write(from, &vec![0; len]);
            }
            _ => {
                let aim = AIMS[1 + rng.below(4)];
                scribble(seg, rng, aim, targets)
            }
        },
        Aim::Areas => {
            let (base, len) = if rng.chance(2) { (AREA0, AREA as usize) } else { (AREA1, AREA as usize) };
            if rng.chance(4) {
                fill(seg, rng, base, base + len);
            } else {
                let from = base + rng.below(len);
                let words = rng.below(1024);
                fill(seg, rng, from, (from + 8 * words).min(base + len));
            }
        }
        Aim::ControlWords => {
            // Mostly the words the victim reads (head 0 only its reader
            // writes: scribbling it mostly makes our own end give up).
            let w = if rng.chance(8) { 128 } else { [256, 384, 512][rng.below(3)] };
            let v = match rng.below(5) {
                0 => 0,
                1 => u64::MAX,
                2 => seg.word(w).load(Ordering::Relaxed).wrapping_add(CELL as u64 * rng.below(64) as u64),
                3 => seg.word(w).load(Ordering::Relaxed).wrapping_sub(CELL as u64),
                _ => rng.next(),
            };
            seg.word(w).store(v, Ordering::Relaxed);
            if rng.chance(8) {
                // The segment's own header: magic, version, sizes.
                fill(seg, rng, 0, 24);
            }
        }
        Aim::Forgeries => forge(seg, rng, targets),
        Aim::VictimsRing => {
            if rng.chance(3) {
                let w = [384, 512][rng.below(2)];
                seg.word(w).store(rng.next() >> rng.below(64), Ordering::Relaxed);
            } else {
                let from = RING1 + rng.below(CAP);
                let words = rng.below(256);
                fill(seg, rng, from, (from + 8 * words).min(RING1 + CAP));
            }
        }
    }
}

/// Writes a record at the victim's read position in ring 0 that looks
/// right (the stamp of the right lap, a version-2 header) but lies: about
/// its length, its payload's place in the area, who sent it, what it is.
fn forge(seg: &Segment, rng: &mut Rng, t: &Targets) {
    let head = seg.word(128).load(Ordering::Relaxed);
    let pos = (head as usize) & (CAP - 1) & !(CELL - 1);
    let lap = (head / CAP as u64) & 0xFFFF_FFFF;
    let kinds = [1u8, 1, 1, 2, 3, 4, 6, 7, 5, 0];
    let kind = kinds[rng.below(kinds.len())];
    let mut flags_word = (rng.below(4) as u16) << flags::CHECKPOINT_SHIFT;
    let detached = rng.chance(2);
    if detached {
        flags_word |= flags::DETACHED;
    }
    if rng.chance(10) {
        flags_word |= 1 << (3 + rng.below(13));
    }
    let payload: Vec<u8> = if detached || kind == 7 {
        // A descriptor {offset, len}: sometimes inside the area, sometimes not.
        let (off, len) = match rng.below(5) {
            0 => (0u64, AREA),
            1 => (rng.below(16) as u64 * 4096, 1 + rng.below(AREA as usize) as u64),
            2 => (AREA - 4096, 8192),
            3 => (u64::MAX - 4095, 8192),
            _ => (rng.next(), rng.next()),
        };
        [off.to_le_bytes(), len.to_le_bytes()].concat()
    } else {
        rng.some_bytes(0, 200)
    };
    let src = if rng.chance(6) { t.stranger } else { t.me };
    let dst = [t.echo, t.calc, t.nowhere][rng.below(3)];
    let mut head_bytes = [0u8; HEADER_LEN];
    let mut h = Header::new(Kind::Data, src, dst, rng.next() >> rng.below(64));
    h.len = payload.len() as u32;
    h.encode(&mut head_bytes);
    head_bytes[1] = kind;
    head_bytes[2..4].copy_from_slice(&flags_word.to_le_bytes());
    if rng.chance(4) {
        // A length that is not the payload's.
        head_bytes[4..8].copy_from_slice(&(rng.next() as u32 >> rng.below(32)).to_le_bytes());
    }
    head_bytes[32..40].copy_from_slice(&[0, 1, u64::MAX, rng.next()][rng.below(4)].to_le_bytes());
    let body = [&head_bytes[..], &payload].concat();
    let max_body = CAP / 4 - 8;
    let mut len = 8 + body.len().min(max_body);
    if rng.chance(5) {
        len = [0, 3, 8, max_body + 9, CAP, 0x7FFF_FFFF, rng.below(1 << 31)][rng.below(7)];
    }
    let fits = pos + body.len().min(max_body) + 8 <= CAP;
    if fits {
        seg.write(RING0 + pos + 8, &body[..body.len().min(max_body)]);
    }
    let mut stamp = lap << 32 | len as u64;
    if rng.chance(8) {
        stamp |= 1 << 31; // padding, of any length
    }
    if rng.chance(8) {
        stamp = stamp.wrapping_add(1 << 32); // the wrong lap
    }
    seg.word(RING0 + pos).store(stamp, Ordering::Release);
}

/// The addresses a hostile frame may name.
struct Targets {
    me: ferry::testing::Addr,
    stranger: ferry::testing::Addr,
    echo: ferry::testing::Addr,
    calc: ferry::testing::Addr,
    nowhere: ferry::testing::Addr,
}

/// One frame (or a large message) from the hostile's end, of any kind; a
/// frame that breaks the protocol by itself (a release of a range never
/// lent, a frame from another team) only if `violate`.
fn hostile_send(end: &ShmEnd, rng: &mut Rng, t: &Targets, call: &mut u64, violate: bool) {
    *call += 1;
    let dst = [t.echo, t.echo, t.calc, t.nowhere][rng.below(4)];
    let checkpoint =
        [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn][rng.below(4)];
    let mut h = Header::new(Kind::Data, t.me, dst, *call).with_checkpoint(checkpoint);
    h.budget_ns = [0, 1, 50_000_000, u64::MAX][rng.below(4)];
    match rng.below(10) {
        // Large: staged in our payload area, sent as a descriptor.
        0 | 1 => {
            let payload = rng.some_bytes(1, AREA as usize / 2);
            if let Ok(staged) = end.stage(&payload) {
                let _ = end.try_send_staged(&h, &mut Some(staged));
            }
        }
        // Answers to calls the victim never made, cancels of calls it never got.
        2 => {
            h.kind = [Kind::Ack, Kind::Reply, Kind::Nack, Kind::Cancel][rng.below(4)];
            h.call_id = rng.next();
            let _ = end.try_send(&h, &rng.some_bytes(0, 64));
        }
        // A release of a range the victim never lent us.
        3 if violate && rng.chance(4) => {
            h.kind = Kind::Release;
            let _ = end.try_send(&h, &rng.bytes(16));
        }
        // From another team: a protocol violation, at once.
        4 if violate && rng.chance(8) => {
            h.src = t.stranger;
            let _ = end.try_send(&h, b"not mine");
        }
        _ => {
            let _ = end.try_send(&h, &rng.some_bytes(0, 300));
        }
    }
}

/// Round after round for at least `ATTACK`: bind a channel to the victim
/// as a real team of this process, find its segment, then scribble on it
/// while sending, until the victim closes it (each round ends with the
/// victim's read position trashed, if nothing did it before). Returns the
/// number of rounds.
fn shm_attack(dir: &Path, victim: TeamId, echo: EndpointId, calc: EndpointId, rng: &mut Rng) -> usize {
    let hostile = Team::builder().runtime_dir(dir).node(2).processors(0).start().unwrap();
    let sock = dir.join("teams").join(format!("{}.sock", victim.team));
    let me = hostile.id();
    let targets = Targets {
        me: me.endpoint(1).unwrap().addr(),
        stranger: TeamId { team: me.team + 1, ..me }.endpoint(1).unwrap().addr(),
        echo: echo.addr(),
        calc: calc.addr(),
        nowhere: victim.endpoint(9999).unwrap().addr(),
    };
    let t0 = Instant::now();
    let mut rounds = 0;
    let mut call = 0u64;
    // Per aim: rounds the victim ended, rounds our end ended, rounds that needed the final trashing.
    let mut outcomes: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    while t0.elapsed() < ATTACK || rounds < AIMS.len() {
        let aim = AIMS[rounds % AIMS.len()];
        rounds += 1;
        let side = ShmBind {
            me,
            doorbell: Arc::new(Doorbell::create().unwrap()),
            ring_bytes: CAP,
            area_bytes: AREA,
            magic: None,
            patience: Duration::from_secs(5),
        };
        let stream = UnixStream::connect(&sock).expect("the victim's socket");
        let end = shm_connect(stream, &side, victim).unwrap_or_else(|e| panic!("round {rounds}: bind: {e}"));
        let marker: [u8; 16] = rng.bytes(16).try_into().unwrap();
        end.try_send(&Header::new(Kind::Data, targets.me, targets.echo, 0), &marker).unwrap();
        let seg = find_segment(&marker)
            .unwrap_or_else(|| panic!("round {rounds}: the channel's segment is not in /proc/self/fd"));
        // Scribble and send, for a while or until the channel ends: the
        // victim hangs up (`Gone`), or our own end gives up (`Closed`: its
        // producer found the head word we scribbled over corrupt; it hangs
        // up on the victim, which then drops the channel as a gone peer's).
        let until = Instant::now() + Duration::from_millis(40 + rng.below(80) as u64);
        let mut ended = Liveness::Alive;
        while Instant::now() < until && ended == Liveness::Alive {
            for _ in 0..1 + rng.below(8) {
                scribble(&seg, rng, aim, &targets);
            }
            // The gentler aims send only well-formed frames: the scribbling
            // alone must be survived, and end the channel if it is fatal.
            let violate = matches!(aim, Aim::Everything | Aim::Forgeries);
            for _ in 0..rng.below(6) {
                hostile_send(&end, rng, &targets, &mut call, violate);
            }
            ended = end.check_liveness();
            if rng.chance(4) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let tally = outcomes.entry(format!("{aim:?}")).or_default();
        if ended == Liveness::Alive {
            // Trash what the victim reads next (and nothing our end reads), and ring it.
            tally[2] += 1;
            fill(&seg, rng, RING0, RING0 + CAP);
            let _ = end.try_send(&Header::new(Kind::Data, targets.me, targets.echo, 0), b"wake up");
            let gone = common::eventually(CLOSE_BOUND, || {
                ended = end.check_liveness();
                ended != Liveness::Alive
            });
            assert!(gone, "round {rounds} ({aim:?}): the victim did not close a channel whose ring is garbage");
        }
        tally[if ended == Liveness::Gone { 0 } else { 1 }] += 1;
        // The channel is over: the hostile's sends fail, with a typed error.
        let again = end.try_send(&Header::new(Kind::Data, targets.me, targets.echo, 0), b"again");
        assert_eq!(again, Err(SendError::Closed), "round {rounds} ({aim:?})");
        assert!(end.is_closed());
        drop(seg);
        drop(end);
    }
    // Last, bind and hang up again and again: each hang-up looks like a
    // death to the victim (which looks for the dead team's files to sweep).
    for _ in 0..100 {
        let side = ShmBind {
            me,
            doorbell: Arc::new(Doorbell::create().unwrap()),
            ring_bytes: ferry::testing::MIN_RING,
            area_bytes: 0,
            magic: None,
            patience: Duration::from_secs(5),
        };
        drop(shm_connect(UnixStream::connect(&sock).unwrap(), &side, victim).expect("bind"));
    }
    drop(hostile);
    eprintln!("shm rounds per aim [closed by the victim, by our end, after the final trashing]: {outcomes:?}");
    rounds
}

// ---------------------------------------------------------------- the TCP hostile

/// What the hostile does on one TCP connection after the handshake.
#[derive(Clone, Copy, Debug)]
enum Garbage {
    RandomBytes,
    BadVersion,
    UnknownKind,
    UnknownFlags,
    /// A header whose length stops short: what follows is read as a header.
    LengthTooShort,
    /// A non-detached frame longer than the credit granted.
    PastCredit,
    /// Frames past the credit in total, in one write.
    PastCreditInTotal,
    /// Length 0xFFFF_FFFF, detached or not.
    HugeLength,
    /// A detached frame with no payload, then garbage.
    DetachedEmpty,
    /// From another team, or to one.
    NotItsTeam,
    /// A credit frame of the wrong size; or one returning absurd credit, then garbage.
    BadCredit,
    /// Answers to nothing, cancels of nothing, garbage RPC envelopes; then garbage.
    Nonsense,
    /// A frame announced (within the credit) and never finished: the victim
    /// gives the silent peer up after its peer timeout.
    NeverFinished,
}

const GARBAGE: [Garbage; 13] = [
    Garbage::RandomBytes,
    Garbage::BadVersion,
    Garbage::UnknownKind,
    Garbage::UnknownFlags,
    Garbage::LengthTooShort,
    Garbage::PastCredit,
    Garbage::PastCreditInTotal,
    Garbage::HugeLength,
    Garbage::DetachedEmpty,
    Garbage::NotItsTeam,
    Garbage::BadCredit,
    Garbage::Nonsense,
    Garbage::NeverFinished,
];

fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut head = [0u8; HEADER_LEN];
    let mut h = *h;
    h.len = payload.len() as u32;
    h.encode(&mut head);
    [&head[..], payload].concat()
}

/// Reads frames off `raw` until a reply to `call` comes (within `limit`).
fn await_reply(raw: &mut TcpStream, call: u64, limit: Duration) -> Result<Vec<u8>, String> {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no reply to call {call} within {limit:?}"));
        }
        raw.set_read_timeout(Some(left)).unwrap();
        let mut head = [0u8; HEADER_LEN];
        raw.read_exact(&mut head).map_err(|e| format!("reading a header: {e}"))?;
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        raw.read_exact(&mut body).map_err(|e| format!("reading a payload: {e}"))?;
        let h = Header::decode(&[&head[..], &body].concat()).map_err(|e| format!("the victim sent {e}"))?;
        if h.kind == Kind::Reply && h.call_id == call {
            return Ok(body);
        }
    }
}

/// Waits (at most `limit`) for the victim to end the stream; whatever it
/// sends before is read and dropped.
fn await_hang_up(raw: &mut TcpStream, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    let mut sink = vec![0u8; 64 << 10];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        raw.set_read_timeout(Some(left)).unwrap();
        match raw.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true, // reset
        }
    }
}

/// One TCP round: a handshake as an authenticated node, a call that works,
/// then `what`; the victim must close the connection (the hostile's end
/// then fails its sends).
fn tcp_round(victim_addr: SocketAddr, victim: TeamId, t: &Targets, what: Garbage, rng: &mut Rng) {
    let me = TeamId { node: 1, team: t.me.team(), incarnation: 7 };
    let bind = TcpBind {
        me,
        doorbell: Arc::new(Doorbell::create().unwrap()),
        key: Arc::from(KEY),
        grant: Grant { frames: 64 << 10, detached: 1 << 20 },
        patience: Duration::from_secs(5),
        peer_timeout: Duration::from_secs(60),
        magic: None,
        tls: None,
    };
    let sock = TcpStream::connect_timeout(&victim_addr, Duration::from_secs(5)).unwrap();
    let mut raw = sock.try_clone().unwrap();
    let end: TcpEnd = tcp_connect(sock, &bind, victim).unwrap_or_else(|e| panic!("{what:?}: handshake: {e}"));
    // The end made the socket non-blocking (for both descriptors): the raw side blocks, with timeouts.
    raw.set_nonblocking(false).unwrap();
    raw.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let echo =
        |call: u64, checkpoint: Checkpoint| Header::new(Kind::Data, t.me, t.echo, call).with_checkpoint(checkpoint);
    // First, a call that works: the channel is a real one.
    raw.write_all(&frame(&echo(1, Checkpoint::OnReturn), b"hello")).unwrap();
    assert_eq!(await_reply(&mut raw, 1, CLOSE_BOUND), Ok(b"hello".to_vec()), "{what:?}");
    let valid = frame(&echo(2, Checkpoint::Immediate), b"fine");
    let garbage = || [&[0xEEu8; 7][..], &[0xFF; 64]].concat();
    let bytes: Vec<u8> = match what {
        Garbage::RandomBytes => {
            let mut b = rng.some_bytes(1, 500);
            if rng.chance(2) {
                b[0] = 2; // the right version: the checks go deeper
            }
            b
        }
        Garbage::BadVersion => {
            let mut f = valid.clone();
            f[0] = [0, 1, 3, 255][rng.below(4)];
            f
        }
        Garbage::UnknownKind => {
            let mut f = valid.clone();
            f[1] = [0, 5, 8, 200][rng.below(4)];
            f
        }
        Garbage::UnknownFlags => {
            let mut f = valid.clone();
            f[2..4].copy_from_slice(&(1u16 << (3 + rng.below(13))).to_le_bytes());
            f
        }
        Garbage::LengthTooShort => {
            let mut f = frame(&echo(3, Checkpoint::OnReturn), &rng.bytes(200));
            f[4..8].copy_from_slice(&(rng.below(100) as u32).to_le_bytes());
            f
        }
        Garbage::PastCredit => {
            let mut f = valid[..HEADER_LEN].to_vec();
            f[4..8].copy_from_slice(&(64u32 << 10).to_le_bytes());
            f
        }
        Garbage::PastCreditInTotal => {
            let big = frame(&echo(0, Checkpoint::Immediate), &vec![7u8; 30 << 10]);
            let mut v = Vec::new();
            for _ in 0..8 {
                v.extend_from_slice(&big);
            }
            v.extend(garbage());
            v
        }
        Garbage::HugeLength => {
            let mut f = valid[..HEADER_LEN].to_vec();
            f[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            if rng.chance(2) {
                f[2] |= flags::DETACHED as u8;
            }
            f
        }
        Garbage::DetachedEmpty => {
            let mut h = echo(4, Checkpoint::OnReturn);
            h.flags |= flags::DETACHED;
            let mut v = frame(&h, b"");
            v.extend(garbage());
            v
        }
        Garbage::NotItsTeam => {
            let mut h = echo(5, Checkpoint::OnReturn);
            if rng.chance(2) {
                h.src = t.stranger;
            } else {
                h.dst = TeamId { team: victim.team + 1, ..victim }.endpoint(1).unwrap().addr();
            }
            frame(&h, b"whose?")
        }
        Garbage::BadCredit => {
            let h = Header::new(Kind::Release, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
            if rng.chance(2) {
                let n = [0, 8, 15, 17][rng.below(4)];
                frame(&h, &rng.bytes(n))
            } else {
                // Credit it was never given: believed, the victim would queue
                // its replies without bound for a peer that reads nothing.
                let (frames, detached) = [(u64::MAX, 0), (0, u64::MAX), (1 << 20, 0), (0, 2 << 20)][rng.below(4)];
                frame(&h, &[frames.to_le_bytes(), detached.to_le_bytes()].concat())
            }
        }
        Garbage::Nonsense => {
            let mut v = Vec::new();
            for k in [Kind::Ack, Kind::Reply, Kind::Nack, Kind::Cancel] {
                v.extend(frame(&Header::new(k, t.me, t.echo, rng.next()), &rng.some_bytes(0, 40)));
            }
            let mut rpc = Header::new(Kind::Data, t.me, t.calc, 6).with_checkpoint(Checkpoint::OnReturn);
            rpc.budget_ns = u64::MAX;
            v.extend(frame(&rpc, &rng.some_bytes(0, 60)));
            v.extend(garbage());
            v
        }
        Garbage::NeverFinished => {
            let mut f = frame(&echo(7, Checkpoint::OnReturn), b"only the start");
            f[4..8].copy_from_slice(&(1000u32 + rng.below(30000) as u32).to_le_bytes());
            if rng.chance(2) {
                // Detached: the length may be anything up to the large-payload credit.
                f[2] |= flags::DETACHED as u8;
                f[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
            }
            f
        }
    };
    // The victim may close before it has read it all: a failed write is fine.
    let _ = raw.write_all(&bytes);
    let limit = match what {
        Garbage::NeverFinished => PEER_TIMEOUT + CLOSE_BOUND,
        _ => CLOSE_BOUND,
    };
    assert!(await_hang_up(&mut raw, limit), "{what:?}: the victim did not close the connection within {limit:?}");
    // The hostile's end learns it, and its sends fail with a typed error.
    raw.set_nonblocking(true).unwrap();
    let seen = common::eventually(CLOSE_BOUND, || end.check_liveness() != Liveness::Alive || end.is_closed());
    assert!(seen, "{what:?}: the hostile's end did not see the hang-up");
    assert_eq!(end.try_send(&echo(8, Checkpoint::Immediate), b"again"), Err(SendError::Closed), "{what:?}");
}

/// Every kind of garbage, round after round for at least `ATTACK`; the
/// rounds that wait for the victim's peer timeout run beside the others.
fn tcp_attack(victim_addr: SocketAddr, victim: TeamId, echo: EndpointId, calc: EndpointId, rng: &mut Rng) -> usize {
    let fake = TeamId { node: 1, team: 4242, incarnation: 7 };
    let targets = Arc::new(Targets {
        me: fake.endpoint(1).unwrap().addr(),
        stranger: TeamId { team: 4243, ..fake }.endpoint(1).unwrap().addr(),
        echo: echo.addr(),
        calc: calc.addr(),
        nowhere: victim.endpoint(9999).unwrap().addr(),
    });
    // Two at once (one detached, one not, whichever the seed picks).
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let (t, mut r) = (targets.clone(), Rng::new(rng.next()));
            std::thread::spawn(move || tcp_round(victim_addr, victim, &t, Garbage::NeverFinished, &mut r))
        })
        .collect();
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < ATTACK || rounds < GARBAGE.len() {
        let what = GARBAGE[rounds % GARBAGE.len()];
        rounds += 1;
        if matches!(what, Garbage::NeverFinished) {
            continue;
        }
        tcp_round(victim_addr, victim, &targets, what, rng);
    }
    common::within(PEER_TIMEOUT + CLOSE_BOUND * 3, "the never-finished rounds", move || {
        slow.into_iter().try_for_each(|t| t.join())
    })
    .expect("a never-finished round failed");
    rounds + 2
}

// ---------------------------------------------------------------- the test

/// One victim, one honest peer, one hostile: the hostile scribbles over its
/// shared memory with the victim, then sends garbage over TCP; the honest
/// peer's calls all succeed in time throughout, the victim closes each of
/// the hostile's channels, and afterwards it is idle, no larger than it
/// was (give or take), and never panicked.
#[test]
fn a_hostile_peer_hurts_only_itself() {
    let mut rng = Rng::new(seed());
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (addr1, addr2) = (common::free_loopback_addr(), common::free_loopback_addr());
    let env = |cmd: &mut std::process::Command| {
        cmd.env("HOSTILE_ADDR1", addr1.to_string()).env("HOSTILE_ADDR2", addr2.to_string());
    };

    let mut victim = Child::spawn_with("victim", dir2.path(), |cmd| {
        env(cmd);
        cmd.stderr(std::process::Stdio::piped());
    });
    let victim_err = collect_stderr(&mut victim);
    let ready = victim.expect("ready", START);
    let mut ids = ready.split_whitespace().map(|s| s.parse::<EndpointId>().unwrap());
    let (echo, calc) = (ids.next().unwrap(), ids.next().unwrap());
    let victim_team = echo.team_id();

    let mut honest = Child::spawn_with("honest", dir2.path(), |cmd| {
        env(cmd);
        cmd.env("HOSTILE_DIR1", dir1.path())
            .env("HOSTILE_ECHO", echo.to_string())
            .env("HOSTILE_CALC", calc.to_string());
    });
    honest.expect("ready", START);
    // A second of honest calls with no hostile: how slow this machine is now.
    honest.tell("reset");
    std::thread::sleep(Duration::from_secs(1));
    let quiet = honest_report(&mut honest);
    eprintln!("no hostile: honest peer: {}", quiet.line);
    assert_eq!(quiet.failures, 0, "the honest peer's calls failed with no hostile about: {}", quiet.line);
    honest.tell("reset");
    let before = victim_stats(&mut victim);
    eprintln!("victim before: {before:?}");

    let t0 = Instant::now();
    let shm_rounds = shm_attack(dir2.path(), victim_team, echo, calc, &mut rng);
    let shm_took = t0.elapsed();
    assert!(victim.proc.try_wait().unwrap().is_none(), "the victim died under the shared-memory attack");
    let now = victim_stats(&mut victim);
    assert!(now.threads <= before.threads + 6, "the victim runs {} threads, {} before", now.threads, before.threads);
    let after_shm = honest_report(&mut honest);
    eprintln!("shm: {shm_rounds} rounds in {shm_took:?}; honest peer: {}", after_shm.line);

    let t1 = Instant::now();
    let tcp_rounds = tcp_attack(addr2, victim_team, echo, calc, &mut rng);
    let tcp_took = t1.elapsed();
    assert!(victim.proc.try_wait().unwrap().is_none(), "the victim died under the TCP attack");
    let report = honest_report(&mut honest);
    eprintln!("tcp: {tcp_rounds} rounds in {tcp_took:?}; honest peer: {}", report.line);

    // Every other peer's traffic went on: all the honest calls succeeded, in
    // time (on a machine so loaded that calls are slow with no hostile, a
    // few times as slow as then).
    assert_eq!(report.failures, 0, "the honest peer's calls failed: {}", report.line);
    let bound = WORST_LATENCY.max(quiet.worst * 4);
    assert!(report.worst < bound, "an honest call took {:?} (bound {bound:?}): {}", report.worst, report.line);
    assert!(
        after_shm.shm > 50 && after_shm.tcp > 50,
        "the honest peer made few calls during the shm attack: {}",
        after_shm.line
    );
    assert!(
        report.shm > after_shm.shm + 50 && report.tcp > after_shm.tcp + 50,
        "few calls during the TCP attack: {}",
        report.line
    );

    // Afterwards: idle, not spinning; no larger than before (give or take);
    // the hostile's channels reclaimed.
    honest.tell("stop");
    honest.expect("stopped", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let a = victim_stats(&mut victim);
    std::thread::sleep(Duration::from_secs(1));
    let b = victim_stats(&mut victim);
    eprintln!("victim after: {b:?}");
    let idle_cpu = Duration::from_micros(b.cpu_us - a.cpu_us);
    assert!(idle_cpu < Duration::from_millis(300), "the victim used {idle_cpu:?} of CPU in an idle second: spinning");
    let grew = b.rss_kib.saturating_sub(before.rss_kib);
    eprintln!("victim idle: {idle_cpu:?} of CPU in an idle second; RSS grew by {grew} KiB");
    assert!(grew < 64 << 10, "the victim's RSS grew by {grew} KiB");
    let reclaimed = common::eventually(CLOSE_BOUND, || {
        let s = victim_stats(&mut victim);
        s.fds <= before.fds + 4 && s.threads <= before.threads + 6
    });
    let now = victim_stats(&mut victim);
    assert!(reclaimed, "the hostile's channels were not reclaimed: before {before:?}, now {now:?}");

    // No panic, and a clean exit.
    honest.tell("exit");
    victim.tell("exit");
    let status = victim.wait_exit(Duration::from_secs(20)).expect("the victim did not exit");
    let err = victim_err.lock().unwrap().clone();
    assert!(status.success(), "the victim exited with {status}: {err}");
    assert!(!err.contains("panicked"), "the victim panicked: {err}");
    let _ = honest.wait_exit(Duration::from_secs(20));
}

/// Counts this process's threads named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .count()
}

/// A live peer that binds and hangs up, again and again: each hang-up
/// looks like a death to the victim, which sweeps the dead team's files —
/// and, as the team is alive, used to start a thread that looked again
/// every 10 ms for 3 s. A hostile binding in a loop so made the victim
/// start threads without bound (hundreds at once, each waking 100 times a
/// second). Now one sweeper per team number at a time.
#[test]
fn a_live_peer_hanging_up_again_and_again_costs_the_victim_no_threads() {
    let dir = tempfile::tempdir().unwrap();
    let victim = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let hostile = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let sock = dir.path().join("teams").join(format!("{}.sock", victim.id().team));
    let side = ShmBind {
        me: hostile.id(),
        doorbell: Arc::new(Doorbell::create().unwrap()),
        ring_bytes: ferry::testing::MIN_RING,
        area_bytes: 0,
        magic: None,
        patience: Duration::from_secs(5),
    };
    let mut most = 0;
    for _ in 0..200 {
        let end = shm_connect(UnixStream::connect(&sock).unwrap(), &side, victim.id()).expect("bind");
        drop(end);
        most = most.max(threads_named("ferry-sweep"));
    }
    common::eventually(Duration::from_millis(200), || {
        most = most.max(threads_named("ferry-sweep"));
        false
    });
    assert!(most <= 2, "{most} sweeper threads at once");
}

/// Regression: an RPC server replied on the thread that served the call,
/// waiting for room in the caller's channel with the caller's deadline. A
/// caller that sent calls without a deadline and never read its replies
/// (here one that only sends, over shared memory) so held the service's
/// one serving task for good, and every other caller's calls timed out.
/// Now the server's replies never wait: one that finds no room waits in the
/// channel, and past a bound the victim takes no more calls from that peer,
/// which holds up only itself.
#[test]
fn a_caller_that_never_reads_its_replies_holds_up_only_itself() {
    never_reading_caller(Target::Service);
}

/// The same for a port whose threads answer with `Message::reply`: a reply
/// waited for room up to the caller's deadline, so calls with none, from a
/// caller that never reads, held every serving thread for good. Replies
/// now never wait, as an RPC service's.
#[test]
fn a_caller_that_never_reads_its_replies_holds_up_only_itself_at_a_port() {
    never_reading_caller(Target::Port);
}

/// What the caller that never reads calls: the calc service or the echo port.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Service,
    Port,
}

fn never_reading_caller(target: Target) {
    let dir = tempfile::tempdir().unwrap();
    let (addr1, addr2) = (common::free_loopback_addr(), common::free_loopback_addr());
    let mut victim = Child::spawn_with("victim", dir.path(), |cmd| {
        cmd.env("HOSTILE_ADDR1", addr1.to_string()).env("HOSTILE_ADDR2", addr2.to_string());
    });
    let ready = victim.expect("ready", START);
    let mut ids = ready.split_whitespace().map(|s| s.parse::<EndpointId>().unwrap());
    let (echo, calc) = (ids.next().unwrap(), ids.next().unwrap());
    let before = victim_stats(&mut victim);
    let (victim_team, hostile) =
        (echo.team_id(), Team::builder().runtime_dir(dir.path()).node(2).processors(0).start().unwrap());
    let sock = dir.path().join("teams").join(format!("{}.sock", victim_team.team));
    let side = ShmBind {
        me: hostile.id(),
        doorbell: Arc::new(Doorbell::create().unwrap()),
        ring_bytes: CAP,
        area_bytes: AREA,
        magic: None,
        patience: Duration::from_secs(5),
    };
    let end = shm_connect(UnixStream::connect(&sock).unwrap(), &side, victim_team).unwrap();
    // The honest caller, calling all along.
    let honest = Team::builder().runtime_dir(dir.path()).node(2).start().unwrap();
    let to_calc = CalcClient::bind_to(&honest, calc).unwrap().with_timeout(CALL_DEADLINE);
    let to_echo = honest.raw_sender(echo).with_timeout(CALL_DEADLINE);
    let call = move |n: i32| match target {
        Target::Service => to_calc.add_blocking(n, 1).map_err(|e| format!("call {n}: {e}")),
        Target::Port => to_echo
            .call(&(n + 1).to_le_bytes())
            .map_err(|e| format!("call {n}: {e}"))
            .map(|b| i32::from_le_bytes(b.try_into().unwrap())),
    };
    assert_eq!(call(1), Ok(2));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut n, mut worst) = (0, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                assert_eq!(call(n), Ok(n + 1));
                worst = worst.max(t0.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (n, worst)
        })
    };
    // Calls without a deadline (to the service, their envelopes are
    // garbage: each is answered at once, with an error; the port echoes
    // them), as fast as the ring takes them.
    let to = if target == Target::Service { calc } else { echo };
    let me = hostile.id().endpoint(1).unwrap().addr();
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed() < Duration::from_millis(1500) {
        let h = Header::new(Kind::Data, me, to.addr(), sent + 1).with_checkpoint(Checkpoint::OnReturn);
        match end.try_send(&h, &[0xC1; 40]) {
            Ok(()) => sent += 1,
            Err(SendError::Full) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("the victim closed a channel that broke no rule: {e:?} after {sent} calls"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (n, worst) = common::within(CALL_DEADLINE * 2, "the honest calls", move || calls.join())
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    eprintln!("the hostile sent {sent} calls; the honest caller made {n}, the slowest in {worst:?}");
    assert!(n > 50 && worst < WORST_LATENCY, "the honest caller made {n} calls, the slowest in {worst:?}");
    // The victim stopped taking the hostile's calls at its bound (the
    // inbox, the hold queue and the waiting answers), not at its memory's end.
    assert!(sent < 20_000, "the victim took {sent} calls from a peer that reads nothing");
    let now = victim_stats(&mut victim);
    assert!(now.rss_kib < before.rss_kib + (64 << 10), "the victim grew from {before:?} to {now:?}");
    assert!(victim.proc.try_wait().unwrap().is_none(), "the victim died");
    drop(end);
}

/// Regression: a TCP end believed any credit its peer returned, so a peer
/// that returned credit for bytes never sent (here 1 MiB, or `u64::MAX`)
/// and then read nothing made the end queue frames without bound (a victim
/// echoing 30 KiB requests for such a peer grew by 100 MB in 4 s). Credit
/// past the grant is now a protocol violation; credit honestly returned is
/// taken as before.
#[test]
fn a_tcp_peer_returning_credit_it_was_never_given_is_cut_off() {
    let release = |frames: u64, detached: u64| {
        let h = Header::new(Kind::Release, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
        frame(&h, &[frames.to_le_bytes(), detached.to_le_bytes()].concat())
    };
    for (frames, detached) in [(1 << 20, 0), (0, 1), (u64::MAX, u64::MAX)] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (sock, _) = listener.accept().unwrap();
        let grant = Grant { frames: 64 << 10, detached: 1 << 20 };
        let end =
            TcpEnd::new(sock, grant, grant, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
        let to = |call| Header::new(Kind::Data, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, call);
        // Credit honestly returned (for a frame sent), and a heartbeat: fine.
        end.try_send(&to(1), &[1; 100]).unwrap();
        raw.write_all(&release(HEADER_LEN as u64 + 100, 0)).unwrap();
        raw.write_all(&release(0, 0)).unwrap();
        let settled = common::eventually(Duration::from_secs(5), || {
            let _ = end.try_recv(&mut |_, _| true);
            raw.set_nonblocking(true).unwrap();
            let mut got = [0u8; 256];
            let quiet = matches!(raw.read(&mut got), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            quiet
        });
        assert!(settled && !end.is_closed(), "honest credit closed the channel");
        raw.set_nonblocking(false).unwrap();
        // Then credit never given: the channel is closed.
        raw.write_all(&release(frames, detached)).unwrap();
        let closed = common::eventually(Duration::from_secs(5), || {
            let _ = end.try_recv(&mut |_, _| true);
            end.is_closed()
        });
        assert!(closed, "credit of {frames} frame bytes and {detached} payload bytes past the grant was believed");
        assert_eq!(end.try_send(&to(2), b"no"), Err(SendError::Closed));
    }
}

/// Regression: a TCP end took the credit its peer granted at the handshake
/// as it came, up to the protocol's bounds (1 GiB of frames, 64 GiB of
/// large payloads), so a peer holding the cluster key could grant that
/// much, read nothing, and have the end queue that much for it. An end now
/// queues for its peer no more than it grants the peer.
#[test]
fn a_tcp_peer_granting_huge_credit_gets_no_more_than_the_end_grants_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let _raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    let ours = Grant { frames: 64 << 10, detached: 1 << 20 };
    let theirs = Grant { frames: 1 << 30, detached: 1 << 36 };
    let end = TcpEnd::new(sock, ours, theirs, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
    let to = Header::new(Kind::Data, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
    // The peer reads nothing: frames go into the kernel's buffers, then queue.
    let mut queued = 0usize;
    while end.try_send(&to, &[7; 1000]).is_ok() {
        queued += HEADER_LEN + 1000;
        assert!(queued <= 64 << 20, "still queueing after 64 MiB for a peer that reads nothing");
    }
    assert!(end.max_payload() < 64 << 10, "inline payloads up to {} bytes", end.max_payload());
    assert!(end.max_detached() <= 1 << 20, "large payloads up to {} bytes", end.max_detached());
    // Credit counts what was sent and not yet given back, in the kernel's
    // buffers or ours: at most the 64 KiB we grant.
    assert!(queued <= 64 << 10, "sent {queued} bytes to a peer that reads nothing");
}

/// The other side of the bound above: two honest ends with different
/// grants (one 16 times the other) agree on the smaller, so the reader
/// gives credit back in time and a stream of frames never stalls (a
/// writer held to the smaller grant while its reader counted the larger
/// one would wait forever for credit).
#[test]
fn tcp_ends_with_different_grants_run_on_the_smaller_without_stalling() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let x = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (y, _) = listener.accept().unwrap();
    let (small, large) = (Grant { frames: 64 << 10, detached: 1 << 20 }, Grant { frames: 1 << 20, detached: 16 << 20 });
    let bell = || Arc::new(Doorbell::create().unwrap());
    let a = TcpEnd::new(x, small, large, bell(), Duration::from_secs(10)).unwrap();
    let b = TcpEnd::new(y, large, small, bell(), Duration::from_secs(10)).unwrap();
    let to = Header::new(Kind::Data, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
    let until = Instant::now() + Duration::from_secs(20);
    for (from, into) in [(&a, &b), (&b, &a)] {
        let (mut sent, mut got) = (0, 0);
        while got < 2000 {
            assert!(Instant::now() < until, "stalled: {sent} frames sent, {got} received");
            if sent < 2000 && from.try_send(&to, &[5; 1000]).is_ok() {
                sent += 1;
            }
            if matches!(into.try_recv(&mut |_, _| true), Ok(ferry::testing::Recv::Consumed)) {
                got += 1;
            }
            from.tidy();
        }
    }
}

/// Regression: a TCP end read all the kernel held before splitting frames,
/// growing its buffer 64 KiB a read while reads filled it, so a peer that
/// streams credit frames (which need no credit) faster than the end reads
/// grew the buffer without bound. A pump now stops at the credit granted
/// and a read's worth, and the next receive goes on from there.
#[test]
fn a_tcp_peer_streaming_credit_frames_does_not_grow_the_ends_buffer() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    let grant = Grant { frames: 64 << 10, detached: 1 << 20 };
    let end = TcpEnd::new(sock, grant, grant, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
    let h = Header::new(Kind::Release, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
    let heartbeat = frame(&h, &[0u8; 16]);
    // 64 MiB of heartbeats (empty credit frames), in 1 MiB writes, as fast as the socket takes them.
    let chunk: Vec<u8> =
        heartbeat.iter().copied().cycle().take(heartbeat.len() * ((1 << 20) / heartbeat.len())).collect();
    let writer = std::thread::spawn(move || {
        for _ in 0..64 {
            raw.write_all(&chunk).unwrap();
        }
        raw
    });
    let mut largest = 0;
    while !writer.is_finished() {
        assert!(matches!(end.try_recv(&mut |_, _| true), Ok(ferry::testing::Recv::Empty)));
        largest = largest.max(end.rx_buffer_len());
    }
    let _raw = writer.join().unwrap();
    assert!(!end.is_closed(), "heartbeats closed the channel");
    // The cap (64 KiB + 1 MiB of credit, 64 KiB of read) and a read past it, doubled by the compaction's lag.
    assert!(largest <= 4 << 20, "the buffer grew to {largest} bytes");
}

/// Issue 16: a large payload was read into the end's buffer (which grew to
/// hold the whole frame, and stayed that large until a heartbeat cooled it)
/// and then copied out into the `Received` handed to the receiver: gathered
/// whole twice, the buffer as large as the largest frame. Now its header
/// sends the rest of it into a buffer of its own, which the receiver gets:
/// the end's buffer stays at a few reads.
#[test]
fn a_large_tcp_payload_is_read_into_a_buffer_of_its_own_not_the_ends() {
    const LEN: usize = 16 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    let grant = Grant { frames: 64 << 10, detached: 32 << 20 };
    let end = TcpEnd::new(sock, grant, grant, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
    let mut h = Header::new(Kind::Data, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 7);
    h.flags |= flags::DETACHED;
    let payload: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let bytes = frame(&h, &payload);
    // In 1 MiB writes, so the end reads it in many pieces, as it arrives.
    let writer = std::thread::spawn(move || {
        for chunk in bytes.chunks(1 << 20) {
            raw.write_all(chunk).unwrap();
        }
        raw
    });
    let (mut largest, mut got) = (0, None);
    let until = Instant::now() + Duration::from_secs(30);
    while got.is_none() {
        assert!(Instant::now() < until, "the frame never came whole");
        let r = end.try_recv(&mut |h, body| {
            let ferry::testing::Body::Detached(slot) = body else { panic!("a large payload came inline") };
            let Some(ferry::testing::Detached::Received(r)) = slot.take() else { panic!("not a TCP payload") };
            got = Some((h.call_id, r.into_vec()));
            true
        });
        assert!(r.is_ok(), "{r:?}");
        largest = largest.max(end.rx_buffer_len());
    }
    let _raw = writer.join().unwrap();
    let (call, received) = got.unwrap();
    assert_eq!(call, 7);
    assert!(received == payload, "the payload came back altered");
    // Its own buffer, of its size: not a larger one it was read into first.
    assert_eq!(received.capacity(), LEN);
    // A few reads' worth (64 KiB each), not the frame.
    assert!(largest <= 256 << 10, "the end's buffer grew to {largest} bytes for a {LEN}-byte frame");
}

/// The other side of the above: the buffer a large payload gets is sized by
/// its header, so a header claiming more than the credit we granted closes
/// the channel from the header alone, nothing allocated for it (and one
/// within the credit waits for its bytes).
#[test]
fn a_tcp_header_claiming_past_the_credit_closes_the_channel_before_any_allocation() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    let grant = Grant { frames: 64 << 10, detached: 1 << 20 };
    let end = TcpEnd::new(sock, grant, grant, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
    let mut h = Header::new(Kind::Data, ferry::testing::Addr::NONE, ferry::testing::Addr::NONE, 0);
    h.flags |= flags::DETACHED;
    let mut head = [0u8; HEADER_LEN];
    // Within the credit: its bytes are awaited.
    h.len = 1 << 20;
    h.encode(&mut head);
    raw.write_all(&head).unwrap();
    raw.write_all(&[1; 1000]).unwrap();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert!(matches!(end.try_recv(&mut |_, _| true), Ok(ferry::testing::Recv::Empty)));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!end.is_closed());
    // A second end: a header for 4 GiB - 1 bytes, 1 MiB granted.
    let mut raw = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    let end = TcpEnd::new(sock, grant, grant, Arc::new(Doorbell::create().unwrap()), Duration::from_secs(10)).unwrap();
    h.len = u32::MAX;
    h.encode(&mut head);
    raw.write_all(&head).unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let err = loop {
        assert!(Instant::now() < until, "the header was never refused");
        match end.try_recv(&mut |_, _| panic!("a frame past the credit was received")) {
            Ok(ferry::testing::Recv::Empty) => continue,
            r => break r,
        }
    };
    assert!(matches!(err, Err(ferry::testing::RecvError::Corrupt(_))), "{err:?}");
    assert!(end.is_closed(), "the channel stayed open");
    assert!(end.rx_buffer_len() <= 64 << 10, "{} bytes buffered", end.rx_buffer_len());
}

/// Regression: the team that binds a shared-memory channel sizes both its
/// payload areas (up to 64 GiB: they are sparse), and the other team staged
/// its large messages in the one it writes as long as there was room. So a
/// peer that made huge areas and never gave a range back (it reads its
/// replies and keeps them) had an echo service fill up to 64 GiB of memory
/// for it. A team now stages at most its own `max_message` (as a payload
/// area it makes holds) in the area it writes: past that, its replies wait
/// for the peer to give ranges back.
#[test]
fn a_peer_that_makes_huge_payload_areas_gets_no_more_than_the_victims_max_message() {
    const LARGE: usize = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let victim = Team::builder().runtime_dir(dir.path()).max_message(1 << 20).start().unwrap();
    let echo = victim.open_raw_port().unwrap();
    let to = echo.id();
    let server = std::thread::spawn(move || {
        while let Ok(m) = echo.recv_timeout(Duration::from_secs(3)) {
            let back = m.payload().to_vec();
            let _ = m.reply(&back);
        }
    });
    let hostile = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let side = ShmBind {
        me: hostile.id(),
        doorbell: Arc::new(Doorbell::create().unwrap()),
        ring_bytes: 64 << 10,
        area_bytes: 64 << 20,
        magic: None,
        patience: Duration::from_secs(5),
    };
    let sock = dir.path().join("teams").join(format!("{}.sock", victim.id().team));
    let end = shm_connect(UnixStream::connect(&sock).unwrap(), &side, victim.id()).expect("bind");
    // 40 large calls, each with a deadline (a reply waits for room no longer).
    let me = hostile.id().endpoint(1).unwrap().addr();
    for call in 1..=40 {
        let mut h = Header::new(Kind::Data, me, to.addr(), call).with_checkpoint(Checkpoint::OnReturn);
        h.budget_ns = 300_000_000;
        let staged = end.stage(&vec![call as u8; LARGE]).expect("room in our own area");
        end.try_send_staged(&h, &mut Some(staged)).expect("room in the ring");
    }
    // Take the replies, and keep them: their ranges never go back.
    let mut kept = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let _ = end.try_recv(&mut |h, body| {
            if let ferry::testing::Body::Detached(slot) = body {
                if h.kind == Kind::Reply {
                    kept.push(slot.take().expect("offered"));
                }
            }
            true
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    let held: usize = kept.iter().map(|d| d.len()).sum();
    eprintln!("the victim lent {} replies, {held} bytes", kept.len());
    assert!(!kept.is_empty(), "no reply came");
    assert!(held <= 1 << 20, "the victim staged {held} bytes for us, more than its max_message");
    drop((kept, end));
    server.join().unwrap();
}
