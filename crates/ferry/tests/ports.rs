//! Ports (DESIGN §1) over both placements a process can see: two tasks of
//! one team (the loop-back channel) and two teams of one process (a
//! shared-memory channel). Each case is a function of the [`Placement`],
//! instantiated for both by `placements!` at the bottom.
//!
//! Every wait is bounded (`recv_timeout`, [`within`]) so a bug fails a case
//! instead of hanging the suite.

mod common;

use common::pattern;
use ferry::codec;
use ferry::{Checkpoint, Error, Port, RawPort, Select, Team, TeamBuilder};
use serde::{Deserialize, Serialize};
use std::future::{poll_fn, Future};
use std::path::Path;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Where the two ends of a port conversation live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Sender and port in one team: the loop-back (in-process) channel.
    SameTeam,
    /// Sender and port in two teams of this process: a shared-memory channel.
    TwoTeams,
}

/// Longest any single step of a case may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(5);

fn builder(dir: &Path) -> TeamBuilder {
    Team::builder().runtime_dir(dir).spin(Duration::from_micros(5))
}

/// (sending team, receiving team) in one team.
fn same_team(dir: &Path, tweak: impl Fn(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    let t = tweak(builder(dir)).start().expect("start team");
    (t.clone(), t)
}

/// (sending team, receiving team) as two teams of this process.
fn two_teams(dir: &Path, tweak: impl Fn(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    let tx = tweak(builder(dir)).start().expect("start sending team");
    let rx = tweak(builder(dir)).start().expect("start receiving team");
    assert_ne!(tx.id(), rx.id());
    (tx, rx)
}

fn teams(p: Placement, dir: &Path, tweak: impl Fn(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    match p {
        Placement::SameTeam => same_team(dir, tweak),
        Placement::TwoTeams => two_teams(dir, tweak),
    }
}

fn defaults(b: TeamBuilder) -> TeamBuilder {
    b
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

fn typed_messages_round_trip(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<Order>().unwrap();
    assert_eq!(port.id().team_id(), rx.id());
    let s = tx.sender::<Order>(port.id());
    assert_eq!(s.to(), port.id());
    for i in 0..20 {
        let cp = [Checkpoint::Immediate, Checkpoint::OnReceipt][i as usize % 2];
        s.send(&order(i), cp).unwrap();
    }
    for i in 0..20 {
        let m = port.recv_timeout(PATIENCE).unwrap();
        assert_eq!(m.value, order(i));
        assert_eq!(m.from().team_id(), tx.id(), "the source is an endpoint of the sending team");
        assert!(!m.wants_reply());
    }
    assert!(port.is_empty());
}

fn raw_messages_round_trip(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    let sizes = [0usize, 1, 39, 40, 41, 1000, 4096, 70_000];
    let t = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..sizes.len() * 3 {
            let m = port.recv_timeout(PATIENCE).unwrap();
            assert!(!m.wants_reply());
            got.push(m.into_payload());
        }
        got
    });
    let mut want = Vec::new();
    for (i, len) in sizes.iter().enumerate() {
        for cp in [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery] {
            let body = pattern(i as u64 * 10 + cp as u64, *len);
            loop {
                match s.send(&body, cp) {
                    Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
                    r => {
                        assert_eq!(r.unwrap(), Vec::<u8>::new(), "only OnReturn completes with bytes");
                        break;
                    }
                }
            }
            want.push(body);
        }
    }
    let got = t.join().unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "message {k} ({} bytes) arrived damaged or out of order", w.len());
    }
}

/// `Immediate` completes with nobody receiving; the message then waits in
/// the port. (The first async send to another team waits for the bind,
/// which is not made on the caller's thread; later ones are ready at once.)
fn immediate_completes_without_a_receiver(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.raw_sender(port.id());
    let first = s.send_async(&codec::encode(&7u32).unwrap(), Checkpoint::Immediate);
    assert_eq!(within(&tx, PATIENCE, first).unwrap(), Vec::<u8>::new());
    let mut d = s.send_async(&codec::encode(&8u32).unwrap(), Checkpoint::Immediate);
    assert!(matches!(poll_once(Pin::new(&mut d)), Poll::Ready(Ok(ref v)) if v.is_empty()));
    wait_until("the messages are in the port", || port.len() == 2);
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 7);
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 8);
}

/// `OnReceipt` completes once the receiving runtime put the message into the port.
fn on_receipt_completes_once_the_port_has_it(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id());
    for i in 0..10 {
        s.send(&i, Checkpoint::OnReceipt).unwrap();
        // Acknowledged after the port took it: it is there, nobody received yet.
        assert_eq!(port.len(), i as usize + 1);
    }
    for i in 0..10 {
        assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, i);
    }
}

