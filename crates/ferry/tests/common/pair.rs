//! Two-sided cases: one test source for every placement of a conversation.
//!
//! A case is two closures, one per side (A and B), each with a team of its
//! own, which tell each other what they need through a *control line*:
//! endpoint ids, "sent", "checked". Nothing else is shared, so the same
//! case runs with the sides
//!
//! - [`Placement::SameTeam`]: one team, two threads (the loop-back channel);
//! - [`Placement::TwoTeams`]: two teams of this process (shared memory);
//! - [`Placement::TwoProcesses`]: two processes of this machine (shared memory);
//! - [`Placement::TwoNodes`]: two processes in two network namespaces, two
//!   nodes of a cluster (TCP). Only under `scripts/netns-test.sh`, which
//!   makes the namespaces and the cluster files; elsewhere these are ignored.
//! - [`Placement::LoopbackNodes`]: two teams of this process, two nodes of
//!   a cluster on loopback (TCP): what crosses machines, without
//!   namespaces (`loopback_placements!`, for the suites that ask for it).
//!
//! For the process placements the test runs itself again, twice, as the
//! same test (`--exact <its name>`) with `FERRY_TEST_CHILD=pair-a|pair-b`;
//! each child runs its side only, and this process relays the control
//! lines between them and fails if either side fails.

use super::Child;
use ferry::{Team, TeamBuilder, TeamId};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the two sides of a case live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    SameTeam,
    TwoTeams,
    TwoProcesses,
    TwoNodes,
    LoopbackNodes,
}

impl Placement {
    /// Both sides are one team.
    pub fn one_team(self) -> bool {
        self == Placement::SameTeam
    }

    /// Both sides are in this process.
    pub fn one_process(self) -> bool {
        matches!(self, Placement::SameTeam | Placement::TwoTeams | Placement::LoopbackNodes)
    }

    /// The sides are two nodes of a cluster (TCP between them).
    pub fn two_nodes(self) -> bool {
        matches!(self, Placement::TwoNodes | Placement::LoopbackNodes)
    }
}

/// Longest a side waits for a word from the other (and a little more than
/// any single step of a case may take).
pub const PATIENCE: Duration = Duration::from_secs(10);
/// Longest a case in child processes may take, start to end.
const CASE_LIMIT: Duration = Duration::from_secs(90);
/// What a side says on its control line when it failed.
const FAILED: &str = "__failed";

type Tweak = Box<dyn Fn(TeamBuilder) -> TeamBuilder + Send + Sync>;

/// A case's two sides and how their teams are configured.
pub struct Pair {
    placement: Placement,
    tweak_a: Tweak,
    tweak_b: Tweak,
}

/// The two sides of a case placed as `p`.
pub fn pair(p: Placement) -> Pair {
    Pair { placement: p, tweak_a: Box::new(|b| b), tweak_b: Box::new(|b| b) }
}

impl Pair {
    /// Configures both sides' teams (with one team, its only team).
    pub fn config(self, f: impl Fn(TeamBuilder) -> TeamBuilder + Send + Sync + Clone + 'static) -> Pair {
        Pair { tweak_a: Box::new(f.clone()), tweak_b: Box::new(f), ..self }
    }

    /// Configures side A's team (with one team: its only team).
    pub fn config_a(self, f: impl Fn(TeamBuilder) -> TeamBuilder + Send + Sync + 'static) -> Pair {
        Pair { tweak_a: Box::new(f), ..self }
    }

    /// Configures side B's team (with one team: ignored).
    pub fn config_b(self, f: impl Fn(TeamBuilder) -> TeamBuilder + Send + Sync + 'static) -> Pair {
        Pair { tweak_b: Box::new(f), ..self }
    }

    /// Runs the case: `a` as side A, `b` as side B. Each side waits for the
    /// other at the end, so neither team leaves while the other still talks to it.
    pub fn run(self, a: impl FnOnce(&Side) + Send, b: impl FnOnce(&Side) + Send) {
        let role = super::child_role();
        match (self.placement, role.as_deref()) {
            (_, Some("pair-a")) => run_child(self.placement, &self.tweak_a, a),
            (_, Some("pair-b")) => run_child(self.placement, &self.tweak_b, b),
            (Placement::SameTeam | Placement::TwoTeams | Placement::LoopbackNodes, _) => self.run_here(a, b),
            (Placement::TwoProcesses | Placement::TwoNodes, _) => run_parent(self.placement),
        }
    }

