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
use crate::run_dir::RemoveDir;
use crate::soak::SoakArgs;
use ferry::Error;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
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

/// What every team's name starts with.
const NAME_PREFIX: &str = "csoak-";

fn name(i: usize) -> String {
    format!("{NAME_PREFIX}{i}")
}

/// What a team process is told at start.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Spec {
    index: usize,
    incarnation: u32,
    teams: usize,
    etcd: SocketAddr,
    seed: u64,
}

mod team;

pub(crate) use team::team_if_requested;

// ---------------------------------------------------------------- the run

/// A team process (one incarnation), its lines forwarded to the harness's channel.
struct Incarnation {
    team: usize,
    number: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    started: Instant,
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
    Ok(Incarnation { team: i, number: n, child, stdin, started: Instant::now(), ep: None, sent: None, received: None })
}

/// Every name's bindings over time, as the watcher saw them change.
struct Timeline {
    changes: Vec<Vec<(Instant, Option<String>)>>,
    /// The longest a name went unlooked at: how late a change may be seen.
    slowest_round: Duration,
}

/// Looks every name up every [`NAME_POLL`] until `done`; returns the changes.
fn watch_names(
    etcd: SocketAddr,
    teams: usize,
    done: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Timeline>, Error> {
    let client = ferry::testing::EtcdNames::connect(&[etcd], Duration::from_secs(60))?;
    Ok(std::thread::spawn(move || {
        let mut seen = Timeline { changes: vec![vec![(Instant::now(), None)]; teams], slowest_round: Duration::ZERO };
        let mut last_look = Instant::now();
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(NAME_POLL);
            // Every name in one request (etcd out of reach: no change seen).
            let Ok(bound) = client.list(NAME_PREFIX) else { continue };
            let now = Instant::now();
            seen.slowest_round = seen.slowest_round.max(now - last_look);
            last_look = now;
            let bound: HashMap<String, String> = bound.into_iter().map(|(n, ep)| (n, ep.to_string())).collect();
            for (i, changes) in seen.changes.iter_mut().enumerate() {
                let got = bound.get(&name(i)).cloned();
                if changes.last().is_some_and(|(_, was)| *was != got) {
                    changes.push((now, got));
                }
            }
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

/// A kill: the team, when, the dead incarnation's endpoint, the new incarnation (in `Soak::all`).
struct Kill {
    team: usize,
    at: Instant,
    dead_ep: Option<String>,
    new: usize,
}

/// What the harness did to the cluster.
#[derive(Default)]
struct Chaos {
    events: Vec<String>,
    kills: Vec<Kill>,
    /// (host, when its link came up)
    link_ups: Vec<(usize, Instant)>,
}

/// The run: its teams' incarnations and what they said.
struct Soak {
    prefix: String,
    dir: PathBuf,
    per: usize,
    spec: Spec,
    tx: mpsc::Sender<Line>,
    rx: mpsc::Receiver<Line>,
    /// Every incarnation started.
    all: Vec<Incarnation>,
    /// Per team: its live incarnation (an index into `all`).
    live: Vec<usize>,
    samples: Vec<Vec<Value>>,
}

impl Soak {
    fn host_ns(&self, h: usize) -> String {
        format!("{}-{}", self.prefix, h + 2)
    }

    /// Starts team `i`'s incarnation `number`.
    fn start(&mut self, i: usize, number: u32) -> Result<usize, String> {
        let spec = Spec { index: i, incarnation: number, ..self.spec };
        self.all.push(spawn(&self.host_ns(i / self.per), &spec, &self.dir, &self.tx)?);
        Ok(self.all.len() - 1)
    }

    /// Files a line a team said.
    fn take(&mut self, (i, n, v): Line) {
        let Some(c) = self.all.iter_mut().find(|c| c.team == i && c.number == n) else { return };
        if let Some(ep) = v.get("ep").and_then(Value::as_str) {
            c.ep = Some(ep.to_string());
        } else if let Some(s) = v.get("sample") {
            self.samples[i].push(s.clone());
        } else if let Some(s) = v.get("sent") {
            c.sent = Some(s.clone());
        } else if let Some(r) = v.get("received") {
            c.received = Some(r.clone());
        }
    }

    /// Until `until`: a kill every [`KILL_EVERY`], a link down every
    /// [`LINK_EVERY`] for [`LINK_DOWN`]; meanwhile the teams' lines.
    fn chaos(&mut self, started: Instant, until: Instant, rng: &mut Rng) -> Result<Chaos, String> {
        let secs = |t: Instant| (t - started).as_secs_f64();
        let mut chaos = Chaos::default();
        let (mut next_kill, mut next_link) = (started + KILL_EVERY, started + LINK_EVERY);
        let mut down: Option<(usize, Instant)> = None;
        let (teams, hosts) = (self.live.len(), self.live.len() / self.per);
        loop {
            let now = Instant::now();
            if let Some((h, t)) = down {
                if now >= t + LINK_DOWN || now >= until {
                    ip(&["-n", &self.host_ns(h), "link", "set", "eth0", "up"])?;
                    chaos.events.push(format!("{:.1} s: host {} link up", secs(now), h + 1));
                    chaos.link_ups.push((h, now));
                    down = None;
                }
            }
            if now >= until {
                return Ok(chaos);
            }
            if now >= next_kill {
                next_kill += KILL_EVERY;
                let i = rng.below(teams as u64) as usize;
                let victim = &mut self.all[self.live[i]];
                let _ = victim.child.kill();
                let _ = victim.child.wait();
                let (dead_ep, number) = (victim.ep.clone(), victim.number + 1);
                chaos.events.push(format!(
                    "{:.1} s: team {i} (host {}) killed, incarnation {number} started",
                    secs(now),
                    i / self.per + 1
                ));
                self.live[i] = self.start(i, number)?;
                chaos.kills.push(Kill { team: i, at: now, dead_ep, new: self.live[i] });
            }
            if down.is_none() && now >= next_link {
                next_link += LINK_EVERY;
                let h = rng.below(hosts as u64) as usize;
                ip(&["-n", &self.host_ns(h), "link", "set", "eth0", "down"])?;
                chaos.events.push(format!("{:.1} s: host {} link down", secs(now), h + 1));
                down = Some((h, now));
            }
            if let Ok(line) = self.rx.recv_timeout(Duration::from_millis(50)) {
                self.take(line);
            }
        }
    }

    /// Every live team stops sending and says what it sent, then what it
    /// received, then leaves.
    fn finish(&mut self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(120);
        for (say, key) in [("stop", "sent"), ("report", "received")] {
            for &a in &self.live {
                self.all[a].tell(say);
            }
            let missing = |s: &Soak| -> Vec<usize> {
                let said = |c: &Incarnation| if key == "sent" { c.sent.is_some() } else { c.received.is_some() };
                s.live.iter().filter(|&&a| !said(&s.all[a])).map(|&a| s.all[a].team).collect()
            };
            while !missing(self).is_empty() {
                match self.rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(line) => self.take(line),
                    Err(_) => return Err(format!("teams {:?} did not say what they {key} in time", missing(self))),
                }
            }
        }
        for &a in &self.live {
            self.all[a].tell("quit");
        }
        Ok(())
    }

    /// What the live incarnations sent and received, and the checks on it:
    /// `(report, failures)`.
    fn traffic(&self) -> (Value, u64) {
        let (mut ops, mut calls, mut lookups, mut late, mut worst_ms) = (0u64, 0u64, 0u64, 0u64, 0.0f64);
        let mut errors: BTreeMap<String, u64> = BTreeMap::new();
        // Confirmed messages per (receiver endpoint, sender team, sender incarnation).
        let mut confirmed: HashMap<(String, u64, u64), u64> = HashMap::new();
        let count = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
        for c in self.live.iter().map(|&a| &self.all[a]) {
            let s = c.sent.as_ref().expect("finished");
            (ops, calls, lookups, late) = (
                ops + count(s, "ops"),
                calls + count(s, "calls"),
                lookups + count(s, "lookups"),
                late + count(s, "late"),
            );
            worst_ms = worst_ms.max(s["worst_ms"].as_f64().unwrap_or(0.0));
            for (k, n) in s["errors"].as_object().into_iter().flatten() {
                *errors.entry(k.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
            for (ep, n) in s["confirmed"].as_object().into_iter().flatten() {
                confirmed.insert((ep.clone(), c.team as u64, u64::from(c.number)), n.as_u64().unwrap_or(0));
            }
        }
        let is_live = |team: u64, number: u64| u64::from(self.all[self.live[team as usize]].number) == number;
        let (mut messages, mut duplicated, mut reordered, mut corrupted, mut missing) = (0, 0, 0, 0, 0);
        for c in self.live.iter().map(|&a| &self.all[a]) {
            let r = c.received.as_ref().expect("finished");
            messages += count(r, "messages");
            duplicated += count(r, "duplicated");
            reordered += count(r, "reordered");
            corrupted += count(r, "corrupted");
            // Per sender incarnation: the messages of confirmed kinds received.
            let got: HashMap<(u64, u64), u64> = (r["from"].as_array().into_iter().flatten())
                .map(|f| {
                    let n = |i: usize| f[i].as_u64().unwrap_or(0);
                    ((n(0), n(1)), n(2))
                })
                .collect();
            let Some(ep) = &c.ep else { continue };
            for ((to, team, number), n) in &confirmed {
                if to == ep && is_live(*team, *number) {
                    missing += n.saturating_sub(got.get(&(*team, *number)).copied().unwrap_or(0));
                }
            }
        }
        let report = json!({
            "ops": ops, "calls": calls, "lookups": lookups, "errors": errors,
            "late": late, "worst_op_ms": worst_ms.round(),
            "messages": messages, "duplicated": duplicated, "reordered": reordered, "corrupted": corrupted,
            "acked_missing": missing,
        });
        // Reordering is reported, not failed: across a peer's bind made
        // before the team knew its old channel failed, an old message may
        // still overtake (docs/RELIABILITY.md, Cluster soak).
        (report, late + duplicated + corrupted + missing)
    }

    /// The names: after each kill, how long the dead incarnation's binding
    /// stayed and when the new one's came; after each link up, when all of
    /// the host's names were its live teams' again. `(report, names not
    /// converged within a TTL)`: a change counts as seen in time within the
    /// TTL, etcd's expiry check (every 500 ms) and the watcher's slowest
    /// round (what the look at a name may lag behind it).
    fn names(&self, timeline: &Timeline, chaos: &Chaos) -> (Value, u64) {
        let (mut stale, mut rebound, mut healed) = (Vec::new(), Vec::new(), Vec::new());
        let mut unconverged = 0u64;
        for k in &chaos.kills {
            if let Some(dead) = &k.dead_ep {
                match first_seen(&timeline.changes[k.team], k.at, |v| v.as_ref() != Some(dead)) {
                    Some(s) => stale.push(s),
                    None => unconverged += 1,
                }
            }
            if let Some(ep) = &self.all[k.new].ep {
                match first_seen(&timeline.changes[k.team], k.at, |v| v.as_ref() == Some(ep)) {
                    Some(s) => rebound.push(s),
                    None => unconverged += 1,
                }
            }
        }
        for (h, t) in &chaos.link_ups {
            let mut worst: Option<f64> = Some(0.0);
            for (i, changes) in timeline.changes.iter().enumerate().skip(h * self.per).take(self.per) {
                // The team's incarnation live at `t` (if it said its endpoint).
                let inc = self.all.iter().rev().find(|c| c.team == i && c.started <= *t);
                let Some(ep) = inc.and_then(|c| c.ep.clone()) else { continue };
                let killed_later = chaos.kills.iter().any(|k| k.team == i && k.at > *t);
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
        let bound = (TTL + Duration::from_millis(500) + timeline.slowest_round).as_secs_f64();
        let over = |v: &[f64]| v.iter().filter(|&&s| s > bound).count() as u64;
        let late = over(&stale) + over(&healed) + unconverged;
        let report = json!({"stale_after_kill": median_max(stale), "rebound_after_kill": median_max(rebound),
                            "bound_after_link_up": median_max(healed), "unconverged": unconverged, "late": late,
                            "bound_ms": (bound * 1e3).round(), "slowest_look_round_ms": timeline.slowest_round.as_millis() as u64});
        (report, late)
    }

    /// Latency and memory minute by minute: the median of the teams'
    /// 10-second call medians, the worst 99th percentile and call, the
    /// largest team's RSS.
    fn by_minute(&self, minutes: f64) -> Vec<Value> {
        (0..minutes.ceil().max(1.0) as usize)
            .map(|m| {
                let w: Vec<&Value> = (self.samples.iter().flatten())
                    .filter(|v| (v["t"].as_f64().unwrap_or(0.0) / 60.0) as usize == m && v["calls"].as_u64() > Some(0))
                    .collect();
                let mut p50: Vec<u64> = w.iter().filter_map(|v| v["p50_us"].as_u64()).collect();
                p50.sort_unstable();
                let worst = |k: &str| w.iter().filter_map(|v| v[k].as_u64()).max().unwrap_or(0);
                let rss = w.iter().filter_map(|v| v["rss"].as_f64()).fold(0.0, f64::max);
                json!({"minute": m, "p50_us": p50.get(p50.len() / 2).copied().unwrap_or(0),
                       "p99_us": worst("p99_us"), "max_us": worst("max_us"), "rss_mib": rss / (1 << 20) as f64})
            })
            .collect()
    }
}

/// Writes the cluster's key and each host's cluster file (`host<h+2>.cluster`,
/// its namespace's number) and runtime directory under `dir`.
fn write_cluster(dir: &Path, hosts: usize) -> std::io::Result<()> {
    std::fs::write(dir.join("key"), b"the cluster soak's key, 32 bytes")?;
    let host_ip = |h: usize| Ipv4Addr::new(10, 77, 0, h as u8 + 2);
    for h in 0..hosts {
        let mut file =
            format!("node {}\nlisten {}:{NODE_PORT}\nkey-file {}\n", h + 1, host_ip(h), dir.join("key").display());
        for o in (0..hosts).filter(|&o| o != h) {
            file += &format!("peer {} {}:{NODE_PORT}\n", o + 1, host_ip(o));
        }
        std::fs::write(dir.join(format!("host{}.cluster", h + 2)), file)?;
        std::fs::create_dir_all(dir.join(format!("host{}", h + 2)))?;
    }
    Ok(())
}

/// Runs the cluster soak and prints its report; an error if a check failed.
pub fn run(args: &SoakArgs) -> ferry::Result<()> {
    let fail = |e: String| crate::failed("cluster soak", e);
    let prefix = std::env::var("FERRY_SOAK_NETNS")
        .map_err(|_| fail("needs the network namespaces scripts/cluster-soak.sh makes ($FERRY_SOAK_NETNS)".into()))?;
    let (hosts, per) = (args.hosts, args.teams_per_host.max(1));
    let teams = hosts * per;
    if teams < 2 || hosts > 200 {
        return Err(fail(format!("{hosts} hosts of {per} teams: need 2 teams or more and 200 hosts at most")));
    }
    let dir = std::env::temp_dir().join(format!("ferry-cluster-soak-{}", std::process::id()));
    let _cleanup = RemoveDir(dir.clone());
    std::fs::create_dir_all(&dir).and_then(|()| write_cluster(&dir, hosts)).map_err(Error::io("cluster soak files"))?;
    let etcd = Etcd::start(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)), &dir).map_err(fail)?;
    let seed = crate::crash::rng::now_ns();
    let (tx, rx) = mpsc::channel::<Line>();
    let spec = Spec { index: 0, incarnation: 0, teams, etcd: etcd.addr, seed };
    let mut soak = Soak {
        prefix,
        dir: dir.clone(),
        per,
        spec,
        tx,
        rx,
        all: Vec::new(),
        live: Vec::new(),
        samples: vec![Vec::new(); teams],
    };
    for i in 0..teams {
        let a = soak.start(i, 0).map_err(fail)?;
        soak.live.push(a);
    }
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_names(etcd.addr, teams, done.clone())?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.minutes * 60.0);
    let chaos = soak.chaos(started, until, &mut Rng::derive(seed, &[])).map_err(fail)?;
    soak.finish().map_err(fail)?;
    done.store(true, Ordering::Relaxed);
    let timeline = watcher.join().map_err(|_| fail("the name watcher panicked".into()))?;

    let (traffic, traffic_bad) = soak.traffic();
    let (names, names_late) = soak.names(&timeline, &chaos);
    let mut report = json!({
        "hosts": hosts, "teams": teams, "minutes": args.minutes, "seed": seed,
        "ttl_ms": TTL.as_millis() as u64, "deadline_ms": DEADLINE.as_millis() as u64,
        "kills": chaos.kills.len(), "link_flaps": chaos.link_ups.len(), "names": names,
        "by_minute": soak.by_minute(args.minutes), "events": chaos.events,
    });
    report.as_object_mut().expect("an object").extend(traffic.as_object().expect("an object").clone());
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    if traffic_bad + names_late > 0 {
        let n = |k: &str| report[k].as_u64().unwrap_or(0);
        return Err(fail(format!(
            "{} operations past their deadline, {} duplicated, {} corrupted, {} confirmed but not received, \
             {names_late} names not converged within a TTL",
            n("late"),
            n("duplicated"),
            n("corrupted"),
            n("acked_missing")
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
    println!(
        "       not converged within a TTL ({} ms with etcd's expiry check and the slowest round of looks, {} ms): {}",
        n["bound_ms"], n["slowest_look_round_ms"], n["late"]
    );
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
