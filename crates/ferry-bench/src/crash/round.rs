//! One round of the matrix: start the teams, run their traffic, SIGKILL
//! one at a random moment, let the others go on, stop them, and check
//! what is left of the dead team; then let the survivors leave.

use crate::crash::files;
use crate::crash::member::Member;
use crate::crash::placement::{Placement, Transport};
use crate::crash::procfs::{self, Leaks};
use crate::crash::protocol::{port_name, svc_name, Command, PeerInfo, Report};
use crate::crash::rng::Rng;
use crate::crash::traffic::{Outcome, SLACK};
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a team may take to start and say so.
const START: Duration = Duration::from_secs(20);
/// The kill comes this long after the traffic started (uniform).
const KILL_AFTER_MS: (u64, u64) = (20, 400);
/// How long the survivors' traffic goes on after the kill (TCP: plus the
/// peer timeout, so that a peer found gone only by its silence would be
/// within the window too).
const AFTER_KILL: Duration = Duration::from_millis(300);
/// How long the dead team's leftovers may take to go, once the traffic stopped.
const CLEAN_LIMIT: Duration = Duration::from_secs(4);
/// How long a survivor may take to leave.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

/// What a round found.
#[derive(Default)]
pub(crate) struct RoundResult {
    pub victim: usize,
    pub kill_after_ms: u64,
    /// From the SIGKILL until the harness reaped the victim (the kernel's
    /// teardown of the process), µs.
    pub reaped_us: u64,
    /// Names were on etcd: they are checked at the end of the run.
    pub etcd: bool,
    pub etcd_names: Vec<String>,
    /// Of the dead team's names, those etcd still resolved after the
    /// round's checks (they go when its lease expires).
    pub etcd_dead_bound: usize,
    pub outcomes: Vec<Outcome>,
    pub hangs: Vec<String>,
    pub leaked_files: Vec<String>,
    pub leaked_mappings: Vec<String>,
    pub leaked_fds: Vec<String>,
    pub leaked_names: Vec<String>,
    /// What else went wrong (a team that did not start...).
    pub errors: Vec<String>,
    /// How long the dead team's leftovers took to go (ms).
    pub clean_ms: u64,
    /// Over shared memory: no survivor had a channel to the dead team, so
    /// its files went with the first look-up of its names.
    pub unmet: bool,
}

impl RoundResult {
    pub fn duplicate_executions(&self) -> u64 {
        self.outcomes.iter().map(|o| o.duplicate_executions).sum()
    }
    pub fn wrong(&self) -> u64 {
        self.outcomes.iter().map(|o| o.wrong).sum()
    }
    pub fn survivor_failures(&self) -> u64 {
        self.outcomes.iter().map(|o| o.survivor_failures).sum()
    }
    pub fn late(&self, bound: Duration) -> usize {
        let bound = bound.as_micros() as u64;
        self.outcomes.iter().flat_map(|o| &o.peer_gone_us).filter(|&&us| us > bound).count()
    }

    pub fn passed(&self, bound: Duration) -> bool {
        self.hangs.is_empty()
            && self.leaked_files.is_empty()
            && self.leaked_mappings.is_empty()
            && self.leaked_fds.is_empty()
            && self.leaked_names.is_empty()
            && self.errors.is_empty()
            && self.duplicate_executions() == 0
            && self.wrong() == 0
            && self.survivor_failures() == 0
            && self.late(bound) == 0
    }
}

/// A started team: its process and what it said.
struct Started {
    member: Member,
    team: u32,
    pid: u32,
}

