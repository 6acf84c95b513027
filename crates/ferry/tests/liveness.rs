//! Liveness across real processes: a peer killed at an awkward moment must
//! fail what waits on it (`PeerGone`), and a busy processor must not delay
//! requests another processor could take.

mod common;

use common::{within, Child};
use ferry::{Checkpoint, Error, Team};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a dead peer may take to fail the calls waiting on it.
const DEATH_NOTICE: Duration = Duration::from_secs(5);
const START: Duration = Duration::from_secs(20);

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    match role.as_str() {
        // Answers each call with 8 MiB: more than a ring, so in pieces.
        "big-reply" => {
            let port = team.open_named_port::<String>("big").unwrap();
            common::say("ready");
            loop {
                let m = port.recv_blocking().unwrap();
                common::say("replying");
                m.reply(&"x".repeat(8 << 20)).unwrap();
            }
        }
        // Takes one call and keeps it unanswered, then sends three messages
        // to the parent's port "sink" (whose inbox holds one: the other two
        // wait in the channel's hold queue).
        "hold-and-flood" => {
            let port = team.open_named_port::<String>("holder").unwrap();
            common::say("ready");
            let held = port.recv_blocking().unwrap();
            // The messages must share the held call's channel: give the bind
            // thread time to record it as the parent's, or `connect` could
            // race it and bind a second channel (defect 2).
            std::thread::sleep(Duration::from_millis(100));
            let sink = team.connect::<u64>("sink").unwrap();
            for i in 0..3u64 {
                sink.send(&i, Checkpoint::Immediate).unwrap();
            }
            common::say("flooded");
            std::thread::sleep(Duration::from_secs(60));
            drop(held);
        }
        other => panic!("unknown role {other}"),
    }
}

fn is_peer_gone<T: std::fmt::Debug>(r: &ferry::Result<T>) -> bool {
    matches!(r, Err(Error::PeerGone { .. }))
}

/// Defect 1: a peer killed between the pieces of a message it was sending
/// left the receiver's channel "assembling" for good, so every call
/// pending on that channel waited forever instead of failing with
/// `PeerGone`. (Large messages now travel whole, out of band; the test
/// keeps checking that a peer killed while answering fails what waits.)
///
/// Deterministic: the parent's team has no processor and makes no blocking
/// call while the child answers, so nothing drains the child's ring; the
/// child's 8 MiB reply fills it with its first pieces and waits for room.
/// Then the child is killed, and only then does the parent wait.
#[test]
fn peer_killed_mid_stream_fails_the_pending_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("big-reply", dir.path());
    child.expect("ready", START);
    // The channel's payload areas (sized by the side that binds: us) hold
    // one 8 MiB reply, not two: the child's second reply waits for room.
    let me = Team::builder().runtime_dir(dir.path()).processors(0).max_message(12 << 20).start().unwrap();
    let big = me.connect::<String>("big").unwrap();
    // Both requests are written now; nobody here reads the replies yet.
    let first = big.call_async::<String>(&"first".into());
    let second = big.call_async::<String>(&"second".into());
    child.expect("replying", START);
    // The child's reply fills the 64 KiB ring within microseconds, then waits.
    std::thread::sleep(Duration::from_millis(300));
    child.kill();
    let killed_at = Instant::now();
    let (r1, r2) = within(DEATH_NOTICE, "calls pending on a peer killed mid-message", move || {
        let r1 = me.block_on(first);
        let r2 = me.block_on(second);
        (r1.map(|s: String| s.len()), r2.map(|s: String| s.len()))
    });
    // A large reply now travels whole, out of band: it arrived complete
    // before the kill, or not at all. Never a hang, never a cut message.
    assert!(
        matches!(r1, Ok(n) if n == 8 << 20) || is_peer_gone(&r1),
        "the call whose reply was being sent: want the whole reply or PeerGone, got {r1:?}"
    );
    assert!(is_peer_gone(&r2), "the other call on the channel: want PeerGone, got {r2:?}");
    assert!(killed_at.elapsed() < DEATH_NOTICE);
}

/// Defect 1, second case: messages waiting in the channel's hold queue
/// (their port's inbox is full and nobody receives) keep a dead peer's
/// channel open, so a call pending on it never fails.
#[test]
fn peer_killed_with_held_messages_fails_the_pending_call() {
    let dir = tempfile::tempdir().unwrap();
    let me = Team::builder().runtime_dir(dir.path()).inbox_capacity(1).start().unwrap();
    // Never received from: one message fills it, the next ones are held.
    let sink = me.open_named_port::<u64>("sink").unwrap();
    let mut child = Child::spawn("hold-and-flood", dir.path());
    child.expect("ready", START);
    let holder = me.connect::<String>("holder").unwrap();
    let call = holder.call_async::<String>(&"never answered".into());
    child.expect("flooded", START);
    // The parent's processor takes the first message into the inbox and holds the rest.
    assert!(common::eventually(Duration::from_secs(5), || sink.len() == 1), "the sink never got its first message");
    std::thread::sleep(Duration::from_millis(100));
    child.kill();
    let waiter = me.clone();
    let r = within(DEATH_NOTICE, "a call pending on a dead peer with held messages", move || {
        waiter.block_on(call).map(|s: String| s.len())
    });
    assert!(is_peer_gone(&r), "want PeerGone, got {r:?}");
    drop(sink);
}

#[ferry::service]
pub trait Slow {
    /// Computes for `ms` milliseconds before its first await (on the processor that received the call).
    async fn busy(&self, ms: u64);
}

#[ferry::service]
pub trait Quick {
    async fn ping(&self) -> u32;
}

struct SlowImpl;
struct QuickImpl;

impl Slow for SlowImpl {
    async fn busy(&self, ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            std::hint::spin_loop();
        }
    }
}

impl Quick for QuickImpl {
    async fn ping(&self) -> u32 {
        7
    }
}

fn blocking_team(dir: &Path, processors: usize) -> Team {
    Team::builder()
        .runtime_dir(dir)
        .processors(processors)
        .blocking()
        .park_timeout(Duration::from_secs(2))
        .start()
        .unwrap()
}

/// Defect 5: a processor running user code (a handler called straight from
/// its poll of the channels) still counts as a poller, so a sender sees
/// "someone is polling" and does not ring; the team's other processor
/// sleeps on, and a request to another endpoint waits until the handler
/// ends (or the park timeout) instead of being taken at once.
#[test]
fn a_busy_processor_does_not_delay_requests_another_could_take() {
    let dir = tempfile::tempdir().unwrap();
    let server = blocking_team(dir.path(), 2);
    let _slow = SlowServer::serve(&server, "slow", SlowImpl).unwrap();
    let _quick = QuickServer::serve(&server, "quick", QuickImpl).unwrap();
    let client = blocking_team(dir.path(), 1);
    let slow = SlowClient::bind(&client, "slow").unwrap();
    let quick = QuickClient::bind(&client, "quick").unwrap().with_timeout(Duration::from_secs(10));
    assert_eq!(quick.ping_blocking().unwrap(), 7);
    // Best of three: a loaded machine may delay one ping; the defect delays every one.
    let mut took = Vec::new();
    for _ in 0..3 {
        let busy = slow.busy(500);
        // Let one processor take the call and start computing.
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        assert_eq!(quick.ping_blocking().unwrap(), 7);
        took.push(t0.elapsed());
        busy.wait().unwrap();
    }
    let best = *took.iter().min().unwrap();
    assert!(best < Duration::from_millis(50), "ping answered after {took:?} while another processor was busy");
}
