//! Fifos (`ferry::fifo`): a fifo owned by one team, fed by producers in
//! every placement (the same team, two teams of one process, two
//! processes mapping their own rings, two nodes — in namespaces, and on
//! loopback in this process — whose enqueues the owner's runtime serves);
//! many producer processes at once; hostile and dead producers and owners.

mod common;

use common::pair::{pair, Placement, Side};
use common::{Child, ROLE};
use ferry::memory::Key;
use ferry::{Error, Team};
use std::time::Duration;

/// The tests of this file run one at a time: some count this process's
/// descriptors and mappings.
static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

const ELEMENTS: u32 = 2000;

/// Elements go through in order, none lost or doubled, through a ring of
/// 8 (so the producer meets a full ring and waits for room); a parked
/// owner is woken by a producer; mistakes are typed errors.
fn elements_flow_in_every_placement(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).run(
        |a: &Side| {
            let mut fifo = a.team.fifo("jobs", 8, 16).unwrap();
            a.put("key", fifo.key());
            for i in 0..ELEMENTS {
                let e = fifo.dequeue_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(e, i.to_le_bytes(), "element {i}");
            }
            assert_eq!(fifo.try_dequeue(), None);
            // Parked (past its spin), then woken by the producer.
            a.put("parking", "");
            let t0 = std::time::Instant::now();
            assert_eq!(fifo.dequeue_timeout(Duration::from_secs(10)).unwrap(), b"late");
            assert!(t0.elapsed() >= Duration::from_millis(50));
            a.put("full?", "");
            a.get::<String>("full");
            for _ in 0..8 {
                fifo.try_dequeue().unwrap();
            }
            a.put("drained", "");
            a.get::<String>("done");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            assert!(matches!(b.team.open_fifo("jobs", Key::from_bytes([7; 16])), Err(Error::AccessDenied { .. })));
            assert!(matches!(b.team.open_fifo("no-such-fifo", key), Err(Error::NameNotFound(_))));
            let wrong = b.team.block_on(b.team.open_fifo_async("jobs", Key::from_bytes([7; 16])));
            assert!(matches!(wrong, Err(Error::AccessDenied { .. })), "the async form checks the key too");
            // Opened as a future (a blocking thread opens it).
            let mut jobs = b.team.block_on(b.team.open_fifo_async("jobs", key)).unwrap();
            assert!(matches!(jobs.enqueue(&[0; 17]), Err(Error::TooLarge { len: 17, max: 16 })));
            for i in 0..ELEMENTS {
                jobs.enqueue_timeout(&i.to_le_bytes(), Duration::from_secs(10)).unwrap();
            }
            b.get::<String>("parking");
            std::thread::sleep(Duration::from_millis(100));
            jobs.enqueue(b"late").unwrap();
            b.get::<String>("full?");
            for _ in 0..8 {
                jobs.enqueue(b"x").unwrap();
            }
            assert!(matches!(jobs.enqueue(b"x"), Err(Error::WouldBlock { .. })), "nothing is dropped");
            assert!(matches!(jobs.enqueue_timeout(b"x", Duration::from_millis(20)), Err(Error::DeadlineExceeded)));
            b.put("full", "");
            b.get::<String>("drained");
            b.team.block_on(jobs.enqueue_async(&b.team, b"async")).unwrap();
            b.put("done", "");
        },
    );
}

/// The owner drops its fifo: a producer's next enqueue fails `NoSuchEndpoint`
/// (across machines once its credit is used: the ring's free slots, 4).
fn a_dropped_fifo_fails_its_producers(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).run(
        |a: &Side| {
            let fifo = a.team.fifo("short-lived", 4, 8).unwrap();
            a.put("key", fifo.key());
            a.get::<String>("opened");
            drop(fifo);
            a.put("dropped", "");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let mut f = b.team.open_fifo("short-lived", key).unwrap();
            f.enqueue(b"one").unwrap();
            b.put("opened", "");
            b.get::<String>("dropped");
            let refused = (0..=4).find_map(|_| f.enqueue(b"two").err());
            assert!(matches!(refused, Some(Error::NoSuchEndpoint(_))), "{refused:?}");
        },
    );
}

/// A producer's team gone without a word (its handle forgotten, its team
/// shut down): the owner drains what it enqueued, then drops its ring.
fn a_vanished_producers_ring_goes_once_drained(p: Placement) {
    if p.one_team() {
        return; // One team: the producer's team is the owner's.
    }
    pair(p).run(
        |a: &Side| {
            let mut fifo = a.team.fifo("forgotten", 16, 8).unwrap();
            a.put("key", fifo.key());
            a.get::<String>("gone");
            assert_eq!(fifo.dequeue_timeout(Duration::from_secs(10)).unwrap(), b"last");
            let drained = || fifo.try_dequeue().is_none() && fifo.producers() == 0;
            assert!(common::eventually(Duration::from_secs(10), drained), "the vanished producer's ring stayed");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let mut f = b.team.open_fifo("forgotten", key).unwrap();
            f.enqueue(b"last").unwrap();
            std::mem::forget(f);
            b.team.shutdown();
            b.put("gone", "");
        },
    );
}

