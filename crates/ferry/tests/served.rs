//! Served frames (`ferry::extend`), the core's extension point for
//! primitives, over every placement: a handler registered for a range of
//! frame kinds answers them from the progress loop — also while every task
//! of its team is blocked, and in a team without processors, from a thread
//! waiting in a blocking call.

mod common;

use common::pair::{pair, Placement, Side};
use ferry::extend::{FrameHandler, ServedFrame};
use ferry::{Checkpoint, EndpointId, Error, Refusal, Team, TeamId};
use rustix::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kind 200 answers with the payload reversed (a large one: with its
/// length), 201 refuses, 202 drops the frame unanswered; each counts.
#[derive(Default)]
struct Test {
    served: AtomicUsize,
}

const REVERSE: u8 = 200;
const REFUSE: u8 = 201;
const DROP: u8 = 202;
const NOBODY: u8 = 203;

impl FrameHandler for Test {
    fn serve(&self, frame: ServedFrame<'_>) {
        self.served.fetch_add(1, Ordering::SeqCst);
        match frame.kind() {
            REVERSE => {
                let answer = frame.with_payload(|b| match b.len() > 1024 {
                    true => (b.len() as u64).to_le_bytes().to_vec(),
                    false => b.iter().rev().copied().collect(),
                });
                frame.reply(&answer).unwrap();
            }
            REFUSE => frame.refuse("not today"),
            _ => drop(frame),
        }
    }
}

fn owner(team: &TeamId) -> EndpointId {
    team.endpoint(0).unwrap()
}

/// Every way a served frame is answered, and the frames that are not.
fn served_frames_are_answered(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let handler = Arc::new(Test::default());
            let _serving = a.team.serve_frames(REVERSE..=DROP, handler.clone()).unwrap();
            a.put("serving", "");
            let sent: usize = a.get::<usize>("sent") + 1;
            assert!(common::eventually(Duration::from_secs(5), || handler.served.load(Ordering::SeqCst) == sent));
        },
        |b: &Side| {
            b.get::<String>("serving");
            let to = owner(&b.peer);
            // The first frame, with a deadline, waits for the bind in the
            // bind's queue: its answer is the reply, not its going out
            // (a served frame is a request, as a port's message is).
            let first = b.team.frame_sender(to, REVERSE).unwrap().with_timeout(Duration::from_secs(10));
            assert_eq!(first.call(b"first").unwrap(), b"tsrif");
            let send = |kind: u8, bytes: &[u8], c: Checkpoint| b.team.frame_sender(to, kind).unwrap().send(bytes, c);
            assert_eq!(send(REVERSE, b"abc", Checkpoint::OnReturn).unwrap(), b"cba");
            // Large: out of band on shared memory.
            let big = vec![7u8; 3 << 20];
            assert_eq!(send(REVERSE, &big, Checkpoint::OnReturn).unwrap(), (3u64 << 20).to_le_bytes());
            assert_eq!(send(REVERSE, b"x", Checkpoint::OnReceipt).unwrap(), b"");
            assert_eq!(send(REVERSE, b"x", Checkpoint::OnDelivery).unwrap(), b"");
            assert_eq!(send(REVERSE, b"x", Checkpoint::Immediate).unwrap(), b"");
            match send(REFUSE, b"x", Checkpoint::OnReturn) {
                Err(Error::Refused(Refusal::Peer(why))) => assert_eq!(why, "not today"),
                other => panic!("a refusal: {other:?}"),
            }
            assert!(matches!(send(DROP, b"x", Checkpoint::OnReturn), Err(Error::Refused(Refusal::NoReply))));
            // Not counted: no handler runs.
            match send(NOBODY, b"x", Checkpoint::OnReturn) {
                Err(Error::Refused(Refusal::NotServed { kind })) => assert_eq!(kind, NOBODY),
                other => panic!("not served: {other:?}"),
            }
            b.put("sent", 7);
        },
    );
}

