//! Limits (docs/RELIABILITY.md, "Limits"): past each, a typed error that
//! names the limit and how to raise it; and a process out of descriptors
//! neither spins nor hangs.

mod common;

use common::Child;
use ferry::{Checkpoint, EndpointId, Error, Limit, Team};
use std::time::{Duration, Instant};

fn team(dir: &std::path::Path) -> ferry::TeamBuilder {
    Team::builder().runtime_dir(dir)
}

#[test]
fn names_per_team_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let t = team(dir.path()).max_names(3).start().unwrap();
    let held: Vec<_> = (0..3).map(|i| t.open_named_raw_port(&format!("n{i}")).unwrap()).collect();
    let e = t.open_named_raw_port("n3").err().expect("a fourth name was bound");
    assert!(matches!(e, Error::LimitReached { limit: Limit::Names, max: 3 }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("names per team") && text.contains("TeamBuilder::max_names"), "{text}");
    // Names given back make room; a failed bind took none.
    drop(held);
    let mut again: Vec<_> = (0..3).map(|i| t.open_named_raw_port(&format!("m{i}")).unwrap()).collect();
    assert!(matches!(t.open_named_raw_port("m3"), Err(Error::LimitReached { .. })));
    again.pop();
    assert!(matches!(t.open_named_raw_port("m0"), Err(Error::NameTaken { .. })));
    t.open_named_raw_port("m3").unwrap();
}

/// A ring larger than the peer maps: the bind is refused, naming the limit.
#[test]
fn a_ring_larger_than_the_peer_maps_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rx = team(dir.path()).max_ring_bytes(64 << 10).start().unwrap();
    let tx = team(dir.path()).ring_bytes(1 << 20).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let e = tx.raw_sender(port.id()).send(b"x", Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::LimitReached { limit: Limit::RingBytes, max: 65536 }), "{e:?}");
    assert!(e.to_string().contains("ring_bytes"), "{e}");
}

#[test]
fn too_large_and_full_name_their_settings() {
    let dir = tempfile::tempdir().unwrap();
    let tx = team(dir.path()).max_message(1000).start().unwrap();
    let rx = team(dir.path()).inbox_capacity(1).hold_capacity(1).ring_bytes(4096).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let to = tx.raw_sender(port.id());
    let e = to.send(&[0u8; 2000], Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::TooLarge { len: 2000, max: 1000 }), "{e:?}");
    assert!(e.to_string().contains("TeamBuilder::max_message"), "{e}");
    let full = (0..100_000).find_map(|_| to.send(&[1u8; 500], Checkpoint::Immediate).err()).expect("never full");
    assert!(matches!(full, Error::WouldBlock { .. }), "{full:?}");
    assert!(full.to_string().contains("TeamBuilder::inbox_capacity"), "{full}");
}

/// The receiver's `max_message` binds what it takes, also a message small
/// enough to travel inside one frame (it bound only out-of-band ones: a
/// 2,000-byte message reached a team whose limit was 1,000).
#[test]
fn the_receivers_max_message_binds_small_messages_too() {
    let dir = tempfile::tempdir().unwrap();
    let rx = team(dir.path()).max_message(1000).start().unwrap();
    let tx = team(dir.path()).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let to = tx.raw_sender(port.id());
    let e = to.send(&[0u8; 2000], Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::TooLarge { len: 2000, max: 1000 }), "{e:?}");
    to.send(&[0u8; 1000], Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_blocking().unwrap().payload().len(), 1000, "only the one within the limit came");
    assert!(port.try_recv().is_none());
}

/// A team at `max_channels` refuses further binds (the peer gets
/// `LimitReached` naming the limit) and starts none; a channel reclaimed
/// makes room.
#[test]
fn channels_per_team_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let a = team(dir.path()).max_channels(2).start().unwrap();
    let port = a.open_raw_port().unwrap();
    let peers: Vec<Team> = (0..3).map(|_| team(dir.path()).start().unwrap()).collect();
    for p in &peers[..2] {
        p.raw_sender(port.id()).send(b"in", Checkpoint::OnReceipt).unwrap();
    }
    let e = peers[2].raw_sender(port.id()).send(b"refused", Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::LimitReached { limit: Limit::Channels, max: 2 }), "{e:?}");
    assert!(e.to_string().contains("TeamBuilder::max_channels"), "{e}");
    // Nor does the full team start one.
    let theirs = peers[2].open_raw_port().unwrap();
    let e = a.raw_sender(theirs.id()).send(b"out", Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::LimitReached { limit: Limit::Channels, max: 2 }), "{e:?}");
    // A peer that leaves makes room (once its channel is reclaimed).
    peers[0].shutdown();
    assert!(common::eventually(Duration::from_secs(5), || {
        peers[2].raw_sender(port.id()).send(b"room", Checkpoint::OnReceipt).is_ok()
    }));
}

