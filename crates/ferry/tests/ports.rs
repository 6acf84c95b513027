//! Ports (DESIGN §1) over every placement of the two ends: one team (the
//! loop-back channel), two teams of one process and two processes (shared
//! memory), two nodes in two network namespaces (TCP). Each case is two
//! sides that share nothing but what they tell each other
//! (`common::pair`); `placements!` at the bottom instantiates them for
//! every placement. Cases about one team alone, and regressions that need
//! both teams in one process, follow as plain tests.
//!
//! Every wait is bounded (`recv_timeout`, [`within`], the control line's
//! patience) so a bug fails a case instead of hanging the suite.

mod common;

use common::pair::{pair, Placement, Side, PATIENCE};
use common::pattern;
use common::typed::{blob, Blob, Flaky};
use ferry::codec;
use ferry::{Checkpoint, EndpointId, Error, Port, RawPort, Refusal, Select, Team, TeamBuilder};
use serde::{Deserialize, Serialize};
use std::future::{poll_fn, Future};
use std::path::Path;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

fn builder(dir: &Path) -> TeamBuilder {
    Team::builder().runtime_dir(dir).spin(Duration::from_micros(5))
}

/// (sending team, receiving team) as two teams of this process.
fn two_teams(dir: &Path, tweak: impl Fn(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    let tx = tweak(builder(dir)).start().expect("start sending team");
    let rx = tweak(builder(dir)).start().expect("start receiving team");
    assert_ne!(tx.id(), rx.id());
    (tx, rx)
}

/// Runs `fut` on this thread (driving `team`), failing the test if it takes
/// longer than `limit`.
fn within<F: Future>(team: &Team, limit: Duration, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut timer = pin!(team.sleep(limit));
    team.block_on(poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        timer.as_mut().poll(cx).map(|()| None)
    }))
    .unwrap_or_else(|| panic!("not done within {limit:?}"))
}

struct NoopWaker;
impl Wake for NoopWaker {
    fn wake(self: Arc<Self>) {}
}

/// Polls once without waiting.
fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    let waker = Waker::from(Arc::new(NoopWaker));
    f.poll(&mut Context::from_waker(&waker))
}

/// Waits (sleeping a little between looks) until `cond` holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends until the message is taken, sleeping a little on `WouldBlock`.
fn send_patiently<T: Serialize>(s: &ferry::Sender<T>, v: &T, cp: Checkpoint) {
    loop {
        match s.send(v, cp) {
            Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
            r => break r.unwrap(),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: u64,
    item: String,
    qty: Vec<u32>,
}

fn order(i: u64) -> Order {
    Order { id: i, item: format!("item-{i}"), qty: (0..(i % 5) as u32).collect() }
}

// ---------------------------------------------------------------- cases
//
// Side A (the first closure) receives, side B (the second) sends.

fn typed_messages_round_trip(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<Order>().unwrap();
            assert_eq!(port.id().team_id(), rx.team.id());
            rx.put("port", port.id());
            for i in 0..20 {
                let m = port.recv_timeout(PATIENCE).unwrap();
                assert_eq!(m.value, order(i));
                assert_eq!(m.from().team_id(), rx.peer, "the source is an endpoint of the sending team");
                assert!(!m.wants_reply());
            }
            assert!(port.is_empty());
        },
        |tx| {
            let to: EndpointId = tx.get("port");
            let s = tx.team.sender::<Order>(to);
            assert_eq!(s.to(), to);
            for i in 0..20 {
                let cp = [Checkpoint::Immediate, Checkpoint::OnReceipt][i as usize % 2];
                s.send(&order(i), cp).unwrap();
            }
        },
    );
}

const SIZES: [usize; 8] = [0, 1, 39, 40, 41, 1000, 4096, 70_000];
const CHECKPOINTS: [Checkpoint; 3] = [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery];

fn raw_messages_round_trip(p: Placement) {
    let body = |i: usize, cp: Checkpoint| pattern(i as u64 * 10 + cp as u64, SIZES[i]);
    pair(p).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            for (i, len) in SIZES.iter().enumerate() {
                for cp in CHECKPOINTS {
                    let m = port.recv_timeout(PATIENCE).unwrap();
                    assert!(!m.wants_reply());
                    assert!(
                        m.payload() == &body(i, cp)[..],
                        "message {i} {cp:?} ({len} bytes) arrived damaged or out of order"
                    );
                }
            }
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            for i in 0..SIZES.len() {
                for cp in CHECKPOINTS {
                    loop {
                        match s.send(&body(i, cp), cp) {
                            Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
                            r => {
                                assert_eq!(r.unwrap(), Vec::<u8>::new(), "only OnReturn completes with bytes");
                                break;
                            }
                        }
                    }
                }
            }
        },
    );
}

/// `Immediate` completes with nobody receiving; the message then waits in
/// the port. (The first async send to another team waits for the bind,
/// which is not made on the caller's thread; later ones are ready at once.)
fn immediate_completes_without_a_receiver(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("sent");
            wait_until("the messages are in the port", || port.len() == 2);
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 7);
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 8);
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            let first = s.send_async(&codec::encode(&7u32).unwrap(), Checkpoint::Immediate);
            assert_eq!(within(&tx.team, PATIENCE, first).unwrap(), Vec::<u8>::new());
            let mut d = s.send_async(&codec::encode(&8u32).unwrap(), Checkpoint::Immediate);
            assert!(matches!(poll_once(Pin::new(&mut d)), Poll::Ready(Ok(ref v)) if v.is_empty()));
            tx.put("sent", 2);
        },
    );
}

/// `OnReceipt` completes once the receiving runtime put the message into the port.
fn on_receipt_completes_once_the_port_has_it(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            for i in 0..10 {
                // Acknowledged after the port took it: it is there, nobody received yet.
                let sent: usize = rx.get("sent");
                assert_eq!(port.len(), sent);
                rx.put("looked", i);
            }
            for i in 0..10 {
                assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, i);
            }
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port"));
            for i in 0..10 {
                s.send(&i, Checkpoint::OnReceipt).unwrap();
                tx.put("sent", i + 1);
                tx.get::<u32>("looked");
            }
        },
    );
}

