//! Signals (`ferry::signal`): handlers registered by one team in each
//! mode, signalled from every placement (the same team, two teams, two
//! processes, two nodes — in namespaces, and on loopback in this process),
//! with concurrent signallers in several threads and processes.

mod common;

use common::pair::{pair, Placement, Side};
use common::{Child, ROLE};
use ferry::signal::Mode;
use ferry::{Error, Team};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A `Coalesce` handler's record: the arguments it ran with, and whether
/// two of its runs ever overlapped.
#[derive(Default)]
struct Coalesced {
    running: AtomicBool,
    overlaps: AtomicU64,
    seen: Mutex<Vec<Vec<u8>>>,
}

impl Coalesced {
    fn handler(self: &Arc<Self>) -> impl Fn(Vec<u8>) + Send + Sync + 'static {
        let me = self.clone();
        move |args| {
            if me.running.swap(true, Ordering::SeqCst) {
                me.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(20));
            me.seen.lock().push(args);
            me.running.store(false, Ordering::SeqCst);
        }
    }

    /// Every argument once, no two runs at once.
    fn check(&self, expected: usize) {
        let seen = self.seen.lock();
        let unique: HashSet<&Vec<u8>> = seen.iter().collect();
        assert_eq!((seen.len(), unique.len()), (expected, expected), "an argument lost or run twice");
        assert_eq!(self.overlaps.load(Ordering::SeqCst), 0, "two runs at once");
    }
}

/// Signals `args` until it is accepted (a full `Coalesce` fifo refuses it).
fn signal_until_accepted(s: &ferry::signal::Signaller, args: &[u8]) {
    loop {
        match s.signal(args) {
            Ok(()) => return,
            Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("signal: {e}"),
        }
    }
}

/// Each mode's semantics, signalled from the other side; `Coalesce` by 8
/// threads at once.
fn every_mode_in_every_placement(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let total = Arc::new(AtomicU64::new(0));
            let t = total.clone();
            let _every = a
                .team
                .on_signal("every", Mode::EveryTime, move |args| {
                    t.fetch_add(u64::from_le_bytes(args.try_into().unwrap()), Ordering::SeqCst);
                })
                .unwrap();
            let coalesced = Arc::new(Coalesced::default());
            let _coalesce = a.team.on_signal("coalesce", Mode::Coalesce, coalesced.handler()).unwrap();
            let latch = a.team.on_signal("latch", Mode::Latch, |_| {}).unwrap();
            a.put("ready", "");
            a.get::<String>("latched");
            assert!(latch.is_latched());
            latch.rearm();
            a.put("rearmed", "");
            a.get::<String>("done");
            // The runs of signals only accepted (not waited for) may still be under way.
            let all = (1..=100).sum::<u64>();
            assert!(common::eventually(Duration::from_secs(10), || total.load(Ordering::SeqCst) == all));
            coalesced.check(8 * 50 + 1);
        },
        |b: &Side| {
            b.get::<String>("ready");
            let every = b.team.signaller("every").unwrap();
            for i in 1..=100u64 {
                match i % 2 {
                    // Waited for its run, or only for its acceptance (as a future).
                    0 => b.team.block_on(every.signal_done(&i.to_le_bytes())).unwrap(),
                    _ => b.team.block_on(every.signal_async(&i.to_le_bytes())).unwrap(),
                }
            }
            let coalesce = b.team.signaller("coalesce").unwrap();
            std::thread::scope(|s| {
                for t in 0..8u8 {
                    let c = coalesce.clone();
                    s.spawn(move || (0..50u8).for_each(|i| signal_until_accepted(&c, &[t, i])));
                }
            });
            // Accepted after every other one: when it has run, they all have.
            b.team.block_on(coalesce.signal_done(b"last")).unwrap();
            let latch = b.team.signaller("latch").unwrap();
            latch.signal(b"").unwrap();
            assert!(matches!(latch.signal(b""), Err(Error::Latched { .. })));
            assert!(matches!(b.team.block_on(latch.signal_async(b"")), Err(Error::Latched { .. })), "async");
            b.put("latched", "");
            b.get::<String>("rearmed");
            b.team.block_on(latch.signal_done(b"")).unwrap();
            assert!(matches!(b.team.signal("no-such-handler", b""), Err(Error::NameNotFound(_))));
            b.put("done", "");
        },
    );
}

