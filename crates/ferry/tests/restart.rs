//! Clients calling a server that restarts: whatever a client sees while the
//! server leaves and a new one takes its name must be a typed error, never
//! an operating-system error leaking out of a bind or a send.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};

use common::Child;
use ferry::rpc::RpcError;
use ferry::{Error, Team};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    match role.as_str() {
        // Serves "calc" (RPC) and "echo" (a port) until told to quit, then leaves cleanly.
        "server" => {
            let team = Team::builder().runtime_dir(&dir).start().unwrap();
            let serving = CalcServer::serve(&team, "calc", CalcImpl).unwrap();
            let echo = team.open_named_port::<u32>("echo").unwrap();
            let echoes = std::thread::spawn(move || {
                while let Ok(m) = echo.recv_blocking() {
                    let v = m.value;
                    let _ = m.reply(&v);
                }
            });
            common::say("ready");
            while common::hear().is_some_and(|l| l != "quit") {}
            drop(serving);
            team.shutdown();
            echoes.join().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
}

/// Whether a client may see `e` while its server restarts: the server
/// being gone, not there yet, or not answering in time are all typed.
fn typed(e: &Error) -> bool {
    matches!(
        e,
        Error::PeerGone { .. }
            | Error::NoSuchTeam(_)
            | Error::NameNotFound(_)
            | Error::NoSuchEndpoint(_)
            | Error::DeadlineExceeded
            | Error::Refused(_)
    )
}

fn typed_rpc(e: &RpcError) -> bool {
    match e {
        RpcError::PeerGone { .. } | RpcError::DeadlineExceeded | RpcError::Refused(_) => true,
        RpcError::Ferry(e) => typed(e),
        _ => false,
    }
}

/// What one client saw: successful calls, and every error by its text.
#[derive(Default)]
struct Seen {
    ok: u64,
    errors: BTreeMap<String, u64>,
    untyped: BTreeMap<String, u64>,
}

impl Seen {
    fn error(&mut self, text: String, typed: bool) {
        if typed {
            // Typed errors counted by kind (their team numbers differ every time).
            let text = text.replacen("Ferry(", "", 1);
            let kind = text.split(['(', '{']).next().unwrap_or_default().trim().to_string();
            *self.errors.entry(kind).or_default() += 1;
        } else {
            *self.untyped.entry(text).or_default() += 1;
        }
        // A moment before trying again: the next server may not be there yet.
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// An RPC client: binds by name, calls until an error, binds again.
fn rpc_client(team: Team, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut calc = None;
    while !stop.load(Ordering::Relaxed) {
        let c = match calc.take() {
            Some(c) => c,
            None => match CalcClient::bind(&team, "calc") {
                Ok(c) => c.with_timeout(Duration::from_secs(5)),
                Err(e) => {
                    seen.error(format!("bind: {e:?}"), typed_rpc(&e));
                    continue;
                }
            },
        };
        match c.add_blocking(2, 3) {
            Ok(5) => {
                seen.ok += 1;
                calc = Some(c);
            }
            Ok(v) => panic!("2 + 3 = {v}?"),
            Err(e) => seen.error(format!("call: {e:?}"), typed_rpc(&e)),
        }
    }
    seen
}

/// A port client: looks the name up, calls until an error, looks it up again.
fn port_client(team: Team, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut echo = None;
    while !stop.load(Ordering::Relaxed) {
        let to = match echo.take() {
            Some(to) => to,
            None => match team.connect::<u32>("echo") {
                Ok(to) => to.with_timeout(Duration::from_secs(5)),
                Err(e) => {
                    seen.error(format!("lookup: {e:?}"), typed(&e));
                    continue;
                }
            },
        };
        match to.call::<u32>(&9) {
            Ok(9) => {
                seen.ok += 1;
                echo = Some(to);
            }
            Ok(v) => panic!("echo of 9 is {v}?"),
            Err(e) => seen.error(format!("call: {e:?}"), typed(&e)),
        }
    }
    seen
}

/// Defect 3: a client racing a server's clean exit sees raw I/O errors:
/// `Io { context: "recvmsg", ConnectionReset }`, `Io { context: "sendmsg" }`
/// (EPIPE), `Io { context: "shared-memory bind" }`, from a bind handshake
/// with a team that is leaving.
///
/// Three clients (two RPC, one port, each its own team) call in a loop
/// while the server process restarts 20 times.
#[test]
fn clients_of_a_restarting_server_see_only_typed_errors() {
    const RESTARTS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done) = std::sync::mpsc::channel();
    let mut server = Child::spawn("server", dir.path());
    server.expect("ready", Duration::from_secs(20));
    for i in 0..3 {
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let (stop, done_tx) = (stop.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let seen = if i < 2 { rpc_client(team, stop) } else { port_client(team, stop) };
            let _ = done_tx.send(seen);
        });
    }
    let t0 = Instant::now();
    let mut lives = 0x9E37_79B9u64;
    for n in 0..RESTARTS {
        // Each server lives 20..200 ms; clients keep calling throughout.
        lives = lives.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(20 + (lives >> 33) % 180));
        server.tell("quit");
        let exited = server.wait_exit(Duration::from_secs(10));
        assert!(exited.is_some_and(|s| s.success()), "server {n} did not leave cleanly: {exited:?}");
        server = Child::spawn("server", dir.path());
        server.expect("ready", Duration::from_secs(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let mut all = Seen::default();
    for _ in 0..3 {
        // Every call has a 5 s deadline and a bind waits at most 10 s.
        let seen = done.recv_timeout(Duration::from_secs(30)).expect("a client hung");
        all.ok += seen.ok;
        for (k, v) in seen.errors {
            *all.errors.entry(k).or_default() += v;
        }
        for (k, v) in seen.untyped {
            *all.untyped.entry(k).or_default() += v;
        }
    }
    eprintln!("{RESTARTS} restarts in {:?}: {} calls answered; typed errors: {:#?}", t0.elapsed(), all.ok, all.errors);
    assert!(all.untyped.is_empty(), "untyped errors: {:#?}", all.untyped);
    assert!(all.ok > RESTARTS, "the clients hardly reached the servers ({} calls)", all.ok);
}