/// `OnDelivery` does not complete while the message only sits in the port;
/// it completes when a receiver takes it. Three times: raw `send_async`,
/// typed `send_async`, a blocking send from another thread.
fn on_delivery_waits_for_a_receiver(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<String>().unwrap();
            rx.put("port", port.id());
            for want in ["first", "second", "third"] {
                rx.get::<String>("sent");
                wait_until("the message is in the port", || port.len() == 1);
                rx.put("arrived", want);
                rx.get::<String>("pending");
                assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, want);
            }
        },
        |tx| {
            let to: EndpointId = tx.get("port");
            let still_pending = |pending: &mut dyn FnMut() -> bool| {
                tx.get::<String>("arrived");
                std::thread::sleep(Duration::from_millis(30));
                assert!(pending(), "OnDelivery completed before anybody received");
                tx.put("pending", "");
            };
            // Raw.
            let raw = tx.team.raw_sender(to);
            let mut d = raw.send_async(&codec::encode("first").unwrap(), Checkpoint::OnDelivery);
            tx.put("sent", 1);
            still_pending(&mut || poll_once(Pin::new(&mut d)).is_pending());
            assert_eq!(within(&tx.team, PATIENCE, d).unwrap(), Vec::<u8>::new());

            // Typed.
            let s = tx.team.sender::<String>(to);
            let mut d = Box::pin(s.send_async(&"second".to_string(), Checkpoint::OnDelivery));
            assert!(poll_once(d.as_mut()).is_pending());
            tx.put("sent", 2);
            still_pending(&mut || poll_once(d.as_mut()).is_pending());
            within(&tx.team, PATIENCE, d).unwrap();

            // Blocking, from another thread.
            let t = std::thread::spawn(move || {
                let t0 = Instant::now();
                s.send(&"third".to_string(), Checkpoint::OnDelivery).unwrap();
                t0.elapsed()
            });
            tx.put("sent", 3);
            tx.get::<String>("arrived");
            std::thread::sleep(Duration::from_millis(50));
            assert!(!t.is_finished(), "a blocking OnDelivery send returned before anybody received");
            tx.put("pending", "");
            assert!(t.join().unwrap() >= Duration::from_millis(50));
        },
    );
}

/// `OnReturn` carries the receiver's reply back (typed `call`, `call_async`, raw `call`).
fn on_return_carries_the_reply(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<Order>().unwrap();
            let raw_port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            rx.put("raw", raw_port.id());
            for _ in 0..10 {
                let m = port.recv_timeout(PATIENCE).unwrap();
                assert!(m.wants_reply());
                let total: u32 = m.value.qty.iter().sum();
                let id = m.value.id;
                m.reply(&(id, total)).unwrap();
            }
            let mut m = raw_port.recv_timeout(PATIENCE).unwrap();
            assert!(m.wants_reply());
            let mut body = m.payload().to_vec();
            body.reverse();
            // A responder taken out of the message answers just the same.
            m.responder().unwrap().reply(&body).unwrap();
            assert!(!m.wants_reply());
        },
        |tx| {
            let s = tx.team.sender::<Order>(tx.get("port"));
            let raw = tx.team.raw_sender(tx.get("raw"));
            for i in 0..5 {
                let (id, total): (u64, u32) = s.call(&order(i)).unwrap();
                assert_eq!((id, total), (i, order(i).qty.iter().sum()));
            }
            for i in 5..10 {
                let r: (u64, u32) = within(&tx.team, PATIENCE, s.call_async(&order(i))).unwrap();
                assert_eq!(r, (i, order(i).qty.iter().sum()));
            }
            assert_eq!(raw.call(b"abc").unwrap(), b"cba");
        },
    );
}

/// A message the receiver drops without replying fails the caller with `Refused`.
fn dropped_without_reply_is_refused(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            let m = port.recv_timeout(PATIENCE).unwrap();
            assert!(m.wants_reply());
            drop(m);
            let m = port.recv_timeout(PATIENCE).unwrap();
            let _value: u32 = m.into_value(); // the value is kept, the message (and reply duty) dropped
                                              // The port is fine afterwards.
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 3);
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port"));
            assert!(matches!(s.call::<u32>(&1), Err(Error::Refused(Refusal::NoReply))));
            assert!(matches!(
                s.as_raw().send(&codec::encode(&2u32).unwrap(), Checkpoint::OnReturn),
                Err(Error::Refused(Refusal::NoReply))
            ));
            s.send(&3, Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// A message that does not decode as the port's type is a `Codec` error for
/// the receiver and, for `OnReturn`, a refusal for the caller.
fn undecodable_message(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<Order>().unwrap();
            rx.put("port", port.id());
            let r = port.recv_timeout(PATIENCE);
            assert!(matches!(r, Err(Error::Codec(_))), "got {:?}", r.map(|m| m.value));
        },
        |tx| {
            let raw = tx.team.raw_sender(tx.get("port"));
            assert!(matches!(raw.call(&[0xc1]), Err(Error::Refused(Refusal::NoReply))));
        },
    );
}

/// Messages far larger than a ring travel in pieces and arrive whole and
/// in order, between small ones.
fn large_messages_over_small_rings(p: Placement) {
    const PLAN: [(u64, usize, Checkpoint); 7] = [
        (1, 10, Checkpoint::OnReceipt),
        (2, 1 << 20, Checkpoint::OnReceipt),
        (3, 0, Checkpoint::OnDelivery),
        (4, 5 << 20, Checkpoint::OnReceipt),
        (5, 3, Checkpoint::OnReceipt),
        (6, (1 << 20) + 17, Checkpoint::Immediate),
        (7, 1, Checkpoint::OnReceipt),
    ];
    pair(p).config(|b| b.ring_bytes(4096)).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            for (i, len, _) in PLAN {
                let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i} ({len} bytes): {e}"));
                assert_eq!(m.payload().len(), len, "message {i}");
                assert!(m.payload() == &pattern(i, len)[..], "message {i} ({len} bytes) damaged");
            }
            assert!(port.recv_timeout(Duration::from_millis(20)).is_err(), "nothing extra arrives");
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            for (i, len, cp) in PLAN {
                let body = pattern(i, len);
                loop {
                    match s.send(&body, cp) {
                        Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
                        r => break drop(r.unwrap_or_else(|e| panic!("message {i}: {e}"))),
                    }
                }
            }
        },
    );
}