/// A dropped handler refuses signals (`NoSuchEndpoint`); a panicking one
/// fails the `signal_done` that waited on it, and runs again after.
fn dropped_and_panicking_handlers(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let short = a.team.on_signal("short", Mode::EveryTime, |_| {}).unwrap();
            let _panics = a.team.on_signal("panics", Mode::EveryTime, |args| assert!(args != b"panic")).unwrap();
            a.put("ready", "");
            a.get::<String>("signalled");
            drop(short);
            a.put("dropped", "");
            a.get::<String>("done");
        },
        |b: &Side| {
            b.get::<String>("ready");
            let short = b.team.signaller("short").unwrap();
            short.signal(b"").unwrap();
            let panics = b.team.signaller("panics").unwrap();
            assert!(matches!(b.team.block_on(panics.signal_done(b"panic")), Err(Error::Refused(_))));
            b.team.block_on(panics.signal_done(b"fine")).unwrap();
            b.put("signalled", "");
            b.get::<String>("dropped");
            assert!(matches!(short.signal(b""), Err(Error::NoSuchEndpoint(_))));
            b.put("done", "");
        },
    );
}

/// Signals from `threads` threads at once, `each` signals a thread, with
/// the arguments `tag ++ [thread, i]`: even threads wait for acceptance
/// (`signal`), odd ones for the run (`signal_done`).
fn signal_from_threads(team: &Team, s: &ferry::signal::Signaller, threads: u8, each: u8, tag: &[u8]) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            let s = s.clone();
            scope.spawn(move || {
                for i in 0..each {
                    let args = [tag, &[t, i]].concat();
                    match t % 2 {
                        0 => s.signal(&args).unwrap(),
                        _ => team.block_on(s.signal_done(&args)).unwrap(),
                    }
                }
            });
        }
    });
}

/// The arguments [`signal_from_threads`] sends.
fn arguments(threads: u8, each: u8, tag: &[u8]) -> HashSet<Vec<u8>> {
    (0..threads).flat_map(|t| (0..each).map(move |i| [tag, &[t, i]].concat())).collect()
}

/// One round at a latched-or-armed `Latch` handler: `threads` threads at
/// once, `each` signals a thread, arguments `tag ++ [thread, i]` (even
/// threads `signal`, odd ones `signal_done`). Every signal is either
/// accepted or refused `Latched` (anything else fails the test); returns
/// the accepted ones' arguments and the count refused.
fn latch_round(team: &Team, s: &ferry::signal::Signaller, threads: u8, each: u8, tag: &[u8]) -> (Vec<Vec<u8>>, u32) {
    let accepted = Mutex::new(Vec::new());
    let refused = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (s, accepted, refused) = (s.clone(), &accepted, &refused);
            scope.spawn(move || {
                for i in 0..each {
                    let args = [tag, &[t, i]].concat();
                    let r = match t % 2 {
                        0 => s.signal(&args),
                        _ => team.block_on(s.signal_done(&args)),
                    };
                    match r {
                        Ok(()) => accepted.lock().push(args),
                        Err(Error::Latched { handler }) => {
                            assert_eq!(handler, s.to());
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("a latch's signal: {e}"),
                    }
                }
            });
        }
    });
    (accepted.into_inner(), refused.load(Ordering::SeqCst) as u32)
}

/// Arguments as words (for the control line): `1.0.7`.
fn label(args: &[u8]) -> String {
    args.iter().map(u8::to_string).collect::<Vec<_>>().join(".")
}

/// Latch rounds of the cases below.
const ROUNDS: u8 = 3;

