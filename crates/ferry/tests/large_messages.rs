//! Large messages: sent in pieces, they must neither deadlock a team that
//! is called back meanwhile, nor make an `Immediate` send wait, and the
//! documented maximum must hold for the user's data, not its encoding.

mod common;

use common::{within, Child};
use ferry::rpc::ServiceEndpoint;
use ferry::{Checkpoint, EndpointId, Error, Team};
use std::sync::Arc;
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(20);
const MIB: usize = 1 << 20;

#[ferry::service]
pub trait Callee {
    /// Binds the caller's `Back` service at `back`, for `hello`.
    async fn meet(&self, back: EndpointId) -> bool;
    /// Calls back `Back::ping` (no deadline) and answers its result plus one.
    async fn hello(&self) -> u32;
}

#[ferry::service]
pub trait Back {
    async fn ping(&self) -> u32;
}

#[ferry::service]
pub trait Sink {
    async fn len(&self, data: String) -> u64;
}

struct CalleeImpl {
    team: Team,
    back: std::sync::Mutex<Option<BackClient>>,
}
struct BackImpl;
struct SinkImpl;

impl Callee for CalleeImpl {
    async fn meet(&self, back: EndpointId) -> bool {
        let client = BackClient::connect(&self.team, back).await;
        let ok = client.is_ok();
        *self.back.lock().unwrap() = client.ok();
        ok
    }
    async fn hello(&self) -> u32 {
        let back = self.back.lock().unwrap().clone().expect("meet first");
        back.ping().await.map_or(0, |v| v + 1)
    }
}

impl Back for BackImpl {
    async fn ping(&self) -> u32 {
        41
    }
}