/// With nobody receiving, `Immediate` sends fill the port and the channel and
/// then fail with `WouldBlock`; nothing accepted is lost or repeated.
fn immediate_to_full_port_would_block_and_loses_nothing(p: Placement) {
    // A small hold queue too: the receiving runtime sets aside at most 8
    // messages for the full port before the channel itself fills.
    pair(p).config(|b| b.inbox_capacity(4).hold_capacity(8).ring_bytes(4096)).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("pushed-back");
            wait_until("the port is full", || port.len() == 4);
            rx.put("full", "");
            let accepted: u32 = rx.get("accepted");
            // The port holds its capacity and not one more.
            assert_eq!(port.len(), 4);
            for i in 0..accepted {
                let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i} of {accepted}: {e}"));
                assert_eq!(m.value, i, "lost, repeated or reordered");
            }
            assert!(matches!(port.recv_timeout(Duration::from_millis(50)), Err(Error::DeadlineExceeded)));
            rx.put("drained", "");
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 7);
        },
        |tx| {
            let to: EndpointId = tx.get("port");
            let s = tx.team.sender::<u32>(to);
            let mut accepted = 0u32;
            let send_until_pushed_back = |accepted: &mut u32| loop {
                match s.send(accepted, Checkpoint::Immediate) {
                    Ok(()) => *accepted += 1,
                    Err(e) => break e,
                }
                assert!(*accepted < 1_000_000, "Immediate sends never pushed back");
            };
            // The first push-back may come from the channel alone, before the
            // receiving runtime moved anything into the port.
            let err = send_until_pushed_back(&mut accepted);
            assert!(matches!(err, Error::WouldBlock { to: t } if t == to), "got {err:?}");
            tx.put("pushed-back", "");
            tx.get::<String>("full");
            // Now the port is full: fill the channel for good. The receiving
            // runtime may still move messages into its hold queue for a
            // moment, so fill until the push-back lasts.
            loop {
                let err = send_until_pushed_back(&mut accepted);
                assert!(matches!(err, Error::WouldBlock { to: t } if t == to), "got {err:?}");
                std::thread::sleep(Duration::from_millis(20));
                match s.send(&accepted, Checkpoint::Immediate) {
                    Ok(()) => accepted += 1,
                    Err(Error::WouldBlock { .. }) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(accepted >= 4, "only {accepted} messages accepted");
            // The channel stays full.
            let again = s.send(&accepted, Checkpoint::Immediate);
            assert!(
                matches!(again, Err(Error::WouldBlock { .. })),
                "a full port and channel took another message: {again:?}"
            );
            tx.put("accepted", accepted);
            // Room again once drained.
            tx.get::<String>("drained");
            send_patiently(&s, &7, Checkpoint::Immediate);
        },
    );
}

/// A send to a port that was closed (dropped) fails with `NoSuchEndpoint`.
fn send_to_closed_port_is_no_such_endpoint(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("sent");
            drop(port);
            rx.put("closed", "");
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 5);
        },
        |tx| {
            let id: EndpointId = tx.get("port");
            let s = tx.team.sender::<u32>(id);
            s.send(&1, Checkpoint::OnReceipt).unwrap();
            tx.put("sent", "");
            tx.get::<String>("closed");
            for cp in [Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn] {
                match s.send(&2, cp) {
                    Err(Error::NoSuchEndpoint(e)) => assert_eq!(e, id, "{cp:?}"),
                    r => panic!("{cp:?}: expected NoSuchEndpoint, got {r:?}"),
                }
            }
            // An endpoint that never existed on a live team.
            let never = tx.peer.endpoint(999_999).unwrap();
            let r = tx.team.sender::<u32>(never).send(&3, Checkpoint::OnReceipt);
            assert!(matches!(r, Err(Error::NoSuchEndpoint(e)) if e == never), "got {r:?}");
            // `Immediate` learns nothing and succeeds; the team goes on working.
            s.send(&4, Checkpoint::Immediate).unwrap();
            tx.team.sender::<u32>(tx.get("port")).send(&5, Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// Closing a port fails the sends still waiting in it for delivery.
fn closing_a_port_fails_the_sends_waiting_in_it(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("sent");
            wait_until("both messages are in the port", || port.len() == 2);
            drop(port);
        },
        |tx| {
            let id: EndpointId = tx.get("port");
            let raw = tx.team.raw_sender(id);
            let d1 = raw.send_async(&codec::encode(&1u32).unwrap(), Checkpoint::OnDelivery);
            let d2 = raw.send_async(&codec::encode(&2u32).unwrap(), Checkpoint::OnReturn);
            tx.put("sent", "");
            assert!(matches!(within(&tx.team, PATIENCE, d1), Err(Error::NoSuchEndpoint(e)) if e == id));
            assert!(matches!(within(&tx.team, PATIENCE, d2), Err(Error::NoSuchEndpoint(e)) if e == id));
        },
    );
}

/// Named ports: connect by name, `NameTaken` for a duplicate, `NameNotFound`
/// for a missing or released name, from either side.
///
/// Across nodes with the embedded name plane a name is unique on its node
/// (the other node finds it, but may bind it too); with etcd it is unique
/// in the cluster (`tests/etcd.rs`).
fn names(p: Placement) {
    let name_taken = |side: &Side, owner: EndpointId| {
        match side.team.open_named_port::<String>("orders.v1") {
            Err(Error::NameTaken { name, owner: o }) => assert_eq!((name.as_str(), o), ("orders.v1", owner)),
            Err(e) => panic!("expected NameTaken, got {e:?}"),
            Ok(_) => panic!("expected NameTaken, got a second port"),
        }
        assert!(matches!(side.team.open_named_raw_port("orders.v1"), Err(Error::NameTaken { .. })));
    };
    pair(p).run(
        |rx| {
            let port = rx.team.open_named_port::<String>("orders.v1").unwrap();
            assert_eq!(port.as_raw().name(), Some("orders.v1"));
            assert_eq!(rx.team.lookup("orders.v1").unwrap(), port.id());
            rx.put("named", port.id());
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, "hi");
            name_taken(rx, port.id());
            assert!(matches!(rx.team.open_named_port::<u8>(".hidden"), Err(Error::InvalidName(_))));
            // Dropping the port releases the name; it can be bound again.
            rx.get::<String>("looked");
            drop(port);
            rx.put("dropped", "");
            let again: EndpointId = rx.get("again");
            assert_eq!(rx.team.lookup("orders.v1").unwrap(), again);
            rx.team.connect::<String>("orders.v1").unwrap().send(&"back".into(), Checkpoint::OnReceipt).unwrap();
        },
        |tx| {
            let owner: EndpointId = tx.get("named");
            assert_eq!(tx.team.lookup("orders.v1").unwrap(), owner);
            let s = tx.team.connect::<String>("orders.v1").unwrap();
            assert_eq!(s.to(), owner);
            s.send(&"hi".into(), Checkpoint::OnReceipt).unwrap();
            if p != Placement::TwoNodes {
                name_taken(tx, owner);
            }
            // The failed attempts did not disturb the binding.
            assert_eq!(tx.team.lookup("orders.v1").unwrap(), owner);
            assert!(matches!(tx.team.lookup("missing"), Err(Error::NameNotFound(n)) if n == "missing"));
            assert!(matches!(tx.team.connect::<String>("missing"), Err(Error::NameNotFound(n)) if n == "missing"));
            assert!(matches!(tx.team.lookup("../etc"), Err(Error::InvalidName(_))));
            tx.put("looked", "");
            tx.get::<String>("dropped");
            assert!(matches!(tx.team.lookup("orders.v1"), Err(Error::NameNotFound(_))));
            let again = tx.team.open_named_port::<String>("orders.v1").unwrap();
            tx.put("again", again.id());
            assert_eq!(again.recv_timeout(PATIENCE).unwrap().value, "back");
        },
    );
}