/// `EveryTime` and `Latch` signalled by 8 threads of the other side at
/// once: every `EveryTime` signal runs the handler exactly once (400
/// runs, each argument once, none after); at a `Latch` handler exactly one
/// of 80 concurrent signals is accepted and runs, the 79 others are refused
/// `Latched`, round after round, each round once re-armed.
fn every_time_and_latch_under_concurrent_signallers(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let every_runs = Arc::new(Mutex::new(Vec::new()));
            let r = every_runs.clone();
            let _every = a.team.on_signal("every-8", Mode::EveryTime, move |args| r.lock().push(args)).unwrap();
            let latch_runs = Arc::new(Mutex::new(Vec::new()));
            let r = latch_runs.clone();
            let latch = a.team.on_signal("latch-8", Mode::Latch, move |args| r.lock().push(args)).unwrap();
            a.put("ready", "");
            a.get::<String>("signalled");
            // Those only accepted may still be running.
            assert!(common::eventually(Duration::from_secs(10), || every_runs.lock().len() >= 8 * 50));
            for round in 0..ROUNDS {
                let winner: String = a.get("won");
                assert!(common::eventually(Duration::from_secs(10), || latch_runs.lock().len() > round as usize));
                assert_eq!(label(&latch_runs.lock()[round as usize]), winner, "the run is not the accepted signal's");
                assert!(latch.is_latched());
                latch.rearm();
                a.put("rearmed", "");
            }
            a.get::<String>("done");
            std::thread::sleep(Duration::from_millis(100));
            let runs = every_runs.lock();
            let once: HashSet<Vec<u8>> = runs.iter().cloned().collect();
            assert_eq!((runs.len(), once), (8 * 50, arguments(8, 50, b"")), "a signal lost or run twice");
            assert_eq!(latch_runs.lock().len(), ROUNDS as usize, "a latched signal ran");
        },
        |b: &Side| {
            b.get::<String>("ready");
            let every = b.team.signaller("every-8").unwrap();
            signal_from_threads(&b.team, &every, 8, 50, b"");
            b.put("signalled", "");
            let latch = b.team.signaller("latch-8").unwrap();
            for round in 0..ROUNDS {
                let (accepted, refused) = latch_round(&b.team, &latch, 8, 10, &[round]);
                assert_eq!((accepted.len(), refused), (1, 8 * 10 - 1), "round {round}: {accepted:?}");
                b.put("won", label(&accepted[0]));
                b.get::<String>("rearmed");
            }
            b.put("done", "");
        },
    );
}

loopback_placements!(
    every_mode_in_every_placement,
    dropped_and_panicking_handlers,
    every_time_and_latch_under_concurrent_signallers
);

/// `Coalesce` signalled by 4 processes of 2 threads each (50 signals a
/// thread): every argument once, never two runs at once.
#[test]
fn coalesce_under_signallers_in_four_processes() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let coalesced = Arc::new(Coalesced::default());
    let _h = owner.on_signal("merged", Mode::Coalesce, coalesced.handler()).unwrap();
    let mut children: Vec<Child> = (0..4u8)
        .map(|i| {
            Child::spawn_with("signal", dir.path(), |c| {
                c.env("FERRY_TEST_PROCESS", i.to_string());
            })
        })
        .collect();
    for c in &mut children {
        c.expect("signalled", Duration::from_secs(60));
    }
    coalesced.check(4 * 2 * 50 + 4);
}

/// Signaller processes of the fan-in tests below (each 2 threads), and
/// the signals of each thread.
const PROCESSES: u8 = 4;
const EACH: u8 = 50;

/// Writes the files of a cluster of two nodes on loopback in `dir`:
/// `1.cluster` and `2.cluster`, and the nodes' runtime dirs `1` and `2`.
fn loopback_cluster(dir: &Path) {
    let ports = [common::free_port(), common::free_port()];
    std::fs::write(dir.join("key"), b"the signal test's cluster key").unwrap();
    for (node, peer) in [(1, 2), (2, 1)] {
        let file = format!(
            "node {node}\nlisten 127.0.0.1:{}\nkey-file {}\npeer {peer} 127.0.0.1:{}\n",
            ports[node - 1],
            dir.join("key").display(),
            ports[peer - 1]
        );
        std::fs::write(dir.join(format!("{node}.cluster")), file).unwrap();
        std::fs::create_dir_all(dir.join(node.to_string())).unwrap();
    }
}

/// Where a fan-in test runs: the owner's team, its signaller processes'
/// runtime dir, and (if asked) a team on another node, in this process (a
/// cluster of two on loopback: its signals cross TCP).
struct FanIn {
    dir: tempfile::TempDir,
    owner: Team,
    other: Option<Team>,
}

