//! `ferry bench soak --hosts N`: the soak on a cluster of N hosts, network
//! namespaces joined by a bridge (`scripts/cluster-soak.sh` makes them:
//! this harness and an etcd run in `PREFIX-1` at 10.77.0.1, host h in
//! `PREFIX-(h+2)` at 10.77.0.(h+2)), each a node of `--teams-per-host`
//! teams (processes) with their names on the etcd. The teams send each
//! other messages and calls of random sizes (shared memory within a host,
//! TCP between hosts) while the harness, every 30 s, takes one host's link
//! down and, [`LINK_DOWN`] later, up again, and every 20 s SIGKILLs a
//! random team and starts it again (a new incarnation, under the same
//! name). All in blocking mode: 32 teams and etcd share 2 cores.
//!
//! What it checks:
//! - **deadlines**: every operation (a send at any checkpoint, a call, a
//!   look-up) returns, with its answer or a typed error, within its
//!   deadline (plus [`GRACE`] for a machine this loaded): `late` = 0;
//! - **nothing duplicated, reordered or corrupted**: every message carries
//!   its sender, the sender's incarnation, a sequence number and a
//!   checksum;
//! - **nothing confirmed lost**: a message the sender was told arrived (a
//!   send `OnReceipt` or `OnDelivery`, or a call, that returned `Ok`) is
//!   counted by its receiver; checked between incarnations alive at the
//!   end, as a lower bound (`acked_missing` = 0: a message that timed out
//!   but arrived hides one lost);
//! - **names converge**: a harness thread looks every name up in etcd
//!   every [`NAME_POLL`] and times how long a name stays bound to a dead
//!   incarnation after a kill (at most one lease TTL, when the dead
//!   team's lease expires), how long until the new incarnation holds it,
//!   and how long after a link comes back its host's names are all bound
//!   again (their leases expired while it was down; the teams renew them
//!   at their next keep-alive: at most one TTL).

use crate::crash::etcd::Etcd;
use crate::crash::rng::Rng;
use crate::soak::{checksum, sample, say, SoakArgs};
use ferry::{Checkpoint, EndpointId, Error, RawSender, Team};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable that makes this binary a cluster soak team (its [`Spec`]).
const CHILD: &str = "FERRY_CLUSTER_SOAK_TEAM";
/// The names' lease TTL.
const TTL: Duration = Duration::from_secs(3);
/// Every operation's deadline.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a silent node is waited for before its channels fail.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// What an operation may take past its deadline before it counts as late:
/// 32 processes share 2 cores, a thread may wait that long for one.
const GRACE: Duration = Duration::from_secs(1);
/// How long a host's link stays down: longer than the TTL (its names
/// expire) and the peer timeout (its channels fail).
const LINK_DOWN: Duration = Duration::from_secs(8);
const LINK_EVERY: Duration = Duration::from_secs(30);
const KILL_EVERY: Duration = Duration::from_secs(20);
/// How often the harness looks every name up.
const NAME_POLL: Duration = Duration::from_millis(250);
/// Pause between a team's operations (32 teams on 2 cores).
const PACE: Duration = Duration::from_millis(5);
/// Message header: sender, its incarnation, sequence number, kind, checksum of the rest.
const HEAD: usize = 4 + 4 + 8 + 1 + 8;
/// The port every node listens on.
const NODE_PORT: u16 = 7400;

fn name(i: usize) -> String {
    format!("csoak-{i}")
}

/// What a team process is told at start.
#[derive(Serialize, Deserialize)]
struct Spec {
    index: usize,
    incarnation: u32,
    teams: usize,
    etcd: SocketAddr,
    seed: u64,
}

// ---------------------------------------------------------------- a team

/// In a re-executed team: plays it and exits.
pub(crate) fn team_if_requested() {
    let Ok(spec) = std::env::var(CHILD) else { return };
    play(serde_json::from_str(&spec).expect("team spec"));
    std::process::exit(0);
}

/// What a team saw of one sender incarnation.
#[derive(Default)]
struct FromSender {
    /// Messages of the kinds a sender gets confirmed (not `Immediate`).
    confirmed_kinds: u64,
    last: Option<u64>,
    /// Sequence numbers seen lately (to tell a duplicate from a reordering).
    recent: VecDeque<u64>,
}

#[derive(Default)]
struct Seen {
    from: HashMap<(u32, u32), FromSender>,
    received: u64,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
}