pub(crate) fn run(pl: &Placement, round: usize, seed: u64) -> RoundResult {
    let mut res = RoundResult::default();
    let mut rng = Rng::derive(seed, &[2, pl.transport as u64, round as u64]);
    res.etcd = pl.etcd.is_some() && round % 2 == 1;
    let addrs = if pl.transport == Transport::Tcp { pl.addresses() } else { Vec::new() };

    // Start the teams; each says its endpoints.
    let mut teams = Vec::new();
    let mut peers = Vec::new();
    for i in 0..pl.teams {
        let spec = pl.spec(round, i, &addrs, rng.next(), res.etcd);
        let mut member = match Member::spawn(&spec, pl.namespace(i).as_deref()) {
            Ok(m) => m,
            Err(e) => return res.error(e),
        };
        match member.hear(START) {
            Ok(Report::Ready { team: _, pid, port, svc }) => {
                let team = port.parse::<ferry::EndpointId>().map(|e| e.team()).unwrap_or(0);
                peers.push(PeerInfo { index: i, port, svc });
                teams.push(Started { member, team, pid });
            }
            Ok(other) => return res.error(format!("team {i} said {other:?} first")),
            Err(e) => return res.error(e),
        }
    }
    for t in &mut teams {
        let others = peers.iter().filter(|p| p.index != t.member.index).cloned().collect();
        t.member.tell(&Command::Go { peers: others });
    }

    // The kill, at a random moment of the traffic.
    res.kill_after_ms = rng.between(KILL_AFTER_MS.0, KILL_AFTER_MS.1);
    std::thread::sleep(Duration::from_millis(res.kill_after_ms));
    res.victim = rng.below(pl.teams as u64) as usize;
    let mut dead = teams.remove(res.victim);
    let (kill_ns, victim) = match dead.member.kill() {
        Ok((kill_ns, reaped_us, victim)) => {
            res.reaped_us = reaped_us;
            (kill_ns, victim)
        }
        Err(e) => return res.error(e),
    };
    for t in &mut teams {
        t.member.tell(&Command::Dead { index: res.victim, kill_ns });
    }
    let after = AFTER_KILL + if pl.transport == Transport::Tcp { pl.peer_timeout } else { Duration::ZERO };
    std::thread::sleep(after);

    // The survivors stop and say what their operations saw.
    for t in &mut teams {
        t.member.tell(&Command::Stop);
    }
    for t in &mut teams {
        match t.member.hear(pl.deadline + SLACK + Duration::from_secs(5)) {
            Ok(Report::Done(o)) => {
                for s in &o.stuck {
                    res.hangs.push(format!("team {}: {s}", t.member.index));
                }
                if o.overdue > 0 {
                    res.hangs.push(format!("team {}: {} operations overdue", t.member.index, o.overdue));
                }
                res.outcomes.push(*o);
            }
            Ok(other) => res.errors.push(format!("team {} said {other:?}", t.member.index)),
            Err(e) => res.hangs.push(format!("stopping the traffic: {e}")),
        }
    }

    // What is left of the dead team: files, memory, descriptors, names.
    // Its files: over shared memory, a survivor that had a channel to it
    // sweeps them (its reactor sees the hang-up); if none had, they go with
    // the first look at one of its names (the look-ups below). Over TCP it
    // was its node's only team: the witness stands for the next team there.
    let victim_dir = pl.runtime_dir(res.victim);
    let witness = (pl.transport == Transport::Tcp).then(|| witness(&victim_dir));
    res.unmet = pl.transport == Transport::Shm && !teams.iter().any(|t| victim.unix_peers.contains(&t.pid));
    let files_now = || if res.unmet { Vec::new() } else { files::of_team(&victim_dir, dead.team, dead.pid) };
    let started = Instant::now();
    let own: HashSet<u64> = teams.iter().flat_map(|t| procfs::own_doorbell(t.pid)).collect();
    let (leftover, leaks) = loop {
        let leftover = files_now();
        let leaks: Vec<(usize, Leaks)> = teams
            .iter()
            .map(|t| (t.member.index, procfs::leaks(t.pid, &victim, &own)))
            .filter(|l| !l.1.is_empty())
            .collect();
        if (leftover.is_empty() && leaks.is_empty()) || started.elapsed() > CLEAN_LIMIT {
            break (leftover, leaks);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    res.clean_ms = started.elapsed().as_millis() as u64;
    drop(witness);
    res.leaked_files.extend(leftover);
    for (i, l) in leaks {
        res.leaked_mappings.extend(l.mappings.into_iter().map(|m| format!("team {i} maps {m}")));
        res.leaked_fds.extend(l.fds.into_iter().map(|f| format!("team {i} holds {f}")));
    }
    let names = vec![port_name(round, res.victim), svc_name(round, res.victim)];
    if res.etcd {
        // Names on etcd go with their lease: checked at the end of the run.
        res.etcd_names.extend((0..pl.teams).flat_map(|i| [port_name(round, i), svc_name(round, i)]));
        res.etcd_dead_bound = pl.etcd.as_ref().map_or(0, |e| e.bound(&names).len());
    } else {
        for t in &mut teams {
            t.member.tell(&Command::Lookup { names: names.clone() });
            match t.member.hear(Duration::from_secs(20)) {
                Ok(Report::Looked { resolved }) => res.leaked_names.extend(
                    resolved.into_iter().map(|(n, ep)| format!("team {} resolves {n} to {ep}", t.member.index)),
                ),
                Ok(other) => res.errors.push(format!("team {} said {other:?}", t.member.index)),
                Err(e) => res.hangs.push(format!("looking names up: {e}")),
            }
        }
    }
    drop(victim);
    if res.unmet {
        res.leaked_files.extend(files::of_team(&victim_dir, dead.team, dead.pid));
    }

    // The survivors leave; then nothing is left in the runtime directories.
    for t in &mut teams {
        t.member.tell(&Command::Exit);
    }
    for t in &mut teams {
        if let Err(e) = t.member.finish(EXIT_LIMIT) {
            res.hangs.push(format!("leaving: {e}"));
        }
    }
    let reported: HashSet<String> = res.leaked_files.iter().cloned().collect();
    for dir in pl.runtime_dirs() {
        let left = files::all(&dir).into_iter().map(|f| format!("{}: {f}", dir.display()));
        res.leaked_files.extend(left.filter(|f| !reported.contains(f)).map(|f| format!("after the round: {f}")));
    }
    res
}

impl RoundResult {
    fn error(mut self, e: String) -> RoundResult {
        self.errors.push(e);
        self
    }
}

/// Over TCP the dead team was its node's only team, so no survivor shares
/// its runtime directory: what it left there goes when the next team
/// starts on that node. This team, started in the harness, is that next
/// team (it needs no network: it only meets the node's files).
fn witness(dir: &Path) -> Option<ferry::Team> {
    ferry::Team::builder().runtime_dir(dir).processors(0).start().ok()
}