impl FanIn {
    fn new(other_node: bool) -> FanIn {
        let dir = tempfile::tempdir().unwrap();
        if !other_node {
            let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
            return FanIn { dir, owner, other: None };
        }
        loopback_cluster(dir.path());
        let node = |n: usize| {
            let cluster = ferry::Cluster::from_file(&dir.path().join(format!("{n}.cluster"))).unwrap();
            Team::builder().runtime_dir(dir.path().join(n.to_string())).cluster(cluster).start().unwrap()
        };
        let (owner, other) = (node(1), Some(node(2)));
        FanIn { dir, owner, other }
    }

    /// Signaller process `p`, running `role` on the owner's node.
    fn child(&self, role: &str, p: u8) -> Child {
        let clustered = self.other.is_some();
        let dir = if clustered { self.dir.path().join("1") } else { self.dir.path().to_path_buf() };
        Child::spawn_with(role, &dir, |c| {
            c.env("FERRY_TEST_PROCESS", p.to_string());
            if clustered {
                c.env("FERRY_CLUSTER", self.dir.path().join("1.cluster"));
            }
        })
    }

    /// Signallers in all: the processes, and the team on the other node.
    fn signallers(&self) -> u8 {
        PROCESSES + u8::from(self.other.is_some())
    }
}

/// `EveryTime` signalled by 4 processes of 2 threads each (50 signals a
/// thread; one thread waits for each run, the other for acceptance), and
/// with `other_node` by a team on another node too, while a run of the
/// handler is held: every signal runs the handler exactly once (each
/// argument once, none after), and none waits for the held run (it is let
/// go only once all the others ran).
fn every_time_fan_in(other_node: bool) {
    let at = FanIn::new(other_node);
    let others = usize::from(at.signallers()) * 2 * usize::from(EACH);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let (holding, held_through) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (r, h, t) = (runs.clone(), holding.clone(), held_through.clone());
    let _every = at
        .owner
        .on_signal("fan-in", Mode::EveryTime, move |args| {
            if args == b"hold" {
                h.store(true, Ordering::SeqCst);
                // Let go once every other signal ran: none waits for this run.
                t.store(common::eventually(Duration::from_secs(30), || r.lock().len() >= others), Ordering::SeqCst);
            }
            r.lock().push(args);
        })
        .unwrap();
    at.owner.signal("fan-in", b"hold").unwrap();
    assert!(common::eventually(Duration::from_secs(5), || holding.load(Ordering::SeqCst)), "the held run never ran");
    let mut children: Vec<Child> = (0..PROCESSES).map(|p| at.child("every", p)).collect();
    let far = at.other.clone().map(|team| {
        std::thread::spawn(move || {
            let s = team.signaller("fan-in").unwrap();
            signal_from_threads(&team, &s, 2, EACH, &[PROCESSES]);
        })
    });
    for c in &mut children {
        c.expect("signalled", Duration::from_secs(60));
    }
    if let Some(far) = far {
        far.join().expect("the other node's signaller failed");
    }
    assert!(common::eventually(Duration::from_secs(30), || runs.lock().len() > others), "a run is missing");
    assert!(held_through.load(Ordering::SeqCst), "a run waited for the held one");
    std::thread::sleep(Duration::from_millis(100));
    let mut expected: HashSet<Vec<u8>> = (0..at.signallers()).flat_map(|p| arguments(2, EACH, &[p])).collect();
    expected.insert(b"hold".to_vec());
    let runs = runs.lock();
    let once: HashSet<Vec<u8>> = runs.iter().cloned().collect();
    assert_eq!((runs.len(), once), (others + 1, expected), "a signal lost or run twice");
}

#[test]
fn every_time_under_signallers_in_four_processes() {
    every_time_fan_in(false);
}

#[test]
fn every_time_under_signallers_in_four_processes_and_on_another_node() {
    every_time_fan_in(true);
}

/// Signals of each thread in a round of the `Latch` fan-in test.
const LATCH_EACH: u8 = 25;

