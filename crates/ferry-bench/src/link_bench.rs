//! `ferry bench links` (issue 20): a round trip on a link between two
//! teams over shared memory — fresh, and after both ends moved once and
//! the route was repaired — and the time an end takes to move there and
//! back with its route repaired, beside a port round trip (`ferry.shm.spin`,
//! run in the same suite) and the two-line floor.
//!
//! Both teams spin, as `ferry.shm.spin`'s do: the child listens for links
//! (`bench.links`) and takes ends on its port (`bench.links.port`); the
//! parent takes ends on its port (`bench.links.home`).

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::link::Link;
use ferry::{Checkpoint, Port, Sender, Team};
use std::time::{Duration, Instant};

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("ferry.shm.link.fresh", fresh_parent, fresh_child),
        Case::new("ferry.shm.link.moved", moved_parent, moved_child),
        Case::new("ferry.shm.link.move", move_parent, move_child),
    ]
}

const PATIENCE: Duration = Duration::from_secs(10);
const STOP: &[u8] = b"";

fn start_team(run_id: &str) -> Team {
    let b = Team::builder().runtime_dir(run_dir(run_id)).processors(0).spin(Duration::from_secs(5));
    b.start().expect("start team")
}

/// This side's port for ends, and a sender to the other side's.
fn ends_ports(team: &Team, mine: &str, theirs: &str) -> (Port<Link>, Sender<Link>) {
    let port = team.open_named_port::<Link>(mine).expect("open port");
    (port, team.connect_wait::<Link>(theirs, PATIENCE).expect("the other side's port"))
}

/// Waits until this team keeps no proxy of an end that moved (its route
/// repaired), driving the team meanwhile (it has no processor: a thread
/// in a blocking call serves the route's frames).
fn repaired(team: &Team) {
    let t = Instant::now();
    while team.link_routers().proxies > 0 {
        assert!(t.elapsed() < PATIENCE, "a route not repaired: {:?}", team.link_routers());
        team.block_on(team.sleep(Duration::from_micros(1)));
    }
}

/// Round trips of 8 bytes on `link` (the child echoes them).
fn ping(link: &Link, p: &Params) -> Vec<f64> {
    let msg = [7u8; 8];
    let samples = p.measure(p.iters, |n| {
        for _ in 0..n {
            link.send_bytes(&msg, Checkpoint::Immediate).unwrap();
            link.recv_bytes_blocking().unwrap();
        }
    });
    link.send_bytes(STOP, Checkpoint::Immediate).unwrap();
    samples
}

/// Echoes what comes on `link` until the parent's stop.
fn echo(link: &Link) {
    loop {
        let m = link.recv_bytes_blocking().unwrap();
        if m.value == STOP {
            break;
        }
        link.send_bytes(&m.value, Checkpoint::Immediate).unwrap();
    }
}

/// The child's side of every case: its listener, its port, its team.
fn child_side(ctx: &ChildCtx) -> (Team, ferry::link::LinkListener, Port<Link>, Sender<Link>) {
    let team = start_team(&ctx.run_id);
    let listener = team.named_link_listener("bench.links").expect("listen");
    let (port, home) = ends_ports(&team, "bench.links.port", "bench.links.home");
    (team, listener, port, home)
}

/// The parent's side: its team, its port, and a link made at the child's listener.
fn parent_side(peer: &Peer) -> (Team, Port<Link>, Sender<Link>, Link) {
    let team = start_team(&peer.run_id);
    let (port, there) = ends_ports(&team, "bench.links.home", "bench.links.port");
    let link = team.link_to(team.lookup_wait("bench.links", PATIENCE).expect("the listener")).expect("link_to");
    (team, port, there, link)
}

fn fresh_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let (team, _port, _there, link) = parent_side(peer);
    let samples = ping(&link, p);
    team.shutdown();
    samples
}

fn fresh_child(ctx: &ChildCtx) {
    let (team, listener, _port, _home) = child_side(ctx);
    echo(&listener.accept_blocking().unwrap());
    team.shutdown();
}

/// Both ends swap teams (each moves once); once the route is repaired,
/// the same round trips.
fn moved_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let (team, port, there, link) = parent_side(peer);
    there.send(&link, Checkpoint::OnReceipt).unwrap();
    let link = port.recv_timeout(PATIENCE).unwrap().into_value();
    repaired(&team);
    let samples = ping(&link, p);
    team.shutdown();
    samples
}

fn moved_child(ctx: &ChildCtx) {
    let (team, listener, port, home) = child_side(ctx);
    home.send(&listener.accept_blocking().unwrap(), Checkpoint::OnReceipt).unwrap();
    let link = port.recv_timeout(PATIENCE).unwrap().into_value();
    repaired(&team);
    echo(&link);
    team.shutdown();
}

/// One end goes to the child and comes back (two moves), until this
/// team's proxy of it left: per move.
fn move_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let (team, port, there, link) = parent_side(peer);
    let mut link = Some(link);
    let samples = p.measure(p.iters_div(100), |n| {
        for _ in 0..n {
            there.send(&link.take().unwrap(), Checkpoint::Immediate).unwrap();
            link = Some(port.recv_timeout(PATIENCE).unwrap().into_value());
            repaired(&team);
        }
    });
    link.take().unwrap().send(&0u8, Checkpoint::Immediate).unwrap();
    team.shutdown();
    samples.into_iter().map(|ns| ns / 2.0).collect()
}

fn move_child(ctx: &ChildCtx) {
    let (team, listener, port, home) = child_side(ctx);
    let other = listener.accept_blocking().unwrap();
    // Every end that comes goes back; the stop comes on the end it keeps.
    while other.try_recv::<u8>().is_none() {
        if let Ok(m) = port.recv_timeout(Duration::from_millis(1)) {
            home.send(&m.into_value(), Checkpoint::Immediate).unwrap();
        }
    }
    team.shutdown();
}