impl Seen {
    fn take(&mut self, p: &[u8]) -> Option<u64> {
        if p.len() < HEAD {
            self.corrupted += 1;
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"));
        let (from, inc, seq, kind, sum) = (u32_at(0), u32_at(4), u64_at(8), p[16], u64_at(17));
        if checksum(&p[HEAD..]) != sum {
            self.corrupted += 1;
            return None;
        }
        let f = self.from.entry((from, inc)).or_default();
        let dup = f.recent.contains(&seq);
        let reordered = !dup && f.last.is_some_and(|l| seq < l);
        if !dup {
            self.received += 1;
            f.confirmed_kinds += u64::from(kind != 0);
            f.last = Some(f.last.map_or(seq, |l| l.max(seq)));
            f.recent.push_back(seq);
            if f.recent.len() > 4096 {
                f.recent.pop_front();
            }
        }
        self.duplicated += u64::from(dup);
        self.reordered += u64::from(reordered);
        Some(sum)
    }
}

/// The error's variant, as the report counts it.
fn variant(e: &Error) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("?").to_string()
}

fn play(spec: Spec) {
    let me = spec.index;
    // Commands from the harness: "stop" (sending), "report", "quit".
    let stop = Arc::new(AtomicBool::new(false));
    let (cmd_tx, cmd_rx) = mpsc::channel::<String>();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if line == "stop" {
                    stop.store(true, Ordering::Relaxed);
                }
                let _ = cmd_tx.send(line);
            }
            // The harness is gone: so is this team.
            std::process::exit(1);
        });
    }
    // The host's link may be down now (etcd out of reach), and the name
    // stays the dead incarnation's until its lease expires: both are
    // waited out.
    let t0 = Instant::now();
    let patience = Duration::from_secs(60);
    let team = loop {
        match Team::builder().blocking().etcd(spec.etcd, TTL).peer_timeout(PEER_TIMEOUT).start() {
            Ok(t) => break t,
            Err(e) if t0.elapsed() < patience => {
                eprintln!("cluster soak team {me}: start: {e}; again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("team {me} could not start: {e}"),
        }
    };
    let port = loop {
        match team.open_named_raw_port(&name(me)) {
            Ok(p) => break p,
            Err(e) if t0.elapsed() < patience => {
                if !matches!(e, Error::NameTaken { .. }) {
                    eprintln!("cluster soak team {me}: bind its name: {e}; again");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("team {me} could not bind its name: {e}"),
        }
    };
    say(json!({"ready": me, "ep": port.id().to_string()}));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let receiver = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            while let Ok(m) = port.recv_blocking() {
                let sum = seen.lock().unwrap().take(m.payload());
                if let (true, Some(sum)) = (m.wants_reply(), sum) {
                    let _ = m.reply(&sum.to_le_bytes());
                }
            }
        })
    };

    let mut rng = Rng::derive(spec.seed, &[me as u64, u64::from(spec.incarnation)]);
    let mut peers: HashMap<usize, (EndpointId, RawSender)> = HashMap::new();
    let mut seq = 0u64;
    let (mut ops, mut calls, mut late, mut lookups) = (0u64, 0u64, 0u64, 0u64);
    let mut worst = Duration::ZERO;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    // Per destination endpoint: messages confirmed.
    let mut confirmed: HashMap<String, u64> = HashMap::new();
    let mut rtts: Vec<u32> = Vec::new();
    let start = Instant::now();
    let mut next_sample = start + Duration::from_secs(10);
    // Times an operation; counts it late past its deadline and the grace.
    let timed = |what: &str, t: Instant, worst: &mut Duration, late: &mut u64| {
        let took = t.elapsed();
        *worst = (*worst).max(took);
        if took > DEADLINE + GRACE {
            *late += 1;
            eprintln!("cluster soak team {me}: {what} took {took:?}, past its deadline {DEADLINE:?}");
        }
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(PACE);
        let j = (me + 1 + rng.below(spec.teams as u64 - 1) as usize) % spec.teams;
        if let std::collections::hash_map::Entry::Vacant(v) = peers.entry(j) {
            let t = Instant::now();
            lookups += 1;
            let found = team.lookup(&name(j));
            timed("a look-up", t, &mut worst, &mut late);
            match found {
                Ok(ep) => {
                    v.insert((ep, team.raw_sender(ep).with_timeout(DEADLINE)));
                }
                Err(e) => {
                    *errors.entry(format!("lookup:{}", variant(&e))).or_default() += 1;
                    continue;
                }
            }
        }
        let (ep, to) = &peers[&j];
        let len = match rng.below(100) {
            0..=69 => rng.below(256),
            70..=94 => 256 + rng.below(16 << 10),
            _ => (16 << 10) + rng.below(240 << 10),
        } as usize;
        let kind = rng.below(4) as u8;
        let body: Vec<u8> = (0..len).map(|k| (seq as usize).wrapping_add(k * 31) as u8).collect();
        let mut msg = Vec::with_capacity(HEAD + len);
        msg.extend_from_slice(&(me as u32).to_le_bytes());
        msg.extend_from_slice(&spec.incarnation.to_le_bytes());
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.push(kind);
        msg.extend_from_slice(&checksum(&body).to_le_bytes());
        msg.extend_from_slice(&body);
        seq += 1;
        let t = Instant::now();
        let r = match kind {
            0 => loop {
                // Immediate: a full channel is not a failure before the deadline.
                match to.send(&msg, Checkpoint::Immediate) {
                    Err(Error::WouldBlock { .. }) if t.elapsed() < DEADLINE => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    r => break r.map(drop),
                }
            },
            1 => to.send(&msg, Checkpoint::OnReceipt).map(drop),
            2 => to.send(&msg, Checkpoint::OnDelivery).map(drop),
            _ => to.call(&msg).and_then(|back| {
                if back == msg[17..25] {
                    Ok(())
                } else {
                    Err(Error::Refused("the reply's checksum differs".into()))
                }
            }),
        };
        timed(
            ["an immediate send", "a send on receipt", "a send on delivery", "a call"][kind as usize],
            t,
            &mut worst,
            &mut late,
        );
        ops += 1;
        match r {
            Ok(()) => {
                if kind != 0 {
                    *confirmed.entry(ep.to_string()).or_default() += 1;
                }
                if kind == 3 {
                    calls += 1;
                    rtts.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                }
            }
            Err(e) => {
                *errors.entry(variant(&e)).or_default() += 1;
                // Looked up again: the peer may be a new incarnation.
                peers.remove(&j);
            }
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(10);
            say(json!({"sample": sample(start, &mut rtts)}));
        }
    }
    say(json!({"sample": sample(start, &mut rtts)}));
    say(json!({"sent": {"ops": ops, "calls": calls, "lookups": lookups, "late": late,
                        "worst_ms": worst.as_secs_f64() * 1e3, "errors": errors, "confirmed": confirmed}}));
    while let Ok(line) = cmd_rx.recv() {
        match line.as_str() {
            "report" => {
                let s = seen.lock().unwrap();
                let from: Vec<Value> = s.from.iter().map(|((f, inc), v)| json!([f, inc, v.confirmed_kinds])).collect();
                say(json!({"received": {"messages": s.received, "duplicated": s.duplicated,
                    "reordered": s.reordered, "corrupted": s.corrupted, "from": from}}));
            }
            "quit" => break,
            _ => {}
        }
    }
    team.shutdown();
    let _ = receiver.join();
}

