//! `ferry bench links` (issue 20): a round trip on a link between two
//! teams over shared memory, and between two nodes over TCP — fresh, and
//! after both ends moved once and the route was repaired — and the time an
//! end takes to move there and back with its route repaired, beside a port
//! round trip (`ferry.shm.spin`), a null RPC over TCP and the two-line
//! floor, run in the same suite.
//!
//! Both teams spin (over TCP: busy-poll): the child listens for links
//! (`bench.links`) and takes ends on its port (`bench.links.port`); the
//! parent takes ends on its port (`bench.links.home`).

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::link::Link;
use ferry::{Checkpoint, Port, Sender, Team};
use std::time::{Duration, Instant};

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("ferry.shm.link.fresh", |p, q| fresh_parent(p, q, Net::Shm), |c| fresh_child(c, Net::Shm)),
        Case::new("ferry.shm.link.moved", |p, q| moved_parent(p, q, Net::Shm), |c| moved_child(c, Net::Shm)),
        Case::new("ferry.shm.link.move", |p, q| move_parent(p, q, Net::Shm), |c| move_child(c, Net::Shm)),
        Case::new("ferry.tcp.link.fresh", |p, q| fresh_parent(p, q, Net::Tcp), |c| fresh_child(c, Net::Tcp)),
        Case::new("ferry.tcp.link.moved", |p, q| moved_parent(p, q, Net::Tcp), |c| moved_child(c, Net::Tcp)),
        Case::new("ferry.tcp.link.move", |p, q| move_parent(p, q, Net::Tcp), |c| move_child(c, Net::Tcp)),
    ]
}

const PATIENCE: Duration = Duration::from_secs(10);
const STOP: &[u8] = b"";

/// Where the two teams are: two processes of one node (shared memory), or
/// two nodes of a cluster (TCP, on loopback unless `scripts/bench.sh tcp`'s
/// addresses say otherwise), busy-polling as `ferry.tcp.busypoll.null`'s.
#[derive(Clone, Copy)]
enum Net {
    Shm,
    Tcp,
}

/// The team of one side (no processor: the measuring thread drives it) and
/// the guard that removes its runtime dir.
fn start_team(side: Side<'_>, net: Net) -> (Team, RemoveDir) {
    match (net, side) {
        (Net::Shm, side) => {
            let run_id = match side {
                Side::Parent(p) => &p.run_id,
                Side::Child(c) => &c.run_id,
            };
            let b = Team::builder().runtime_dir(run_dir(run_id)).processors(0).spin(Duration::from_secs(5));
            (b.start().expect("start team"), RemoveDir(run_dir(run_id)))
        }
        (Net::Tcp, Side::Parent(p)) => crate::tcp::parent_node(p, true, 0),
        (Net::Tcp, Side::Child(c)) => crate::tcp::child_node(c, true, 0),
    }
}

enum Side<'a> {
    Parent(&'a Peer),
    Child(&'a ChildCtx),
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

/// Round trips of 8 bytes on `link` (the child echoes them), timed as
/// what they are set beside is: over shared memory the mean of each round
/// (as `ferry.shm.spin`), over TCP each round trip on its own (as
/// `ferry.tcp.busypoll.null`: a p50 of single calls, which a round's mean
/// would not be where a few calls are slow).
fn ping(link: &Link, p: &Params, net: Net) -> Vec<f64> {
    let msg = [7u8; 8];
    let once = || {
        link.send_bytes(&msg, Checkpoint::Immediate).unwrap();
        link.recv_bytes_blocking().unwrap();
    };
    let samples = match net {
        Net::Shm => p.measure(p.iters, |n| (0..n).for_each(|_| once())),
        Net::Tcp => p.measure_each(crate::tcp::calls(p), once),
    };
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

/// The child's side of every case: its team (and dir), listener and port.
type ChildSide = ((Team, RemoveDir), ferry::link::LinkListener, Port<Link>, Sender<Link>);

fn child_side(ctx: &ChildCtx, net: Net) -> ChildSide {
    let (team, dir) = start_team(Side::Child(ctx), net);
    let listener = team.named_link_listener("bench.links").expect("listen");
    let (port, home) = ends_ports(&team, "bench.links.port", "bench.links.home");
    ((team, dir), listener, port, home)
}

/// The parent's side: its team (and dir), its port, and a link made at
/// the child's listener.
type ParentSide = ((Team, RemoveDir), Port<Link>, Sender<Link>, Link);

fn parent_side(peer: &Peer, net: Net) -> ParentSide {
    let (team, dir) = start_team(Side::Parent(peer), net);
    let (port, there) = ends_ports(&team, "bench.links.home", "bench.links.port");
    let link = team.link_to(team.lookup_wait("bench.links", PATIENCE).expect("the listener")).expect("link_to");
    ((team, dir), port, there, link)
}

fn fresh_parent(peer: &mut Peer, p: &Params, net: Net) -> Vec<f64> {
    let ((team, _dir), _port, _there, link) = parent_side(peer, net);
    let samples = ping(&link, p, net);
    team.shutdown();
    samples
}

fn fresh_child(ctx: &ChildCtx, net: Net) {
    let ((team, _dir), listener, _port, _home) = child_side(ctx, net);
    echo(&listener.accept_blocking().unwrap());
    team.shutdown();
}

/// Both ends swap teams (each moves once); once the route is repaired,
/// the same round trips.
fn moved_parent(peer: &mut Peer, p: &Params, net: Net) -> Vec<f64> {
    let ((team, _dir), port, there, link) = parent_side(peer, net);
    there.send(&link, Checkpoint::OnReceipt).unwrap();
    let link = port.recv_timeout(PATIENCE).unwrap().into_value();
    repaired(&team);
    let samples = ping(&link, p, net);
    team.shutdown();
    samples
}

fn moved_child(ctx: &ChildCtx, net: Net) {
    let ((team, _dir), listener, port, home) = child_side(ctx, net);
    home.send(&listener.accept_blocking().unwrap(), Checkpoint::OnReceipt).unwrap();
    let link = port.recv_timeout(PATIENCE).unwrap().into_value();
    repaired(&team);
    echo(&link);
    team.shutdown();
}

/// One end goes to the child and comes back (two moves), until this
/// team's proxy of it left: per move.
fn move_parent(peer: &mut Peer, p: &Params, net: Net) -> Vec<f64> {
    let ((team, _dir), port, there, link) = parent_side(peer, net);
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

fn move_child(ctx: &ChildCtx, net: Net) {
    let ((team, _dir), listener, port, home) = child_side(ctx, net);
    let other = listener.accept_blocking().unwrap();
    // Every end that comes goes back; the stop comes on the end it keeps.
    while other.try_recv::<u8>().is_none() {
        if let Ok(m) = port.recv_timeout(Duration::from_millis(1)) {
            home.send(&m.into_value(), Checkpoint::Immediate).unwrap();
        }
    }
    team.shutdown();
}
