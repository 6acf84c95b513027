//! The control backlog's bound (defect 3), seen from a peer that never
//! reads its ring: a raw shared-memory end bound to a team, posing as
//! another team of this process (the acceptor checks the pid only).

use super::channel::{Channel, CONTROL_BACKLOG};
use crate::id::TeamId;
use crate::transport::doorbell::Doorbell;
use crate::transport::shm::{self, BindConfig, ShmEnd};
use crate::transport::{inproc, Body, Recv, SendError, Transport};
use crate::wire::{Checkpoint, Header, Kind, NackReason};
use crate::{RawMessage, Team};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(10);

/// A peer's raw end of a channel to `team`, bound as `posing_as`, with
/// 4 KiB rings (about 85 frames each).
struct RawPeer {
    end: ShmEnd,
    me: TeamId,
}

impl RawPeer {
    fn bind(team: &Team, posing_as: &Team) -> RawPeer {
        let socket = UnixStream::connect(team.names().dir().team_socket(team.id().team)).unwrap();
        let cfg = BindConfig {
            me: posing_as.id(),
            doorbell: Arc::new(Doorbell::create().unwrap()),
            ring_bytes: 4096,
            max_ring_bytes: 4096,
            area_bytes: 4096,
            handshake_timeout: shm::HANDSHAKE_TIMEOUT,
            cooler: None,
            lease: None,
        };
        let end = shm::connect(socket, &cfg, team.id()).unwrap();
        RawPeer { end, me: posing_as.id() }
    }

    fn data(&self, to: crate::EndpointId, call_id: u64, checkpoint: Checkpoint) -> Header {
        Header::new(Kind::Data, self.me.endpoint(1).unwrap().addr(), to.addr(), call_id).with_checkpoint(checkpoint)
    }