// ---------------------------------------------------------------- the run

/// A team process (one incarnation), its lines forwarded to the harness's channel.
struct Incarnation {
    team: usize,
    number: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    started: Instant,
    killed: bool,
    /// Its endpoint, once it said it is ready.
    ep: Option<String>,
    /// Its last words: what it sent, then what it received.
    sent: Option<Value>,
    received: Option<Value>,
}

impl Incarnation {
    fn tell(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }
}

impl Drop for Incarnation {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line from team `.0`'s incarnation `.1`.
type Line = (usize, u32, Value);

/// Starts a team's incarnation in network namespace `ns` (its host's).
fn spawn(ns: &str, spec: &Spec, dir: &Path, lines: &mpsc::Sender<Line>) -> Result<Incarnation, String> {
    let host = ns.rsplit('-').next().unwrap_or("?");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // `ip netns exec` execs this binary: the pid is the team's.
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .env(CHILD, serde_json::to_string(spec).expect("spec"))
        .env("FERRY_RUNTIME_DIR", dir.join(format!("host{host}")))
        .env("FERRY_CLUSTER", dir.join(format!("host{host}.cluster")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start team {}: {e}", spec.index))?;
    let out = BufReader::new(child.stdout.take().expect("piped"));
    let (tx, i, n) = (lines.clone(), spec.index, spec.incarnation);
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            // Anything else on stdout (not JSON) is skipped.
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send((i, n, v)).is_err() {
                    return;
                }
            }
        }
    });
    let stdin = child.stdin.take();
    Ok(Incarnation {
        team: i,
        number: n,
        child,
        stdin,
        started: Instant::now(),
        killed: false,
        ep: None,
        sent: None,
        received: None,
    })
}