/// `OnDelivery` does not complete while the message only sits in the port;
/// it completes when a receiver takes it.
fn on_delivery_waits_for_a_receiver(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<String>().unwrap();

    // Raw Delivery.
    let raw = tx.raw_sender(port.id());
    let mut d = raw.send_async(&codec::encode("first").unwrap(), Checkpoint::OnDelivery);
    wait_until("the message is in the port", || port.len() == 1);
    std::thread::sleep(Duration::from_millis(30));
    assert!(poll_once(Pin::new(&mut d)).is_pending(), "OnDelivery completed before anybody received");
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, "first");
    assert_eq!(within(&tx, PATIENCE, d).unwrap(), Vec::<u8>::new());

    // Typed send_async.
    let s = tx.sender::<String>(port.id());
    let mut d = Box::pin(s.send_async(&"second".to_string(), Checkpoint::OnDelivery));
    assert!(poll_once(d.as_mut()).is_pending());
    wait_until("the message is in the port", || port.len() == 1);
    std::thread::sleep(Duration::from_millis(30));
    assert!(poll_once(d.as_mut()).is_pending(), "OnDelivery completed before anybody received");
    assert_eq!(port.try_recv().expect("waiting message").unwrap().value, "second");
    within(&tx, PATIENCE, d).unwrap();

    // Blocking send from another thread, received later.
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        s.send(&"third".to_string(), Checkpoint::OnDelivery).unwrap();
        t0.elapsed()
    });
    wait_until("the message is in the port", || port.len() == 1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!t.is_finished(), "a blocking OnDelivery send returned before anybody received");
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, "third");
    assert!(t.join().unwrap() >= Duration::from_millis(50));
}

/// `OnReturn` carries the receiver's reply back (typed `call`, `call_async`, raw `call`).
fn on_return_carries_the_reply(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<Order>().unwrap();
    let raw_port = rx.open_raw_port().unwrap();
    let s = tx.sender::<Order>(port.id());
    let raw = tx.raw_sender(raw_port.id());
    let server = std::thread::spawn(move || {
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
    });
    for i in 0..5 {
        let (id, total): (u64, u32) = s.call(&order(i)).unwrap();
        assert_eq!((id, total), (i, order(i).qty.iter().sum()));
    }
    for i in 5..10 {
        let r: (u64, u32) = within(&tx, PATIENCE, s.call_async(&order(i))).unwrap();
        assert_eq!(r, (i, order(i).qty.iter().sum()));
    }
    assert_eq!(raw.call(b"abc").unwrap(), b"cba");
    server.join().unwrap();
}

/// A message the receiver drops without replying fails the caller with `Refused`.
fn dropped_without_reply_is_refused(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id());
    let server = std::thread::spawn(move || {
        let m = port.recv_timeout(PATIENCE).unwrap();
        assert!(m.wants_reply());
        drop(m);
        let m = port.recv_timeout(PATIENCE).unwrap();
        let _value: u32 = m.into_value(); // the value is kept, the message (and reply duty) dropped
        port
    });
    assert!(matches!(s.call::<u32>(&1), Err(Error::Refused(_))));
    assert!(matches!(s.as_raw().send(&codec::encode(&2u32).unwrap(), Checkpoint::OnReturn), Err(Error::Refused(_))));
    let port = server.join().unwrap();
    // The port is fine afterwards.
    s.send(&3, Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 3);
}

/// A message that does not decode as the port's type is a `Codec` error for
/// the receiver and, for `OnReturn`, a refusal for the caller.
fn undecodable_message(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<Order>().unwrap();
    let raw = tx.raw_sender(port.id());
    let server = std::thread::spawn(move || {
        let r = port.recv_timeout(PATIENCE);
        assert!(matches!(r, Err(Error::Codec(_))), "got {:?}", r.map(|m| m.value));
    });
    assert!(matches!(raw.call(&[0xc1]), Err(Error::Refused(_))));
    server.join().unwrap();
}

