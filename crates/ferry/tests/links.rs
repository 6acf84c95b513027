//! Links (`ferry::link`) that do not move, in every placement: the same
//! team (`link_pair`, and `link_to` its own listener), two teams of one
//! process, two processes, two nodes (in namespaces, and on loopback in
//! this process). Messages both ways in order through a small window,
//! every checkpoint, calls and their refusals, close, and a dead peer.

mod common;

use common::pair::{pair, Placement, Side};
use ferry::{Checkpoint, EndpointId, Error, Team};
use std::time::Duration;

const MESSAGES: u32 = 3000;

/// A small window, so that senders meet it and wait for room.
fn small_window(b: ferry::TeamBuilder) -> ferry::TeamBuilder {
    b.link_window(8, 4096)
}

/// Both sides stream to each other at once, past the window many times,
/// in order; then every checkpoint and calls both ways.
fn messages_flow_both_ways_in_order(p: Placement) {
    pair(p).config(small_window).run(
        |a: &Side| {
            let listener = a.team.link_listener().unwrap();
            a.put("listener", listener.id());
            let link = listener.accept_blocking().unwrap();
            exchange(&link, "a");
            let m = link.recv_blocking::<String>().unwrap();
            assert!(m.wants_reply());
            let text = m.value.clone();
            m.reply(&format!("{text}!")).unwrap();
            // A request dropped unanswered.
            let m = link.recv_blocking::<String>().unwrap();
            assert_eq!(m.value, "drop me");
            drop(m);
            // Calls the other way.
            assert_eq!(link.call::<u32, u32>(&20).unwrap(), 21);
            a.get::<String>("done");
        },
        |b: &Side| {
            let listener: EndpointId = b.get("listener");
            let link = b.team.link_to(listener).unwrap();
            exchange(&link, "b");
            send_or_wait(&link, &"Immediate");
            link.send(&"OnReceipt", Checkpoint::OnReceipt).unwrap();
            link.send(&"OnDelivery", Checkpoint::OnDelivery).unwrap();
            assert_eq!(link.call::<_, String>(&"ping").unwrap(), "ping!");
            assert!(matches!(link.call::<_, String>(&"drop me"), Err(Error::Refused(ferry::Refusal::NoReply))));
            let m = link.recv_blocking::<u32>().unwrap();
            let n = m.value;
            m.reply(&(n + 1)).unwrap();
            b.put("done", "");
        },
    );
}

/// Sends `MESSAGES` numbered messages while receiving as many, from a
/// thread of its own; then receives the three checkpointed ones on side a.
fn exchange(link: &ferry::link::Link, me: &str) {
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..MESSAGES {
                send_or_wait(link, &(me, i));
            }
        });
        for i in 0..MESSAGES {
            let (from, n) = link.recv_blocking::<(String, u32)>().unwrap().value;
            assert_ne!(from, me);
            assert_eq!(n, i, "message {i} from {from}");
        }
    });
    if me == "a" {
        for checkpoint in ["Immediate", "OnReceipt", "OnDelivery"] {
            assert_eq!(link.recv_blocking::<String>().unwrap().value, checkpoint);
        }
    }
}

/// An `Immediate` send; past the window (`WouldBlock`), one that waits for room.
fn send_or_wait<T: serde::Serialize>(link: &ferry::link::Link, value: &T) {
    match link.send(value, Checkpoint::Immediate) {
        Err(Error::WouldBlock { .. }) => link.send(value, Checkpoint::OnReceipt).unwrap(),
        sent => sent.unwrap(),
    }
}

/// Closing an end: the other receives what was sent before it, then
/// `LinkClosed`, and its sends fail so; `link_to` a listener that is gone
/// is `NoSuchEndpoint`.
fn close_comes_after_what_was_sent(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let listener = a.team.link_listener().unwrap();
            a.put("listener", listener.id());
            let link = listener.accept_blocking().unwrap();
            for i in 0..50u32 {
                link.send(&i, Checkpoint::Immediate).unwrap();
            }
            link.close();
            drop(listener);
            a.put("closed", "");
            a.get::<String>("done");
        },
        |b: &Side| {
            let to: EndpointId = b.get("listener");
            let link = b.team.link_to(to).unwrap().with_timeout(Duration::from_secs(10));
            b.get::<String>("closed");
            for i in 0..50u32 {
                assert_eq!(link.recv_blocking::<u32>().unwrap().value, i);
            }
            assert!(matches!(link.recv_blocking::<u32>(), Err(Error::LinkClosed { .. })));
            assert!(matches!(link.send(&1u32, Checkpoint::OnReceipt), Err(Error::LinkClosed { .. })));
            assert!(matches!(b.team.link_to(to), Err(Error::NoSuchEndpoint(_))));
            b.put("done", "");
        },
    );
}