    /// Both sides as threads of this process.
    fn run_here(self, a: impl FnOnce(&Side) + Send, b: impl FnOnce(&Side) + Send) {
        let dir = tempfile::tempdir().unwrap();
        let ports = [super::free_port(), super::free_port()];
        let start = |tweak: &Tweak, node: usize| {
            let mut b = base().runtime_dir(dir.path());
            if self.placement == Placement::LoopbackNodes {
                // A node's own runtime dir: names cross nodes as the cluster's.
                b = b.runtime_dir(dir.path().join(node.to_string())).cluster(loopback_cluster(node, ports));
            }
            tweak(b).start().expect("start team")
        };
        let team_a = start(&self.tweak_a, 1);
        let team_b = if self.placement.one_team() { team_a.clone() } else { start(&self.tweak_b, 2) };
        let (to_a, to_b) = (Arc::new(Inbox::default()), Arc::new(Inbox::default()));
        let side_a = Side::new(self.placement, team_a, team_b.id(), to_a.clone(), Line::Inbox(to_b.clone()));
        let side_b = Side::new(self.placement, team_b, side_a.team.id(), to_b, Line::Inbox(to_a));
        std::thread::scope(|s| {
            let a = s.spawn(|| side_a.play(a));
            let b = s.spawn(|| side_b.play(b));
            let (a, b) = (a.join(), b.join());
            if let Err(e) = a.and(b) {
                std::panic::resume_unwind(e);
            }
        });
    }
}

/// Node `node` (1 or 2) of a cluster of two on loopback, at `ports`.
fn loopback_cluster(node: usize, ports: [u16; 2]) -> ferry::Cluster {
    let addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], ports[i - 1]));
    let peer = 3 - node;
    ferry::Cluster {
        node: node as u16,
        listen: addr(node),
        peers: [(peer as u16, addr(peer))].into_iter().collect(),
        key: Arc::from(&b"the loopback pair's cluster key"[..]),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    }
}

/// The team builder every side starts from (the placements add the rest).
fn base() -> TeamBuilder {
    Team::builder().spin(Duration::from_micros(5))
}

/// One side of a case: its team, the other side's team, and the control line.
pub struct Side {
    pub placement: Placement,
    pub team: Team,
    /// The other side's team (this one with [`Placement::SameTeam`]).
    pub peer: TeamId,
    inbox: Arc<Inbox>,
    out: Line,
}

impl Side {
    fn new(placement: Placement, team: Team, peer: TeamId, inbox: Arc<Inbox>, out: Line) -> Side {
        Side { placement, team, peer, inbox, out }
    }

    /// Tells the other side `value` under `key` (one per [`Side::get`]:
    /// values put under one key queue up).
    pub fn put(&self, key: &str, value: impl Display) {
        assert!(!key.contains(' ') && !key.is_empty(), "a control key is one word");
        let value = value.to_string();
        match &self.out {
            Line::Inbox(to) => to.push(key, value),
            Line::Parent => super::say(format!("ctl {key} {value}")),
        }
    }

    /// The next value the other side put under `key` (waits at most [`PATIENCE`]).
    pub fn get<T: FromStr>(&self, key: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        self.get_within(key, PATIENCE)
    }

    /// [`Side::get`] waiting at most `limit`.
    pub fn get_within<T: FromStr>(&self, key: &str, limit: Duration) -> T
    where
        T::Err: std::fmt::Debug,
    {
        let v = self.inbox.pop(key, limit);
        v.parse().unwrap_or_else(|e| panic!("control value {key}={v:?}: {e:?}"))
    }

    /// Waits until the other side also reached `point`.
    pub fn meet(&self, point: &str) {
        self.put(point, "here");
        self.get::<String>(point);
    }

    /// Runs `f` on this side, then meets the other side at the end. A
    /// failure is told to the other side, which then fails at once instead
    /// of waiting its patience out.
    fn play(&self, f: impl FnOnce(&Side)) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            f(self);
            self.meet("__end");
        }));
        if let Err(e) = r {
            self.put(FAILED, "");
            std::panic::resume_unwind(e);
        }
    }
}

/// Where a side's words go.
enum Line {
    /// The other side's inbox, in this process.
    Inbox(Arc<Inbox>),
    /// This process's stdout, for the parent to relay.
    Parent,
}

/// The values put for one side, by key.
#[derive(Default)]
struct Inbox {
    values: Mutex<HashMap<String, VecDeque<String>>>,
    arrived: Condvar,
}

impl Inbox {
    fn push(&self, key: &str, value: String) {
        self.values.lock().entry(key.to_string()).or_default().push_back(value);
        self.arrived.notify_all();
    }

    fn pop(&self, key: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        let mut values = self.values.lock();
        loop {
            if values.get(FAILED).is_some_and(|q| !q.is_empty()) {
                panic!("the other side failed (while this one waited for {key:?})");
            }
            if let Some(v) = values.get_mut(key).and_then(VecDeque::pop_front) {
                return v;
            }
            if self.arrived.wait_until(&mut values, until).timed_out() {
                panic!("the other side did not say {key:?} within {limit:?}");
            }
        }
    }
}

// ---------------------------------------------------------------- processes