/// Messages far larger than a ring travel in pieces and arrive whole and
/// in order, between small ones.
fn large_messages_over_small_rings(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), |b| b.ring_bytes(4096));
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    let plan: Vec<(u64, usize, Checkpoint)> = vec![
        (1, 10, Checkpoint::OnReceipt),
        (2, 1 << 20, Checkpoint::OnReceipt),
        (3, 0, Checkpoint::OnDelivery),
        (4, 5 << 20, Checkpoint::OnReceipt),
        (5, 3, Checkpoint::OnReceipt),
        (6, (1 << 20) + 17, Checkpoint::Immediate),
        (7, 1, Checkpoint::OnReceipt),
    ];
    let sends = plan.clone();
    let sender = std::thread::spawn(move || {
        for (i, len, cp) in sends {
            let body = pattern(i, len);
            loop {
                match s.send(&body, cp) {
                    Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
                    r => break drop(r.unwrap_or_else(|e| panic!("message {i}: {e}"))),
                }
            }
        }
    });
    for (i, len, _) in plan {
        let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i} ({len} bytes): {e}"));
        assert_eq!(m.payload().len(), len, "message {i}");
        assert!(m.payload() == &pattern(i, len)[..], "message {i} ({len} bytes) damaged");
    }
    sender.join().unwrap();
    assert!(port.recv_timeout(Duration::from_millis(20)).is_err(), "nothing extra arrives");
}