/// The same over TCP: a node's team at its limit refuses a bind from
/// another node, which gets `LimitReached`.
#[test]
fn channels_per_team_are_bounded_over_tcp() {
    use std::collections::BTreeMap;
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let addrs = [free(), free(), free()];
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let node = |n: u16, b: ferry::TeamBuilder| {
        let peers: BTreeMap<u16, _> = (1..=3).filter(|&m| m != n).map(|m| (m, addrs[m as usize - 1])).collect();
        let key = std::sync::Arc::from(&b"a cluster key of more than 16 bytes"[..]);
        let c = ferry::Cluster {
            node: n,
            listen: addrs[n as usize - 1],
            peers,
            key,
            tls: None,
            from: Default::default(),
            handshakes_per_source: None,
        };
        b.runtime_dir(dirs[n as usize - 1].path()).cluster(c).start().unwrap()
    };
    let a = node(1, Team::builder().max_channels(1));
    let port = a.open_raw_port().unwrap();
    let (b, c) = (node(2, Team::builder()), node(3, Team::builder()));
    b.raw_sender(port.id()).send(b"in", Checkpoint::OnReceipt).unwrap();
    let e = c.raw_sender(port.id()).send(b"refused", Checkpoint::OnReceipt).unwrap_err();
    assert!(matches!(e, Error::LimitReached { limit: Limit::Channels, max: 1 }), "{e:?}");
}

// ------------------------------------------------------------ open files

/// The child: a team, then every descriptor the process may have taken.
#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    if role == "one-left" {
        return one_descriptor_left();
    }
    assert_eq!(role, "starved");
    let t = Team::builder().start().unwrap();
    let port = t.open_raw_port().unwrap();
    let parents: EndpointId = std::env::var("PARENT_PORT").unwrap().parse().unwrap();
    // A low limit, then all of it taken.
    let open = common::fd_count() as u64;
    let lim = libc::rlimit { rlim_cur: open + 16, rlim_max: open + 16 };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut hoard = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hoard.push(f);
    }
    // Its own bind fails, saying why.
    let r = t.raw_sender(parents).with_timeout(Duration::from_secs(2)).send(b"x", Checkpoint::OnReceipt);
    common::say(format!("send {r:?}"));
    // Binds to it wait in the backlog: its reactor must rest, not spin.
    let cpu = || {
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage with a valid out pointer.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        Duration::new(u.ru_utime.tv_sec as u64, u.ru_utime.tv_usec as u32 * 1000)
            + Duration::new(u.ru_stime.tv_sec as u64, u.ru_stime.tv_usec as u32 * 1000)
    };
    common::say(format!("port {}", port.id()));
    assert_eq!(common::hear().as_deref(), Some("measure"));
    let before = cpu();
    std::thread::sleep(Duration::from_millis(1500));
    common::say(format!("cpu {}", (cpu() - before).as_millis()));
    // Descriptors back: binds are taken again.
    drop(hoard);
    common::say("freed");
    // (The early message comes too if its bind outlived the shortage.)
    while let Ok(m) = port.recv_timeout(Duration::from_secs(10)) {
        common::say(format!("got {}", String::from_utf8_lossy(m.payload())));
    }
}

/// The child "one-left": a team whose process can take one descriptor
/// more (a bind's connection, not the descriptors its hello carries).
fn one_descriptor_left() {
    let t = Team::builder().start().unwrap();
    let port = t.open_raw_port().unwrap();
    // Its threads' first sleeps open their epoll sets: done before the count.
    std::thread::sleep(Duration::from_millis(200));
    let limit = common::fd_count() as u64 + 16;
    let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut hoard = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hoard.push(f);
    }
    hoard.pop();
    common::say(format!("limit {limit}"));
    common::say(format!("port {}", port.id()));
    let _ = common::hear();
    drop(t);
}

/// Defect 13 of issue 15: a live team out of descriptors accepted a bind's
/// connection, could not take the descriptors its hello carried, and
/// closed it: the connector got `NoSuchTeam`, which must mean only that the
/// team is gone. It gets `LimitReached(OpenFiles)` with the server's limit.
#[test]
fn a_bind_to_a_team_out_of_descriptors_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let parent = team(dir.path()).start().unwrap();
    let mut child = Child::spawn("one-left", dir.path());
    expect_open_files_refusal(&parent, &mut child);
}

/// A bind from `parent` to the port of `child` (a "one-left" child: one
/// descriptor left, its limit and its port said) fails with
/// `LimitReached(OpenFiles)` and the child's limit.
fn expect_open_files_refusal(parent: &ferry::Team, child: &mut Child) {
    let limit: u64 = child.expect("limit ", Duration::from_secs(20)).parse().unwrap();
    let theirs: EndpointId = child.expect("port ", Duration::from_secs(10)).parse().unwrap();
    let r = parent.raw_sender(theirs).with_timeout(Duration::from_secs(4)).send(b"x", Checkpoint::OnReceipt);
    match r {
        Err(Error::LimitReached { limit: Limit::OpenFiles, max }) => assert_eq!(max, limit),
        other => panic!("a bind to a team out of descriptors: {other:?}"),
    }
    child.tell("done");
}