/// The team holding the other end dies: waits and sends fail with
/// `PeerGone` within a bound, and `unconfirmed` says what may be lost.
fn a_dead_peer_fails_the_link(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let listener = a.team.link_listener().unwrap();
            a.put("listener", listener.id());
            let link = listener.accept_blocking().unwrap();
            assert_eq!(link.recv_blocking::<u32>().unwrap().value, 1);
            a.put("got", "");
            a.get::<String>("waiting");
            std::thread::sleep(Duration::from_millis(50));
            a.team.shutdown();
            drop(link);
            a.put("gone", "");
        },
        |b: &Side| {
            let to: EndpointId = b.get("listener");
            let link = b.team.link_to(to).unwrap();
            link.send(&1u32, Checkpoint::Immediate).unwrap();
            b.get::<String>("got");
            // Unconsumed, then lost with the team.
            link.send(&2u32, Checkpoint::Immediate).unwrap();
            b.put("waiting", "");
            let t0 = std::time::Instant::now();
            let err = link.recv_blocking::<u32>().unwrap_err();
            // (In one team, the team itself is gone: `Shutdown`.)
            assert!(matches!(err, Error::PeerGone { .. } | Error::LinkClosed { .. } | Error::Shutdown), "{err:?}");
            assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
            if matches!(err, Error::PeerGone { .. }) {
                assert!(link.unconfirmed() >= 1, "message 2 was never consumed");
            }
            b.get::<String>("gone");
        },
    );
}

/// The largest message a link takes is what its teams' runtimes take
/// (`max_message`, less the link's framing): a larger message, or reply,
/// is refused at its sender with `TooLarge`, and the link goes on. Before,
/// the send succeeded, the receiving runtime refused the frame, and the
/// link stalled at the missing message.
fn a_message_larger_than_the_link_takes_is_refused(p: Placement) {
    const MAX_MESSAGE: usize = 64 << 10;
    let big = vec![7u8; 100_000];
    pair(p).config(|b| b.max_message(MAX_MESSAGE)).run(
        |a: &Side| {
            let listener = a.team.link_listener().unwrap();
            a.put("listener", listener.id());
            let link = listener.accept_blocking().unwrap().with_timeout(Duration::from_secs(10));
            let largest = match link.send_bytes(&big, Checkpoint::Immediate) {
                Err(Error::TooLarge { len: 100_000, max }) if max < MAX_MESSAGE => max,
                other => panic!("a message past the link's largest: {other:?}"),
            };
            // The largest there is goes, and the link goes on.
            link.send_bytes(&big[..largest], Checkpoint::OnReceipt).unwrap();
            link.send(&1u32, Checkpoint::OnReceipt).unwrap();
            // A reply past it: the replier is told, the caller gets `NoReply`.
            let m = link.recv_bytes_blocking().unwrap();
            assert!(matches!(m.reply_bytes(&big), Err(Error::TooLarge { len: 100_000, .. })));
            a.get::<String>("done");
        },
        |b: &Side| {
            let to: EndpointId = b.get("listener");
            let link = b.team.link_to(to).unwrap().with_timeout(Duration::from_secs(10));
            assert!(link.recv_bytes_blocking().unwrap().value.len() < MAX_MESSAGE);
            assert_eq!(link.recv_blocking::<u32>().unwrap().value, 1);
            let call = link.call::<_, serde_bytes::ByteBuf>(&"big, please");
            assert!(matches!(call, Err(Error::Refused(ferry::Refusal::NoReply))), "{call:?}");
            b.put("done", "");
        },
    );
}

/// Waits (at most 10 s) until the team keeps no proxy of a moved end.
fn no_proxy_stays(team: &Team) {
    let t0 = std::time::Instant::now();
    while team.link_routers().proxies > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "proxies stay: {:?}", team.link_routers());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Frames each way in the moving test.
const MOVED: u32 = 500;

