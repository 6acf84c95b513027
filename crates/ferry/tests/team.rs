//! A team's life: who keeps it alive, how it leaves, across real processes
//! where the question is what a process leaves behind.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};

use common::Child;
use ferry::Team;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(20);

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    match role.as_str() {
        // The README's server, as a `main` would write it: the role returns
        // with `_serving` and `team` still in scope.
        "readme-server" => readme_server().unwrap(),
        "stuck-handler" => stuck_handler().unwrap(),
        "stuck-task" => stuck_task().unwrap(),
        "late-server" => late_server().unwrap(),
        other => panic!("unknown role {other}"),
    }
}

fn readme_server() -> ferry::Result<()> {
    let team = Team::start()?;
    let _serving = CalcServer::serve(&team, "calc", CalcImpl)?;
    common::say("ready");
    common::hear();
    Ok(())
}

/// Files in the runtime dir that belong to team number `team` (the first
/// team of a process is numbered by its pid), and names bound to it.
fn files_of(dir: &Path, team: u32) -> Vec<String> {
    let prefix = format!("teams/{team}.");
    let mut left: Vec<String> = common::runtime_files(dir).into_iter().filter(|f| f.starts_with(&prefix)).collect();
    for f in common::runtime_files(dir).into_iter().filter(|f| f.starts_with("names/")) {
        let entry = std::fs::read_to_string(dir.join(&f)).unwrap_or_default();
        if entry.trim().parse::<ferry::EndpointId>().is_ok_and(|ep| ep.team() == team) {
            left.push(f);
        }
    }
    left
}

/// Defect 10: a server written as the README shows (`let _serving =
/// CalcServer::serve(&team, ...)`, then the end of `main`) left its files
/// behind: its serving task, merely aborted, still held a `Team`, so
/// dropping the user's `Team` ran no shutdown before the process exited.
#[test]
fn readme_server_leaves_no_files_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let client_team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    for run in 0..10 {
        let mut child = Child::spawn("readme-server", dir.path());
        child.expect("ready", START);
        // A served call first, so the server has a channel and a handler ran.
        let calc = CalcClient::bind(&client_team, "calc").unwrap();
        assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
        drop(calc);
        child.tell("quit");
        let status = child.wait_exit(Duration::from_secs(10)).expect("the server did not exit");
        assert!(status.success(), "run {run}: server exited with {status}");
        let left = files_of(dir.path(), child.pid());
        assert!(left.is_empty(), "run {run}: the server left {left:?}");
    }
}

/// An aborted task that holds a `Team` clone does not keep the team alive:
/// its future is dropped at the abort, not whenever a processor next runs
/// it (with no processors, never).
#[test]
fn an_aborted_task_does_not_keep_its_team_alive() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let me = team.id().team;
    let held = team.clone();
    let task = team.spawn(async move {
        let port = held.open_raw_port().unwrap();
        let _ = port.recv().await;
    });
    // Polled once: it now waits, its waker in the port's inbox.
    team.block_on(team.sleep(Duration::from_millis(5)));
    task.abort();
    drop(team);
    assert_eq!(files_of(dir.path(), me), Vec::<String>::new(), "the team did not leave");
}

#[ferry::service]
pub trait Stall {
    /// Never returns: blocks its processor for an hour.
    async fn stall(&self);
}

static STALLED: AtomicBool = AtomicBool::new(false);

struct Staller;

impl Stall for Staller {
    async fn stall(&self) {
        STALLED.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A server whose only processor is stuck in a handler, returning from `main`.
fn stuck_handler() -> ferry::Result<()> {
    let team = Team::start()?;
    let _serving = StallServer::serve(&team, "stall", Staller)?;
    common::say("ready");
    while !STALLED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    common::say("stalled");
    Ok(())
}

/// A team whose only processor is stuck in a task, returning from `main`.
fn stuck_task() -> ferry::Result<()> {
    let team = Team::start()?;
    drop(team.spawn(async {
        STALLED.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(3600));
    }));
    while !STALLED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    common::say("stalled");
    Ok(())
}

/// Defect 9: shutdown joined every processor, so a handler (or a task)
/// that never returns hung the drop of the `Team`, and the process with it.
/// Shutdown now waits a bounded time for its threads, then leaves them.
#[test]
fn shutdown_with_a_processor_stuck_in_a_handler_returns() {
    let dir = tempfile::tempdir().unwrap();
    let client_team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut child = Child::spawn("stuck-handler", dir.path());
    child.expect("ready", START);
    let stall = StallClient::bind(&client_team, "stall").unwrap();
    let _pending = stall.stall();
    exits_promptly(&mut child, dir.path());
}

/// Defect 9, with a spawned task that blocks its processor.
#[test]
fn shutdown_with_a_processor_stuck_in_a_task_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("stuck-task", dir.path());
    exits_promptly(&mut child, dir.path());
}

