//! Leaving: an explicit `shutdown` is bounded in time even when user code
//! on a processor never returns, and takes the team's names with it. Runs
//! in a child process, timed and inspected from outside. (Leaving by
//! dropping the last `Team`, and the README's server, are in `team.rs`.)

mod common;

use common::Child;
use ferry::{Error, Team};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(20);
/// How long leaving may take.
const LEAVE: Duration = Duration::from_secs(5);

#[ferry::service]
pub trait Stuck {
    /// Blocks its thread for an hour (tells the test when it started).
    async fn forever(&self);
}

struct StuckImpl(Mutex<Sender<()>>);

impl Stuck for StuckImpl {
    async fn forever(&self) {
        let _ = self.0.lock().unwrap().send(());
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    match role.as_str() {
        // A server whose handler blocks its processor for good; then the team shuts down.
        "stuck-handler" => {
            let team = Team::builder().runtime_dir(&dir).start().unwrap();
            let (entered, handler_runs) = channel();
            let serving = StuckServer::serve(&team, "stuck", StuckImpl(Mutex::new(entered))).unwrap();
            let client = Team::builder().runtime_dir(&dir).start().unwrap();
            let stuck = StuckClient::bind(&client, "stuck").unwrap();
            let _call = stuck.forever();
            handler_runs.recv_timeout(START).expect("the handler never ran");
            common::say("leaving");
            let t0 = Instant::now();
            team.shutdown();
            common::say(format!("left after {:?}", t0.elapsed()));
            drop(serving);
            // The server's name went with it.
            let gone = matches!(client.lookup("stuck"), Err(Error::NameNotFound(_)));
            common::say(format!("name gone: {gone}"));
            // The client team and its call are left to the exit.
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Defect 6: shutdown joins the team's processors, so one blocked for good
/// in a handler (here: `std::thread::sleep` of an hour, called from an
/// implicit-receipt handler) makes `shutdown` hang for good too.
#[test]
fn shutdown_is_bounded_while_a_handler_never_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("stuck-handler", dir.path());
    child.expect("leaving", START);
    let took = child.expect("left after", LEAVE);
    eprintln!("shutdown took {took}");
    assert_eq!(child.expect("name gone:", LEAVE), "true", "the team did not leave");
}