/// An end travels inside a port message to the other side and back, while
/// its other end sends all along (and some messages wait unconsumed in the
/// end as it goes: they go with it); everything arrives once, in order, at
/// whoever holds the end; its new holder answers calls; the end left here
/// answers `LinkMoved`.
fn an_end_moves_to_the_other_side_and_back(p: Placement) {
    use ferry::link::Link;
    pair(p).config(small_window).run(
        |a: &Side| {
            let back = a.team.open_port::<(u32, Link)>().unwrap();
            a.put("back", back.id());
            let to_b = a.team.sender::<(u32, Link)>(a.get("port"));
            let (x, y) = a.team.link_pair().unwrap();
            for i in 0..5u32 {
                x.send(&i, Checkpoint::Immediate).unwrap();
            }
            let moving = (1u32, y);
            to_b.send(&moving, Checkpoint::OnReceipt).unwrap();
            assert!(matches!(moving.1.recv_blocking::<u32>(), Err(Error::LinkMoved { .. })));
            drop(moving);
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 5..MOVED {
                        send_or_wait(&x, &i);
                    }
                });
                for i in 0..MOVED {
                    assert_eq!(x.recv_blocking::<u32>().unwrap().value, i, "from the moved end");
                }
            });
            assert_eq!(x.call::<u32, u32>(&7).unwrap(), 8);
            // It comes back (moved again), and talks here.
            let (n, y) = back.recv_blocking().unwrap().into_value();
            assert_eq!(n, 2);
            x.send(&"home", Checkpoint::OnReceipt).unwrap();
            assert_eq!(y.recv_blocking::<String>().unwrap().value, "home");
            y.send(&"hello", Checkpoint::OnReceipt).unwrap();
            assert_eq!(x.recv_blocking::<String>().unwrap().value, "hello");
            // The route was repaired behind both moves: no proxy stays here.
            no_proxy_stays(&a.team);
            a.get::<String>("done");
        },
        |b: &Side| {
            let port = b.team.open_port::<(u32, Link)>().unwrap();
            b.put("port", port.id());
            let (n, y) = port.recv_blocking().unwrap().into_value();
            assert_eq!(n, 1);
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..MOVED {
                        send_or_wait(&y, &i);
                    }
                });
                for i in 0..MOVED {
                    assert_eq!(y.recv_blocking::<u32>().unwrap().value, i, "at the moved end");
                }
            });
            let m = y.recv_blocking::<u32>().unwrap();
            let v = m.value;
            m.reply(&(v + 1)).unwrap();
            let back = b.team.sender::<(u32, Link)>(b.get("back"));
            back.send(&(2, y), Checkpoint::OnReceipt).unwrap();
            no_proxy_stays(&b.team);
            b.put("done", "");
        },
    );
}

/// Both ends of a link move at once (each inside a message of its own,
/// one on a port, the other on another link), with messages waiting in
/// both; the other side gets everything in order, and no proxy stays.
fn both_ends_move_at_once(p: Placement) {
    use ferry::link::Link;
    pair(p).config(small_window).run(
        |a: &Side| {
            let to_b = a.team.sender::<Link>(a.get("port"));
            let carrier = a.team.link_to(a.get("listener")).unwrap();
            let (x, y) = a.team.link_pair().unwrap();
            for i in 0..5u32 {
                x.send(&i, Checkpoint::Immediate).unwrap();
                y.send(&(100 + i), Checkpoint::Immediate).unwrap();
            }
            to_b.send(&x, Checkpoint::Immediate).unwrap();
            carrier.send(&y, Checkpoint::Immediate).unwrap();
            drop((x, y));
            no_proxy_stays(&a.team);
            a.get::<String>("done");
        },
        |b: &Side| {
            let port = b.team.open_port::<Link>().unwrap();
            b.put("port", port.id());
            let listener = b.team.link_listener().unwrap();
            b.put("listener", listener.id());
            let carrier = listener.accept_blocking().unwrap();
            let x = port.recv_blocking().unwrap().into_value();
            let y: Link = carrier.recv_blocking().unwrap().into_value();
            for i in 0..5u32 {
                assert_eq!(y.recv_blocking::<u32>().unwrap().value, i);
                assert_eq!(x.recv_blocking::<u32>().unwrap().value, 100 + i);
            }
            std::thread::scope(|s| {
                s.spawn(|| (0..MOVED).for_each(|i| send_or_wait(&x, &i)));
                for i in 0..MOVED {
                    assert_eq!(y.recv_blocking::<u32>().unwrap().value, i);
                }
            });
            no_proxy_stays(&b.team);
            b.put("done", "");
        },
    );
}