/// The child says "stalled" and returns from its role: its process must
/// end within 5 s, its team's files removed.
fn exits_promptly(child: &mut Child, dir: &Path) {
    child.expect("stalled", START);
    let status = child.wait_exit(Duration::from_secs(5)).expect("the process did not exit within 5 s of returning");
    assert!(status.success(), "the process exited with {status}");
    assert_eq!(files_of(dir, child.pid()), Vec::<String>::new());
}

#[ferry::service]
pub trait Files {
    /// Blocks 300 ms (think: a slow file read) on a blocking thread.
    async fn read_slowly(&self) -> u32;
    async fn ping(&self) -> u32;
}

struct FilesImpl {
    team: Team,
}

impl Files for FilesImpl {
    async fn read_slowly(&self) -> u32 {
        let read = || {
            std::thread::sleep(Duration::from_millis(300));
            42
        };
        self.team.spawn_blocking(read).await.unwrap()
    }
    async fn ping(&self) -> u32 {
        7
    }
}

/// A handler that must block hands the blocking part to `spawn_blocking`:
/// while it waits, the team's only processor answers other calls at once
/// (blocking in the handler itself delays them by the whole 300 ms).
#[test]
fn a_handler_waiting_on_spawn_blocking_leaves_its_processor_free() {
    let dir = tempfile::tempdir().unwrap();
    let server = Team::builder().runtime_dir(dir.path()).processors(1).start().unwrap();
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let _serving = FilesServer::serve(&server, "files", FilesImpl { team: server.clone() }).unwrap();
    let files = FilesClient::bind(&client, "files").unwrap();
    assert_eq!(files.ping_blocking().unwrap(), 7);
    // Best of three: a loaded machine may delay one ping; a stalled processor delays every one.
    let mut took = Vec::new();
    for _ in 0..3 {
        let slow = files.read_slowly();
        // Let the handler start and hand its read over.
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        assert_eq!(files.ping_blocking().unwrap(), 7);
        took.push(t0.elapsed());
        assert_eq!(slow.wait().unwrap(), 42);
        if took.last().unwrap() < &Duration::from_millis(50) {
            break;
        }
    }
    let best = *took.iter().min().unwrap();
    assert!(best < Duration::from_millis(50), "ping answered after {took:?} while a handler waited on a blocking job");
}

/// Registers "late-calc" 200 ms after the parent says "go".
fn late_server() -> ferry::Result<()> {
    let team = Team::start()?;
    common::say("started");
    common::hear();
    std::thread::sleep(Duration::from_millis(200));
    let _serving = CalcServer::serve(&team, "late-calc", CalcImpl)?;
    common::say("registered");
    common::hear();
    Ok(())
}

/// Starts `late-server` and has it register 200 ms after this lookup failed.
fn late_server_after_a_failed_lookup(team: &Team, dir: &Path) -> Child {
    let mut child = Child::spawn("late-server", dir);
    child.expect("started", START);
    let r = team.lookup("late-calc");
    assert!(matches!(r, Err(ferry::Error::NameNotFound(_))), "{r:?}");
    child.tell("go");
    child
}

/// A process started before the one that registers a name waits for it:
/// the parent looks first, the child registers 200 ms later, the wait
/// finds it (a plain lookup fails: `NameNotFound`).
#[test]
fn lookup_wait_finds_a_name_another_process_registers_later() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut child = late_server_after_a_failed_lookup(&team, dir.path());
    let calc = CalcClient::bind_wait(&team, "late-calc", START).unwrap();
    assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
    child.tell("quit");
}

/// The same from async code (here tokio), which must not block its worker.
#[test]
fn lookup_async_finds_a_name_another_process_registers_later() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut child = late_server_after_a_failed_lookup(&team, dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let sum = rt.block_on(async {
        // Another task of this one worker thread runs meanwhile.
        let ticks = tokio::spawn(async {
            let mut n = 0u32;
            while n < 5 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                n += 1;
            }
            n
        });
        let ep = team.lookup_async("late-calc", START).await.unwrap();
        let calc = CalcClient::connect(&team, ep).await.unwrap();
        assert!(ticks.is_finished(), "the worker was blocked while the lookup waited");
        calc.add(2, 3).await.unwrap()
    });
    assert_eq!(sum, 5);
    child.tell("quit");
}

/// A name that never comes: `NameNotFound` once the limit passes; a team
/// that leaves meanwhile ends the wait with `Shutdown`.
#[test]
fn lookup_wait_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let t0 = Instant::now();
    let r = team.lookup_wait("never", Duration::from_millis(100));
    assert!(matches!(&r, Err(ferry::Error::NameNotFound(n)) if n == "never"), "{r:?}");
    assert!(t0.elapsed() >= Duration::from_millis(100) && t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let leaving = team.clone();
    let r = common::within(Duration::from_secs(5), "a wait on a team that left", move || {
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            leaving.shutdown();
        });
        let r = team.lookup_wait("never", Duration::from_secs(3600));
        t.join().unwrap();
        r
    });
    assert!(matches!(r, Err(ferry::Error::Shutdown)), "{r:?}");
}