/// Review of issue 15's defect 3 (7 of the review): a node out of descriptors, which could
/// not make the second descriptor a TCP connection's handshake deadline
/// needs, refused it as if past its bound of strangers: the connector was
/// told `LimitReached(Handshakes, 64)` (and tried again for nothing). It is
/// told `LimitReached(OpenFiles)` with the node's limit. Here the child is
/// node 1 of a cluster, one descriptor left (the connection's).
#[test]
fn a_tcp_bind_to_a_node_out_of_descriptors_says_so() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (one, two) = (free(), free());
    let key = d1.path().join("cluster.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let file = d1.path().join("cluster");
    std::fs::write(&file, format!("node 1\nlisten {one}\nkey-file {}\npeer 2 {two}\n", key.display())).unwrap();
    let mut child = Child::spawn_with("one-left", d1.path(), |c| {
        c.env("FERRY_CLUSTER", &file);
    });
    let c2 = ferry::Cluster::parse(&format!("node 2\nlisten {two}\nkey-file cluster.key\npeer 1 {one}\n"), d1.path());
    let parent = team(d2.path()).cluster(c2.unwrap()).start().unwrap();
    expect_open_files_refusal(&parent, &mut child);
}

/// A process out of descriptors: its own binds fail with
/// `LimitReached(OpenFiles)`; a bind to it fails so too (a descriptor kept
/// in reserve takes and refuses it), and its reactor
/// rests meanwhile (it used to spin on the listener it could not accept
/// from); with descriptors back, binds succeed.
#[test]
fn a_process_out_of_descriptors_says_so_and_does_not_spin() {
    let dir = tempfile::tempdir().unwrap();
    let parent = team(dir.path()).start().unwrap();
    let mine = parent.open_raw_port().unwrap();
    let mut child = Child::spawn_with("starved", dir.path(), |c| {
        c.env("PARENT_PORT", mine.id().to_string());
    });
    let send = child.expect("send ", Duration::from_secs(20));
    assert!(send.contains("LimitReached") && send.contains("OpenFiles"), "{send}");
    let theirs: EndpointId = child.expect("port ", Duration::from_secs(10)).parse().unwrap();
    child.tell("measure");
    let to = parent.raw_sender(theirs).with_timeout(Duration::from_secs(1));
    let t0 = Instant::now();
    // It fails, saying why (issue 15, defect 13: it waited for its
    // handshake's timeout, `DeadlineExceeded`, while the starved process
    // could not take the connection), or (if the starved process freed a
    // descriptor meanwhile: a thread of its own that ended) gets through;
    // it must not hang.
    let early = to.send(b"early", Checkpoint::OnReceipt);
    assert!(t0.elapsed() < Duration::from_secs(8), "the bind took {:?}", t0.elapsed());
    assert!(
        matches!(early, Ok(_) | Err(Error::LimitReached { limit: Limit::OpenFiles, .. })),
        "a bind to a process out of descriptors: {early:?}"
    );
    let cpu: u64 = child.expect("cpu ", Duration::from_secs(10)).parse().unwrap();
    assert!(cpu < 500, "the starved process used {cpu} ms of CPU in 1.5 s: its reactor spins");
    child.expect("freed", Duration::from_secs(10));
    let to = parent.raw_sender(theirs).with_timeout(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match to.send(b"late", Checkpoint::OnReceipt) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "binds never came back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut got = child.expect("got ", Duration::from_secs(10));
    if got == "early" {
        got = child.expect("got ", Duration::from_secs(10));
    }
    assert_eq!(got, "late");
}

/// Sends waiting for their answer are bounded (`max_calls_in_flight`): one
/// past the bound fails at once, naming the limit; an answer makes room.
#[test]
fn calls_in_flight_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let tx = team(dir.path()).max_calls_in_flight(3).start().unwrap();
    let rx = team(dir.path()).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let to = tx.raw_sender(port.id());
    let mut waiting: Vec<_> = (0..3).map(|_| to.send_async(b"q", Checkpoint::OnReturn)).collect();
    let e = to.send(b"q", Checkpoint::OnReturn).unwrap_err();
    assert!(matches!(e, Error::LimitReached { limit: Limit::CallsInFlight, max: 3 }), "{e:?}");
    assert!(e.to_string().contains("TeamBuilder::max_calls_in_flight"), "{e}");
    // An answer ends one call; its entry serves the next.
    let m = port.recv_timeout(Duration::from_secs(10)).unwrap();
    m.reply(b"a").unwrap();
    assert_eq!(tx.block_on(waiting.remove(0)).unwrap(), b"a");
    let next = to.send_async(b"q", Checkpoint::OnReturn);
    // Dropped sends give theirs back too.
    drop(waiting);
    for _ in 0..2 {
        port.recv_timeout(Duration::from_secs(10)).unwrap().reply(b"b").unwrap();
    }
    let m = port.recv_timeout(Duration::from_secs(10)).unwrap();
    m.reply(b"c").unwrap();
    assert_eq!(tx.block_on(next).unwrap(), b"c");
    let _more: Vec<_> = (0..3).map(|_| to.send_async(b"q", Checkpoint::OnReturn)).collect();
    assert!(matches!(to.send(b"q", Checkpoint::OnReturn), Err(Error::LimitReached { .. })));
}
