//! What one peer's well-formed requests can make an RPC server hold. The
//! server runs in a process of its own, so that its peak memory (VmHWM)
//! is its own; the client crafts requests as a hostile peer would.

mod common;

use common::Child;
use ferry::rpc::{__private::decode_response, CancelToken, RpcError};
use ferry::{Checkpoint, Error, Limit, Team};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[ferry::service]
pub trait Hold {
    /// Does nothing (what the entries of a crafted batch call).
    async fn nothing(&self);
    /// Waits until the server is told to release its handlers.
    async fn wait(&self);
}

struct HoldImpl {
    release: CancelToken,
}

impl Hold for HoldImpl {
    async fn nothing(&self) {}
    async fn wait(&self) {
        self.release.cancelled().await
    }
}

/// The server's bound on running calls (`max_running_calls`) and its
/// inbox's byte bound, in the test of the first.
const RUNNING_BOUND: usize = 256;
const INBOX_BYTES: usize = 1 << 20;

/// The process's peak resident memory (VmHWM), in bytes.
fn vm_hwm() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The server: serves `Hold` as "hold" until its input ends, and answers
/// "hwm" with its VmHWM, "running" with the most calls it saw running at
/// once and now, and "release" by releasing every `wait`.
#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let builder = Team::builder();
    let team = match role.as_str() {
        "server" => builder.start().unwrap(),
        "bounded-server" => builder.max_running_calls(RUNNING_BOUND).inbox_bytes(INBOX_BYTES).start().unwrap(),
        other => panic!("unknown role {other}"),
    };
    let release = CancelToken::default();
    let serving = Arc::new(HoldServer::serve(&team, "hold", HoldImpl { release: release.clone() }).unwrap());
    // Watches the running-calls counter.
    let (most, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let watch = {
        let (serving, most, stop) = (serving.clone(), most.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(serving.running(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    common::say("serving");
    while let Some(line) = common::hear() {
        match line.as_str() {
            "hwm" => common::say(format!("hwm {}", vm_hwm())),
            "running" => common::say(format!("running {} {}", most.load(Ordering::Relaxed), serving.running())),
            "release" => release.cancel(),
            other => panic!("unknown command {other}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    watch.join().unwrap();
}

/// Asks the server for its VmHWM.
fn server_hwm(server: &mut Child) -> u64 {
    server.tell("hwm");
    server.expect("hwm", Duration::from_secs(10)).parse().unwrap()
}

/// Regression (issue 15, defect 4): a batch of 8-byte empty entries became
/// a vector of entries and then a call of ~300 bytes each: 64 MiB asked
/// for more than 2 GiB. Now a batch carries at most as many calls as its
/// size allows; past that it is refused, typed, before anything is made of it.
#[test]
fn a_batch_of_empty_entries_is_refused_within_twice_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Child::spawn("server", dir.path());
    server.expect("serving", Duration::from_secs(10));
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let to = client.raw_sender(client.lookup("hold").unwrap()).with_timeout(Duration::from_secs(60));
    // A request the server answers first: the channel is up, the server warm.
    let mut ping = vec![2u8]; // CALL, method 0, no arguments
    ping.extend_from_slice(&0u32.to_le_bytes());
    ping.push(0xc0); // MessagePack: no arguments (`()`, nil)
    decode_response::<(), ferry::rpc::Never>(&to.send(&ping, Checkpoint::OnReturn).unwrap()).unwrap();
    let before = server_hwm(&mut server);

    // BATCH, count, then that many entries (method 0, no arguments).
    let size = 64 * MIB as usize;
    let entries = (size - 5) / 8;
    let mut batch = vec![0u8; 5 + entries * 8];
    batch[0] = 3;
    batch[1..5].copy_from_slice(&(entries as u32).to_le_bytes());
    let reply = to.send(&batch, Checkpoint::OnReturn).unwrap();
    match decode_response::<(), ferry::rpc::Never>(&reply) {
        Err(RpcError::Ferry(Error::LimitReached { limit: Limit::BatchCalls, max })) => {
            assert!(max < entries as u64, "{max}")
        }
        other => panic!("want LimitReached(BatchCalls), got {other:?}"),
    }
    let grew = server_hwm(&mut server).saturating_sub(before);
    assert!(grew <= 2 * batch.len() as u64, "the server's VmHWM grew by {} MiB", grew / MIB);
    // The server still serves.
    decode_response::<(), ferry::rpc::Never>(&to.send(&ping, Checkpoint::OnReturn).unwrap()).unwrap();
}

/// Regression (review of issue 15, defect 4): a batch of any size could
/// carry calls costing up to 4 MiB and counted as one running call, so many
/// small batches whose first call waits made the server hold ~35 times what
/// was sent (1024 batches of 100 KB: ~4 GiB). Now a batch of n calls takes
/// n places (at most the bound) in the running-calls gate: the calls held
/// at once are at most the bound's, or one batch's.
#[test]
fn many_small_batches_that_wait_hold_within_twice_what_was_sent() {
    const BATCHES: usize = 100;
    /// ~100 KB each: `wait`, then `nothing`s (9 bytes an entry).
    const ENTRIES: usize = 11_000;
    /// The inbox (1 MiB), one batch's calls (4 MiB), the channel's hold
    /// queue and ring, the runtime's own.
    const ALLOWANCE: u64 = 32 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Child::spawn("bounded-server", dir.path());
    server.expect("serving", Duration::from_secs(10));
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let hold = HoldClient::bind(&client, "hold").unwrap();
    hold.nothing_blocking().unwrap();
    let to = client.raw_sender(client.lookup("hold").unwrap()).with_timeout(Duration::from_secs(120));
    let before = server_hwm(&mut server);

    // BATCH, count, then entries: method, args' length 1, `()` (nil).
    let mut batch = vec![3u8];
    batch.extend_from_slice(&(ENTRIES as u32).to_le_bytes());
    for i in 0..ENTRIES {
        batch.extend_from_slice(&u32::from(i == 0).to_le_bytes());
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.push(0xc0);
    }
    let sends: Vec<_> = (0..BATCHES).map(|_| to.send_async(&batch, Checkpoint::OnReturn)).collect();
    let sent = (BATCHES * batch.len()) as u64;
    // Every batch is in (each counted once without the fix), or the bound is reached.
    assert!(
        common::eventually(Duration::from_secs(30), || server_running(&mut server).1 >= BATCHES),
        "the server never ran the batches: {:?}",
        server_running(&mut server)
    );
    std::thread::sleep(Duration::from_millis(500));
    let grew = server_hwm(&mut server).saturating_sub(before);
    assert!(
        grew <= 2 * sent + ALLOWANCE,
        "the server's VmHWM grew by {} MiB holding batches of {} MiB that wait",
        grew / MIB,
        sent / MIB
    );
    server.tell("release");
    for (i, d) in sends.into_iter().enumerate() {
        let reply = client.block_on(d).unwrap_or_else(|e| panic!("batch {i}: {e}"));
        decode_response::<(), ferry::rpc::Never>(&reply).unwrap_or_else(|e| panic!("batch {i}: {e}"));
    }
    let (most, _) = server_running(&mut server);
    assert!(most <= RUNNING_BOUND, "the running-calls counter went past its bound: {most}");
    assert!(common::eventually(Duration::from_secs(5), || server_running(&mut server).1 == 0));
}

/// The most calls the server saw running at once, and those running now.
fn server_running(server: &mut Child) -> (usize, usize) {
    server.tell("running");
    let line = server.expect("running", Duration::from_secs(10));
    let mut n = line.split_whitespace().map(|v| v.parse().unwrap());
    (n.next().unwrap(), n.next().unwrap())
}

/// Regression (issue 15, defect 5): implicit receipt gave every call that
/// waits a task of its own, with no bound: a client could make a server
/// hold as many calls as it sent. Now at most `max_running_calls` run; the
/// rest wait in the inbox, whose bounds push back on the client, and run
/// once the running ones end.
#[test]
fn calls_past_the_running_bound_wait_in_the_inbox() {
    const CALLS: usize = 100_000;
    /// What the server may hold beyond its inbox: the channel's hold queue
    /// (1024 small messages), the running calls, the runtime's own.
    const ALLOWANCE: u64 = 32 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Child::spawn("bounded-server", dir.path());
    server.expect("serving", Duration::from_secs(10));
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let hold = HoldClient::bind(&client, "hold").unwrap().with_timeout(Duration::from_secs(120));
    hold.nothing_blocking().unwrap();
    let before = server_hwm(&mut server);

    let calls: Vec<_> = (0..CALLS).map(|_| hold.wait()).collect();
    // The server fills up to its bound, and stays there.
    assert!(
        common::eventually(Duration::from_secs(20), || server_running(&mut server).1 == RUNNING_BOUND),
        "the server never ran {RUNNING_BOUND} calls at once: {:?}",
        server_running(&mut server)
    );
    std::thread::sleep(Duration::from_millis(500));
    let grew = server_hwm(&mut server).saturating_sub(before);
    assert!(
        grew <= INBOX_BYTES as u64 + ALLOWANCE,
        "the server's VmHWM grew by {} MiB holding calls that wait",
        grew / MIB
    );
    server.tell("release");
    for (i, c) in calls.into_iter().enumerate() {
        c.wait().unwrap_or_else(|e| panic!("call {i}: {e}"));
    }
    let (most, now) = server_running(&mut server);
    assert_eq!(most, RUNNING_BOUND, "the running-calls counter went past its bound");
    assert!(common::eventually(Duration::from_secs(5), || server_running(&mut server).1 == 0), "{now} still running");
}

/// Regression (issue 15, defect 5): every repeat of a retryable call that
/// was still running waited for its reply, with no bound. Now at most 8
/// wait; an older one is refused when a newer comes.
#[test]
fn repeats_of_a_running_retryable_call_are_bounded() {
    const REPEATS: usize = 20;
    const KEPT: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let server = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let release = CancelToken::default();
    let serving = HoldServer::serve(&server, "hold", HoldImpl { release: release.clone() }).unwrap();
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let to = client.raw_sender(client.lookup("hold").unwrap()).with_timeout(Duration::from_secs(30));
    // CALL_ONCE, request id 7, method 1 (`wait`), no arguments: the same call each time.
    let mut request = vec![4u8];
    request.extend_from_slice(&7u64.to_le_bytes());
    request.extend_from_slice(&1u32.to_le_bytes());
    request.push(0xc0);
    let (refused, ok) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        let call = || match decode_response::<(), ferry::rpc::Never>(&to.send(&request, Checkpoint::OnReturn).unwrap())
        {
            Ok(()) => ok.fetch_add(1, Ordering::SeqCst),
            Err(RpcError::Refused(_)) => refused.fetch_add(1, Ordering::SeqCst),
            Err(e) => panic!("{e}"),
        };
        s.spawn(call);
        assert!(common::eventually(Duration::from_secs(10), || serving.running() == 1));
        for _ in 0..REPEATS {
            s.spawn(call);
        }
        let all_in = common::eventually(Duration::from_secs(10), || refused.load(Ordering::SeqCst) == REPEATS - KEPT);
        assert!(all_in, "{} repeats refused while the call ran", refused.load(Ordering::SeqCst));
        release.cancel();
    });
    assert_eq!(ok.load(Ordering::SeqCst), 1 + KEPT, "the call and the repeats kept get its reply");
    // The call's place is freed just after its reply went out.
    assert!(
        common::eventually(Duration::from_secs(5), || serving.running() == 0),
        "{} still running",
        serving.running()
    );
}

/// Regression (issue 15, defect 7): cancels that come before their call's
/// hook (the call still queued) were remembered in one FIFO of 1024 for
/// every channel. A peer whose cancels find no call (here: calls that
/// ended before their cancel came, 2,000 of them) pushed out another
/// peer's, whose queued call then ran on although cancelled.
#[test]
fn one_peers_cancels_do_not_evict_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let start = || Team::builder().runtime_dir(dir.path()).start().unwrap();
    let (server, x, y) = (start(), start(), start());
    let explicit = ferry::rpc::ServiceEndpoint::open_unnamed(&server, HoldClient::descriptor()).unwrap();
    let explicit_id = explicit.id();
    let release = CancelToken::default();
    let _serving = HoldServer::serve(&server, "hold", HoldImpl { release }).unwrap();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let acceptor = std::thread::spawn(move || {
        // Answers the bind, then takes the first call.
        explicit.accept_blocking().unwrap().reply_ok(&()).unwrap();
        go.recv().unwrap();
        let queued = explicit.accept_blocking().unwrap();
        assert_eq!(queued.method_name(), "wait");
        queued.cancel_token().unwrap().is_cancelled()
    });
    // X: a call queued at the explicit endpoint, cancelled there (its
    // cancel comes before anyone accepts it).
    let x_explicit = HoldClient::bind_to(&x, explicit_id).unwrap();
    x_explicit.nothing_blocking().unwrap();
    drop(x_explicit.wait());
    let x_hold = HoldClient::bind(&x, "hold").unwrap();
    x_hold.nothing_blocking().unwrap(); // behind the cancel on X's channel
                                        // Y: 2,000 cancels of calls that ended already.
    let y_hold = HoldClient::bind(&y, "hold").unwrap();
    for _ in 0..2000 {
        drop(y_hold.nothing());
    }
    y_hold.nothing_blocking().unwrap(); // behind Y's cancels
    go_tx.send(()).unwrap();
    assert!(acceptor.join().unwrap(), "X's call is no longer seen cancelled");
}

/// The client refuses to queue a batched call past what a batch may carry
/// (`LimitReached(BatchCalls)`, the call not queued), so that what it sends
/// the server takes: flushing the full batch runs all of it.
#[test]
fn a_client_refuses_batched_calls_past_the_bound_and_the_server_takes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let _serving = HoldServer::serve(&team, "hold", HoldImpl { release: CancelToken::default() }).unwrap();
    let hold = HoldClient::bind(&team, "hold").unwrap();
    let mut queued = 0;
    let max = loop {
        match hold.nothing_batched() {
            Ok(()) => queued += 1,
            Err(RpcError::Ferry(Error::LimitReached { limit: Limit::BatchCalls, max })) => break max,
            Err(e) => panic!("{e}"),
        }
        assert!(queued <= 70_000, "no bound");
    };
    // The flush that ends the batch is its last call.
    assert_eq!(queued + 1, max as usize);
    hold.flush().unwrap();
    hold.nothing_batched().unwrap();
    hold.nothing_blocking().unwrap();
}