loopback_placements!(
    elements_flow_in_every_placement,
    a_dropped_fifo_fails_its_producers,
    a_vanished_producers_ring_goes_once_drained
);

/// Elements per producer of the many-producer tests.
const EACH: u32 = 5000;

/// Producer `who`'s elements: its number, then the element's (u32 each).
fn produce(f: &mut ferry::fifo::FifoRef, who: u32) {
    for n in 0..EACH {
        let e = [who.to_le_bytes(), n.to_le_bytes()].concat();
        f.enqueue_timeout(&e, Duration::from_secs(30)).unwrap();
    }
}

/// Takes every element of `producers` producers: each producer's in its
/// order, none lost or doubled.
fn take_in_order(fifo: &mut ferry::fifo::Fifo, producers: usize) {
    let mut next = vec![0u32; producers];
    for _ in 0..producers * EACH as usize {
        let e = match fifo.dequeue_timeout(Duration::from_secs(30)) {
            Ok(e) => e,
            Err(e) => panic!("{e} after each producer's elements {next:?}, {} producers' rings", fifo.producers()),
        };
        let (who, n) = (u32::from_le_bytes(e[..4].try_into().unwrap()), u32::from_le_bytes(e[4..].try_into().unwrap()));
        assert_eq!(n, next[who as usize], "producer {who} out of order");
        next[who as usize] += 1;
    }
    assert!(next.iter().all(|&n| n == EACH), "{next:?}");
}

/// 4 producer processes, 5,000 elements each, into one fifo: nothing lost
/// or doubled, each producer's elements in its order.
#[test]
fn four_producer_processes_lose_nothing_and_keep_their_order() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut fifo = owner.fifo("many", 64, 8).unwrap();
    let mut children: Vec<Child> = (0..4u32)
        .map(|i| {
            Child::spawn_with("produce", dir.path(), |c| {
                c.env("FERRY_TEST_KEY", fifo.key().to_string()).env("FERRY_TEST_PRODUCER", i.to_string());
            })
        })
        .collect();
    take_in_order(&mut fifo, 4);
    for c in &mut children {
        c.expect("produced", Duration::from_secs(30));
    }
    assert_eq!(fifo.try_dequeue(), None);
}

/// 4 producer processes on the owner's node and a producer on another node
/// (a cluster on loopback; its enqueues served by the owner's runtime),
/// 5,000 elements each, into one fifo: nothing lost or doubled, each
/// producer's elements in its order.
#[test]
fn producers_in_four_processes_and_on_another_node_lose_nothing() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let ports = [common::free_port(), common::free_port()];
    std::fs::write(dir.path().join("key"), b"the fifo test's cluster key").unwrap();
    for (node, peer) in [(1, 2), (2, 1)] {
        let file = format!(
            "node {node}\nlisten 127.0.0.1:{}\nkey-file {}\npeer {peer} 127.0.0.1:{}\n",
            ports[node - 1],
            dir.path().join("key").display(),
            ports[peer - 1]
        );
        std::fs::write(dir.path().join(format!("{node}.cluster")), file).unwrap();
        std::fs::create_dir_all(dir.path().join(node.to_string())).unwrap();
    }
    let node = |n: usize| {
        let cluster = dir.path().join(format!("{n}.cluster"));
        let builder = Team::builder().runtime_dir(dir.path().join(n.to_string()));
        builder.cluster(ferry::Cluster::from_file(&cluster).unwrap()).start().unwrap()
    };
    let owner = node(1);
    let mut fifo = owner.fifo("many", 64, 8).unwrap();
    let mut children: Vec<Child> = (0..4u32)
        .map(|i| {
            Child::spawn_with("produce", &dir.path().join("1"), |c| {
                c.env("FERRY_TEST_KEY", fifo.key().to_string())
                    .env("FERRY_TEST_PRODUCER", i.to_string())
                    .env("FERRY_CLUSTER", dir.path().join("1.cluster"));
            })
        })
        .collect();
    let remote = node(2);
    let key = fifo.key();
    let far = std::thread::spawn(move || {
        let mut f = remote.open_fifo("many", key).unwrap();
        assert!(!f.scribble_tail(0), "another node's producer has no ring mapped: its enqueues are served");
        produce(&mut f, 4);
        remote
    });
    take_in_order(&mut fifo, 5);
    for c in &mut children {
        c.expect("produced", Duration::from_secs(30));
    }
    far.join().unwrap().shutdown();
    assert_eq!(fifo.try_dequeue(), None);
}

/// A producer that scribbles on its ring (its tail far past its capacity)
/// is closed, `Closed` at its next enqueue; another producer goes on.
#[test]
fn a_scribbling_producer_hurts_only_itself() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut fifo = owner.fifo("guarded", 16, 8).unwrap();
    let user = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let (mut honest, mut hostile) =
        (user.open_fifo("guarded", fifo.key()).unwrap(), user.open_fifo("guarded", fifo.key()).unwrap());
    honest.enqueue(b"honest").unwrap();
    hostile.enqueue(b"hostile").unwrap();
    assert!(hostile.scribble_tail(1 << 40));
    let mut got = Vec::new();
    while let Some(e) = fifo.try_dequeue() {
        got.push(e);
    }
    assert_eq!(got, [b"honest".to_vec()]);
    assert!(matches!(hostile.enqueue(b"again"), Err(Error::Closed { .. })));
    honest.enqueue(b"on").unwrap();
    assert_eq!(fifo.try_dequeue().unwrap(), b"on");
    assert_eq!(fifo.producers(), 1);
}