/// A service whose calls carry link ends both ways.
#[ferry::service]
pub trait Relay {
    /// Takes `end`, says 7 on it, and returns an end of a new link on whose
    /// other end the server says 8.
    async fn swap(&self, end: ferry::link::Link) -> ferry::link::Link;
}

struct RelayImpl {
    team: Team,
    kept: std::sync::Mutex<Vec<ferry::link::Link>>,
}

impl Relay for RelayImpl {
    async fn swap(&self, end: ferry::link::Link) -> ferry::link::Link {
        end.send(&7u32, Checkpoint::Immediate).unwrap();
        let (mine, theirs) = self.team.link_pair().unwrap();
        mine.send(&8u32, Checkpoint::Immediate).unwrap();
        self.kept.lock().unwrap().extend([end, mine]);
        theirs
    }
}

/// An end inside an RPC argument becomes the server's, one inside its
/// result the caller's: each receives what was sent to it there.
fn ends_travel_in_rpc_arguments_and_results(p: Placement) {
    pair(p).run(
        |a: &Side| {
            let imp = RelayImpl { team: a.team.clone(), kept: Default::default() };
            let _serving = RelayServer::serve(&a.team, "relay", imp).unwrap();
            a.put("serving", "");
            a.get_within::<String>("done", Duration::from_secs(60));
        },
        |b: &Side| {
            b.get::<String>("serving");
            let relay = RelayClient::bind(&b.team, "relay").unwrap();
            let (here, there) = b.team.link_pair().unwrap();
            let got = relay.swap_blocking(there).unwrap().with_timeout(Duration::from_secs(10));
            let here = here.with_timeout(Duration::from_secs(10));
            assert_eq!(here.recv_blocking::<u32>().unwrap().value, 7, "the argument's end is the server's");
            assert_eq!(got.recv_blocking::<u32>().unwrap().value, 8, "the result's end is the caller's");
            // And they talk both ways from where they are now.
            got.send(&9u32, Checkpoint::Immediate).unwrap();
            b.put("done", "");
        },
    );
}

loopback_placements!(
    ends_travel_in_rpc_arguments_and_results,
    messages_flow_both_ways_in_order,
    close_comes_after_what_was_sent,
    a_message_larger_than_the_link_takes_is_refused,
    a_dead_peer_fails_the_link,
    an_end_moves_to_the_other_side_and_back,
    both_ends_move_at_once
);

/// Both ends in one team, made at once.
#[test]
fn a_pair_in_one_team_talks_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    for processors in [0, 1] {
        let team = Team::builder().runtime_dir(dir.path()).processors(processors).link_window(4, 4096).start().unwrap();
        let (x, y) = team.link_pair().unwrap();
        assert_eq!(x.id(), y.id());
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..1000u32 {
                    x.send(&i, Checkpoint::OnReceipt).unwrap();
                }
                assert_eq!(x.call::<_, u32>(&7u32).unwrap(), 8);
            });
            for i in 0..1000u32 {
                assert_eq!(y.recv_blocking::<u32>().unwrap().value, i);
            }
            let m = y.recv_blocking::<u32>().unwrap();
            let n = m.value;
            m.reply(&(n + 1)).unwrap();
        });
        // Async forms.
        team.block_on(async {
            x.send_bytes_async(b"async", Checkpoint::OnReceipt).await.unwrap();
        });
        assert_eq!(team.block_on(y.recv_bytes()).unwrap().value, b"async");
        // Immediate past the window: WouldBlock, nothing lost.
        let mut sent = 0u32;
        while x.send(&sent, Checkpoint::Immediate).is_ok() {
            sent += 1;
        }
        // At most the window (four messages), less what the last
        // acknowledgement had not counted consumed yet.
        assert!((1..=4).contains(&sent), "{sent} Immediate sends in a window of four");
        for i in 0..sent {
            assert_eq!(y.recv_blocking::<u32>().unwrap().value, i);
        }
        assert_eq!(x.try_recv::<u32>().map(|r| r.is_ok()), None);
        // A receive with a time limit.
        let x = x.with_timeout(Duration::from_millis(50));
        assert!(matches!(x.recv_blocking::<u32>(), Err(Error::DeadlineExceeded)));
        drop(y);
        assert!(matches!(x.recv_blocking::<u32>(), Err(Error::LinkClosed { .. })));
    }
}

