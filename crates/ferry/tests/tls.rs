//! TLS between nodes (cargo feature `tls`): nodes whose cluster files name a
//! certificate, its key and a CA talk in mutual TLS, on loopback here, with
//! certificates made for each test (`common::certs`). A node with TLS and a
//! node without refuse each other with `Error::Tls`, a certificate the CA
//! did not sign is refused (`Unauthenticated`), and nothing waits for long.
#![cfg(feature = "tls")]

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};
use common::certs::{self, Ca};
use ferry::testing::{tcp_accept, tcp_connect, Doorbell, Grant, TcpBind};
use ferry::{Checkpoint, Cluster, Error, Team, TeamId};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"a cluster key of more than 16 bytes";

/// Longest a refused bind may take (a handshake's patience is 5 s).
const PROMPT: Duration = Duration::from_secs(4);

/// A free loopback address (bound and released: a later bind may race, rarely).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Certificates for the tests of this file, in `dir`: CA `good`, which
/// signs `node1`, `node2` (for 127.0.0.1) and `elsewhere` (for 127.0.0.2
/// only); CA `rogue`, which signs `rogue` (for 127.0.0.1).
fn make_certs(dir: &Path) {
    let good = Ca::new(dir, "good");
    good.issue(dir, "node1", &["127.0.0.1"]);
    good.issue(dir, "node2", &["127.0.0.1"]);
    good.issue(dir, "elsewhere", &["127.0.0.2"]);
    Ca::new(dir, "rogue").issue(dir, "rogue", &["127.0.0.1"]);
}

/// Node `node` of a cluster on `addrs` (node `i + 1` at `addrs[i]`), read
/// from a cluster file written in `dir`: with TLS if `tls` names its
/// certificate and CA.
fn cluster(dir: &Path, addrs: &[SocketAddr], node: u16, tls: Option<(&str, &str)>) -> Cluster {
    std::fs::write(dir.join("cluster.key"), KEY).unwrap();
    let mut text = format!("node {node}\nlisten {}\nkey-file cluster.key\n", addrs[node as usize - 1]);
    for (i, a) in addrs.iter().enumerate().filter(|(i, _)| *i as u16 + 1 != node) {
        text += &format!("peer {} {a}\n", i + 1);
    }
    if let Some((cert, ca)) = tls {
        text += &certs::lines(dir, cert, ca);
    }
    let path = dir.join(format!("cluster-{node}"));
    std::fs::write(&path, text).unwrap();
    let c = Cluster::from_file(&path).unwrap();
    assert_eq!(c.tls.is_some(), tls.is_some());
    c
}

/// A team of `c`'s node, alone on it: its runtime directory is `dir/run-N`.
fn team(dir: &Path, c: Cluster) -> Team {
    let run = dir.join(format!("run-{}", c.node));
    std::fs::create_dir_all(&run).unwrap();
    Team::builder().runtime_dir(run).cluster(c).start().unwrap()
}

/// Ports, calls, a large message, names and RPC between two nodes in TLS,
/// as without it.
#[test]
fn ports_names_and_rpc_work_between_two_nodes_in_tls() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr()];
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("node1", "good"))));
    let b = team(dir.path(), cluster(dir.path(), &addrs, 2, Some(("node2", "good"))));

    common::exchange_messages(&a, &b);

    // The other way, and by name: the name query runs in TLS too.
    let back = a.open_named_port::<u64>("back").unwrap();
    let to_a = b.sender::<u64>(b.lookup("back").unwrap());
    for i in 0..100 {
        to_a.send(&i, Checkpoint::OnReceipt).unwrap();
    }
    for i in 0..100 {
        assert_eq!(back.recv_timeout(Duration::from_secs(10)).unwrap().value, i);
    }

    // RPC: a service of node 2 bound by name from node 1.
    let _serving = CalcServer::serve(&b, "calc", CalcImpl).unwrap();
    let calc = CalcClient::bind(&a, "calc").unwrap();
    for i in 0..100 {
        assert_eq!(calc.add_blocking(i, 1).unwrap(), i + 1);
    }
}

/// A bind in TLS that the kernel gives to another team of the node is
/// handed to the team its preamble names, before TLS starts.
#[test]
fn a_bind_in_tls_taken_by_another_team_of_the_node_is_handed_over() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr()];
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("node1", "good"))));
    let two = cluster(dir.path(), &addrs, 2, Some(("node2", "good")));
    let bs: Vec<Team> = (0..4).map(|_| team(dir.path(), two.clone())).collect();
    let ports: Vec<_> = bs.iter().map(|b| b.open_raw_port().unwrap()).collect();
    for (i, p) in ports.iter().enumerate() {
        a.raw_sender(p.id()).send(&[i as u8], Checkpoint::OnReceipt).unwrap();
        assert_eq!(p.recv_timeout(Duration::from_secs(10)).unwrap().payload(), [i as u8]);
    }
}