/// Every name's bindings over time, as the watcher saw them change.
type Timeline = Vec<Vec<(Instant, Option<String>)>>;

/// Looks every name up every [`NAME_POLL`] until `done`; returns the changes.
fn watch_names(
    etcd: SocketAddr,
    teams: usize,
    done: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Timeline>, Error> {
    let client = ferry::testing::EtcdNames::connect(&[etcd], Duration::from_secs(60))?;
    Ok(std::thread::spawn(move || {
        let mut seen: Timeline = vec![vec![(Instant::now(), None)]; teams];
        while !done.load(Ordering::Relaxed) {
            for (i, changes) in seen.iter_mut().enumerate() {
                let got = client.lookup(&name(i)).ok().map(|ep| ep.to_string());
                if changes.last().is_some_and(|(_, was)| *was != got) {
                    changes.push((Instant::now(), got));
                }
            }
            std::thread::sleep(NAME_POLL);
        }
        seen
    }))
}

/// When, from `from` on, `changes` first showed `want` (seconds after `from`).
fn first_seen(
    changes: &[(Instant, Option<String>)],
    from: Instant,
    want: impl Fn(&Option<String>) -> bool,
) -> Option<f64> {
    // The binding at `from`: the last change before it.
    let before = changes.iter().rev().find(|(t, _)| *t <= from);
    if before.is_some_and(|(_, v)| want(v)) {
        return Some(0.0);
    }
    changes.iter().find(|(t, v)| *t > from && want(v)).map(|(t, _)| (*t - from).as_secs_f64())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let s = Command::new("ip").args(args).status().map_err(|e| format!("ip: {e}"))?;
    if s.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {s}", args.join(" ")))
    }
}

/// `{"n", "median", "max"}` of `v` (seconds), in milliseconds.
fn median_max(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let ms = |x: Option<&f64>| x.map_or(0.0, |s| (s * 1e3).round());
    json!({"n": v.len(), "median_ms": ms(v.get(v.len() / 2)), "max_ms": ms(v.last())})
}