/// The same with each producer in a process of its own, mapping its ring
/// (handed over its channel): the scribbler's ring is closed (its next
/// enqueue fails `Closed`), its element after the scribble is not taken,
/// and the honest process's elements flow before and after.
#[test]
fn a_scribbling_producer_process_hurts_only_itself() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut fifo = owner.fifo("guarded", 16, 8).unwrap();
    let key = fifo.key();
    let spawn = |role: &str| Child::spawn_with_key(role, dir.path(), &key);
    let (mut honest, mut scribbler) = (spawn("honest"), spawn("scribble"));
    honest.tell("before");
    honest.expect("sent", Duration::from_secs(20));
    scribbler.expect("scribbled", Duration::from_secs(20));
    let mut got = Vec::new();
    while let Ok(e) = fifo.dequeue_timeout(Duration::from_millis(300)) {
        got.push(e);
    }
    assert_eq!(got, [b"before".to_vec()], "only the honest element");
    scribbler.tell("again");
    assert_eq!(scribbler.expect("", Duration::from_secs(20)), "closed");
    honest.tell("after");
    honest.expect("sent", Duration::from_secs(20));
    assert_eq!(fifo.dequeue_timeout(Duration::from_secs(10)).unwrap(), b"after");
    assert_eq!(fifo.producers(), 1, "the scribbler's ring is gone");
}

/// A producer killed mid-stream: the owner drains what it enqueued, then
/// keeps nothing of it (no mapping, no descriptor). The owner killed: a
/// producer's next enqueue fails `PeerGone`, and its ring goes with its handle.
#[test]
fn killed_producers_and_owners_leave_nothing_behind() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut fifo = owner.fifo("victim", 64, 8).unwrap();
    let ours = |s: &str| s.contains("ferry-fifo:");
    let rings = || {
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().filter_map(|f| std::fs::read_link(f.ok()?.path()).ok());
        fds.filter(|l| ours(&l.to_string_lossy())).count()
            + common::shared_mappings().iter().filter(|m| ours(m)).count()
    };
    let mut producer = Child::spawn_with_key("produce-forever", dir.path(), &fifo.key());
    producer.expect("producing", Duration::from_secs(10));
    assert_eq!(fifo.dequeue_timeout(Duration::from_secs(10)).unwrap(), b"alive");
    producer.kill();
    assert!(common::eventually(Duration::from_secs(10), || {
        while fifo.try_dequeue().is_some() {}
        fifo.producers() == 0 && rings() == 0
    }));

    let team = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let mut owner_child = Child::spawn("own", dir.path());
    let key: Key = owner_child.expect("key", Duration::from_secs(10)).parse().unwrap();
    let mut f = team.open_fifo("owned", key).unwrap();
    f.enqueue(b"x").unwrap();
    assert!(rings() > 0);
    owner_child.kill();
    assert!(common::eventually(Duration::from_secs(5), || matches!(f.enqueue(b"y"), Err(Error::PeerGone { .. }))));
    drop(f);
    assert_eq!(rings(), 0, "the dead owner's ring stayed mapped");
}

/// What the child processes run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    let key = || -> Key { std::env::var("FERRY_TEST_KEY").unwrap().parse().unwrap() };
    match role.as_str() {
        "produce" => {
            let who: u32 = std::env::var("FERRY_TEST_PRODUCER").unwrap().parse().unwrap();
            produce(&mut team.open_fifo("many", key()).unwrap(), who);
            common::say("produced");
        }
        "produce-forever" => {
            let mut f = team.open_fifo("victim", key()).unwrap();
            f.enqueue(b"alive").unwrap();
            common::say("producing");
            loop {
                let _ = f.enqueue(b"more");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Enqueues, then writes over its ring's tail (it maps the ring: a
        // producer in another process), then tries again when told.
        "scribble" => {
            let mut f = team.open_fifo("guarded", key()).unwrap();
            f.enqueue(b"hostile").unwrap();
            assert!(f.scribble_tail(1 << 40), "the ring is mapped in this process");
            common::say("scribbled");
            assert_eq!(common::hear().as_deref(), Some("again"));
            match f.enqueue(b"again") {
                Err(Error::Closed { .. }) => common::say("closed"),
                other => common::say(format!("not closed: {other:?}")),
            }
        }
        // Enqueues one element each time it is told.
        "honest" => {
            let mut f = team.open_fifo("guarded", key()).unwrap();
            while let Some(what) = common::hear() {
                f.enqueue(what.as_bytes()).unwrap();
                common::say("sent");
            }
        }
        "own" => {
            let fifo = team.fifo("owned", 16, 8).unwrap();
            common::say(format!("key {}", fifo.key()));
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}
