//! The cluster name plane on a real etcd, which each test starts on
//! loopback ports of its own (Debian's `etcd-server`; `scripts/test.sh`
//! installs it) and stops: names seen by every team and taken once, a
//! dead team's names expiring with its lease, waits that are watches and
//! survive a compaction, several etcd addresses (one dead) and
//! `$FERRY_ETCD`.

mod common;

use common::Child;
use ferry::testing::{etcd_compact, etcd_revoke_lease, EtcdNames};
use ferry::{EndpointId, Error, Team};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(2);

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = match role.as_str() {
        "mortal" => {
            let etcd: SocketAddr = std::env::var("TEST_ETCD").unwrap().parse().unwrap();
            Team::builder().runtime_dir(&dir).etcd(etcd, TTL).start().unwrap()
        }
        // The parent set $FERRY_ETCD.
        "from-env" => Team::builder().runtime_dir(&dir).start().unwrap(),
        other => panic!("unknown role {other}"),
    };
    let port = team.open_named_port::<u8>(&role).unwrap();
    common::say(port.id());
    std::thread::sleep(Duration::from_secs(3600));
}

/// An etcd of its own, on free loopback ports, stopped (and its data
/// removed) on drop.
struct Etcd {
    proc: std::process::Child,
    addr: SocketAddr,
    _data: tempfile::TempDir,
}