/// A sender `with_timeout` whose `OnReturn` message is never answered gets
/// `DeadlineExceeded`; the late answer afterwards harms nothing.
fn call_with_timeout_unanswered(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            // Nobody receives at first; then the receiver takes a message but sits on it.
            rx.get::<String>("unanswered");
            let first = port.recv_timeout(PATIENCE).unwrap();
            assert_eq!(first.value, 1);
            let m = port.recv_timeout(PATIENCE).unwrap();
            assert_eq!(m.value, 2);
            rx.put("held", "");
            rx.get::<String>("given-up");
            m.reply(&20u32).unwrap(); // too late: nobody waits any more
            drop(first); // and a refusal nobody waits for either
            let m = port.recv_timeout(PATIENCE).unwrap();
            let v = m.value;
            m.reply(&(v * 10)).unwrap();
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port")).with_timeout(Duration::from_millis(100));
            let t0 = Instant::now();
            assert!(matches!(s.call::<u32>(&1), Err(Error::DeadlineExceeded)));
            let took = t0.elapsed();
            assert!(took >= Duration::from_millis(100) && took < Duration::from_secs(2), "took {took:?}");
            tx.put("unanswered", "");

            let held = std::thread::spawn({
                let s = s.clone();
                move || {
                    let t0 = Instant::now();
                    (s.call::<u32>(&2), t0.elapsed())
                }
            });
            tx.get::<String>("held");
            let (r, took) = held.join().unwrap();
            assert!(matches!(r, Err(Error::DeadlineExceeded)), "got {r:?}");
            assert!(took < Duration::from_secs(2), "took {took:?}");
            tx.put("given-up", "");
            // A later call is answered normally, with its own reply.
            let s = tx.team.sender::<u32>(s.to()).with_timeout(PATIENCE);
            assert_eq!(s.call::<u32>(&3).unwrap(), 30);
        },
    );
}

/// `Select` over a port that is never empty and a quiet one: every quiet
/// message is taken within one round of selects (two here, three with three
/// ports), and the busy port's messages still come in order.
fn select_is_fair(p: Placement) {
    const ROUNDS: [(usize, usize, u32); 3] = [(1, 2, 150), (0, 2, 150), (2, 3, 100)];
    pair(p).run(
        |rx| {
            let busy = rx.team.open_port::<u32>().unwrap();
            let busy2 = rx.team.open_port::<u32>().unwrap();
            let quiet = rx.team.open_port::<u32>().unwrap();
            rx.put("ports", format!("{} {} {}", busy.id(), busy2.id(), quiet.id()));
            rx.get::<String>("filled");
            wait_until("the busy ports are filled", || busy.len() == 1000 && busy2.len() == 300);
            let mut next_busy = 0;
            let mut quiet_seen = 0;
            for (quiet_index, ports, rounds) in ROUNDS {
                let mut sel = match quiet_index {
                    1 => Select::new(&[busy.as_raw(), quiet.as_raw()]),
                    0 => Select::new(&[quiet.as_raw(), busy.as_raw()]),
                    _ => Select::new(&[busy.as_raw(), busy2.as_raw(), quiet.as_raw()]),
                };
                for _ in 0..rounds {
                    rx.put("quiet", quiet_seen);
                    wait_until("the quiet message is in its port", || quiet.len() == 1);
                    let mut taken = false;
                    for attempt in 0..ports {
                        let (i, m) = within(&rx.team, PATIENCE, sel.recv()).unwrap();
                        if i == quiet_index {
                            assert_eq!(Port::<u32>::decode(m).unwrap().value, quiet_seen);
                            quiet_seen += 1;
                            taken = true;
                            break;
                        }
                        if ports == 2 {
                            // Only the first busy port is in two-port selects.
                            assert_eq!(Port::<u32>::decode(m).unwrap().value, next_busy, "busy port out of order");
                            next_busy += 1;
                        }
                        assert!(attempt + 1 < ports, "the quiet message was passed over {ports} times");
                    }
                    assert!(taken);
                }
            }
            rx.put("quiet", "done");
            assert_eq!(quiet_seen, 400, "the quiet port got every message");
            assert!(quiet.is_empty());
            assert!(!busy.is_empty() && !busy2.is_empty(), "the busy ports were never empty");
        },
        |tx| {
            let ids: String = tx.get("ports");
            let ids: Vec<EndpointId> = ids.split(' ').map(|w| w.parse().unwrap()).collect();
            let [to_busy, to_busy2, to_quiet] = [0, 1, 2].map(|i| tx.team.sender::<u32>(ids[i]));
            (0..1000).for_each(|i| send_patiently(&to_busy, &i, Checkpoint::Immediate));
            (0..300).for_each(|i| send_patiently(&to_busy2, &i, Checkpoint::Immediate));
            tx.put("filled", "");
            while let Ok(n) = tx.get::<String>("quiet").parse::<u32>() {
                send_patiently(&to_quiet, &n, Checkpoint::Immediate);
            }
        },
    );
}