/// `Latch` signalled by 4 processes of 2 threads each at once (25 signals
/// a thread; one thread waits for the run, the other for acceptance), and
/// with `other_node` by a team on another node too, round after round:
/// in each round exactly one signal is accepted and its arguments run the
/// handler once; every other is refused `Latched`; re-armed, the next
/// round runs it again; none runs after the last.
fn latch_fan_in(other_node: bool) {
    let at = FanIn::new(other_node);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let latch = at.owner.on_signal("fan-in", Mode::Latch, move |args| r.lock().push(args)).unwrap();
    let mut children: Vec<Child> = (0..PROCESSES).map(|p| at.child("latch", p)).collect();
    for c in &mut children {
        c.expect("ready", Duration::from_secs(30));
    }
    let signals = u32::from(at.signallers()) * 2 * u32::from(LATCH_EACH);
    for round in 0..ROUNDS {
        for c in &mut children {
            c.tell(&format!("go {round}"));
        }
        let far = at.other.clone().map(|team| {
            std::thread::spawn(move || {
                let s = team.signaller("fan-in").unwrap();
                latch_round(&team, &s, 2, LATCH_EACH, &[PROCESSES, round])
            })
        });
        let (mut accepted, mut refused) = (Vec::new(), 0);
        for c in &mut children {
            // "<refused> <the accepted ones' labels, comma-separated, or ->"
            let line = c.expect(&format!("round {round} "), Duration::from_secs(60));
            let (n, won) = line.split_once(' ').unwrap();
            refused += n.parse::<u32>().unwrap();
            accepted.extend(won.split(',').filter(|w| *w != "-").map(str::to_string));
        }
        if let Some(far) = far {
            let (won, n) = far.join().expect("the other node's signaller failed");
            refused += n;
            accepted.extend(won.iter().map(|a| label(a)));
        }
        assert_eq!((accepted.len(), refused), (1, signals - 1), "round {round}: accepted {accepted:?}");
        assert!(common::eventually(Duration::from_secs(10), || runs.lock().len() > usize::from(round)));
        assert_eq!(label(&runs.lock()[usize::from(round)]), accepted[0], "round {round}: not the accepted signal ran");
        assert!(latch.is_latched());
        latch.rearm();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(runs.lock().len(), usize::from(ROUNDS), "a refused signal ran");
}

#[test]
fn latch_under_signallers_in_four_processes() {
    latch_fan_in(false);
}

#[test]
fn latch_under_signallers_in_four_processes_and_on_another_node() {
    latch_fan_in(true);
}

/// The limits docs/SIGNAL.md gives, each a typed error: a `Coalesce`
/// handler with `MAX_PENDING` arguments waiting refuses the next signal
/// (`WouldBlock`) and loses none; arguments past the signaller's
/// `max_message` or the owner's are `TooLarge`; a
/// handler's name counts in `max_names` (`LimitReached`) and is one of a
/// kind (`NameTaken`).
#[test]
fn signal_limits_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).max_message(1000).max_names(2).start().unwrap();
    let user = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let (gate, ran) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (g, r) = (gate.clone(), ran.clone());
    let _held = owner
        .on_signal("held", Mode::Coalesce, move |_| {
            // The first run waits for the gate (at most 10 s): the others wait in the fifo.
            common::eventually(Duration::from_secs(10), || g.load(Ordering::SeqCst));
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let s = user.signaller("held").unwrap();
    for i in 0..=ferry::signal::MAX_PENDING as u32 {
        s.signal(&i.to_le_bytes()).unwrap();
    }
    assert!(matches!(s.signal(b"one too many"), Err(Error::WouldBlock { .. })));
    gate.store(true, Ordering::SeqCst);
    let all = ferry::signal::MAX_PENDING as u64 + 1;
    assert!(
        common::eventually(Duration::from_secs(10), || ran.load(Ordering::SeqCst) == all),
        "a waiting argument lost"
    );
    s.signal(b"room again").unwrap();

    // Arguments: the owner's max_message (1000; within one frame or out
    // of band), and the signaller's.
    for len in [2_000, 20_000] {
        let e = s.signal(&vec![0; len]).unwrap_err();
        assert!(matches!(e, Error::TooLarge { len: l, max: 1000 } if l == len), "{e:?}");
    }
    let small = Team::builder().runtime_dir(dir.path()).max_message(100).start().unwrap();
    let e = small.signaller("held").unwrap().signal(&[0; 200]).unwrap_err();
    assert!(matches!(e, Error::TooLarge { len: 200, max: 100 }), "{e:?}");

    // Names: "held" and one more.
    assert!(matches!(owner.on_signal("held", Mode::EveryTime, |_| {}), Err(Error::NameTaken { .. })));
    let second = owner.on_signal("second", Mode::EveryTime, |_| {}).unwrap();
    let e = owner.on_signal("third", Mode::EveryTime, |_| {}).err();
    assert!(matches!(e, Some(Error::LimitReached { limit: ferry::Limit::Names, max: 2 })), "{e:?}");
    drop(second);
    owner.on_signal("third", Mode::EveryTime, |_| {}).unwrap();
}

/// What the child processes run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    match role.as_str() {
        "signal" => {
            let p: u8 = std::env::var("FERRY_TEST_PROCESS").unwrap().parse().unwrap();
            let s = team.signaller("merged").unwrap();
            std::thread::scope(|scope| {
                for t in 0..2u8 {
                    let s = s.clone();
                    scope.spawn(move || (0..50u8).for_each(|i| signal_until_accepted(&s, &[p, t, i])));
                }
            });
            team.block_on(s.signal_done(&[p, 9, 9, 9])).unwrap();
            common::say("signalled");
        }
        // Signals the `EveryTime` fan-in handler from 2 threads.
        "every" => {
            let p: u8 = std::env::var("FERRY_TEST_PROCESS").unwrap().parse().unwrap();
            let s = team.signaller("fan-in").unwrap();
            signal_from_threads(&team, &s, 2, EACH, &[p]);
            common::say("signalled");
        }
        // A round at the `Latch` fan-in handler at each "go <round>".
        "latch" => {
            let p: u8 = std::env::var("FERRY_TEST_PROCESS").unwrap().parse().unwrap();
            let s = team.signaller("fan-in").unwrap();
            common::say("ready");
            while let Some(line) = common::hear() {
                let round: u8 = line.strip_prefix("go ").expect("go <round>").parse().unwrap();
                let (accepted, refused) = latch_round(&team, &s, 2, LATCH_EACH, &[p, round]);
                let won: Vec<String> = accepted.iter().map(|a| label(a)).collect();
                let won = if won.is_empty() { "-".to_string() } else { won.join(",") };
                common::say(format!("round {round} {refused} {won}"));
            }
        }
        other => panic!("unknown role {other}"),
    }
}