/// A served frame is answered while the owner's only processor is stuck
/// in a task that blocks it (a replacement processor drains the channel):
/// what remote memory relies on.
fn served_while_every_task_blocks(p: Placement) {
    pair(p).config_a(|b| b.processors(1)).run(
        |a: &Side| {
            let _serving = a.team.serve_frames(REVERSE..=DROP, Arc::new(Test::default())).unwrap();
            let stuck = a.team.spawn(async { std::thread::sleep(Duration::from_secs(3)) });
            a.put("blocked", "");
            a.get::<String>("done");
            a.team.block_on(stuck).unwrap();
        },
        |b: &Side| {
            b.get::<String>("blocked");
            // Well inside the block.
            std::thread::sleep(Duration::from_millis(100));
            let sender = b.team.frame_sender(owner(&b.peer), REVERSE).unwrap();
            let t0 = Instant::now();
            assert_eq!(sender.send(b"ab", Checkpoint::OnReturn).unwrap(), b"ba");
            let took = t0.elapsed();
            b.put("done", "");
            assert!(took < Duration::from_secs(1), "answered after {took:?}, behind the blocked task");
        },
    );
}

/// A team without processors serves frames from a thread of its that
/// waits in a blocking call (here, a port's receive).
fn a_processorless_owner_serves_from_its_waiting_thread(p: Placement) {
    if p.one_team() {
        return; // One team: the requester's own thread would serve it.
    }
    pair(p).config_a(|b| b.processors(0)).run(
        |a: &Side| {
            let _serving = a.team.serve_frames(REVERSE..=DROP, Arc::new(Test::default())).unwrap();
            let port = a.team.open_raw_port().unwrap();
            a.put("port", port.id());
            // The only thread driving this team waits here until B is done.
            let m = port.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(m.payload(), b"done");
        },
        |b: &Side| {
            let port: EndpointId = b.get("port");
            let sender = b.team.frame_sender(owner(&b.peer), REVERSE).unwrap();
            for _ in 0..100 {
                assert_eq!(sender.send(b"xyz", Checkpoint::OnReturn).unwrap(), b"zyx");
            }
            b.team.raw_sender(port).send(b"done", Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// Kind 205 answers with a memfd holding "segment", handed over (post-bind
/// resources), or refuses with why it cannot.
struct Segments;

const SEGMENT: u8 = 205;

impl FrameHandler for Segments {
    fn serve(&self, frame: ServedFrame<'_>) {
        let fd = rustix::fs::memfd_create("ferry-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&fd, b"segment").unwrap();
        // Not asked for (or not over shared memory): an error, and the frame
        // is dropped unanswered (its sender gets `NoReply`).
        let _ = frame.reply_with_descriptors(b"here", &[fd.as_fd()]);
    }
}

/// A served frame's answer hands the caller a shared-memory segment after
/// the bind, over shared memory; elsewhere asking is a typed error, and a
/// caller that did not ask gets none.
fn segments_are_handed_over_on_shared_memory(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let _serving = a.team.serve_frames(SEGMENT..=SEGMENT, Arc::new(Segments)).unwrap();
            a.put("serving", "");
            a.get::<String>("done");
        },
        |b: &Side| {
            b.get::<String>("serving");
            let sender = b.team.frame_sender(owner(&b.peer), SEGMENT).unwrap();
            match p {
                Placement::TwoTeams | Placement::TwoProcesses => {
                    for _ in 0..3 {
                        let (reply, fds) = sender.call_for_descriptors(b"give").unwrap();
                        assert_eq!((reply.as_slice(), fds.len()), (&b"here"[..], 1));
                        let mut text = [0u8; 16];
                        let n = rustix::io::pread(&fds[0], &mut text, 0).unwrap();
                        assert_eq!(&text[..n], b"segment");
                    }
                }
                // One team (the loop-back) or TCP: no descriptors travel.
                _ => assert!(matches!(sender.call_for_descriptors(b"give"), Err(Error::InvalidArgument(_)))),
            }
            // Not asked: the handler cannot hand any over (its reply fails:
            // the frame is dropped unanswered).
            assert!(matches!(sender.send(b"give", Checkpoint::OnReturn), Err(Error::Refused(Refusal::NoReply))));
            b.put("done", "");
        },
    );
}

placements!(
    segments_are_handed_over_on_shared_memory,
    served_frames_are_answered,
    served_while_every_task_blocks,
    a_processorless_owner_serves_from_its_waiting_thread
);

/// Kinds outside the served range, and kinds taken, are refused with
/// typed errors; a handler's guard unregisters it.
#[test]
fn kinds_are_checked_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let handler = Arc::new(Test::default());
    assert!(matches!(team.serve_frames(10..=70, handler.clone()), Err(Error::InvalidArgument(_))));
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 210..=200;
    assert!(matches!(team.serve_frames(empty, handler.clone()), Err(Error::InvalidArgument(_))));
    assert!(matches!(team.frame_sender(owner(&team.id()), 3), Err(Error::InvalidArgument(_))));
    let guard = team.serve_frames(REVERSE..=DROP, handler.clone()).unwrap();
    assert!(matches!(team.serve_frames(DROP..=NOBODY, handler.clone()), Err(Error::KindTaken { kind: DROP })));
    let other = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let sender = other.frame_sender(owner(&team.id()), REVERSE).unwrap();
    assert_eq!(sender.send(b"12", Checkpoint::OnReturn).unwrap(), b"21");
    drop(guard);
    assert!(matches!(
        sender.send(b"12", Checkpoint::OnReturn),
        Err(Error::Refused(Refusal::NotServed { kind: REVERSE }))
    ));
    // Free again.
    let _again = team.serve_frames(DROP..=NOBODY, handler).unwrap();
}

/// Regression: a handler that holds its own registration (as a primitive
/// keeps its state and its `ServedKinds` together) deadlocked the team's
/// shutdown, which dropped it under the lock its registration's drop takes.
#[test]
fn a_handler_holding_its_own_registration_goes_at_shutdown() {
    struct SelfHeld(parking_lot::Mutex<Option<ferry::extend::ServedKinds>>);
    impl FrameHandler for SelfHeld {
        fn serve(&self, frame: ServedFrame<'_>) {
            let _ = frame.reply(b"");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let handler = Arc::new(SelfHeld(parking_lot::Mutex::new(None)));
    *handler.0.lock() = Some(team.serve_frames(REVERSE..=REVERSE, handler.clone()).unwrap());
    drop(handler);
    common::within(Duration::from_secs(10), "shutdown", move || team.shutdown());
}

/// Regression (the links stress test's hang on three nodes): a handler's
/// post to a team with no channel yet bound one on the handler's own
/// thread, whose wait drained the team's channels and so ran handlers
/// again under the first one's locks (a link end's: it deadlocked). Now
/// the post returns at once while a blocking thread binds; when that bind
/// fails, every handler hears that the team is gone.
#[test]
fn a_handler_posting_to_a_team_not_bound_yet_never_waits() {
    const POST: u8 = 204;
    #[derive(Default)]
    struct Poster {
        sender: parking_lot::Mutex<Option<ferry::port::RawSender>>,
        posted: parking_lot::Mutex<Option<(Duration, bool)>>,
        gone: parking_lot::Mutex<Vec<TeamId>>,
    }
    impl FrameHandler for Poster {
        fn serve(&self, frame: ServedFrame<'_>) {
            let t = Instant::now();
            let posted = self.sender.lock().as_ref().expect("set before").post(b"frame").is_ok();
            *self.posted.lock() = Some((t.elapsed(), posted));
            drop(frame);
        }
        fn peer_gone(&self, peer: TeamId) {
            self.gone.lock().push(peer);
        }
    }
    // Node 2 of the cluster: a socket that takes connections and never
    // answers (its handshake times out, after 5 s).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = common::free_loopback_addr();
    let cluster = ferry::Cluster {
        node: 1,
        listen,
        peers: [(2, silent.local_addr().unwrap())].into(),
        key: Arc::from(&b"a cluster key of more than 16 bytes"[..]),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).cluster(cluster).start().unwrap();
    let handler = Arc::new(Poster::default());
    let _serving = team.serve_frames(POST..=POST, handler.clone()).unwrap();
    let far = TeamId { node: 2, team: 77, incarnation: 1 };
    *handler.sender.lock() = Some(team.frame_sender(owner(&far), POST).unwrap());
    team.frame_sender(owner(&team.id()), POST).unwrap().send(b"go", Checkpoint::OnReceipt).unwrap();
    let t = Instant::now();
    let (took, posted) = loop {
        if let Some(p) = *handler.posted.lock() {
            break p;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the handler never posted");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(posted, "the frame waits in the bind");
    assert!(took < Duration::from_secs(1), "the handler's post waited {took:?} (a bind on its thread)");
    while !handler.gone.lock().contains(&far) {
        assert!(t.elapsed() < Duration::from_secs(20), "the failed bind was never told to the handler");
        std::thread::sleep(Duration::from_millis(10));
    }
}