/// With nobody receiving, `Immediate` sends fill the port and the channel and
/// then fail with `WouldBlock`; nothing accepted is lost or repeated.
fn immediate_to_full_port_would_block_and_loses_nothing(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    // A small hold queue too: the receiving runtime sets aside at most 8
    // messages for the full port before the channel itself fills.
    let (tx, rx) = teams(p, dir.path(), |b| b.inbox_capacity(4).hold_capacity(8).ring_bytes(4096));
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id());
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
    assert!(matches!(err, Error::WouldBlock { to } if to == port.id()), "got {err:?}");
    wait_until("the port is full", || port.len() == 4);
    // Now the port is full: fill the channel for good. The receiving runtime
    // may still move messages from the ring into its hold queue for a
    // moment, so fill until the push-back lasts.
    loop {
        let err = send_until_pushed_back(&mut accepted);
        assert!(matches!(err, Error::WouldBlock { to } if to == port.id()), "got {err:?}");
        std::thread::sleep(Duration::from_millis(20));
        match s.send(&accepted, Checkpoint::Immediate) {
            Ok(()) => accepted += 1,
            Err(Error::WouldBlock { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(accepted >= 4, "only {accepted} messages accepted");
    // The port holds its capacity and not one more; the channel stays full.
    assert_eq!(port.len(), 4);
    let again = s.send(&accepted, Checkpoint::Immediate);
    assert!(matches!(again, Err(Error::WouldBlock { .. })), "a full port and channel took another message: {again:?}");
    for i in 0..accepted {
        let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i} of {accepted}: {e}"));
        assert_eq!(m.value, i, "lost, repeated or reordered");
    }
    assert!(matches!(port.recv_timeout(Duration::from_millis(50)), Err(Error::DeadlineExceeded)));
    // Room again.
    s.send(&7, Checkpoint::Immediate).unwrap();
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 7);
}

/// A send to a port that was closed (dropped) fails with `NoSuchEndpoint`.
fn send_to_closed_port_is_no_such_endpoint(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let id = port.id();
    let s = tx.sender::<u32>(id);
    s.send(&1, Checkpoint::OnReceipt).unwrap();
    drop(port);
    for cp in [Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn] {
        match s.send(&2, cp) {
            Err(Error::NoSuchEndpoint(e)) => assert_eq!(e, id, "{cp:?}"),
            r => panic!("{cp:?}: expected NoSuchEndpoint, got {r:?}"),
        }
    }
    // An endpoint that never existed on a live team.
    let never = rx.id().endpoint(999_999).unwrap();
    assert!(
        matches!(tx.sender::<u32>(never).send(&3, Checkpoint::OnReceipt), Err(Error::NoSuchEndpoint(e)) if e == never)
    );
    // `Immediate` learns nothing and succeeds; the team goes on working.
    s.send(&4, Checkpoint::Immediate).unwrap();
    let port = rx.open_port::<u32>().unwrap();
    tx.sender::<u32>(port.id()).send(&5, Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, 5);
}

/// Closing a port fails the sends still waiting in it for delivery.
fn closing_a_port_fails_the_sends_waiting_in_it(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let id = port.id();
    let raw = tx.raw_sender(id);
    let d1 = raw.send_async(&codec::encode(&1u32).unwrap(), Checkpoint::OnDelivery);
    let d2 = raw.send_async(&codec::encode(&2u32).unwrap(), Checkpoint::OnReturn);
    wait_until("both messages are in the port", || port.len() == 2);
    drop(port);
    assert!(matches!(within(&tx, PATIENCE, d1), Err(Error::NoSuchEndpoint(e)) if e == id));
    assert!(matches!(within(&tx, PATIENCE, d2), Err(Error::NoSuchEndpoint(e)) if e == id));
}

/// Named ports: connect by name, `NameTaken` for a duplicate, `NameNotFound`
/// for a missing or released name.
fn names(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_named_port::<String>("orders.v1").unwrap();
    assert_eq!(port.as_raw().name(), Some("orders.v1"));
    assert_eq!(tx.lookup("orders.v1").unwrap(), port.id());
    assert_eq!(rx.lookup("orders.v1").unwrap(), port.id());
    let s = tx.connect::<String>("orders.v1").unwrap();
    assert_eq!(s.to(), port.id());
    s.send(&"hi".into(), Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_timeout(PATIENCE).unwrap().value, "hi");

    for team in [&rx, &tx] {
        match team.open_named_port::<String>("orders.v1") {
            Err(Error::NameTaken { name, owner }) => assert_eq!((name.as_str(), owner), ("orders.v1", port.id())),
            Err(e) => panic!("expected NameTaken, got {e:?}"),
            Ok(_) => panic!("expected NameTaken, got a second port"),
        }
        assert!(matches!(team.open_named_raw_port("orders.v1"), Err(Error::NameTaken { .. })));
    }
    // The failed attempts did not disturb the binding.
    assert_eq!(tx.lookup("orders.v1").unwrap(), port.id());

    assert!(matches!(tx.lookup("missing"), Err(Error::NameNotFound(n)) if n == "missing"));
    assert!(matches!(tx.connect::<String>("missing"), Err(Error::NameNotFound(n)) if n == "missing"));
    assert!(matches!(tx.lookup("../etc"), Err(Error::InvalidName(_))));
    assert!(matches!(rx.open_named_port::<u8>(".hidden"), Err(Error::InvalidName(_))));

    // Dropping the port releases the name; it can be bound again.
    drop(port);
    assert!(matches!(tx.lookup("orders.v1"), Err(Error::NameNotFound(_))));
    let again = tx.open_named_port::<String>("orders.v1").unwrap();
    assert_eq!(rx.lookup("orders.v1").unwrap(), again.id());
    rx.connect::<String>("orders.v1").unwrap().send(&"back".into(), Checkpoint::OnReceipt).unwrap();
    assert_eq!(again.recv_timeout(PATIENCE).unwrap().value, "back");
}

/// `recv_timeout` on an empty port gives `DeadlineExceeded` after about the limit.
fn recv_timeout_gives_deadline_exceeded(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (_tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let raw = rx.open_raw_port().unwrap();
    let t0 = Instant::now();
    assert!(matches!(port.recv_timeout(Duration::from_millis(60)), Err(Error::DeadlineExceeded)));
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(60), "gave up early, after {took:?}");
    assert!(took < Duration::from_secs(2), "gave up late, after {took:?}");
    assert!(matches!(raw.recv_timeout(Duration::ZERO), Err(Error::DeadlineExceeded)));
}

/// A sender `with_timeout` whose `OnReturn` message is never answered gets
/// `DeadlineExceeded`; the late answer afterwards harms nothing.
fn call_with_timeout_unanswered(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id()).with_timeout(Duration::from_millis(100));

    // Nobody receives at all.
    let t0 = Instant::now();
    assert!(matches!(s.call::<u32>(&1), Err(Error::DeadlineExceeded)));
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(100) && took < Duration::from_secs(2), "took {took:?}");

    // The receiver takes the message but sits on it.
    let held = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let (h, r) = (held.clone(), release.clone());
    let server = std::thread::spawn(move || {
        let first = port.recv_timeout(PATIENCE).unwrap();
        assert_eq!(first.value, 1);
        let m = port.recv_timeout(PATIENCE).unwrap();
        assert_eq!(m.value, 2);
        h.store(true, Ordering::SeqCst);
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        m.reply(&20u32).unwrap(); // too late: nobody waits any more
        drop(first); // and a refusal nobody waits for either
        let m = port.recv_timeout(PATIENCE).unwrap();
        let v = m.value;
        m.reply(&(v * 10)).unwrap();
    });
    let t0 = Instant::now();
    assert!(matches!(s.call::<u32>(&2), Err(Error::DeadlineExceeded)));
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(held.load(Ordering::SeqCst), "the receiver had the message");
    release.store(true, Ordering::SeqCst);
    // A later call is answered normally, with its own reply.
    let s = tx.sender::<u32>(s.to()).with_timeout(PATIENCE);
    assert_eq!(s.call::<u32>(&3).unwrap(), 30);
    server.join().unwrap();
}