/// Runs the cluster soak and prints its report; an error if a check failed.
pub fn run(args: &SoakArgs) -> ferry::Result<()> {
    let fail = |e: String| Error::Refused(format!("cluster soak: {e}"));
    let io = Error::io;
    let prefix = std::env::var("FERRY_SOAK_NETNS")
        .map_err(|_| fail("needs the network namespaces scripts/cluster-soak.sh makes ($FERRY_SOAK_NETNS)".into()))?;
    let (hosts, per) = (args.hosts, args.teams_per_host.max(1));
    let teams = hosts * per;
    if teams < 2 || hosts > 200 {
        return Err(fail(format!("{hosts} hosts of {per} teams: need 2 teams or more and 200 hosts at most")));
    }
    let dir = std::env::temp_dir().join(format!("ferry-cluster-soak-{}", std::process::id()));
    let _cleanup = RemoveDir(dir.clone());
    std::fs::create_dir_all(&dir).map_err(io("soak dir"))?;
    std::fs::write(dir.join("key"), b"the cluster soak's key, 32 bytes").map_err(io("key file"))?;
    let host_ip = |h: usize| Ipv4Addr::new(10, 77, 0, h as u8 + 2);
    for h in 0..hosts {
        let mut file =
            format!("node {}\nlisten {}:{NODE_PORT}\nkey-file {}\n", h + 1, host_ip(h), dir.join("key").display());
        for o in (0..hosts).filter(|&o| o != h) {
            file += &format!("peer {} {}:{NODE_PORT}\n", o + 1, host_ip(o));
        }
        std::fs::write(dir.join(format!("host{}.cluster", h + 2)), file).map_err(io("cluster file"))?;
        std::fs::create_dir_all(dir.join(format!("host{}", h + 2))).map_err(io("runtime dir"))?;
    }
    let etcd = Etcd::start(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)), &dir).map_err(fail)?;
    let seed = crate::crash::rng::now_ns();
    let mut rng = Rng::derive(seed, &[]);
    let host_ns = |h: usize| format!("{prefix}-{}", h + 2);
    let spec = |i: usize, incarnation: u32| Spec { index: i, incarnation, teams, etcd: etcd.addr, seed };
    let (tx, rx) = mpsc::channel::<Line>();
    let mut all: Vec<Incarnation> = Vec::new();
    for i in 0..teams {
        all.push(spawn(&host_ns(i / per), &spec(i, 0), &dir, &tx).map_err(fail)?);
    }
    // Per team: its live incarnation (an index into `all`).
    let mut live: Vec<usize> = (0..teams).collect();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_names(etcd.addr, teams, done.clone())?;

    let started = Instant::now();
    let secs = |t: Instant| (t - started).as_secs_f64();
    let mut samples: Vec<Vec<Value>> = vec![Vec::new(); teams];
    let mut take = |all: &mut Vec<Incarnation>, (i, n, v): Line| {
        let Some(c) = all.iter_mut().find(|c| c.team == i && c.number == n) else { return };
        if let Some(ep) = v.get("ep").and_then(Value::as_str) {
            c.ep = Some(ep.to_string());
        } else if let Some(s) = v.get("sample") {
            samples[i].push(s.clone());
        } else if let Some(s) = v.get("sent") {
            c.sent = Some(s.clone());
        } else if let Some(r) = v.get("received") {
            c.received = Some(r.clone());
        }
    };
    // The chaos: a kill every KILL_EVERY, a link down every LINK_EVERY (for LINK_DOWN).
    let mut events: Vec<String> = Vec::new();
    let mut kills: Vec<(usize, Instant, Option<String>, usize)> = Vec::new();
    let mut link_ups: Vec<(usize, Instant)> = Vec::new();
    let (mut next_kill, mut next_link) = (started + KILL_EVERY, started + LINK_EVERY);
    let mut down: Option<(usize, Instant)> = None;
    let until = started + Duration::from_secs_f64(args.minutes * 60.0);
    loop {
        let now = Instant::now();
        if let Some((h, t)) = down {
            if now >= t + LINK_DOWN || now >= until {
                ip(&["-n", &host_ns(h), "link", "set", "eth0", "up"]).map_err(fail)?;
                events.push(format!("{:.1} s: host {} link up", secs(now), h + 1));
                link_ups.push((h, now));
                down = None;
            }
        }
        if now >= until {
            break;
        }
        if now >= next_kill {
            next_kill += KILL_EVERY;
            let i = rng.below(teams as u64) as usize;
            let victim = &mut all[live[i]];
            let _ = victim.child.kill();
            let _ = victim.child.wait();
            victim.killed = true;
            let (dead_ep, number) = (victim.ep.clone(), victim.number + 1);
            events.push(format!(
                "{:.1} s: team {i} (host {}) killed, incarnation {number} started",
                secs(now),
                i / per + 1
            ));
            all.push(spawn(&host_ns(i / per), &spec(i, number), &dir, &tx).map_err(fail)?);
            live[i] = all.len() - 1;
            kills.push((i, now, dead_ep, live[i]));
        }
        if down.is_none() && now >= next_link {
            next_link += LINK_EVERY;
            let h = rng.below(hosts as u64) as usize;
            ip(&["-n", &host_ns(h), "link", "set", "eth0", "down"]).map_err(fail)?;
            events.push(format!("{:.1} s: host {} link down", secs(now), h + 1));
            down = Some((h, now));
        }
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            take(&mut all, line);
        }
    }

    // The end: every live team stops sending and says what it sent, then what it received.
    let ending = Instant::now() + Duration::from_secs(120);
    let mut wait_for = |all: &mut Vec<Incarnation>, key: &str| -> Result<(), Error> {
        while live.iter().any(|&a| if key == "sent" { all[a].sent.is_none() } else { all[a].received.is_none() }) {
            let left = ending.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => take(all, line),
                Err(_) => {
                    let slow: Vec<usize> = live.iter().map(|&a| all[a].team).collect();
                    return Err(fail(format!("teams {slow:?} did not say what they {key} within 2 minutes")));
                }
            }
        }
        Ok(())
    };
    live.iter().for_each(|&a| all[a].tell("stop"));
    wait_for(&mut all, "sent")?;
    live.iter().for_each(|&a| all[a].tell("report"));
    wait_for(&mut all, "received")?;
    live.iter().for_each(|&a| all[a].tell("quit"));
    done.store(true, Ordering::Relaxed);
    let timeline = watcher.join().map_err(|_| fail("the name watcher panicked".into()))?;

    // What the live incarnations sent and received.
    let (mut ops, mut calls, mut lookups, mut late, mut worst_ms) = (0u64, 0u64, 0u64, 0u64, 0.0f64);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut messages, mut duplicated, mut reordered, mut corrupted, mut acked_missing) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    // Confirmed messages per (receiver endpoint, sender team, sender incarnation).
    let mut confirmed: HashMap<(String, u64, u64), u64> = HashMap::new();
    for &a in &live {
        let c = &all[a];
        let s = c.sent.as_ref().expect("waited for");
        ops += s["ops"].as_u64().unwrap_or(0);
        calls += s["calls"].as_u64().unwrap_or(0);
        lookups += s["lookups"].as_u64().unwrap_or(0);
        late += s["late"].as_u64().unwrap_or(0);
        worst_ms = worst_ms.max(s["worst_ms"].as_f64().unwrap_or(0.0));
        for (k, n) in s["errors"].as_object().into_iter().flatten() {
            *errors.entry(k.clone()).or_default() += n.as_u64().unwrap_or(0);
        }
        for (ep, n) in s["confirmed"].as_object().into_iter().flatten() {
            confirmed.insert((ep.clone(), c.team as u64, u64::from(c.number)), n.as_u64().unwrap_or(0));
        }
    }
    let is_live = |team: u64, number: u64| all[live[team as usize]].number as u64 == number;
    for &a in &live {
        let c = &all[a];
        let r = c.received.as_ref().expect("waited for");
        messages += r["messages"].as_u64().unwrap_or(0);
        duplicated += r["duplicated"].as_u64().unwrap_or(0);
        reordered += r["reordered"].as_u64().unwrap_or(0);
        corrupted += r["corrupted"].as_u64().unwrap_or(0);
        let mut got: HashMap<(u64, u64), u64> = HashMap::new();
        for f in r["from"].as_array().into_iter().flatten() {
            got.insert((f[0].as_u64().unwrap_or(0), f[1].as_u64().unwrap_or(0)), f[2].as_u64().unwrap_or(0));
        }
        let Some(ep) = &c.ep else { continue };
        for ((to, team, number), n) in &confirmed {
            if to == ep && is_live(*team, *number) {
                acked_missing += n.saturating_sub(got.get(&(*team, *number)).copied().unwrap_or(0));
            }
        }
    }
    // The names: after each kill, how long the dead incarnation's binding
    // stayed and when the new one's came; after each link up, when all
    // of the host's names were its live teams' again.
    let (mut stale, mut rebound, mut healed) = (Vec::new(), Vec::new(), Vec::new());
    let mut unconverged = 0u64;
    for (i, t, dead_ep, a) in &kills {
        if let Some(dead) = dead_ep {
            match first_seen(&timeline[*i], *t, |v| v.as_ref() != Some(dead)) {
                Some(s) => stale.push(s),
                None => unconverged += 1,
            }
        }
        if let Some(ep) = &all[*a].ep {
            match first_seen(&timeline[*i], *t, |v| v.as_ref() == Some(ep)) {
                Some(s) => rebound.push(s),
                None => unconverged += 1,
            }
        }
    }
    for (h, t) in &link_ups {
        let mut worst: Option<f64> = Some(0.0);
        for (i, changes) in timeline.iter().enumerate().skip(h * per).take(per) {
            // The team's incarnation live at `t` (if it said its endpoint).
            let inc = all.iter().rev().find(|c| c.team == i && c.started <= *t);
            let Some(ep) = inc.and_then(|c| c.ep.clone()) else { continue };
            let killed_later = kills.iter().any(|(k, kt, _, _)| *k == i && kt > t);
            match first_seen(changes, *t, |v| v.as_ref() == Some(&ep)) {
                Some(s) => worst = worst.map(|w| w.max(s)),
                // Killed before its name came back: nothing to converge to.
                None if killed_later => {}
                None => worst = None,
            }
        }
        match worst {
            Some(w) => healed.push(w),
            None => unconverged += 1,
        }
    }
    let bound = (TTL + Duration::from_secs(1)).as_secs_f64();
    let over = |v: &[f64]| v.iter().filter(|&&s| s > bound).count() as u64;
    let names_late = over(&stale) + over(&healed) + unconverged;

    // Latency and memory minute by minute, as the two-node soak reports them.
    let minutes = args.minutes.ceil().max(1.0) as usize;
    let by_minute: Vec<Value> = (0..minutes)
        .map(|m| {
            let w: Vec<&Value> = samples
                .iter()
                .flatten()
                .filter(|v| (v["t"].as_f64().unwrap_or(0.0) / 60.0) as usize == m && v["calls"].as_u64() > Some(0))
                .collect();
            let mut p50: Vec<u64> = w.iter().filter_map(|v| v["p50_us"].as_u64()).collect();
            p50.sort_unstable();
            let worst = |k: &str| w.iter().filter_map(|v| v[k].as_u64()).max().unwrap_or(0);
            json!({"minute": m, "p50_us": p50.get(p50.len() / 2).copied().unwrap_or(0),
                   "p99_us": worst("p99_us"), "max_us": worst("max_us"),
                   "rss_mib": w.iter().filter_map(|v| v["rss"].as_f64()).fold(0.0, f64::max) / (1 << 20) as f64})
        })
        .collect();
    let report = json!({
        "hosts": hosts, "teams": teams, "minutes": args.minutes, "seed": seed,
        "ttl_ms": TTL.as_millis() as u64, "deadline_ms": DEADLINE.as_millis() as u64,
        "ops": ops, "calls": calls, "lookups": lookups, "errors": errors,
        "late": late, "worst_op_ms": worst_ms.round(),
        "messages": messages, "duplicated": duplicated, "reordered": reordered, "corrupted": corrupted,
        "acked_missing": acked_missing,
        "kills": kills.len(), "link_flaps": link_ups.len(),
        "names": {"stale_after_kill": median_max(stale), "rebound_after_kill": median_max(rebound),
                  "bound_after_link_up": median_max(healed), "unconverged": unconverged, "late": names_late},
        "by_minute": by_minute, "events": events,
    });
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    let bad = late + duplicated + reordered + corrupted + acked_missing + names_late;
    if bad > 0 {
        return Err(fail(format!(
            "{late} operations past their deadline, {duplicated} duplicated, {reordered} reordered, \
             {corrupted} corrupted, {acked_missing} confirmed but not received, {names_late} names not \
             converged within a TTL"
        )));
    }
    Ok(())
}