impl Sink for SinkImpl {
    async fn len(&self, data: String) -> u64 {
        data.len() as u64
    }
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    match role.as_str() {
        // B: serves `Callee` (which calls back into its caller) and takes raw messages on "sink".
        "callee" => {
            let team = Team::builder().runtime_dir(&dir).start().unwrap();
            let _serving =
                CalleeServer::serve(&team, "callee", CalleeImpl { team: team.clone(), back: Default::default() })
                    .unwrap();
            let sink = team.open_named_raw_port("sink").unwrap();
            common::say("ready");
            while let Ok(m) = sink.recv_blocking() {
                common::say(format!("got {}", m.payload().len()));
            }
        }
        // A: a task has B bind A's `Back`, calls B's `hello` (B calls back
        // `Back::ping`) and, with that call under way, streams 8 MiB to B.
        "caller" => {
            let team = Team::builder().runtime_dir(&dir).start().unwrap();
            let back = ServiceEndpoint::open_unnamed(&team, BackClient::descriptor()).unwrap();
            let back_id = back.id();
            let _serving = back.serve(Arc::new(BackServer::new(BackImpl)));
            let (callee, sink) = (team.lookup("callee").unwrap(), team.lookup("sink").unwrap());
            let t = team.clone();
            let (done, outcome) = std::sync::mpsc::channel();
            drop(team.spawn(async move {
                let callee = CalleeClient::connect(&t, callee).await.unwrap();
                // B's call back must come on this same channel: give B's bind
                // thread time to record it as A's, or B could race it and
                // bind a second channel (defect 2).
                t.sleep(Duration::from_millis(100)).await;
                assert!(callee.meet(back_id).await.unwrap(), "B could not bind A's Back service");
                let hello = callee.hello();
                let streamed = t.raw_sender(sink).send_async(&vec![7u8; 8 * MIB], Checkpoint::OnReceipt).await;
                let _ = done.send(format!("{:?} {:?}", hello.await, streamed));
            }));
            // Judged here, so a stuck team cannot keep the verdict from the parent.
            match outcome.recv_timeout(Duration::from_secs(15)) {
                Ok(r) => common::say(format!("done {r}")),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => common::say("stuck"),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => common::say("the task failed"),
            }
            // Not dropping the team: leaving a stuck team could hang.
            std::process::exit(0);
        }
        // Receives nothing and never drives its channels (no processor, no blocking call).
        "idle-receiver" => {
            let team = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
            let _port = team.open_named_raw_port("idle").unwrap();
            common::say("ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        "silent-channel" => silent_channel(std::path::Path::new(&dir)),
        other => panic!("unknown role {other}"),
    }
}

/// Defect 7: a task of A streams 8 MiB to B; B, handling a call of A's made
/// just before, calls back into A (no deadline). A's processor, waiting for
/// ring space in the middle of the stream, takes B's call and runs its
/// handler, whose reply must go out on the channel the stream holds: it
/// waits for a stream that cannot go on until it returns. Stuck for good
/// (seen in gdb: `send_message` → `Idle::step` → `run_direct` → handler →
/// `reply` → `push_frame` waiting behind `streaming`).
#[test]
fn a_call_back_during_a_large_send_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = Child::spawn("callee", dir.path());
    b.expect("ready", START);
    let mut a = Child::spawn("caller", dir.path());
    let verdict = a.expect("", Duration::from_secs(30));
    assert_eq!(verdict, "done Ok(42) Ok([])", "A's call back and large send did not both finish");
    assert_eq!(b.expect("got", START), (8 * MIB).to_string());
}

/// Defect 7, second case: an `Immediate` send of a message larger than a
/// frame to a receiver that does not drain never waits: it is buffered out
/// of band while there is room, and fails with `WouldBlock` once there is
/// none (it used to send the first piece and wait, with no deadline, for
/// room for the next ones for as long as the receiver slept).
#[test]
fn an_immediate_large_send_never_waits() {
    let dir = tempfile::tempdir().unwrap();
    let mut rx = Child::spawn("idle-receiver", dir.path());
    rx.expect("ready", START);
    // A small payload area (it follows the sender's largest message) fills after a few sends.
    let me = Team::builder().runtime_dir(dir.path()).max_message(8 * MIB).start().unwrap();
    let to = me.raw_sender(me.lookup("idle").unwrap());
    let r = within(Duration::from_secs(5), "Immediate sends of 1 MiB until WouldBlock", move || {
        for sent in 0..64 {
            let t0 = Instant::now();
            let r = to.send(&vec![1u8; MIB], Checkpoint::Immediate);
            assert!(t0.elapsed() < Duration::from_secs(1), "an Immediate send took {:?}", t0.elapsed());
            if let Err(e) = r {
                return (sent, Err(e));
            }
        }
        (64, Ok(Vec::<u8>::new()))
    });
    assert!(matches!(r, (1..=8, Err(Error::WouldBlock { .. }))), "want WouldBlock after a few sends, got {r:?}");
}

/// Two teams of this process, default settings: the sender's messages go
/// over shared memory, in pieces.
fn two_teams(dir: &std::path::Path) -> (Team, Team) {
    (Team::builder().runtime_dir(dir).start().unwrap(), Team::builder().runtime_dir(dir).start().unwrap())
}

/// A typed port message of `len` bytes of user data (a `String`) goes
/// through; the receiver answers its length.
fn typed_message_of(len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = two_teams(dir.path());
    let port = rx.open_port::<String>().unwrap();
    let to = tx.sender::<String>(port.id());
    let receiver = std::thread::spawn(move || {
        let m = port.recv_blocking().unwrap();
        let n = m.value.len() as u64;
        m.reply(&n).unwrap();
    });
    let t0 = Instant::now();
    let r = to.call::<u64>(&"z".repeat(len));
    eprintln!("{len} bytes as a typed message: {:?} in {:?}", r, t0.elapsed());
    assert_eq!(r.unwrap(), len as u64);
    receiver.join().unwrap();
}

/// An RPC argument of `len` bytes of user data goes through.
fn rpc_argument_of(len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = two_teams(dir.path());
    let _serving = SinkServer::serve(&server, "sink", SinkImpl).unwrap();
    let sink = SinkClient::bind(&client, "sink").unwrap();
    let t0 = Instant::now();
    let r = sink.len_blocking("z".repeat(len));
    eprintln!("{len} bytes as an RPC argument: {:?} in {:?}", r, t0.elapsed());
    assert_eq!(r.unwrap(), len as u64);
}

/// Defect 8: the 64 MiB maximum is applied to the encoded message, so
/// exactly 64 MiB of user data is refused (`TooLarge { len: 67108869 }`
/// for a `String`, 67108875 as an RPC argument).
#[test]
fn a_typed_message_of_64_mib_goes_through() {
    typed_message_of(64 * MIB);
}

#[test]
fn an_rpc_argument_of_64_mib_goes_through() {
    rpc_argument_of(64 * MIB);
}

/// Defect 8: 1 GiB is refused with the default settings. (Each took 13-15 s
/// in a debug build when today's core was given a larger `max_message`.)
#[test]
fn a_typed_message_of_1_gib_goes_through() {
    typed_message_of(1024 * MIB);
}

#[test]
fn an_rpc_argument_of_1_gib_goes_through() {
    rpc_argument_of(1024 * MIB);
}

/// Bytes of shared memory the channel segments this process holds have
/// allocated (each memfd once: both teams of a channel hold it).
fn channel_memory() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut bytes = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if !target.to_string_lossy().contains("ferry-channel") {
            continue;
        }
        let Ok(m) = std::fs::metadata(entry.path()) else { continue };
        if seen.insert((m.dev(), m.ino())) {
            bytes += m.blocks() * 512;
        }
    }
    bytes
}