/// `Select` over a port that is never empty and a quiet one: every quiet
/// message is taken within one round of selects (two here, three with three
/// ports), and the busy port's messages still come in order.
fn select_is_fair(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let busy = rx.open_port::<u32>().unwrap();
    let busy2 = rx.open_port::<u32>().unwrap();
    let quiet = rx.open_port::<u32>().unwrap();
    let to_busy = tx.sender::<u32>(busy.id());
    let to_busy2 = tx.sender::<u32>(busy2.id());
    let to_quiet = tx.sender::<u32>(quiet.id());
    let immediate = |s: &ferry::Sender<u32>, v: u32| loop {
        match s.send(&v, Checkpoint::Immediate) {
            Err(Error::WouldBlock { .. }) => std::thread::sleep(Duration::from_millis(1)),
            r => break r.unwrap(),
        }
    };
    for i in 0..1000 {
        immediate(&to_busy, i);
    }
    for i in 0..300 {
        immediate(&to_busy2, i);
    }
    wait_until("the busy ports are filled", || busy.len() == 1000 && busy2.len() == 300);

    let mut next_busy = 0;
    let mut quiet_sent = 0;
    let mut round = |sel: &mut Select, quiet_index: usize, ports: usize, next_busy: &mut u32| {
        immediate(&to_quiet, quiet_sent);
        wait_until("the quiet message is in its port", || quiet.len() == 1);
        for attempt in 0..ports {
            let (i, m) = within(&rx, PATIENCE, sel.recv()).unwrap();
            if i == quiet_index {
                assert_eq!(Port::<u32>::decode(m).unwrap().value, quiet_sent);
                quiet_sent += 1;
                return;
            }
            if ports == 2 {
                // Only the first busy port is in two-port selects.
                assert_eq!(Port::<u32>::decode(m).unwrap().value, *next_busy, "busy port out of order");
                *next_busy += 1;
            }
            assert!(attempt + 1 < ports, "the quiet message was passed over {ports} times");
        }
    };
    let mut sel = Select::new(&[busy.as_raw(), quiet.as_raw()]);
    for _ in 0..150 {
        round(&mut sel, 1, 2, &mut next_busy);
    }
    let mut sel = Select::new(&[quiet.as_raw(), busy.as_raw()]);
    for _ in 0..150 {
        round(&mut sel, 0, 2, &mut next_busy);
    }
    let mut sel = Select::new(&[busy.as_raw(), busy2.as_raw(), quiet.as_raw()]);
    for _ in 0..100 {
        round(&mut sel, 2, 3, &mut next_busy);
    }
    assert_eq!(quiet_sent, 400, "the quiet port got every message");
    assert!(quiet.is_empty());
    assert!(!busy.is_empty() && !busy2.is_empty(), "the busy ports were never empty");
}

/// `Select` waits for whichever port gets a message first.
fn select_waits_for_any_port(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let a = rx.open_raw_port().unwrap();
    let b = rx.open_raw_port().unwrap();
    let to_b = tx.raw_sender(b.id());
    let mut sel = Select::new(&[&a, &b]);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        to_b.send(b"late", Checkpoint::OnReceipt).unwrap();
    });
    let (i, m) = within(&rx, PATIENCE, sel.recv()).unwrap();
    assert_eq!((i, m.payload()), (1, &b"late"[..]));
    t.join().unwrap();
}

/// Tasks on the teams' processors exchange messages; join handles return
/// the tasks' values.
fn spawned_tasks_exchange_messages(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let ping = rx.open_port::<u64>().unwrap();
    let pong = tx.open_port::<u64>().unwrap();
    let to_ping = tx.sender::<u64>(ping.id());
    let to_pong = rx.sender::<u64>(pong.id());
    const N: u64 = 200;
    let server = rx.spawn(async move {
        let mut sum = 0;
        for _ in 0..N {
            let m = ping.recv().await?;
            sum += m.value;
            to_pong.send_async(&(m.value * 2), Checkpoint::OnReceipt).await?;
        }
        Ok::<u64, Error>(sum)
    });
    let client = tx.spawn(async move {
        for i in 0..N {
            let cp = [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery][i as usize % 3];
            to_ping.send_async(&i, cp).await?;
            let m = pong.recv().await?;
            assert_eq!(m.value, i * 2);
        }
        Ok::<&'static str, Error>("client done")
    });
    assert_eq!(within(&tx, PATIENCE, client).unwrap().unwrap(), "client done");
    assert_eq!(within(&rx, PATIENCE, server).unwrap().unwrap(), N * (N - 1) / 2);

    // A task answering calls (OnReturn) from another team's task.
    let svc = rx.open_port::<u32>().unwrap();
    let caller = tx.sender::<u32>(svc.id());
    let server = rx.spawn(async move {
        for _ in 0..10 {
            let m = svc.recv().await.unwrap();
            let v = m.value;
            m.reply(&(v + 1)).unwrap();
        }
    });
    let client = tx.spawn(async move {
        let mut out = Vec::new();
        for i in 0..10u32 {
            out.push(caller.call_async::<u32>(&i).await.unwrap());
        }
        out
    });
    assert_eq!(within(&tx, PATIENCE, client).unwrap(), (1..=10).collect::<Vec<u32>>());
    within(&rx, PATIENCE, server).unwrap();
}