/// A node with TLS and a node without: each one's bind to the other fails
/// with `Tls` at once (no hang), nothing gets through, and names on the
/// other node are out of reach.
#[test]
fn a_node_with_tls_and_a_node_without_refuse_each_other() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr()];
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("node1", "good"))));
    let b = team(dir.path(), cluster(dir.path(), &addrs, 2, None));
    let (pa, pb) = (a.open_named_port::<u8>("at-a").unwrap(), b.open_named_port::<u8>("at-b").unwrap());
    for (from, to, what) in [(&a, pb.id(), "TLS to plain"), (&b, pa.id(), "plain to TLS")] {
        let t0 = Instant::now();
        let r = from.sender::<u8>(to).send(&1, Checkpoint::OnReceipt);
        assert!(matches!(r, Err(Error::Tls { peer, .. }) if peer == to.team_id()), "{what}: {r:?}");
        assert!(t0.elapsed() < PROMPT, "{what}: refused after {:?}", t0.elapsed());
    }
    for (from, name) in [(&a, "at-b"), (&b, "at-a")] {
        let t0 = Instant::now();
        assert!(matches!(from.lookup(name), Err(Error::NameNotFound(_))), "{name}");
        assert!(t0.elapsed() < PROMPT, "{name}: looked up for {:?}", t0.elapsed());
    }
    assert!(pa.try_recv().is_none() && pb.try_recv().is_none(), "a message got through");
}

/// The same at the bind handshake itself, where both sides' outcomes show:
/// `Tls` on both, whichever side has TLS.
#[test]
fn a_bind_between_tls_and_plain_fails_with_tls_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let tls = certs::config(dir.path(), "node1", "good");
    let (c_id, a_id) = (TeamId { node: 1, team: 1, incarnation: 1 }, TeamId { node: 2, team: 1, incarnation: 2 });
    let side = |me, tls: Option<ferry::TlsConfig>| TcpBind {
        me,
        doorbell: Arc::new(Doorbell::create().unwrap()),
        key: Arc::from(KEY),
        grant: Grant { frames: 1 << 16, detached: 1 << 20 },
        patience: Duration::from_secs(5),
        peer_timeout: Duration::from_secs(10),
        magic: None,
        tls,
    };
    for (connector_tls, acceptor_tls) in [(Some(tls.clone()), None), (None, Some(tls.clone()))] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let t0 = Instant::now();
        let connector = side(c_id, connector_tls.clone());
        let (c, a) = std::thread::scope(|s| {
            let c = s.spawn(|| tcp_connect(sock, &connector, a_id));
            let a = tcp_accept(accepted, &side(a_id, acceptor_tls));
            (c.join().unwrap(), a)
        });
        let with = if connector_tls.is_some() { "connector" } else { "acceptor" };
        assert!(matches!(c, Err(Error::Tls { .. })), "TLS at the {with}: connector {:?}", c.err());
        assert!(matches!(a, Err(Error::Tls { .. })), "TLS at the {with}: acceptor {:?}", a.err());
        assert!(t0.elapsed() < PROMPT, "TLS at the {with}: took {:?}", t0.elapsed());
    }
}

/// A node whose certificate the cluster's CA did not sign is refused
/// (`Unauthenticated`) whichever way the bind goes; so is a node whose
/// certificate is for another address than the one it is reached at.
#[test]
fn a_certificate_not_signed_by_the_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr(), free_addr()];
    // Node 1 trusts the right CA but shows a certificate from another one.
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("rogue", "good"))));
    let b = team(dir.path(), cluster(dir.path(), &addrs, 2, Some(("node2", "good"))));
    let (pa, pb) = (a.open_raw_port().unwrap(), b.open_raw_port().unwrap());
    for (from, to, what) in [(&a, pb.id(), "rogue to good"), (&b, pa.id(), "good to rogue")] {
        let t0 = Instant::now();
        let r = from.raw_sender(to).send(b"let me in", Checkpoint::OnReceipt);
        assert!(matches!(r, Err(Error::Unauthenticated { .. })), "{what}: {r:?}");
        assert!(t0.elapsed() < PROMPT, "{what}: refused after {:?}", t0.elapsed());
    }
    assert!(pa.try_recv().is_none() && pb.try_recv().is_none(), "a frame got through");
    // Node 3's certificate is the CA's, but for 127.0.0.2: node 2 dials 127.0.0.1.
    let c = team(dir.path(), cluster(dir.path(), &addrs, 3, Some(("elsewhere", "good"))));
    let pc = c.open_raw_port().unwrap();
    let r = b.raw_sender(pc.id()).send(b"who are you?", Checkpoint::OnReceipt);
    assert!(matches!(r, Err(Error::Unauthenticated { .. })), "a certificate for another address: {r:?}");
}