/// Soak finding (docs/RELIABILITY.md): a payload area kept every page a
/// large message had touched (up to 64 MiB each way), so a channel's
/// memory grew like a high-water mark. Now a channel that falls silent
/// gives what lies above its warm part (1 MiB each way) back within a few
/// seconds, its team's reactor doing it with no further message.
///
/// Measured in a child process of its own: [`channel_memory`] counts every
/// channel of its process, and the other tests of this file, run beside it,
/// hold channels with up to 1 GiB in flight (a CI failure).
#[test]
fn a_channel_that_falls_silent_gives_its_large_messages_pages_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("silent-channel", dir.path());
    let line = child.expect("memory", Duration::from_secs(60));
    let [before, grown, now]: [u64; 3] = line
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("the child said {line:?}"));
    eprintln!("channel memory: {before} bytes before, {grown} with 24 MiB in flight, {now} once silent");
    assert!(grown >= before + 24 * MIB as u64, "{before} -> {grown} bytes");
    assert!(now <= before + 2 * MIB as u64, "still {now} bytes (was {before} before the large messages)");
}

/// The child's part of the test above: says `memory BEFORE GROWN NOW`.
fn silent_channel(dir: &std::path::Path) {
    let (tx, rx) = two_teams(dir);
    let port = rx.open_raw_port().unwrap();
    let to = tx.raw_sender(port.id()).with_timeout(START);
    to.send(b"hello", Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_blocking().unwrap().payload(), b"hello");
    let before = channel_memory();
    // Three 8 MiB messages in flight at once: 24 MiB of the area touched.
    for i in 0..3u8 {
        to.send(&vec![i; 8 * MIB], Checkpoint::Immediate).unwrap();
    }
    let got: Vec<_> = (0..3).map(|_| port.recv_blocking().unwrap()).collect();
    let grown = channel_memory();
    for (i, m) in got.iter().enumerate() {
        assert!(m.payload() == vec![i as u8; 8 * MIB], "message {i} is not what was sent");
    }
    drop(got);
    let until = Instant::now() + Duration::from_secs(10);
    let mut now = channel_memory();
    while now > before + 2 * MIB as u64 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        now = channel_memory();
    }
    common::say(format!("memory {before} {grown} {now}"));
}