/// `Select` waits for whichever port gets a message first.
fn select_waits_for_any_port(p: Placement) {
    pair(p).run(
        |rx| {
            let a = rx.team.open_raw_port().unwrap();
            let b = rx.team.open_raw_port().unwrap();
            rx.put("port", b.id());
            let mut sel = Select::new(&[&a, &b]);
            let (i, m) = within(&rx.team, PATIENCE, sel.recv()).unwrap();
            assert_eq!((i, m.payload()), (1, &b"late"[..]));
        },
        |tx| {
            let to_b = tx.team.raw_sender(tx.get("port"));
            std::thread::sleep(Duration::from_millis(30));
            to_b.send(b"late", Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// Tasks on the teams' processors exchange messages; join handles return
/// the tasks' values.
fn spawned_tasks_exchange_messages(p: Placement) {
    const N: u64 = 200;
    pair(p).run(
        |rx| {
            let ping = rx.team.open_port::<u64>().unwrap();
            rx.put("ping", ping.id());
            let to_pong = rx.team.sender::<u64>(rx.get("pong"));
            let server = rx.team.spawn(async move {
                let mut sum = 0;
                for _ in 0..N {
                    let m = ping.recv().await?;
                    sum += m.value;
                    to_pong.send_async(&(m.value * 2), Checkpoint::OnReceipt).await?;
                }
                Ok::<u64, Error>(sum)
            });
            assert_eq!(within(&rx.team, PATIENCE, server).unwrap().unwrap(), N * (N - 1) / 2);

            // A task answering calls (OnReturn) from another team's task.
            let svc = rx.team.open_port::<u32>().unwrap();
            rx.put("svc", svc.id());
            let server = rx.team.spawn(async move {
                for _ in 0..10 {
                    let m = svc.recv().await.unwrap();
                    let v = m.value;
                    m.reply(&(v + 1)).unwrap();
                }
            });
            within(&rx.team, PATIENCE, server).unwrap();
        },
        |tx| {
            let pong = tx.team.open_port::<u64>().unwrap();
            tx.put("pong", pong.id());
            let to_ping = tx.team.sender::<u64>(tx.get("ping"));
            let client = tx.team.spawn(async move {
                for i in 0..N {
                    let cp = [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery][i as usize % 3];
                    to_ping.send_async(&i, cp).await?;
                    let m = pong.recv().await?;
                    assert_eq!(m.value, i * 2);
                }
                Ok::<&'static str, Error>("client done")
            });
            assert_eq!(within(&tx.team, PATIENCE, client).unwrap().unwrap(), "client done");

            let caller = tx.team.sender::<u32>(tx.get("svc"));
            let client = tx.team.spawn(async move {
                let mut out = Vec::new();
                for i in 0..10u32 {
                    out.push(caller.call_async::<u32>(&i).await.unwrap());
                }
                out
            });
            assert_eq!(within(&tx.team, PATIENCE, client).unwrap(), (1..=10).collect::<Vec<u32>>());
        },
    );
}

/// Leaving fails what waits: on the same team with `Shutdown`, across teams
/// (the peer left) with `PeerGone`; later sends find no team.
fn shutdown_fails_what_waits(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("sent");
            wait_until("both messages are in the port", || port.len() == 2);
            rx.team.shutdown();
            assert!(matches!(port.recv_timeout(Duration::from_millis(10)), Err(Error::Shutdown)));
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            s.send(b"first", Checkpoint::OnReceipt).unwrap();
            let d = s.send_async(b"waits", Checkpoint::OnDelivery);
            tx.put("sent", "");
            if p.one_team() {
                let r = tx.team.block_on(d);
                assert!(matches!(r, Err(Error::Shutdown)), "got {r:?}");
                return;
            }
            let r = within(&tx.team, PATIENCE, d);
            assert!(matches!(r, Err(Error::PeerGone { peer }) if peer == tx.peer), "got {r:?}");
            let r = s.send(b"later", Checkpoint::OnReceipt);
            assert!(matches!(r, Err(Error::NoSuchTeam(t) | Error::PeerGone { peer: t }) if t == tx.peer), "got {r:?}");
        },
    );
}

/// ferry futures are ordinary futures: tokio runtimes await `recv`, a
/// `Delivery`, calls and join handles, while the teams' processors move
/// the messages.
fn tokio_awaits_ferry_futures(p: Placement) {
    use tokio::time::timeout;
    let tokio = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    pair(p).run(
        |rx| {
            assert!(rx.team.config().processors >= 1);
            let port = rx.team.open_port::<String>().unwrap();
            rx.put("port", port.id());
            tokio().block_on(async {
                let mut waited = 0;
                while port.is_empty() {
                    assert!(waited < 5000, "the message never reached the port");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    waited += 1;
                }
                rx.put("arrived", "");
                rx.get::<String>("pending");
                let m = timeout(PATIENCE, port.recv()).await.expect("recv timed out").unwrap();
                assert_eq!(m.value, "hello");
                // A call answered from tokio.
                let m = timeout(PATIENCE, port.recv()).await.expect("recv timed out").unwrap();
                let v = m.value.clone();
                m.reply(&format!("re:{v}")).unwrap();
                // A ferry task's join handle, and a ferry sleep, awaited by tokio.
                let h = rx.team.spawn(async { 6 * 7 });
                assert_eq!(timeout(PATIENCE, h).await.unwrap().unwrap(), 42);
                let t0 = Instant::now();
                timeout(PATIENCE, rx.team.sleep(Duration::from_millis(20))).await.unwrap();
                assert!(t0.elapsed() >= Duration::from_millis(20));
            });
        },
        |tx| {
            assert!(tx.team.config().processors >= 1);
            let to: EndpointId = tx.get("port");
            tokio().block_on(async {
                let raw = tx.team.raw_sender(to);
                let mut d = raw.send_async(&codec::encode("hello").unwrap(), Checkpoint::OnDelivery);
                tx.get::<String>("arrived");
                assert!(poll_once(Pin::new(&mut d)).is_pending(), "OnDelivery completed before the receive");
                tx.put("pending", "");
                assert_eq!(timeout(PATIENCE, d).await.expect("Delivery timed out").unwrap(), Vec::<u8>::new());
                let s = tx.team.sender::<String>(to);
                let reply = timeout(PATIENCE, s.call_async::<String>(&"q".to_string())).await.expect("call timed out");
                assert_eq!(reply.unwrap(), "re:q");
            });
        },
    );
}

/// A sender waiting for room in a full channel must be woken when the
/// receiver makes room, not by its park timeout.
///
/// A missed wake-up costs a whole park timeout, so the timeout is long and
/// the bound half of it: 4 MiB in ~1000 ring-fulls takes well under a second
/// even on a loaded 2-core machine (each refill may wait for a CPU), but a
/// single wake-up left to the timeout exceeds the bound.
fn sender_blocked_on_a_full_channel_is_woken_promptly(p: Placement) {
    const PARK: Duration = Duration::from_secs(6);
    const ROUNDS: usize = 40;
    let body = || pattern(1, 4 << 20);
    pair(p).config(|b| b.park_timeout(PARK).ring_bytes(4096)).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            for _ in 0..ROUNDS {
                assert_eq!(port.recv_timeout(PATIENCE).unwrap().payload().len(), body().len());
            }
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            let body = body();
            for round in 0..ROUNDS {
                let t0 = Instant::now();
                s.send(&body, Checkpoint::OnReceipt).unwrap();
                let took = t0.elapsed();
                assert!(took < PARK / 2, "round {round}: 4 MiB through a 4 KiB ring took {took:?}");
            }
        },
    );
}