/// A task that panics gives `Error::Panicked`; the team goes on.
fn panicking_task_gives_panicked(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = teams(p, dir.path(), defaults);
    let h = tx.spawn(async { panic!("static message") });
    assert!(matches!(within(&tx, PATIENCE, h), Err(Error::Panicked(_))));
    let h = tx.spawn(async move {
        if Instant::now().elapsed() < Duration::from_secs(3600) {
            panic!("boom {}", 7);
        }
        1u8
    });
    assert!(matches!(within(&tx, PATIENCE, h), Err(Error::Panicked(_))));
    // The processor survived.
    assert_eq!(within(&tx, PATIENCE, tx.spawn(async { 41 + 1 })).unwrap(), 42);
}

/// `Error::Panicked` carries the task's panic message (both `&str` and `String` payloads).
fn panicked_error_carries_the_panic_message(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = teams(p, dir.path(), defaults);
    let h = tx.spawn(async { panic!("static message") });
    match within(&tx, PATIENCE, h) {
        Err(Error::Panicked(msg)) => assert_eq!(msg, "static message"),
        r => panic!("expected Panicked, got {r:?}"),
    }
    let h = tx.spawn(async move {
        if Instant::now().elapsed() < Duration::from_secs(3600) {
            panic!("boom {}", 7);
        }
        1u8
    });
    match within(&tx, PATIENCE, h) {
        Err(Error::Panicked(msg)) => assert_eq!(msg, "boom 7"),
        r => panic!("expected Panicked, got {r:?}"),
    }
}

/// `Team::sleep` completes after its duration, in a task and from a thread.
fn team_sleep(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let t0 = Instant::now();
    let sleeps = (rx.sleep(Duration::from_millis(40)), rx.sleep(Duration::from_millis(80)));
    let h = rx.spawn(async move {
        sleeps.1.await;
        let second = Instant::now();
        sleeps.0.await; // already due
        second
    });
    let second = within(&rx, PATIENCE, h).unwrap();
    assert!(second - t0 >= Duration::from_millis(80), "woke after {:?}", second - t0);
    assert!(second - t0 < Duration::from_secs(2), "woke after {:?}", second - t0);

    let t0 = Instant::now();
    tx.block_on(tx.sleep(Duration::from_millis(30)));
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(2), "took {took:?}");
    tx.block_on(tx.sleep(Duration::ZERO));
}

/// Leaving fails what waits: on the same team with `Shutdown`, across teams
/// (the peer left) with `PeerGone`; later sends find no team.
fn shutdown_fails_what_waits(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    s.send(b"first", Checkpoint::OnReceipt).unwrap();
    let d = s.send_async(b"waits", Checkpoint::OnDelivery);
    wait_until("both messages are in the port", || port.len() == 2);
    rx.shutdown();
    assert!(matches!(port.recv_timeout(Duration::from_millis(10)), Err(Error::Shutdown)));
    let r = within(&tx, PATIENCE, d);
    match p {
        Placement::SameTeam => assert!(matches!(r, Err(Error::Shutdown)), "got {r:?}"),
        Placement::TwoTeams => {
            assert!(matches!(r, Err(Error::PeerGone { peer }) if peer == rx.id()), "got {r:?}");
            let r = s.send(b"later", Checkpoint::OnReceipt);
            assert!(matches!(r, Err(Error::NoSuchTeam(t) | Error::PeerGone { peer: t }) if t == rx.id()), "got {r:?}");
        }
    }
}