/// Limits: link ends per team, and settings out of range.
#[test]
fn limits_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).max_links(3).start().unwrap();
    let _one = team.link_pair().unwrap();
    assert!(matches!(team.link_pair(), Err(Error::LimitReached { limit: ferry::Limit::Links, max: 3 })));
    for bad in [Team::builder().max_links(0), Team::builder().link_window(0, 4096), Team::builder().link_window(8, 1)] {
        assert!(matches!(bad.runtime_dir(dir.path()).start(), Err(Error::InvalidSetting { .. })));
    }
    // A listener whose name another team takes, and one no team has.
    let other = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let _listener = team.named_link_listener("links-here").unwrap();
    assert!(matches!(other.named_link_listener("links-here"), Err(Error::NameTaken { .. })));
    let nowhere = team.id().endpoint(99).unwrap();
    assert!(matches!(other.link_to(nowhere), Err(Error::NoSuchEndpoint(_))));
}

/// An end sent in a message nobody reads (its port is dropped with it) is
/// never adopted: its proxy gives the route up at the end of its lifetime,
/// and the other end fails with `PeerGone` instead of waiting for ever;
/// nothing of the route stays.
#[test]
fn an_end_lost_in_an_unread_message_fails_its_other_end() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).link_proxy_lifetime(Duration::from_millis(200)).start().unwrap();
    let port = team.open_port::<ferry::link::Link>().unwrap();
    let (x, y) = team.link_pair().unwrap();
    team.sender::<ferry::link::Link>(port.id()).send(&y, Checkpoint::OnReceipt).unwrap();
    drop((y, port));
    let x = x.with_timeout(Duration::from_secs(5));
    assert!(matches!(x.recv_blocking::<u32>(), Err(Error::PeerGone { .. })));
    assert_eq!(team.link_routers(), ferry::link::LinkRouters { ends: 1, proxies: 0, off_route: 0 });
    drop(x);
    assert_eq!(team.link_routers(), ferry::link::LinkRouters::default());
}

/// An end read only after its proxy gave the route up: the proxy is gone,
/// so its new holder's adoption reaches no router; the team answers that
/// the route broke there, and the end fails with `PeerGone` at once
/// rather than waiting for its proxy for good (found by the stress test).
#[test]
fn an_end_read_after_its_proxy_gave_up_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).link_proxy_lifetime(Duration::from_millis(100)).start().unwrap();
    let port = team.open_port::<ferry::link::Link>().unwrap();
    let (x, y) = team.link_pair().unwrap();
    team.sender::<ferry::link::Link>(port.id()).send(&y, Checkpoint::OnReceipt).unwrap();
    drop(y);
    let x = x.with_timeout(Duration::from_secs(5));
    assert!(matches!(x.recv_blocking::<u32>(), Err(Error::PeerGone { .. })));
    // Read late: adopted, its adoption goes to the proxy that left.
    let y = port.recv_timeout(Duration::from_secs(5)).unwrap().into_value().with_timeout(Duration::from_secs(5));
    let t = std::time::Instant::now();
    assert!(matches!(y.recv_blocking::<u32>(), Err(Error::PeerGone { .. })));
    assert!(t.elapsed() < Duration::from_secs(1), "failed only at its deadline");
    drop((x, y));
    assert_eq!(team.link_routers(), ferry::link::LinkRouters::default());
}

/// An end moves only to a team that takes the messages its link carries:
/// one whose `max_message` is smaller than the link's is adopted and
/// closed at once — its receiver is told why (`TooLarge`, inside the
/// decoding error), the other end sees `LinkClosed` — rather than kept
/// with a peer whose larger messages its runtime would refuse.
#[test]
fn an_end_moved_to_a_team_that_takes_less_arrives_closed() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let small = Team::builder().runtime_dir(dir.path()).max_message(64 << 10).start().unwrap();
    let port = small.open_port::<ferry::link::Link>().unwrap();
    let (x, y) = team.link_pair().unwrap();
    team.sender::<ferry::link::Link>(port.id()).send(&y, Checkpoint::OnReceipt).unwrap();
    drop(y);
    let got = port.recv_timeout(Duration::from_secs(5)).map(|m| m.into_value());
    assert!(matches!(&got, Err(Error::Codec(why)) if why.contains("exceeds the maximum")), "{got:?}");
    let x = x.with_timeout(Duration::from_secs(5));
    assert!(matches!(x.recv_blocking::<u32>(), Err(Error::LinkClosed { .. })));
    drop(x);
    for t in [&team, &small] {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while t.link_routers() != ferry::link::LinkRouters::default() {
            assert!(std::time::Instant::now() < until, "routers stay: {:?}", t.link_routers());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