/// Messages held back because their port was full must move in as soon as
/// the receiver takes one, also when the receiver does not drive the team
/// (`try_recv`, or a future awaited by another executor).
fn full_port_takes_waiting_messages_once_drained(p: Placement) {
    pair(p).config(|b| b.park_timeout(Duration::from_secs(1)).inbox_capacity(2)).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            wait_until("the port is full", || port.len() == 2);
            let mut next = 0;
            let until = Instant::now() + PATIENCE;
            while next < 6 && Instant::now() < until {
                match port.try_recv() {
                    Some(m) => {
                        assert_eq!(m.unwrap().value, next);
                        next += 1;
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            assert_eq!(next, 6);
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port"));
            let took: Vec<Duration> = (0..6u32)
                .map(|i| {
                    let t0 = Instant::now();
                    s.send(&i, Checkpoint::OnReceipt).unwrap();
                    t0.elapsed()
                })
                .collect();
            assert!(took.iter().all(|t| *t < Duration::from_millis(500)), "OnReceipt sends took {took:?}");
        },
    );
}

/// `with_timeout` bounds a send that cannot even be written because the
/// channel is full (nobody receives).
fn with_timeout_bounds_a_send_blocked_on_a_full_channel(p: Placement) {
    pair(p).config(|b| b.inbox_capacity(1).ring_bytes(4096)).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("filled");
            wait_until("the port is full", || port.len() == 1);
            rx.put("full", "");
            rx.get::<String>("done"); // the port stays open (and full) until then
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port"));
            // Fill the port, then the channel.
            let fill =
                || (0..1_000_000).find(|_| s.send(&0, Checkpoint::Immediate).is_err()).expect("never pushed back");
            fill();
            tx.put("filled", "");
            tx.get::<String>("full");
            fill();
            let s = s.with_timeout(Duration::from_millis(50));
            // On a thread of its own, so a send stuck for good fails the case
            // (its team's shutdown at the end unblocks it).
            let (done, result) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let r = s.send(&1, Checkpoint::OnReceipt);
                let _ = done.send((r, t0.elapsed()));
            });
            match result.recv_timeout(Duration::from_secs(2)) {
                Ok((Err(Error::DeadlineExceeded), took)) => assert!(took < Duration::from_secs(1), "took {took:?}"),
                Ok((r, took)) => panic!("expected DeadlineExceeded, got {r:?} after {took:?}"),
                Err(_) => panic!("a send with a 50 ms time limit was still blocked after 2 s"),
            }
            tx.put("done", "");
        },
    );
}

/// A message larger than the receiving team's `max_message` fails the send
/// with an error; it must not hang the sender or silently kill the channel.
fn message_over_the_receivers_limit_fails_the_sender(p: Placement) {
    if p.one_team() {
        return; // one team has one limit for both ends: nothing to cross
    }
    pair(p).config_a(|b| b.max_message(100_000)).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().payload(), b"before");
            assert_eq!(port.recv_timeout(PATIENCE).unwrap().payload(), b"after");
        },
        |tx| {
            let s = tx.team.raw_sender(tx.get("port"));
            // A message waiting in the port (it refers to the channel it came by).
            s.send(b"before", Checkpoint::OnReceipt).unwrap();
            let (done, result) = std::sync::mpsc::channel();
            let big = s.clone();
            std::thread::spawn(move || {
                let _ = done.send(big.send(&vec![1u8; 200_000], Checkpoint::OnReceipt));
            });
            match result.recv_timeout(Duration::from_secs(5)) {
                // The receiver's nack carries the numbers (it used to be `Refused` with them as text).
                Ok(Err(Error::TooLarge { len: 200_000, max: 100_000 })) => {}
                Ok(r) => panic!("expected TooLarge {{ len: 200000, max: 100000 }}, got {r:?}"),
                Err(_) => panic!("the sender of a too-large message was still blocked after 5 s"),
            }
            let after = s.with_timeout(Duration::from_secs(2)).send(b"after", Checkpoint::OnReceipt);
            assert!(after.is_ok(), "the channel is unusable after a too-large message: {after:?}");
        },
    );
}

/// A sender that sends many messages and leaves at once: every message is
/// still received, in order (a channel is finished only when drained; over
/// TCP, what waits to be written goes out before the end closes).
fn nothing_is_lost_when_the_sender_leaves_right_after_sending(p: Placement) {
    if p.one_team() {
        return; // the sender's team is the receiver's: it cannot leave alone
    }
    const N: u64 = 4000;
    const LEN: usize = 4000;
    pair(p).config(|b| b.ring_bytes(16 << 20).inbox_capacity(N as usize)).run(
        |rx| {
            let port = rx.team.open_raw_port().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("left");
            for i in 0..N {
                let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i}: {e}"));
                assert!(m.payload() == &pattern(i, LEN)[..], "message {i} damaged or out of order");
            }
        },
        |tx| {
            let to = tx.team.raw_sender(tx.get("port"));
            for i in 0..N {
                loop {
                    match to.send(&pattern(i, LEN), Checkpoint::Immediate) {
                        Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
                        r => break drop(r.unwrap()),
                    }
                }
            }
            tx.team.shutdown();
            tx.put("left", "");
        },
    );
}

