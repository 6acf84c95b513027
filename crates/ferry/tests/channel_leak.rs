//! A server must reclaim every channel of clients that come and go, however
//! quickly they leave. Alone in its binary: it counts this process's
//! descriptors and mappings, which other tests running alongside would move.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};

use common::Child;
use ferry::Team;
use std::time::{Duration, Instant};

/// How each client leaves once it made its one call.
const ENDINGS: [&str; 4] = ["rpc-return", "rpc-exit", "port-return", "port-sigkill"];

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    match role.as_str() {
        // Calls, then leaves cleanly (the team is dropped).
        "rpc-return" => {
            let calc = CalcClient::bind(&team, "calc").unwrap();
            assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
        }
        // Calls, then exits at once: no destructor runs, the kernel closes everything.
        "rpc-exit" => {
            let calc = CalcClient::bind(&team, "calc").unwrap();
            assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
            std::process::exit(0);
        }
        "port-return" => {
            let echo = team.connect::<u32>("echo").unwrap();
            assert_eq!(echo.call::<u32>(&7).unwrap(), 7);
        }
        // Sends one message and dies on the spot, as close to its bind as it can.
        "port-sigkill" => {
            let echo = team.connect::<u32>("echo").unwrap();
            echo.send(&7, ferry::Checkpoint::Immediate).unwrap();
            // SAFETY: kill(2) on this very process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        other => panic!("unknown role {other}"),
    }
}

/// What the server holds: open descriptors and shared-memory mappings.
fn holdings() -> (usize, usize) {
    (common::fd_count(), common::shared_mappings().len())
}

/// Defect 2: `add_channel` publishes a newly accepted channel before it
/// records it as the peer's channel; a client that leaves in between has
/// its channel finished (and forgotten) first, then recorded for good: its
/// socket, ring memory and doorbell stay with the server.
///
/// ~100 short-lived clients per round, four at a time, ending in every way
/// (returning, exiting without destructors, SIGKILLing themselves, killed by
/// the parent at a random moment). After each round the server's holdings
/// must come back to what they were before. The race is narrow (a few
/// clients in a hundred), so the test runs several rounds.
#[test]
fn short_lived_clients_leave_nothing_at_the_server() {
    const ROUNDS: usize = 5;
    const CLIENTS: usize = 100;
    const AT_ONCE: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let server = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let _calc = CalcServer::serve(&server, "calc", CalcImpl).unwrap();
    let echo = server.open_named_port::<u32>("echo").unwrap();
    let echoes = std::thread::spawn(move || {
        while let Ok(m) = echo.recv_blocking() {
            let v = m.value;
            let _ = m.reply(&v);
        }
    });
    // A first client makes whatever the server creates once (threads, buffers).
    {
        let mut c = Child::spawn("rpc-return", dir.path());
        assert!(c.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    }
    let settle = |want: (usize, usize)| common::eventually(Duration::from_secs(10), || holdings() == want);
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(100));
        let baseline = holdings();
        let t0 = Instant::now();
        let mut running: Vec<Child> = Vec::new();
        for i in 0..CLIENTS {
            while running.len() >= AT_ONCE {
                running.retain_mut(|c| c.proc.try_wait().unwrap().is_none());
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut c = Child::spawn(ENDINGS[i % ENDINGS.len()], dir.path());
            if i % 5 == 4 {
                // Killed from outside at a random moment of its short life.
                std::thread::sleep(Duration::from_millis(random(30)));
                c.kill();
            }
            running.push(c);
        }
        for mut c in running {
            assert!(c.wait_exit(Duration::from_secs(20)).is_some(), "a client did not exit");
        }
        let settled = settle(baseline);
        let now = holdings();
        eprintln!("round {round}: {CLIENTS} clients in {:?}; holdings {baseline:?} -> {now:?}", t0.elapsed());
        assert!(
            settled,
            "round {round}: the server kept {} descriptors and {} shared mappings of clients that left",
            now.0 as isize - baseline.0 as isize,
            now.1 as isize - baseline.1 as isize
        );
    }
    server.shutdown();
    echoes.join().unwrap();
}