fn print_report(r: &Value) {
    println!(
        "cluster soak: {} teams on {} hosts (network namespaces; shared memory within a host, TCP between), names on etcd (TTL {} ms), {} min",
        r["teams"], r["hosts"], r["ttl_ms"], r["minutes"]
    );
    println!(
        "chaos: {} teams SIGKILLed and started again, {} link cuts of {} s",
        r["kills"],
        r["link_flaps"],
        LINK_DOWN.as_secs()
    );
    println!(
        "operations {} (calls {}, look-ups {}): past their deadline ({} ms + {} s) {}, the slowest {} ms",
        r["ops"],
        r["calls"],
        r["lookups"],
        r["deadline_ms"],
        GRACE.as_secs(),
        r["late"],
        r["worst_op_ms"]
    );
    println!("typed errors: {}", r["errors"]);
    println!(
        "messages received {}: duplicated {}, reordered {}, corrupted {}, confirmed but not received {}",
        r["messages"], r["duplicated"], r["reordered"], r["corrupted"], r["acked_missing"]
    );
    let n = &r["names"];
    let mm = |v: &Value| format!("median {} ms, max {} ms (n = {})", v["median_ms"], v["max_ms"], v["n"]);
    println!("names: a dead incarnation's binding stayed {}", mm(&n["stale_after_kill"]));
    println!("       the new incarnation's came {}", mm(&n["rebound_after_kill"]));
    println!("       a host's names all bound again after its link came up {}", mm(&n["bound_after_link_up"]));
    println!("       not converged within a TTL (+1 s): {}", n["late"]);
    println!("by minute: calls' latency p50 / p99 / max (µs); the largest team's RSS");
    for m in r["by_minute"].as_array().into_iter().flatten() {
        println!(
            "  minute {}: {} / {} / {}; {:.1} MiB",
            m["minute"],
            m["p50_us"],
            m["p99_us"],
            m["max_us"],
            m["rss_mib"].as_f64().unwrap_or(0.0)
        );
    }
    for e in r["events"].as_array().into_iter().flatten() {
        println!("  {}", e.as_str().unwrap_or(""));
    }
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