/// The bytes of arguments a handler holds are bounded as their number is
/// (`MAX_PENDING_BYTES`): an `EveryTime` handler whose run holds 40 MiB
/// refuses another 40 MiB while it runs (`WouldBlock`), and so does a
/// `Coalesce` handler with 40 MiB waiting; once the runs end, both take
/// them again, and every argument accepted ran.
#[test]
fn the_bytes_a_handler_holds_are_bounded() {
    const BIG: usize = 40 << 20;
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let user = Team::builder().runtime_dir(dir.path()).start().unwrap();
    for mode in [Mode::EveryTime, Mode::Coalesce] {
        let name = format!("{mode:?}");
        let (gate, ran) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (g, r) = (gate.clone(), ran.clone());
        let _handler = owner
            .on_signal(&name, mode, move |_| {
                // Held until the gate opens (at most 10 s).
                common::eventually(Duration::from_secs(10), || g.load(Ordering::SeqCst));
                r.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let s = user.signaller(&name).unwrap();
        let accepted = match mode {
            // One run holds 40 MiB.
            Mode::EveryTime => 1,
            // One run (small) under way, 40 MiB waiting.
            _ => {
                s.signal(b"first").unwrap();
                2
            }
        };
        s.signal(&vec![1u8; BIG]).unwrap();
        let e = s.signal(&vec![2u8; BIG]).unwrap_err();
        assert!(matches!(e, Error::WouldBlock { .. }), "{mode:?}: {e:?}");
        gate.store(true, Ordering::SeqCst);
        assert!(common::eventually(Duration::from_secs(10), || ran.load(Ordering::SeqCst) == accepted), "{mode:?}");
        s.signal(&vec![3u8; BIG]).unwrap();
        assert!(common::eventually(Duration::from_secs(10), || ran.load(Ordering::SeqCst) == accepted + 1), "{mode:?}");
    }
}