    /// Writes frames `h(i)` for i = first.. until the ring stays full for
    /// `quiet`, or `most` are written; returns how many were.
    fn flood(&self, first: u64, most: u64, quiet: Duration, h: impl Fn(u64) -> Header) -> u64 {
        let mut i = first;
        let mut full_since: Option<Instant> = None;
        while i < first + most {
            match self.end.try_send(&h(i), &[]) {
                Ok(()) => {
                    i += 1;
                    full_since = None;
                }
                Err(SendError::Full) => {
                    if full_since.get_or_insert_with(Instant::now).elapsed() >= quiet {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        i - first
    }

    /// Reads what the team sent until `done` says so (or `PATIENCE` passes).
    fn read_until(&self, mut each: impl FnMut(&Header, &[u8]), done: impl Fn() -> bool) {
        let until = Instant::now() + PATIENCE;
        while !done() {
            assert!(Instant::now() < until, "the team's answers did not all come");
            let got = self
                .end
                .try_recv(&mut |h, body| {
                    match body {
                        Body::Inline(p) => each(h, p),
                        Body::Detached(_) => panic!("a detached answer"),
                    }
                    true
                })
                .unwrap();
            if got == Recv::Empty {
                // Gives consumed space back, which wakes the team's flush.
                self.end.tidy();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Waits until `cond` holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The team's channel to `peer`.
fn channel_to(team: &Team, peer: TeamId) -> Arc<Channel> {
    let until = Instant::now() + PATIENCE;
    loop {
        if let Some(ch) = team.inner.channels.snapshot().iter().find(|c| c.peer == peer) {
            return ch.clone();
        }
        assert!(Instant::now() < until, "the bind never completed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A thread receiving everything `port` gets; `OnReturn` messages are kept in `calls`.
fn receive_all(port: crate::RawPort, stop: Arc<AtomicBool>) -> (Arc<AtomicUsize>, Arc<Mutex<Vec<RawMessage>>>) {
    let got = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (g, c) = (got.clone(), calls.clone());
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(m) = port.recv_timeout(Duration::from_millis(20)) {
                g.fetch_add(1, Ordering::Relaxed);
                if m.wants_reply() {
                    c.lock().unwrap().push(m);
                }
            }
        }
    });
    (got, calls)
}

fn start(dir: &std::path::Path) -> Team {
    Team::builder().runtime_dir(dir).start().unwrap()
}

/// Regression (defect 3): a peer that sends `OnReceipt` messages but never
/// reads its ring grew the team's control backlog by one ack per message,
/// without end (here: all 20 000 frames were taken). Now the team stops
/// taking that peer's frames at the bound: the peer's sends back up, and
/// the backlog never passes `CONTROL_BACKLOG`. Once the peer reads, every
/// ack arrives and the team takes the rest.
#[test]
fn a_peer_that_never_reads_its_ring_backs_up_at_the_control_backlog_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (team, posing) = (start(dir.path()), start(dir.path()));
    let port = team.open_raw_port().unwrap();
    let to = port.id();
    let stop = Arc::new(AtomicBool::new(false));
    let (got, _) = receive_all(port, stop.clone());
    let peer = RawPeer::bind(&team, &posing);
    let ch = channel_to(&team, posing.id());
    const MOST: u64 = 20_000;
    let sent = peer.flood(1, MOST, Duration::from_millis(300), |i| peer.data(to, i, Checkpoint::OnReceipt));
    let backlog = ch.backlog_len();
    eprintln!("sent {sent}, received {}, backlog {backlog}", got.load(Ordering::Relaxed));
    assert!(sent < MOST, "the team took all {MOST} frames of a peer that reads none of its answers");
    assert!(backlog <= CONTROL_BACKLOG, "backlog of {backlog} frames");
    // Two 4 KiB rings hold about 85 frames each: the rest is the backlog.
    assert!(sent as usize <= CONTROL_BACKLOG + 2 * 100, "{sent} frames taken");
    // The peer reads: every message is acknowledged, in order, and the team takes the rest.
    let acked = AtomicUsize::new(0);
    peer.read_until(
        |h, _| {
            assert_eq!((h.kind, h.call_id), (Kind::Ack, acked.load(Ordering::Relaxed) as u64 + 1), "lost or reordered");
            acked.fetch_add(1, Ordering::Relaxed);
        },
        || acked.load(Ordering::Relaxed) as u64 == sent,
    );
    eventually("every message is received", || got.load(Ordering::Relaxed) as u64 == sent);
    // The channel works as before: more messages, promptly acknowledged.
    let more = peer.flood(sent + 1, 50, Duration::from_secs(1), |i| peer.data(to, i, Checkpoint::OnReceipt));
    assert_eq!(more, 50);
    peer.read_until(|_, _| {}, || ch.backlog_len() == 0 && got.load(Ordering::Relaxed) as u64 == sent + 50);
    stop.store(true, Ordering::Relaxed);
}

/// Nacks count as answers too: a peer sending to an endpoint that does not
/// exist, never reading, stops at the bound as well.
#[test]
fn nacks_to_a_peer_that_never_reads_stay_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (team, posing) = (start(dir.path()), start(dir.path()));
    let peer = RawPeer::bind(&team, &posing);
    let ch = channel_to(&team, posing.id());
    let nowhere = team.id().endpoint(999_999).unwrap();
    let sent = peer.flood(1, 20_000, Duration::from_millis(300), |i| peer.data(nowhere, i, Checkpoint::OnReceipt));
    assert!(sent < 20_000, "the team took every frame");
    assert!(ch.backlog_len() <= CONTROL_BACKLOG, "backlog of {} frames", ch.backlog_len());
    let nacked = AtomicUsize::new(0);
    peer.read_until(
        |h, p| {
            assert_eq!((h.kind, p[0]), (Kind::Nack, NackReason::NoSuchEndpoint as u8));
            nacked.fetch_add(1, Ordering::Relaxed);
        },
        || nacked.load(Ordering::Relaxed) as u64 == sent,
    );
}

/// A reply to a call the team admitted is never refused for lack of
/// backlog room: with the backlog at its bound it waits behind it, in the
/// channel (the replying thread goes on at once), and arrives once the
/// peer reads. The nack of a
/// responder dropped unanswered is never refused either: it joins the full
/// backlog (one frame past the bound, standing for a message taken before).
#[test]
fn replies_and_their_nacks_pass_a_full_control_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (team, posing) = (start(dir.path()), start(dir.path()));
    let port = team.open_raw_port().unwrap();
    let to = port.id();
    let stop = Arc::new(AtomicBool::new(false));
    let (got, calls) = receive_all(port, stop.clone());
    let peer = RawPeer::bind(&team, &posing);
    let ch = channel_to(&team, posing.id());
    // Two calls, admitted before the flood.
    for call in [1, 2] {
        assert_eq!(peer.flood(call, 1, PATIENCE, |i| peer.data(to, i, Checkpoint::OnReturn)), 1);
    }
    eventually("the calls arrive", || calls.lock().unwrap().len() == 2);
    let sent = peer.flood(3, 20_000, Duration::from_millis(300), |i| peer.data(to, i, Checkpoint::OnReceipt));
    assert_eq!(ch.backlog_len(), CONTROL_BACKLOG, "the flood should fill the backlog");
    let (answer, dropped) = {
        let mut c = calls.lock().unwrap();
        (c.remove(0), c.remove(0))
    };
    let (done, replied) = mpsc::channel();
    std::thread::spawn(move || done.send(answer.reply(b"the answer")).unwrap());
    drop(dropped);
    assert_eq!(ch.backlog_len(), CONTROL_BACKLOG + 1, "the dropped call's nack was refused");
    replied.recv_timeout(PATIENCE).expect("the replying thread waited for room").unwrap();
    // The peer reads: the acks, the nack and the reply all come, control frames first.
    let (acks, nack, reply) = (AtomicUsize::new(0), AtomicBool::new(false), AtomicBool::new(false));
    peer.read_until(
        |h, p| match h.kind {
            Kind::Ack => {
                acks.fetch_add(1, Ordering::Relaxed);
            }
            Kind::Nack => {
                assert_eq!((h.call_id, p[0]), (2, NackReason::NoReply as u8));
                nack.store(true, Ordering::Relaxed);
            }
            Kind::Reply => {
                assert_eq!((h.call_id, p), (1, &b"the answer"[..]));
                assert!(nack.load(Ordering::Relaxed), "the reply overtook the backlog");
                reply.store(true, Ordering::Relaxed);
            }
            k => panic!("unexpected {k:?}"),
        },
        || acks.load(Ordering::Relaxed) as u64 == sent && reply.load(Ordering::Relaxed),
    );
    eventually("every message is received", || got.load(Ordering::Relaxed) as u64 == sent + 2);
    stop.store(true, Ordering::Relaxed);
}

/// Cancels come from `Drop` and cannot wait: one per call is queued, and
/// past the bound they are dropped. Answers are never dropped.
#[test]
fn cancels_are_coalesced_and_dropped_past_the_bound() {
    let doorbell = Arc::new(Doorbell::create().unwrap());
    let (ours, theirs) = inproc::pair(4096, 0, doorbell.clone(), doorbell);
    let me = TeamId { node: 0, team: 1, incarnation: 1 };
    let ch = Channel::new(TeamId { node: 0, team: 2, incarnation: 1 }, Box::new(ours));
    let (src, dst) = (me.endpoint(1).unwrap().addr(), ch.peer.endpoint(1).unwrap().addr());
    let cancel = |call| Header::new(Kind::Cancel, src, dst, call);
    let ack = |call| Header::new(Kind::Ack, src, dst, call);
    while ch.transport.try_send(&ack(0), &[]).is_ok() {}
    ch.send_cancel(cancel(7));
    ch.send_cancel(cancel(7));
    assert_eq!(ch.backlog_len(), 1, "a call's cancel queued twice");
    for call in 1..CONTROL_BACKLOG as u64 {
        ch.send_control(ack(call), Vec::new());
    }
    assert_eq!(ch.backlog_len(), CONTROL_BACKLOG);
    ch.send_cancel(cancel(8));
    assert_eq!(ch.backlog_len(), CONTROL_BACKLOG, "a cancel joined a full backlog");
    ch.send_control(ack(CONTROL_BACKLOG as u64), Vec::new());
    assert_eq!(ch.backlog_len(), CONTROL_BACKLOG + 1, "an answer was refused");
    // Everything queued goes out, in order, as the peer reads.
    let mut seen = Vec::new();
    while !ch.flush_backlog() {
        while theirs.try_recv(&mut |h, _| {
            seen.push((h.kind, h.call_id));
            true
        }) == Ok(Recv::Consumed)
        {}
    }
    while theirs.try_recv(&mut |h, _| {
        seen.push((h.kind, h.call_id));
        true
    }) == Ok(Recv::Consumed)
    {}
    let seen: Vec<_> = seen.into_iter().filter(|&(k, c)| !(k == Kind::Ack && c == 0)).collect();
    assert_eq!(seen[0], (Kind::Cancel, 7));
    assert_eq!(seen.len(), CONTROL_BACKLOG + 1);
    assert!(!seen.contains(&(Kind::Cancel, 8)));
    assert!(seen[1..].iter().enumerate().all(|(i, &(k, c))| k == Kind::Ack && c == i as u64 + 1));
}

/// Data waits while control frames are backlogged: the peer that reads our
/// ring gets our answers first, before anything that would need one.
#[test]
fn data_waits_behind_backlogged_control_frames() {
    let dir = tempfile::tempdir().unwrap();
    let team = start(dir.path());
    let doorbell = Arc::new(Doorbell::create().unwrap());
    let (ours, theirs) = inproc::pair(4096, 0, doorbell.clone(), doorbell);
    let ch = Arc::new(Channel::new(TeamId { node: 0, team: 2, incarnation: 1 }, Box::new(ours)));
    let (src, dst) = (team.id().endpoint(1).unwrap().addr(), ch.peer.endpoint(1).unwrap().addr());
    let ack = Header::new(Kind::Ack, src, dst, 1);
    while ch.transport.try_send(&ack, &[]).is_ok() {}
    ch.send_control(ack, Vec::new());
    let mut kinds = Vec::new();
    let mut read = |n: usize| {
        for _ in 0..n {
            let got = theirs.try_recv(&mut |h, _| {
                kinds.push(h.kind);
                true
            });
            if got != Ok(Recv::Consumed) {
                break;
            }
        }
    };
    // Room in the ring for the backlogged ack and the data, which goes after it.
    read(3);
    let data = Header::new(Kind::Data, src, dst, 0);
    team.inner.send_message(&ch, data, b"x", false, None).unwrap();
    ch.flush_backlog();
    read(usize::MAX);
    assert_eq!(kinds.last(), Some(&Kind::Data), "data overtook a backlogged ack: {kinds:?}");
    assert!(kinds[..kinds.len() - 1].iter().all(|k| *k == Kind::Ack));
}

/// Two teams flooding each other with messages that need answers, over
/// small rings, both finish: the bound never leaves both stalled, each
/// waiting for the other to read (control frames go first, so a team that
/// reads the other's ring gets its answers before anything needing one).
/// No processors, receivers that only poll: a team reads its rings only
/// while its flooding thread waits, the worst case for backlogs.
#[test]
fn two_teams_flooding_each_other_both_finish() {
    let dir = tempfile::tempdir().unwrap();
    let start = || Team::builder().runtime_dir(dir.path()).ring_bytes(4096).processors(0).start().unwrap();
    let (a, b) = (start(), start());
    const N: usize = 30_000;
    let (pa, pb) = (a.open_raw_port().unwrap(), b.open_raw_port().unwrap());
    let (to_a, to_b) = (pa.id(), pb.id());
    let poll = |port: crate::RawPort| {
        let got = Arc::new(AtomicUsize::new(0));
        let g = got.clone();
        std::thread::spawn(move || {
            while g.load(Ordering::Relaxed) < N {
                match port.try_recv() {
                    Some(_) => g.fetch_add(1, Ordering::Relaxed),
                    None => {
                        std::thread::yield_now();
                        0
                    }
                };
            }
        });
        got
    };
    let (got_a, got_b) = (poll(pa), poll(pb));
    let max_backlog = Arc::new(AtomicUsize::new(0));
    // Flooders that have all their receipts.
    let done = Arc::new(AtomicUsize::new(0));
    let flood = |from: &Team, to, peer: TeamId| {
        let s = from.raw_sender(to);
        let (team, max_backlog, done) = (from.clone(), max_backlog.clone(), done.clone());
        std::thread::spawn(move || {
            // All sent before any is awaited (what finds no room waits in
            // the outbox), so the acks pile up at the sender's peer.
            let sends: Vec<_> = (0..N).map(|_| s.send_async(&[7; 100], Checkpoint::OnReceipt)).collect();
            team.block_on(async {
                for (i, d) in sends.into_iter().enumerate() {
                    if i % 64 == 0 {
                        max_backlog.fetch_max(channel_to(&team, peer).backlog_len(), Ordering::Relaxed);
                    }
                    d.await.unwrap();
                }
            });
            // Keep reading (the only thread that does) until both flooders
            // have all their receipts: the other's last receipts may still
            // wait in this team's control backlog for it to drain its rings.
            done.fetch_add(1, Ordering::SeqCst);
            while done.load(Ordering::SeqCst) < 2 {
                team.block_on(team.sleep(Duration::from_millis(10)));
            }
        })
    };
    let floods = [flood(&a, to_b, b.id()), flood(&b, to_a, a.id())];
    let until = Instant::now() + Duration::from_secs(60);
    while got_a.load(Ordering::Relaxed) < N || got_b.load(Ordering::Relaxed) < N {
        let (ga, gb) = (got_a.load(Ordering::Relaxed), got_b.load(Ordering::Relaxed));
        assert!(Instant::now() < until, "stalled: {ga} and {gb} of {N} received");
        std::thread::sleep(Duration::from_millis(5));
    }
    let largest = max_backlog.load(Ordering::Relaxed);
    eprintln!("largest backlog seen: {largest}");
    assert!(largest <= CONTROL_BACKLOG, "a backlog of {largest} frames");
    for f in floods {
        while !f.is_finished() {
            assert!(Instant::now() < until, "a flooder never got all its receipts");
            std::thread::sleep(Duration::from_millis(5));
        }
        f.join().unwrap();
    }
}

/// Regression (links lost frames under load): frames posted
/// (`RawSender::post`) to a peer whose ring is full wait in the outbox as
/// long as it takes. They were dropped — taken for `Immediate` sends,
/// which fail with `WouldBlock` when the outbox finds no room — whenever
/// a pass over the outbox met a full ring, so a link's frames went missing
/// in the middle of its stream. Frames posted in two pieces
/// (`RawSender::post_parts`) arrive whole, in order, either way.
#[test]
fn posted_frames_wait_for_room_and_none_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (team, posing) = (start(dir.path()), start(dir.path()));
    let peer = RawPeer::bind(&team, &posing);
    // The team registers the bind after the handshake: a post before that
    // would bind to the real `posing` team instead (it timed out so once).
    channel_to(&team, posing.id());
    let sender = team.frame_sender(posing.id().endpoint(0).unwrap(), 200).unwrap();
    // Two 4 KiB rings hold about 85 frames each: most wait in the outbox.
    const POSTED: u64 = 1_000;
    for i in 0..POSTED {
        // Every other frame in two pieces (a link's head, then its bytes):
        // written as one where it goes, or joined where it waits.
        let bytes = i.to_le_bytes();
        match i % 2 {
            0 => sender.post(&bytes).unwrap(),
            _ => sender.post_parts(&bytes[..3], &bytes[3..]).unwrap(),
        }
    }
    let next = AtomicUsize::new(0);
    peer.read_until(
        |h, p| {
            assert_eq!(h.kind, Kind::Served(200));
            let n = u64::from_le_bytes(p.try_into().unwrap());
            assert_eq!(n, next.load(Ordering::Relaxed) as u64, "a posted frame lost or reordered");
            next.fetch_add(1, Ordering::Relaxed);
        },
        || next.load(Ordering::Relaxed) as u64 == POSTED,
    );
}
