//! Identity: an endpoint id kept after its team died must never reach a new
//! process that got the same pid. Alone in its binary: it steers the
//! kernel's next pid, which processes spawned alongside would take.

mod common;

use common::{within, Child};
use ferry::rpc::{RpcError, ServiceEndpoint};
use ferry::{Checkpoint, EndpointId, Error, Sender, Team};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const START: Duration = Duration::from_secs(20);
const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

#[ferry::service]
pub trait Old {
    async fn get(&self) -> u64;
}

/// Another service with the same shape at the same slot: a call meant for
/// `Old` that reached it would run and answer.
#[ferry::service]
pub trait New {
    async fn get(&self) -> u64;
}

struct OldImpl;
struct NewImpl(Arc<AtomicU64>);

impl Old for OldImpl {
    async fn get(&self) -> u64 {
        1
    }
}

impl New for NewImpl {
    async fn get(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst);
        2
    }
}

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    // The same two endpoints in the same order in both roles: a port, then a service.
    let port = team.open_named_port::<u64>(&format!("{role}-port")).unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let (svc, _serving) = match role.as_str() {
        "a" => {
            let ep = ServiceEndpoint::open(&team, "a-svc", OldClient::descriptor()).unwrap();
            (ep.id(), ep.serve(Arc::new(OldServer::new(OldImpl))))
        }
        "b" => {
            let ep = ServiceEndpoint::open(&team, "b-svc", NewClient::descriptor()).unwrap();
            (ep.id(), ep.serve(Arc::new(NewServer::new(NewImpl(calls.clone())))))
        }
        other => panic!("unknown role {other}"),
    };
    let port_id = port.id();
    let counter = received.clone();
    std::thread::spawn(move || {
        // Counts every message; OnReturn ones are dropped unanswered (the sender gets Refused).
        while port.recv_blocking().is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    common::say(format!("ready {port_id} {svc}"));
    while let Some(line) = common::hear() {
        if line == "report" {
            common::say(format!("report {} {}", received.load(Ordering::SeqCst), calls.load(Ordering::SeqCst)));
        }
    }
}

fn ids(line: &str) -> (EndpointId, EndpointId) {
    let mut it = line.split_whitespace().map(|s| s.parse::<EndpointId>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// Whether the kernel's next pid can be set here (root, writable `ns_last_pid`).
fn can_steer_pids() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    std::fs::OpenOptions::new().write(true).open(NS_LAST_PID).map(drop).map_err(|e| format!("{NS_LAST_PID}: {e}"))
}

/// Starts `role` as process number `pid`: sets the kernel's last pid just
/// before the spawn. Another process forking in between takes the number
/// first, so this retries; `None` if it never got it.
fn spawn_as_pid(pid: u32, role: &str, dir: &std::path::Path) -> Option<Child> {
    for _ in 0..50 {
        std::fs::write(NS_LAST_PID, (pid - 1).to_string()).unwrap();
        let child = Child::spawn(role, dir);
        if child.pid() == pid {
            return Some(child);
        }
        drop(child);
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// The errors a send to an endpoint of a dead team may give.
fn gone<T: std::fmt::Debug>(r: &ferry::Result<T>) -> bool {
    matches!(r, Err(Error::NoSuchTeam(_) | Error::PeerGone { .. } | Error::NoSuchEndpoint(_)))
}

fn rpc_gone<T: std::fmt::Debug>(r: &Result<T, RpcError>) -> bool {
    match r {
        Err(RpcError::PeerGone { .. }) => true,
        Err(RpcError::Ferry(e)) => {
            matches!(e, Error::NoSuchTeam(_) | Error::PeerGone { .. } | Error::NoSuchEndpoint(_))
        }
        _ => false,
    }
}

/// Every kind of send through `to` (bounded): each must fail as "gone";
/// what did not is added to `wrong`.
fn check_sends_fail(what: &str, to: &Sender<u64>, wrong: &mut Vec<String>) {
    for cp in [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn] {
        let s = to.clone().with_timeout(Duration::from_secs(2));
        let r = within(Duration::from_secs(10), what, move || s.send(&7, cp));
        if !gone(&r) {
            wrong.push(format!("{what}, {cp:?}: got {r:?}"));
        }
    }
}

/// Defect 5: team numbers are pids with no incarnation, so an endpoint id
/// of a dead process reaches whatever new process got its pid: a sender
/// used before the death rebinds to the newcomer, a sender made from the
/// old id binds to it, and an RPC client bound to the old service calls the
/// newcomer's service at the same slot.
///
/// A is killed; B is started with A's pid (steered through `ns_last_pid`)
/// and opens the same endpoints in the same order, so A's ids name B's
/// endpoints. Every send to A's ids must fail, and B must receive nothing.
#[test]
fn ids_of_a_dead_process_never_reach_a_new_one_with_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let me = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let mut a = Child::spawn("a", dir.path());
    let (port_a, svc_a) = ids(&a.expect("ready", START));
    let pid_a = a.pid();
    assert_eq!(port_a.team(), pid_a, "A's team number is not its pid");
    // (a) used while A lives; the RPC client is bound to A's service.
    let used = me.sender::<u64>(port_a);
    used.send(&1, Checkpoint::OnReceipt).unwrap();
    let old = OldClient::bind_to(&me, svc_a).unwrap().with_timeout(Duration::from_secs(2));
    assert_eq!(old.get_blocking().unwrap(), 1);
    a.kill();
    // The survivor reclaims the channel and sweeps A's files.
    let lock = format!("teams/{pid_a}.lock");
    assert!(
        common::eventually(Duration::from_secs(5), || !common::runtime_files(dir.path()).contains(&lock)),
        "A's files were not swept"
    );
    // With nobody at A's pid, everything fails already.
    let mut wrong = Vec::new();
    check_sends_fail("used sender, A dead", &used, &mut wrong);
    let r = old.get_blocking();
    if !rpc_gone(&r) {
        wrong.push(format!("RPC to the dead A: got {r:?}"));
    }
    assert!(wrong.is_empty(), "sends to a dead team that did not fail as gone: {wrong:#?}");

    if let Err(why) = can_steer_pids() {
        eprintln!("skipping the pid-reuse part: {why}");
        return;
    }
    let Some(mut b) = spawn_as_pid(pid_a, "b", dir.path()) else {
        panic!("could not start a process with pid {pid_a} (other processes kept taking it)");
    };
    let (port_b, svc_b) = ids(&b.expect("ready", START));
    // Same node, team number and slots: only the incarnation tells them apart.
    assert_eq!(
        (port_b.addr(), svc_b.addr()),
        (port_a.addr(), svc_a.addr()),
        "B's endpoints do not have A's addresses: the test proves nothing"
    );
    assert_ne!(port_b.incarnation(), port_a.incarnation());

    check_sends_fail("sender used before A died", &used, &mut wrong);
    // (b) made from A's id, never used before.
    check_sends_fail("fresh sender to A's id", &me.sender::<u64>(port_a), &mut wrong);
    let r = old.get_blocking();
    if !rpc_gone(&r) {
        wrong.push(format!("client bound to A's service: got {r:?}"));
    }
    let r = OldClient::bind_to(&me, svc_a).map(drop);
    if !rpc_gone(&r) {
        wrong.push(format!("binding to A's service id: got {r:?}"));
    }
    b.tell("report");
    let (received, calls) = counts(&b.expect("report", START));
    if (received, calls) != (0, 0) {
        wrong.push(format!("B received {received} port messages and {calls} service calls meant for A"));
    }
    // Want NoSuchTeam, PeerGone or NoSuchEndpoint everywhere, and nothing at B.
    assert!(wrong.is_empty(), "A's ids reached B (pid {pid_a}): {wrong:#?}");
}

fn counts(line: &str) -> (u64, u64) {
    let mut it = line.split_whitespace().map(|s| s.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}