/// Large typed messages (far larger than a frame: staged out of band,
/// encoded where they are staged, decoded where they arrived) arrive
/// whole by every send, their replies too; `recv_into` lands a
/// `Vec<u8>` message in the caller's buffer, reusing its capacity.
fn large_typed_messages_round_trip(p: Placement) {
    const MIB: usize = 1 << 20;
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<Blob>().unwrap();
            let vecs = rx.team.open_port::<Vec<u8>>().unwrap();
            rx.put("port", port.id());
            rx.put("vecs", vecs.id());
            for (id, len) in [(1, 12 * MIB), (2, 100), (3, 9 * MIB)] {
                let m = port.recv_timeout(PATIENCE).unwrap();
                assert!(m.value == blob(id, len), "blob {id} ({len} bytes) damaged");
            }
            let m = port.recv_timeout(PATIENCE).unwrap();
            assert!(m.wants_reply());
            let id = m.value.id;
            m.reply(&blob(id + 1, 10 * MIB)).unwrap();
            let mut buf: Vec<u8> = Vec::new();
            for i in 0..3u8 {
                let m = vecs.recv_into_blocking(&mut buf).unwrap();
                assert_eq!(m.from().team_id(), rx.peer);
                assert_eq!(buf.len(), 4 * MIB - usize::from(i));
                assert!(buf.iter().all(|&b| b == i), "vector {i} damaged");
                if i == 1 {
                    assert!(m.wants_reply());
                    m.reply(&()).unwrap();
                }
            }
            let warm = buf.as_ptr();
            let fut = vecs.recv_into(&mut buf);
            let m = rx.team.block_on(fut).unwrap();
            assert!(buf.len() == MIB && buf.iter().all(|&b| b == 9));
            assert_eq!(buf.as_ptr(), warm, "a smaller message lands in the same buffer");
            drop(m);
        },
        |tx| {
            let s = tx.team.sender::<Blob>(tx.get("port"));
            s.send(&blob(1, 12 * MIB), Checkpoint::OnReceipt).unwrap();
            s.send(&blob(2, 100), Checkpoint::OnReceipt).unwrap();
            within(&tx.team, PATIENCE, s.send_async(&blob(3, 9 * MIB), Checkpoint::OnReceipt)).unwrap();
            let back: Blob = s.call(&blob(7, 11 * MIB)).unwrap();
            assert!(back == blob(8, 10 * MIB), "the large reply damaged");
            let v = tx.team.sender::<Vec<u8>>(tx.get("vecs"));
            v.send(&vec![0u8; 4 * MIB], Checkpoint::OnReceipt).unwrap();
            let () = v.call(&vec![1u8; 4 * MIB - 1]).unwrap();
            v.send(&vec![2u8; 4 * MIB - 2], Checkpoint::OnReceipt).unwrap();
            v.send(&vec![9u8; MIB], Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// A large typed value that encodes to another length than its size pass
/// counted fails its send with `Codec`; nothing of it arrives, and the
/// channel carries the next message whole (not a corrupt frame).
fn encoder_that_changes_its_length_is_a_codec_error(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<Vec<u32>>().unwrap();
            rx.put("port", port.id());
            let m = port.recv_timeout(PATIENCE).unwrap();
            assert_eq!(m.value, vec![7u32; 1 << 18], "the message after the failed ones");
            assert!(port.recv_timeout(Duration::from_millis(50)).is_err(), "nothing else arrived");
        },
        |tx| {
            let to: EndpointId = tx.get("port");
            let flaky = tx.team.sender::<Flaky>(to);
            for grow in [true, false] {
                for cp in [Checkpoint::OnReceipt, Checkpoint::Immediate] {
                    let v = Flaky::new(grow);
                    match flaky.send(&v, cp) {
                        Err(Error::Codec(_)) => {}
                        other => panic!("grow {grow}, {cp:?}: {other:?}"),
                    }
                }
            }
            tx.team.sender::<Vec<u32>>(to).send(&vec![7u32; 1 << 18], Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// A large reply that encodes to another length than counted is not lost:
/// nothing of it is sent, the replier gets `Codec`, and the caller is told
/// (`Refused`, the message dropped without a reply) instead of waiting for
/// ever; the channel carries the next reply whole.
fn reply_that_changes_its_length_tells_the_caller(p: Placement) {
    pair(p).run(
        |rx| {
            let port = rx.team.open_port::<u32>().unwrap();
            rx.put("port", port.id());
            for grow in [true, false] {
                let m = port.recv_timeout(PATIENCE).unwrap();
                match m.reply(&Flaky::new(grow)) {
                    Err(Error::Codec(_)) => {}
                    other => panic!("grow {grow}: {other:?}"),
                }
            }
            port.recv_timeout(PATIENCE).unwrap().reply(&5u32).unwrap();
        },
        |tx| {
            let s = tx.team.sender::<u32>(tx.get("port")).with_timeout(PATIENCE);
            for i in 0..2 {
                match s.call::<Vec<u8>>(&i) {
                    Err(Error::Refused(_)) => {}
                    other => panic!("call {i}: {other:?}"),
                }
            }
            assert_eq!(s.call::<u32>(&2).unwrap(), 5);
        },
    );
}

/// A large typed async send that finds no room to stage (the first one
/// holds most of the payload area, or the TCP credit) waits in the
/// channel's outbox, encoded into a vector then, and goes once the first
/// is received: both arrive whole, in order.
fn large_typed_async_send_waits_encoded(p: Placement) {
    const BIG: usize = 20 << 20;
    pair(p).config(|b| b.max_message(32 << 20)).run(
        |rx| {
            let port = rx.team.open_port::<Blob>().unwrap();
            rx.put("port", port.id());
            rx.get::<String>("sent");
            for id in [1, 2] {
                let m = port.recv_timeout(PATIENCE).unwrap();
                assert!(m.value == blob(id, BIG), "blob {id} damaged");
            }
        },
        |tx| {
            let s = tx.team.sender::<Blob>(tx.get("port"));
            let first = s.send_async(&blob(1, BIG), Checkpoint::OnReceipt);
            let second = s.send_async(&blob(2, BIG), Checkpoint::OnReceipt);
            tx.put("sent", "");
            within(&tx.team, PATIENCE, first).unwrap();
            within(&tx.team, PATIENCE, second).unwrap();
        },
    );
}

placements!(
    reply_that_changes_its_length_tells_the_caller,
    large_typed_async_send_waits_encoded,
    encoder_that_changes_its_length_is_a_codec_error,
    large_typed_messages_round_trip,
    typed_messages_round_trip,
    raw_messages_round_trip,
    immediate_completes_without_a_receiver,
    on_receipt_completes_once_the_port_has_it,
    on_delivery_waits_for_a_receiver,
    on_return_carries_the_reply,
    dropped_without_reply_is_refused,
    undecodable_message,
    large_messages_over_small_rings,
    immediate_to_full_port_would_block_and_loses_nothing,
    send_to_closed_port_is_no_such_endpoint,
    closing_a_port_fails_the_sends_waiting_in_it,
    names,
    call_with_timeout_unanswered,
    select_is_fair,
    select_waits_for_any_port,
    spawned_tasks_exchange_messages,
    shutdown_fails_what_waits,
    tokio_awaits_ferry_futures,
    sender_blocked_on_a_full_channel_is_woken_promptly,
    full_port_takes_waiting_messages_once_drained,
    with_timeout_bounds_a_send_blocked_on_a_full_channel,
    message_over_the_receivers_limit_fails_the_sender,
    nothing_is_lost_when_the_sender_leaves_right_after_sending,
);

#[allow(dead_code)]
fn _types_are_send(port: Port<u32>, raw: RawPort) -> impl Send {
    (port, raw)
}

// ------------------------------------------------- one team

fn one_team() -> (Team, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    (builder(dir.path()).start().unwrap(), dir)
}

/// `recv_timeout` on an empty port gives `DeadlineExceeded` after about the limit.
#[test]
fn recv_timeout_gives_deadline_exceeded() {
    let (team, _dir) = one_team();
    let port = team.open_port::<u32>().unwrap();
    let raw = team.open_raw_port().unwrap();
    let t0 = Instant::now();
    assert!(matches!(port.recv_timeout(Duration::from_millis(60)), Err(Error::DeadlineExceeded)));
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(60), "gave up early, after {took:?}");
    assert!(took < Duration::from_secs(2), "gave up late, after {took:?}");
    assert!(matches!(raw.recv_timeout(Duration::ZERO), Err(Error::DeadlineExceeded)));
}

/// A task that panics gives `Error::Panicked` with the panic's message
/// (`&str` and `String` payloads); the team goes on.
#[test]
fn panicking_task_gives_panicked() {
    let (team, _dir) = one_team();
    let h = team.spawn(async { panic!("static message") });
    match within(&team, PATIENCE, h) {
        Err(Error::Panicked(msg)) => assert_eq!(msg, "static message"),
        r => panic!("expected Panicked, got {r:?}"),
    }
    let h = team.spawn(async move {
        if Instant::now().elapsed() < Duration::from_secs(3600) {
            panic!("boom {}", 7);
        }
        1u8
    });
    match within(&team, PATIENCE, h) {
        Err(Error::Panicked(msg)) => assert_eq!(msg, "boom 7"),
        r => panic!("expected Panicked, got {r:?}"),
    }
    // The processor survived.
    assert_eq!(within(&team, PATIENCE, team.spawn(async { 41 + 1 })).unwrap(), 42);
}

/// `Team::sleep` completes after its duration, in a task and from a thread.
#[test]
fn team_sleep() {
    let (team, _dir) = one_team();
    let t0 = Instant::now();
    let sleeps = (team.sleep(Duration::from_millis(40)), team.sleep(Duration::from_millis(80)));
    let h = team.spawn(async move {
        sleeps.1.await;
        let second = Instant::now();
        sleeps.0.await; // already due
        second
    });
    let second = within(&team, PATIENCE, h).unwrap();
    assert!(second - t0 >= Duration::from_millis(80), "woke after {:?}", second - t0);
    assert!(second - t0 < Duration::from_secs(2), "woke after {:?}", second - t0);

    let t0 = Instant::now();
    team.block_on(team.sleep(Duration::from_millis(30)));
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(2), "took {took:?}");
    team.block_on(team.sleep(Duration::ZERO));
}

// ------------------------------------------------- regressions
//
// Each of these once failed (a bug found by this suite); they are bounded in
// time.

/// A parked team must notice a channel that was bound while it slept: the
/// first message over a fresh channel may not wait for a park timeout.
#[test]
fn first_message_over_a_new_channel_is_not_delayed() {
    for round in 0..100 {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = two_teams(dir.path(), |b| b.park_timeout(Duration::from_secs(1)));
        let port = rx.open_port::<u32>().unwrap();
        std::thread::sleep(Duration::from_millis(2)); // let the receiving team fall asleep
        let t0 = Instant::now();
        tx.sender::<u32>(port.id()).send(&round, Checkpoint::OnReceipt).unwrap();
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(500), "round {round}: the first message took {took:?}");
    }
}

// ------------------------------------------------- review regressions

/// A reply written just before its peer leaves reaches the caller, however
/// the caller's send, the reply and the peer's exit interleave (a caller
/// that was slow to look after its send used to see `PeerGone`).
#[test]
fn a_reply_sent_just_before_the_peer_leaves_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let caller = Team::builder().runtime_dir(dir.path()).spin(Duration::from_micros(5)).start().unwrap();
    for round in 0..200 {
        let server = Team::builder().runtime_dir(dir.path()).spin(Duration::from_micros(5)).start().unwrap();
        let port = server.open_raw_port().unwrap();
        let to = caller.raw_sender(port.id());
        let answer = std::thread::spawn(move || {
            let m = port.recv_timeout(PATIENCE).unwrap();
            m.reply(b"bye").unwrap();
            server.shutdown();
        });
        let reply = to.call(b"quit").unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(reply, b"bye");
        answer.join().unwrap();
    }
}