impl Etcd {
    fn start() -> Etcd {
        let port = || TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (client, peer) = (port(), port());
        let data = tempfile::tempdir().unwrap();
        let url = |p: u16| format!("http://127.0.0.1:{p}");
        let proc = Command::new("etcd")
            .arg("--data-dir")
            .arg(data.path().join("etcd"))
            .args(["--listen-client-urls", &url(client), "--advertise-client-urls", &url(client)])
            .args(["--listen-peer-urls", &url(peer), "--initial-advertise-peer-urls", &url(peer)])
            .args(["--initial-cluster", &format!("default={}", url(peer))])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (Debian: apt-get install etcd-server; scripts/test.sh does)");
        let addr: SocketAddr = format!("127.0.0.1:{client}").parse().unwrap();
        let etcd = Etcd { proc, addr, _data: data };
        let until = Instant::now() + Duration::from_secs(20);
        // Up once it answers a request (a compaction of its empty store).
        while etcd_compact(addr).is_err() {
            assert!(Instant::now() < until, "etcd did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// A team on a node of its own (its own runtime directory), with the etcd plane.
fn team(dir: &Path, etcd: &Etcd) -> Team {
    Team::builder().runtime_dir(dir).etcd(etcd.addr, TTL).start().unwrap()
}

#[test]
fn names_in_etcd_are_seen_by_every_team_and_taken_once() {
    let etcd = Etcd::start();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (team(d1.path(), &etcd), team(d2.path(), &etcd));
    let svc = a.open_named_port::<u8>("svc").unwrap();
    assert_eq!(b.lookup("svc").unwrap(), svc.id());
    match b.open_named_port::<u8>("svc") {
        Err(Error::NameTaken { owner, .. }) => assert_eq!(owner, svc.id()),
        other => panic!("a name bound on another node was taken again: {:?}", other.map(|p| p.id())),
    }
    drop(svc);
    assert!(matches!(b.lookup("svc"), Err(Error::NameNotFound(_))));
    // A team that leaves takes its names with it (its lease is revoked).
    let _kept = a.open_named_port::<u8>("kept").unwrap();
    assert!(b.lookup("kept").is_ok());
    drop((_kept, a));
    assert!(matches!(b.lookup("kept"), Err(Error::NameNotFound(_))));
}

/// A team that dies (SIGKILL) cannot revoke its lease: its names expire
/// with it, once the TTL passes without a keep-alive.
#[test]
fn a_dead_teams_names_expire_with_its_lease() {
    let etcd = Etcd::start();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut child = Child::spawn_with("mortal", d1.path(), |c| {
        c.env("TEST_ETCD", etcd.addr.to_string());
    });
    let id: ferry::EndpointId = child.expect("", Duration::from_secs(20)).parse().unwrap();
    let b = team(d2.path(), &etcd);
    // Kept alive while the team lives, past its TTL.
    std::thread::sleep(TTL * 2);
    assert_eq!(b.lookup("mortal").unwrap(), id);
    child.kill();
    let t0 = Instant::now();
    while b.lookup("mortal").is_ok() {
        assert!(t0.elapsed() < TTL * 3, "the dead team's name outlived its lease");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A wait for a name is a watch: it ends when the name is bound. A watch
/// that must resume from a revision etcd has compacted away lists the key
/// again instead of waiting for good.
#[test]
fn a_wait_for_a_name_is_a_watch_and_survives_compaction() {
    let etcd = Etcd::start();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (team(d1.path(), &etcd), team(d2.path(), &etcd));
    let waiter = std::thread::spawn(move || b.lookup_wait("late", Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(300));
    let late = a.open_named_port::<u8>("late").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), late.id());

    // Revisions pile up, then etcd compacts past the one a watch resumes from.
    let others: Vec<_> = (0..5).map(|i| a.open_named_port::<u8>(&format!("other{i}")).unwrap()).collect();
    etcd_compact(etcd.addr).unwrap();
    let names = EtcdNames::connect(&[etcd.addr], TTL).unwrap();
    let found = names.wait_from("late", 1, Instant::now() + Duration::from_secs(5));
    assert_eq!(found.unwrap(), late.id(), "a compacted watch must list again");
    drop(others);
}

/// A loopback address nobody listens on (bound and released).
fn dead_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Given several etcd addresses, a team goes on to the next while one does
/// not answer: the first one dead, everything works through the second.
#[test]
fn a_dead_etcd_address_is_passed_over() {
    let etcd = Etcd::start();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Team::builder().runtime_dir(d1.path()).etcd_endpoints([dead_addr(), etcd.addr], TTL).start().unwrap();
    let b = Team::builder().runtime_dir(d2.path()).etcd_endpoints([etcd.addr, dead_addr()], TTL).start().unwrap();
    let svc = a.open_named_port::<u8>("svc").unwrap();
    assert_eq!(b.lookup("svc").unwrap(), svc.id());
    assert!(matches!(b.open_named_port::<u8>("svc"), Err(Error::NameTaken { .. })));
    // Past the TTL: the keep-alives got through too.
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || b.lookup_wait("late", Duration::from_secs(20)))
    };
    std::thread::sleep(TTL + TTL / 2);
    assert_eq!(b.lookup("svc").unwrap(), svc.id());
    let late = a.open_named_port::<u8>("late").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), late.id());
    // Leaving revokes the lease through the live address.
    drop((svc, late, a));
    assert!(matches!(b.lookup("svc"), Err(Error::NameNotFound(_))));
    assert!(matches!(b.lookup("late"), Err(Error::NameNotFound(_))));
    // With no address that answers, the team does not start.
    let d3 = tempfile::tempdir().unwrap();
    let none = Team::builder().runtime_dir(d3.path()).etcd_endpoints([dead_addr(), dead_addr()], TTL).start();
    assert!(matches!(none, Err(Error::Io { .. })), "{:?}", none.map(|t| t.id()));
}

/// `$FERRY_ETCD` holds comma-separated addresses, a dead one passed over.
#[test]
fn ferry_etcd_takes_a_list_of_addresses() {
    let etcd = Etcd::start();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut child = Child::spawn_with("from-env", d1.path(), |c| {
        c.env("FERRY_ETCD", format!("{}, {}", dead_addr(), etcd.addr));
    });
    let id: ferry::EndpointId = child.expect("", Duration::from_secs(20)).parse().unwrap();
    assert_eq!(team(d2.path(), &etcd).lookup("from-env").unwrap(), id);
}

/// A team unbinds only a name bound under its own lease (its lease may
/// have expired, and the name gone to another team).
#[test]
fn a_team_unbinds_only_its_own_names() {
    let etcd = Etcd::start();
    let (a, b) = (EtcdNames::connect(&[etcd.addr], TTL).unwrap(), EtcdNames::connect(&[etcd.addr], TTL).unwrap());
    let ep: ferry::EndpointId = "0.7.1#00000001".parse().unwrap();
    a.register("mine", ep).unwrap();
    // A registration retried after its answer was lost finds itself.
    a.register("mine", ep).unwrap();
    b.unregister("mine").unwrap();
    assert_eq!(b.lookup("mine").unwrap(), ep);
    a.unregister("mine").unwrap();
    assert!(matches!(b.lookup("mine"), Err(Error::NameNotFound(_))));
}

/// A lease that expires while its team lives (here revoked behind its
/// back, as etcd does when keep-alives stop reaching it: a cut link) is
/// replaced at the next keep-alive, and the team's names are bound again
/// under the new lease.
#[test]
fn a_lease_lost_while_the_team_lives_is_renewed_and_its_names_bound_again() {
    let etcd = Etcd::start();
    let names = EtcdNames::connect(&[etcd.addr], TTL).unwrap();
    let ep: EndpointId = "1.2.3#0000000a".parse().unwrap();
    names.register("phoenix", ep).unwrap();
    let old = names.lease_id();
    etcd_revoke_lease(etcd.addr, &old).unwrap();
    let other = EtcdNames::connect(&[etcd.addr], TTL).unwrap();
    assert!(matches!(other.lookup("phoenix"), Err(Error::NameNotFound(_))));
    // Within a keep-alive period (TTL / 3) and its requests.
    assert_eq!(other.wait_for("phoenix", TTL * 2).unwrap(), ep);
    assert_ne!(names.lease_id(), old);
    // Under the new lease: the team's leaving takes the name away.
    names.revoke();
    assert!(matches!(other.lookup("phoenix"), Err(Error::NameNotFound(_))));
}