/// ferry futures are ordinary futures: a tokio runtime awaits `recv` and a
/// `Delivery`, calls, and join handles, while the teams' processors move
/// the messages.
async fn tokio_awaits_ferry_futures(p: Placement) {
    use tokio::time::timeout;
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), defaults);
    assert!(tx.config().processors >= 1 && rx.config().processors >= 1);
    let port = rx.open_port::<String>().unwrap();

    let raw = tx.raw_sender(port.id());
    let mut d = raw.send_async(&codec::encode("hello").unwrap(), Checkpoint::OnDelivery);
    let mut waited = 0;
    while port.is_empty() {
        assert!(waited < 5000, "the message never reached the port");
        tokio::time::sleep(Duration::from_millis(1)).await;
        waited += 1;
    }
    assert!(poll_once(Pin::new(&mut d)).is_pending(), "OnDelivery completed before the receive");
    let m = timeout(PATIENCE, port.recv()).await.expect("recv timed out").unwrap();
    assert_eq!(m.value, "hello");
    assert_eq!(timeout(PATIENCE, d).await.expect("Delivery timed out").unwrap(), Vec::<u8>::new());

    // Caller and server both in this tokio task.
    let s = tx.sender::<String>(port.id());
    let (reply, ()) = timeout(PATIENCE, async {
        tokio::join!(s.call_async::<String>(&"q".to_string()), async {
            let m = port.recv().await.unwrap();
            let v = m.value.clone();
            m.reply(&format!("re:{v}")).unwrap();
        })
    })
    .await
    .expect("call timed out");
    assert_eq!(reply.unwrap(), "re:q");

    // A ferry task's join handle, and a ferry sleep, awaited by tokio.
    let h = rx.spawn(async { 6 * 7 });
    assert_eq!(timeout(PATIENCE, h).await.unwrap().unwrap(), 42);
    let t0 = Instant::now();
    timeout(PATIENCE, rx.sleep(Duration::from_millis(20))).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(20));
}

macro_rules! placements {
    ($($case:ident),* $(,)? ; known_bugs: $($bug:ident => $why:literal),* $(,)?) => {
        // Bugs found and fixed are listed as cases; `known_bugs` holds what still fails.
        mod same_team {
            use super::*;
            $( #[test] fn $case() { super::$case(Placement::SameTeam) } )*
            $( #[test] #[ignore = $why] fn $bug() { super::$bug(Placement::SameTeam) } )*
            #[tokio::test]
            async fn tokio_awaits_ferry_futures() { super::tokio_awaits_ferry_futures(Placement::SameTeam).await }
        }
        mod two_teams {
            use super::*;
            $( #[test] fn $case() { super::$case(Placement::TwoTeams) } )*
            $( #[test] #[ignore = $why] fn $bug() { super::$bug(Placement::TwoTeams) } )*
            #[tokio::test]
            async fn tokio_awaits_ferry_futures() { super::tokio_awaits_ferry_futures(Placement::TwoTeams).await }
        }
    };
}

#[allow(dead_code)]
fn _types_are_send(port: Port<u32>, raw: RawPort) -> impl Send {
    (port, raw)
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

/// A sender waiting for room in a full channel must be woken when the
/// receiver makes room, not by its park timeout.
///
/// A missed wake-up costs a whole park timeout, so the timeout is long and
/// the bound half of it: 4 MiB in ~1000 ring-fulls takes well under a second
/// even on a loaded 2-core machine (each refill may wait for a CPU), but a
/// single wake-up left to the timeout exceeds the bound.
fn sender_blocked_on_a_full_channel_is_woken_promptly(p: Placement) {
    const PARK: Duration = Duration::from_secs(6);
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), |b| b.park_timeout(PARK).ring_bytes(4096));
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    let body = pattern(1, 4 << 20);
    for round in 0..40 {
        let t0 = Instant::now();
        s.send(&body, Checkpoint::OnReceipt).unwrap();
        let took = t0.elapsed();
        assert!(took < PARK / 2, "round {round}: 4 MiB through a 4 KiB ring took {took:?}");
        assert_eq!(port.recv_timeout(PATIENCE).unwrap().payload().len(), body.len());
    }
}

/// Messages held back because their port was full must move in as soon as
/// the receiver takes one, also when the receiver does not drive the team
/// (`try_recv`, or a future awaited by another executor).
fn full_port_takes_waiting_messages_once_drained(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), |b| b.park_timeout(Duration::from_secs(1)).inbox_capacity(2));
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id());
    let sender = std::thread::spawn(move || {
        (0..6u32)
            .map(|i| {
                let t0 = Instant::now();
                s.send(&i, Checkpoint::OnReceipt).unwrap();
                t0.elapsed()
            })
            .collect::<Vec<_>>()
    });
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
    let took = sender.join().unwrap();
    assert_eq!(next, 6);
    assert!(took.iter().all(|t| *t < Duration::from_millis(500)), "OnReceipt sends took {took:?}");
}

