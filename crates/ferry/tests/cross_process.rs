//! Ports between real processes: the test binary re-runs itself as the
//! child (`child_entry`, selected by `FERRY_TEST_CHILD`), so both sides are
//! separate teams talking over shared memory.

use ferry::rpc::RpcError;
use ferry::{Checkpoint, Error, Team};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "FERRY_TEST_CHILD";

#[ferry::service]
pub trait Echo {
    async fn echo(&self, text: String) -> String;
    /// Never answers (the test kills the server meanwhile).
    async fn hang(&self);
}

struct EchoImpl;

impl Echo for EchoImpl {
    async fn echo(&self, text: String) -> String {
        text
    }
    async fn hang(&self) {
        println!("ferry-child: holding");
        std::future::pending::<()>().await
    }
}

/// The child side. Ignored in normal runs; the parent runs it explicitly.
#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).spin(Duration::from_micros(20)).start().unwrap();
    match role.as_str() {
        // Replies "re:<msg>" to calls; exits on "quit".
        "echo" => {
            let port = team.open_named_port::<String>("echo").unwrap();
            println!("ferry-child: ready");
            loop {
                let m = port.recv_blocking().unwrap();
                let v = m.value.clone();
                if m.wants_reply() {
                    m.reply(&format!("re:{v}")).unwrap();
                }
                if v == "quit" {
                    break;
                }
            }
        }
        // Takes one call and never answers: the parent kills it meanwhile.
        "hold" => {
            let port = team.open_named_port::<String>("hold").unwrap();
            println!("ferry-child: ready");
            let m = port.recv_blocking().unwrap();
            println!("ferry-child: holding");
            std::thread::sleep(Duration::from_secs(60));
            drop(m);
        }
        // Sends 1000 numbered messages, alternating checkpoints, to the parent's port.
        "sender" => {
            let to = team.connect::<u64>("sink").unwrap();
            for i in 0..1000u64 {
                let cp = if i % 2 == 0 { Checkpoint::OnReceipt } else { Checkpoint::Immediate };
                loop {
                    match to.send(&i, cp) {
                        Err(Error::WouldBlock { .. }) => std::thread::yield_now(),
                        r => break r.unwrap(),
                    }
                }
            }
            to.send(&u64::MAX, Checkpoint::OnDelivery).unwrap();
        }
        // Serves Echo until killed.
        "rpc" => {
            let _serving = EchoServer::serve(&team, "echo-svc", EchoImpl).unwrap();
            println!("ferry-child: ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
    team.shutdown();
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(role: &str, dir: &Path) -> (ChildGuard, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("FERRY_RUNTIME_DIR", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (ChildGuard(child), out)
}

/// Reads the child's stdout until a `ferry-child: <what>` line (with a deadline).
fn wait_for(out: &mut BufReader<std::process::ChildStdout>, what: &str) {
    let want = format!("ferry-child: {what}");
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited before saying {what:?}");
        if line.trim_end().ends_with(&want) {
            return;
        }
    }
}

fn shm_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Every file a team made is gone: the runtime dir has only its empty
/// folders. A survivor sweeps a dead peer's files within a bounded time.
fn assert_no_leaks(dir: &Path, shm_before: &[String]) {
    let left = || -> Vec<_> {
        ["teams", "names"]
            .iter()
            .flat_map(|sub| std::fs::read_dir(dir.join(sub)).unwrap().map(|e| e.unwrap().file_name()))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(left().is_empty(), "left in the runtime dir: {:?}", left());
    assert_eq!(shm_entries(), shm_before, "/dev/shm changed");
}

fn team(dir: &Path) -> Team {
    Team::builder().runtime_dir(dir).spin(Duration::from_micros(20)).start().unwrap()
}

#[test]
fn ports_across_processes_every_checkpoint() {
    let shm_before = shm_entries();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut out) = spawn_child("echo", dir.path());
    wait_for(&mut out, "ready");
    let me = team(dir.path());
    let echo = me.connect::<String>("echo").unwrap();
    echo.send(&"a".into(), Checkpoint::Immediate).unwrap();
    echo.send(&"b".into(), Checkpoint::OnReceipt).unwrap();
    echo.send(&"c".into(), Checkpoint::OnDelivery).unwrap();
    assert_eq!(echo.call::<String>(&"d".into()).unwrap(), "re:d");
    // Larger than a ring: goes in pieces.
    let big = "x".repeat(3 << 20);
    assert_eq!(echo.call::<String>(&big).unwrap(), format!("re:{big}"));
    // Many calls in flight at once from tasks.
    let calls: Vec<_> = (0..100).map(|i| echo.call_async::<String>(&i.to_string())).collect();
    for (i, c) in calls.into_iter().enumerate() {
        assert_eq!(me.block_on(c).unwrap(), format!("re:{i}"));
    }
    assert_eq!(echo.call::<String>(&"quit".into()).unwrap(), "re:quit");
    assert!(child.0.wait().unwrap().success());
    me.shutdown();
    assert_no_leaks(dir.path(), &shm_before);
}

#[test]
fn messages_from_another_process_arrive_in_order_exactly_once() {
    let shm_before = shm_entries();
    let dir = tempfile::tempdir().unwrap();
    let me = Team::builder().runtime_dir(dir.path()).inbox_capacity(16).ring_bytes(4096).start().unwrap();
    let sink = me.open_named_port::<u64>("sink").unwrap();
    let (mut child, _out) = spawn_child("sender", dir.path());
    for i in 0..1000u64 {
        assert_eq!(sink.recv_timeout(Duration::from_secs(20)).unwrap().value, i);
    }
    assert_eq!(sink.recv_timeout(Duration::from_secs(20)).unwrap().value, u64::MAX);
    assert!(child.0.wait().unwrap().success());
    drop(sink);
    me.shutdown();
    assert_no_leaks(dir.path(), &shm_before);
}

fn killed_peer_fails_the_waiting_call(me: Team) {
    let dir = me.names().dir().path().to_path_buf();
    let (mut child, mut out) = spawn_child("hold", &dir);
    wait_for(&mut out, "ready");
    let hold = me.connect::<String>("hold").unwrap();
    let call = hold.call_async::<String>(&"wait for me".into());
    let waiter = {
        let me = me.clone();
        std::thread::spawn(move || {
            let r = me.block_on(call);
            (r, Instant::now())
        })
    };
    wait_for(&mut out, "holding");
    let killed_at = Instant::now();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let (r, failed_at) = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::PeerGone { .. })), "got {r:?}");
    let took = failed_at.saturating_duration_since(killed_at);
    assert!(took < Duration::from_secs(1), "PeerGone took {took:?}");
    // The survivor reclaimed the channel and swept the dead team's files...
    let deadline = Instant::now() + Duration::from_secs(5);
    while me.lookup("hold").is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(me.lookup("hold"), Err(Error::NameNotFound(_))));
    // ...and a new send to the dead team fails at once.
    assert!(hold.send(&"late".into(), Checkpoint::OnReceipt).is_err());
}