/// Regression (issue 15, defect 10): in TLS, a node whose certificate the
/// CA signed, for its own address, could claim another node's identity.
/// Here a team with the key and the certificate of 127.0.0.2 says it is
/// node 1 (at 127.0.0.1 in node 2's file): node 2 refuses it with
/// `Unauthenticated`, and the real node 1 binds and calls as before.
#[test]
fn a_certificate_for_another_address_cannot_claim_a_node() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr()];
    let b = team(dir.path(), cluster(dir.path(), &addrs, 2, Some(("node2", "good"))));
    let pb = b.open_raw_port().unwrap();
    let elsewhere = std::net::TcpListener::bind("127.0.0.2:0").unwrap().local_addr().unwrap();
    let impostor = cluster(dir.path(), &[elsewhere, addrs[1]], 1, Some(("elsewhere", "good")));
    let run = dir.path().join("run-impostor");
    std::fs::create_dir_all(&run).unwrap();
    let impostor = Team::builder().runtime_dir(run).cluster(impostor).start().unwrap();
    let r = impostor.raw_sender(pb.id()).send(b"I am node 1", Checkpoint::OnReceipt);
    assert!(matches!(r, Err(Error::Unauthenticated { .. })), "{r:?}");
    assert!(pb.try_recv().is_none(), "a frame got through");
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("node1", "good"))));
    a.raw_sender(pb.id()).send(b"I am node 1", Checkpoint::OnReceipt).unwrap();
    assert_eq!(pb.recv_timeout(Duration::from_secs(5)).unwrap().payload(), b"I am node 1");
}

/// Garbage where TLS should start, or a connection in the clear, costs a
/// TLS node that connection only: it says so (in the clear) and closes it
/// at once, and binds in TLS go on.
#[test]
fn garbage_instead_of_tls_closes_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addrs = [free_addr(), free_addr()];
    let a = team(dir.path(), cluster(dir.path(), &addrs, 1, Some(("node1", "good"))));
    let b = team(dir.path(), cluster(dir.path(), &addrs, 2, Some(("node2", "good"))));
    let connect = || {
        let s = std::net::TcpStream::connect(addrs[1]).unwrap();
        s.set_read_timeout(Some(PROMPT)).unwrap();
        s
    };
    let read_to_end = |mut s: std::net::TcpStream, what: &str| {
        let t0 = Instant::now();
        let mut sink = Vec::new();
        // Closed (or reset) on us, not left waiting.
        let r = s.read_to_end(&mut sink);
        assert!(t0.elapsed() < PROMPT, "{what}: kept open for {:?} ({r:?})", t0.elapsed());
        sink
    };
    // TLS announced, then garbage instead of a ClientHello.
    let mut s = connect();
    s.write_all(b"FERRYTS1\x02\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let mut answer = [0u8; 8];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"FERRYTSY");
    s.write_all(&[0x16, 3, 3, 0xff, 0xff]).unwrap();
    s.write_all(&[0xEE; 300]).unwrap();
    let _ = read_to_end(s, "garbage for a ClientHello");
    // A connection in the clear (here, a hello of 60 bytes of garbage) is told that TLS is required.
    let mut s = connect();
    s.write_all(&[b'x'; 60]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let said = read_to_end(s, "a connection in the clear");
    assert_eq!(said, b"FERRYTSR", "a TLS node answers a connection without TLS");
    // A team that is not there: the preamble is closed on, as a hello would be.
    let nobody: ferry::EndpointId = "2.99.1#00000001".parse().unwrap();
    let r = a.raw_sender(nobody).send(b"anyone?", Checkpoint::OnReceipt);
    assert!(matches!(r, Err(Error::NoSuchTeam(_))), "a team that is not there: {r:?}");
    // The node goes on.
    let port = b.open_raw_port().unwrap();
    a.raw_sender(port.id()).send(b"still here", Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_timeout(Duration::from_secs(10)).unwrap().payload(), b"still here");
}