/// `with_timeout` bounds a send that cannot even be written because the
/// channel is full (nobody receives).
fn with_timeout_bounds_a_send_blocked_on_a_full_channel(p: Placement) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(p, dir.path(), |b| b.inbox_capacity(1).ring_bytes(4096));
    let port = rx.open_port::<u32>().unwrap();
    let s = tx.sender::<u32>(port.id());
    // Fill the port, then the channel.
    let fill = || (0..1_000_000).find(|_| s.send(&0, Checkpoint::Immediate).is_err()).expect("never pushed back");
    fill();
    wait_until("the port is full", || port.len() == 1);
    fill();
    let s = s.with_timeout(Duration::from_millis(50));
    let (done, result) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = s.send(&1, Checkpoint::OnReceipt);
        let _ = done.send((r, t0.elapsed()));
    });
    let outcome = result.recv_timeout(Duration::from_secs(2));
    drop((port, rx, tx)); // unblocks the sender (Shutdown) if it is still stuck
    t.join().unwrap();
    match outcome {
        Ok((Err(Error::DeadlineExceeded), took)) => assert!(took < Duration::from_secs(1), "took {took:?}"),
        Ok((r, took)) => panic!("expected DeadlineExceeded, got {r:?} after {took:?}"),
        Err(_) => panic!("a send with a 50 ms time limit was still blocked after 2 s"),
    }
}

/// A message larger than the receiving team's `max_message` fails the send
/// with an error; it must not hang the sender or silently kill the channel.
#[test]

fn message_over_the_receivers_limit_fails_the_sender() {
    let dir = tempfile::tempdir().unwrap();
    let tx = builder(dir.path()).start().unwrap();
    let rx = builder(dir.path()).max_message(100_000).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    // A message waiting in the port (it refers to the channel it came by).
    s.send(b"before", Checkpoint::OnReceipt).unwrap();
    let (done, result) = std::sync::mpsc::channel();
    let big = s.clone();
    let t = std::thread::spawn(move || {
        let _ = done.send(big.send(&vec![1u8; 200_000], Checkpoint::OnReceipt));
    });
    let outcome = result.recv_timeout(Duration::from_secs(5));
    let after = outcome.is_ok().then(|| s.with_timeout(Duration::from_secs(2)).send(b"after", Checkpoint::OnReceipt));
    drop((port, rx, tx)); // unblocks the sender (Shutdown) if it is still stuck
    t.join().unwrap();
    match outcome {
        Ok(Err(Error::Refused(_) | Error::TooLarge { .. })) => {}
        Ok(r) => panic!("expected Refused or TooLarge, got {r:?}"),
        Err(_) => panic!("the sender of a too-large message was still blocked after 5 s"),
    }
    assert!(matches!(after, Some(Ok(_))), "the channel is unusable after a too-large message: {after:?}");
}

placements!(
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
    recv_timeout_gives_deadline_exceeded,
    call_with_timeout_unanswered,
    select_is_fair,
    select_waits_for_any_port,
    spawned_tasks_exchange_messages,
    panicking_task_gives_panicked,
    team_sleep,
    panicked_error_carries_the_panic_message,
    shutdown_fails_what_waits,
    sender_blocked_on_a_full_channel_is_woken_promptly,
    full_port_takes_waiting_messages_once_drained,
    with_timeout_bounds_a_send_blocked_on_a_full_channel
    ;
    known_bugs:
);

// ------------------------------------------------- review regressions

/// A peer that sends many messages and leaves at once: every message is
/// still received (the channel is finished only when drained).
#[test]
fn nothing_is_lost_when_a_peer_leaves_right_after_sending() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Team::builder().runtime_dir(dir.path()).spin(Duration::from_micros(5)).start().unwrap();
    let port = rx.open_raw_port().unwrap();
    {
        let tx = Team::builder().runtime_dir(dir.path()).ring_bytes(1 << 20).start().unwrap();
        let to = tx.raw_sender(port.id());
        for i in 0..300u32 {
            to.send(&i.to_le_bytes(), Checkpoint::Immediate).unwrap();
        }
        tx.shutdown();
    }
    for i in 0..300u32 {
        let m = port.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!(m.payload(), i.to_le_bytes());
    }
}

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