#[test]
fn sigkill_of_peer_fails_waiter_with_peer_gone_spinning() {
    let shm_before = shm_entries();
    let dir = tempfile::tempdir().unwrap();
    killed_peer_fails_the_waiting_call(team(dir.path()));
    assert_no_leaks(dir.path(), &shm_before);
}

#[test]
fn sigkill_of_peer_fails_waiter_with_peer_gone_parked() {
    let shm_before = shm_entries();
    let dir = tempfile::tempdir().unwrap();
    let me = Team::builder().runtime_dir(dir.path()).blocking().park_timeout(Duration::from_secs(10)).start().unwrap();
    killed_peer_fails_the_waiting_call(me);
    assert_no_leaks(dir.path(), &shm_before);
}

#[test]
fn rpc_across_processes_and_server_death() {
    let shm_before = shm_entries();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut out) = spawn_child("rpc", dir.path());
    wait_for(&mut out, "ready");
    let me = team(dir.path());
    let echo = EchoClient::bind(&me, "echo-svc").unwrap();
    assert_eq!(echo.echo_blocking("over shared memory".into()).unwrap(), "over shared memory");
    let big = "y".repeat(1 << 20);
    assert_eq!(echo.echo_blocking(big.clone()).unwrap(), big);
    let hanging = echo.hang();
    wait_for(&mut out, "holding");
    let killed_at = Instant::now();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    match hanging.wait() {
        Err(RpcError::PeerGone { .. }) => {}
        other => panic!("want PeerGone, got {other:?}"),
    }
    assert!(killed_at.elapsed() < Duration::from_secs(1), "PeerGone took {:?}", killed_at.elapsed());
    assert!(echo.echo_blocking("anyone?".into()).is_err());
    me.shutdown();
    assert_no_leaks(dir.path(), &shm_before);
}