/// In a child: starts this side's team (runtime dir and cluster from the
/// environment the parent set) and plays `f`, hearing the other side
/// through the parent on stdin.
fn run_child(placement: Placement, tweak: &Tweak, f: impl FnOnce(&Side)) {
    let team = tweak(base()).start().expect("start team");
    let inbox = Arc::new(Inbox::default());
    let relay = inbox.clone();
    std::thread::spawn(move || {
        while let Some(line) = super::hear() {
            let mut words = line.splitn(3, ' ');
            if let (Some("ctl"), Some(key), value) = (words.next(), words.next(), words.next()) {
                relay.push(key, value.unwrap_or("").to_string());
            }
        }
    });
    // The teams tell each other who they are (as the id of their slot 0).
    super::say(format!("ctl __team {}", team.id().endpoint(0).unwrap()));
    let peer = inbox.pop("__team", PATIENCE).parse::<ferry::EndpointId>().expect("a team id").team_id();
    let me = team.id();
    match placement {
        Placement::TwoNodes => assert_ne!(peer.node, me.node, "the sides are not on two nodes"),
        _ => assert_eq!((peer.node, peer.team != me.team), (me.node, true), "the sides are not two teams of one node"),
    }
    Side::new(placement, team, peer, inbox, Line::Parent).play(f);
}

/// In the parent: starts both sides as child processes running this test,
/// relays their control lines, and fails unless both pass in time.
fn run_parent(placement: Placement) {
    let test = std::thread::current().name().expect("a test thread is named after its test").to_string();
    let tmp = tempfile::tempdir().unwrap();
    let mut sides: Vec<Child> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let role = format!("pair-{n}");
            let cmd = match placement {
                Placement::TwoNodes => {
                    let (prefix, work) = netns();
                    let dir = work.join(format!("{n}.run"));
                    let mut c = Child::command(&test, &role, &dir, Some(&format!("{prefix}-{}", i + 1)));
                    c.env("FERRY_CLUSTER", work.join(format!("{n}.cluster")));
                    c
                }
                _ => Child::command(&test, &role, tmp.path(), None),
            };
            Child::from_command(cmd, &role)
        })
        .collect();
    // Both sides' lines in one queue, relayed as soon as they come.
    let (lines_tx, lines) = std::sync::mpsc::channel();
    for (i, side) in sides.iter_mut().enumerate() {
        let (from, to) = (side.take_lines(), lines_tx.clone());
        std::thread::spawn(move || from.iter().try_for_each(|l| to.send((i, l))));
    }
    let until = Instant::now() + CASE_LIMIT;
    let mut done = [None, None];
    while done.iter().any(Option::is_none) {
        assert!(Instant::now() < until, "{test}: not done within {CASE_LIMIT:?} (hung)");
        if let Ok((i, line)) = lines.recv_timeout(Duration::from_millis(5)) {
            if line.starts_with("ctl ") {
                sides[1 - i].tell(&line);
            }
        }
        for i in 0..2 {
            if done[i].is_none() {
                done[i] = sides[i].proc.try_wait().unwrap();
                if done[i].is_some_and(|s| !s.success()) {
                    // The other side fails at once instead of waiting for words that never come.
                    sides[1 - i].tell(&format!("ctl {FAILED} "));
                }
            }
        }
    }
    let [a, b] = done.map(Option::unwrap);
    assert!(a.success() && b.success(), "{test}: side A {a}, side B {b} (their output is above)");
}

/// The namespaces' name prefix and the work directory with the cluster
/// files (`a.cluster`, `a.run`, ...), from `scripts/netns-test.sh`.
pub fn netns() -> (String, PathBuf) {
    let prefix = std::env::var("FERRY_NETNS").expect("run by scripts/netns-test.sh, which makes the namespaces");
    (prefix, PathBuf::from(std::env::var("FERRY_NETNS_WORK").unwrap()))
}

/// The cases of [`placements!`] also between two nodes on loopback, in
/// this process (`mod loopback_nodes`).
#[macro_export]
macro_rules! loopback_placements {
    ($($case:ident),* $(,)?) => {
        $crate::placements!($($case),*);
        mod loopback_nodes {
            $( #[test] fn $case() { super::$case($crate::common::pair::Placement::LoopbackNodes) } )*
        }
    };
}

/// Instantiates the two-sided cases for every placement: modules
/// `same_team`, `two_teams`, `two_processes` and `two_nodes` (ignored:
/// `scripts/netns-test.sh` runs it).
#[macro_export]
macro_rules! placements {
    ($($case:ident),* $(,)?) => {
        mod same_team {
            $( #[test] fn $case() { super::$case($crate::common::pair::Placement::SameTeam) } )*
        }
        mod two_teams {
            $( #[test] fn $case() { super::$case($crate::common::pair::Placement::TwoTeams) } )*
        }
        mod two_processes {
            $( #[test] fn $case() { super::$case($crate::common::pair::Placement::TwoProcesses) } )*
        }
        mod two_nodes {
            $(
                #[test]
                #[ignore = "needs network namespaces: scripts/netns-test.sh runs it"]
                fn $case() { super::$case($crate::common::pair::Placement::TwoNodes) }
            )*
        }
    };
}
