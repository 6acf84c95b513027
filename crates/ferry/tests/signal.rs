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
            assert_eq!(total.load(Ordering::SeqCst), (1..=100).sum::<u64>());
            coalesced.check(8 * 50 + 1);
        },
        |b: &Side| {
            b.get::<String>("ready");
            let every = b.team.signaller("every").unwrap();
            for i in 1..=100u64 {
                b.team.block_on(every.signal_done(&i.to_le_bytes())).unwrap();
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

loopback_placements!(every_mode_in_every_placement, dropped_and_panicking_handlers);

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
        other => panic!("unknown role {other}"),
    }
}