/// A task that never waits must not starve timers on its processor.
#[test]
fn timers_fire_while_a_task_keeps_the_processor_busy() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(1).start().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let t = team.clone();
    // Yields constantly (always ready again), never sleeps.
    team.spawn(async move {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            let mut yielded = false;
            std::future::poll_fn(|cx| {
                if yielded {
                    std::task::Poll::Ready(())
                } else {
                    yielded = true;
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
            })
            .await;
        }
        drop(t);
    });
    let t0 = Instant::now();
    let slept = team.spawn({
        let team = team.clone();
        async move { team.sleep(Duration::from_millis(20)).await }
    });
    team.block_on(slept).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(t0.elapsed() < Duration::from_millis(500), "a 20 ms sleep took {:?}", t0.elapsed());
}

/// Shutdown while a task is blocked in a receive: the receive fails with
/// `Shutdown` and shutdown returns.
#[test]
fn shutdown_returns_while_a_task_blocks_in_a_receive() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(1).start().unwrap();
    let port = team.open_raw_port().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    team.spawn(async move {
        tx.send(port.recv_blocking().err()).unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    team.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(2), "shutdown took {:?}", t0.elapsed());
    assert!(matches!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), Some(Error::Shutdown)));
}

/// With no processors, a blocking call runs the team's tasks itself.
#[test]
fn tasks_run_in_a_team_without_processors() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let port = team.open_raw_port().unwrap();
    let to = team.raw_sender(port.id());
    let answer = team.spawn(async move { to.send_async(b"hi", Checkpoint::OnDelivery).await.map(|_| 42) });
    assert_eq!(port.recv_timeout(Duration::from_secs(5)).unwrap().payload(), b"hi");
    assert_eq!(team.block_on(answer).unwrap().unwrap(), 42);
}

/// A full port does not block the channel: a call to another endpoint
/// behind messages for the full port is answered at once, and the held
/// messages arrive later, in order.
#[test]
fn a_full_port_does_not_block_other_traffic_on_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Team::builder().runtime_dir(dir.path()).inbox_capacity(1).spin(Duration::from_micros(5)).start().unwrap();
    let tx = Team::builder().runtime_dir(dir.path()).spin(Duration::from_micros(5)).start().unwrap();
    let full = rx.open_raw_port().unwrap();
    let service = rx.open_raw_port().unwrap();
    let service_id = service.id();
    let server = std::thread::spawn(move || {
        let m = service.recv_timeout(Duration::from_secs(5)).unwrap();
        m.reply(b"pong").unwrap();
    });
    let to_full = tx.raw_sender(full.id());
    for i in 0..3u8 {
        to_full.send(&[i], Checkpoint::Immediate).unwrap();
    }
    let t0 = Instant::now();
    let reply = tx.raw_sender(service_id).with_timeout(Duration::from_secs(5)).call(b"ping").unwrap();
    assert_eq!(reply, b"pong");
    assert!(t0.elapsed() < Duration::from_secs(1), "the call waited {:?} behind a full port", t0.elapsed());
    server.join().unwrap();
    for i in 0..3u8 {
        assert_eq!(full.recv_timeout(Duration::from_secs(5)).unwrap().payload(), [i]);
    }
}

/// A large message never holds its channel up: it travels out of band, so
/// with a tiny ring and nobody draining it, an `Immediate` send behind it
/// is buffered at once, and both arrive whole and in order.
#[test]
fn a_large_message_does_not_hold_the_channel_up() {
    let dir = tempfile::tempdir().unwrap();
    // No processor and nobody receiving yet: nothing drains the receiver's ring.
    let rx = Team::builder().runtime_dir(dir.path()).processors(0).spin(Duration::from_micros(5)).start().unwrap();
    let tx = Team::builder().runtime_dir(dir.path()).ring_bytes(4096).spin(Duration::from_micros(5)).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let to = tx.raw_sender(port.id());
    let big = common::pattern(1, 4 << 20);
    let t0 = Instant::now();
    to.send(&big, Checkpoint::Immediate).unwrap();
    to.send(b"small", Checkpoint::Immediate).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "Immediate sends waited {:?}", t0.elapsed());
    let m = port.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(m.payload() == &big[..], "the large message arrived damaged");
    let mut reused = Vec::with_capacity(16);
    port.recv_timeout(Duration::from_secs(10)).unwrap().read_into(&mut reused);
    assert_eq!(reused, b"small");
}
