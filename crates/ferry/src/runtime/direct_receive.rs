//! Direct receive: a thread blocked on a port takes its message straight
//! from the channel's ring into the message it returns, skipping the
//! progress loop's layers (the sweep over the channels, the drain, the
//! routing and the port's inbox) and their locks but the channel's own.
//! A thread blocked on a link end takes its end's own frames itself (and
//! hands others to the links' handler), and one blocked on a call's
//! answer hands it straight to the call's slab entry.
//!
//! Only the common case goes this way: a message within its frame for the
//! waiting port (a call too, while its answer has room, as the drain
//! requires), at the head of a channel that holds none for full inboxes,
//! while the port's inbox is empty. Anything else stays in the ring for
//! the progress loop, which the waiting thread runs next. When more
//! follows a message taken so (a burst), the thread drains every channel
//! at once, as the progress loop would: the next receives find the rest
//! in the inbox.
//!
//! Order is kept: messages of one channel reach the inbox only under the
//! channel's `rx` lock, which the direct receive holds from its look at
//! the inbox to its take.

use super::channel::{Channel, Incoming, RxState};
use super::dispatch::{incoming, Drained};
use super::endpoints::EndpointInbox;
use super::payload::Payload;
use super::team::TeamInner;
use crate::error::Violation;
use crate::id::{Addr, TeamId};
use crate::transport::Body;
use crate::wire::{flags, Checkpoint, Header, Kind};
use std::sync::Arc;

/// Most frames of other kinds (releases of payload ranges, which the
/// transport takes itself) a direct receive takes before it gives up.
const PASSES: usize = 4;

#[cfg(test)]
thread_local! {
    /// Messages this thread took by a direct receive.
    static DIRECT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Served frames a waiting thread's own taker took (see `serve_direct`).
    static OWN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl TeamInner {
    /// The next message from `ch` for the endpoint at `to`, whose inbox is
    /// `inbox`, if it is a plain one at the head of the channel; `None`
    /// (the frame left where it is) otherwise, or if another thread drains
    /// the channel now. A message taken so is acked on receipt if it asks
    /// (other answers are the taker's: `port::take`).
    pub(crate) fn receive_direct(&self, ch: &Arc<Channel>, to: Addr, inbox: &EndpointInbox) -> Option<Incoming> {
        let rx = ch.rx.try_lock()?;
        // Held messages go first, and so do those in the inbox already
        // (none of this channel's can join them while `rx` is held).
        if !rx.held.is_empty() || !inbox.is_empty() {
            return None;
        }
        let mut caught = None;
        let since = crate::cost::start();
        let drained = take_head(ch, &rx, |h, body| match body {
            Body::Inline(p)
                if h.kind == Kind::Data
                    && h.dst == to
                    && h.flags & flags::HANDOVER == 0
                    && p.len() <= self.cfg.max_message
                    && ch.carries(h, self.id)
                    && !self.answer_must_wait(ch, h) =>
            {
                caught = Some(incoming(ch, h, Payload::from_slice(p), since));
                if h.checkpoint() == Checkpoint::OnReceipt {
                    self.ack(ch, h, Checkpoint::OnReceipt);
                }
                true
            }
            _ => false,
        });
        let burst = caught.is_some() && ch.transport.more_at_hand();
        self.after_drain(ch, rx, drained);
        if burst {
            // The rest of a burst goes to the inboxes now, with every other
            // channel's frames, as the progress loop would take them: the
            // next receives find them there.
            self.progress_on(&self.channels.snapshot());
        }
        #[cfg(test)]
        DIRECT.set(DIRECT.get() + u64::from(caught.is_some()));
        caught
    }

    /// The frame at the head of `ch`, if it is a plain answer (an ack,
    /// reply or nack within its frame, bringing no descriptors), handed
    /// straight to the call it answers (a thread blocked on a call: its
    /// waker says when the answer was its own). Whether one was.
    ///
    /// Answers never wait behind held messages (the drain completes them
    /// at once too), so none are looked at.
    pub(crate) fn answer_direct(&self, ch: &Arc<Channel>) -> bool {
        let Some(rx) = ch.rx.try_lock() else { return false };
        let mut answered = false;
        let drained = take_head(ch, &rx, |h, body| match body {
            Body::Inline(p)
                if matches!(h.kind, Kind::Ack | Kind::Reply | Kind::Nack)
                    && h.flags & flags::HANDOVER == 0
                    && p.len() <= self.cfg.max_message
                    && ch.carries(h, self.id) =>
            {
                self.complete(ch, h, Ok(Payload::from_slice(p)));
                answered = true;
                true
            }
            _ => false,
        });
        self.after_drain(ch, rx, drained);
        #[cfg(test)]
        DIRECT.set(DIRECT.get() + u64::from(answered));
        answered
    }

    /// The frame at the head of `ch`, if it is a served frame of one of
    /// `kinds` that needs no room for an answer, handed straight to the
    /// primitive. Whether one was.
    ///
    /// The waiting thread's own taker `mine` sees it first: a frame that
    /// asks for no answer (`Immediate`), with its header, sending team and
    /// bytes. It takes what is for itself (a link end blocked on its next
    /// message takes its own frame without the handler's lookups) and
    /// declines the rest, which goes to the kind's handler as the
    /// progress loop would send it (the handler queues it at its end).
    pub(crate) fn serve_direct(
        &self,
        ch: &Arc<Channel>,
        kinds: &std::ops::RangeInclusive<u8>,
        mine: &mut dyn FnMut(&Header, TeamId, &[u8]) -> bool,
    ) -> bool {
        let Some(rx) = ch.rx.try_lock() else { return false };
        let mut served = false;
        let drained = take_head(ch, &rx, |h, body| match (h.kind, &body) {
            (Kind::Served(k), Body::Inline(p))
                if kinds.contains(&k)
                    && h.flags & flags::HANDOVER == 0
                    && ch.carries(h, self.id)
                    && !self.answer_must_wait(ch, h) =>
            {
                let own = h.checkpoint() == Checkpoint::Immediate
                    && p.len() <= self.cfg.max_message
                    && self.serve_own(|| mine(h, ch.peer, p));
                if !own {
                    self.route_served(ch, h, body);
                }
                #[cfg(test)]
                OWN.set(OWN.get() + u64::from(own));
                served = true;
                true
            }
            _ => false,
        });
        self.after_drain(ch, rx, drained);
        #[cfg(test)]
        DIRECT.set(DIRECT.get() + u64::from(served));
        served
    }

    /// Runs a waiting thread's own taker of a served frame: whether it took
    /// it. Its panic is the handler's (see `serve_frame`): logged, the frame taken.
    fn serve_own(&self, mine: impl FnOnce() -> bool) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(mine)).unwrap_or_else(|e| {
            tracing::error!(panic = %super::panic_message(&*e), "a served frame's direct taker panicked");
            true
        })
    }
}

/// Offers `accept` the frame at the head of `ch` (its `rx` lock held: `_rx`),
/// looking past at most [`PASSES`] frames the transport takes itself (a
/// release) until one is offered; the receive's outcome, as a drain's.
#[inline(always)]
fn take_head(
    ch: &Channel,
    _rx: &parking_lot::MutexGuard<'_, RxState>,
    mut accept: impl FnMut(&Header, Body<'_>) -> bool,
) -> std::result::Result<Drained, Violation> {
    let mut drained = Ok(Drained::default());
    for _ in 0..PASSES {
        let mut offered = false;
        // SAFETY: every receive-side call on a channel's transport is made
        // under its `rx` lock, which our caller holds (`_rx`).
        let got = unsafe {
            ch.transport.try_recv_serialized(&mut |h, body| {
                offered = true;
                accept(h, body)
            })
        };
        drained = Drained::of(got);
        // Taken by the transport itself (a release): look again.
        if offered || !matches!(drained, Ok(Drained { taken: 1, .. })) {
            break;
        }
    }
    drained
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{Checkpoint, Team};
    use std::time::Duration;

    fn teams(dir: &std::path::Path) -> (Team, Team) {
        let b = || Team::builder().runtime_dir(dir).processors(0);
        (b().start().unwrap(), b().start().unwrap())
    }

    /// `n` links made by `a` to a listener of `b`: (a's end, b's end) each.
    fn links(a: &Team, b: &Team, n: usize) -> Vec<(crate::link::Link, crate::link::Link)> {
        let listener = b.link_listener().unwrap();
        let to = listener.id();
        std::thread::scope(|s| {
            let opening = s.spawn(|| (0..n).map(|_| a.link_to(to).unwrap()).collect::<Vec<_>>());
            let there: Vec<_> = (0..n).map(|_| listener.accept_blocking().unwrap()).collect();
            opening.join().unwrap().into_iter().zip(there).collect()
        })
    }

    /// A port of a second team and a sender to it from the first, their
    /// channel bound (a send that waits for the bind is not in the ring).
    fn bound_port(caller: &Team, server: &Team) -> (crate::RawPort, crate::RawSender) {
        let port = server.open_raw_port().unwrap();
        let to = caller.raw_sender(port.id());
        to.send(b"bind", Checkpoint::Immediate).unwrap();
        assert_eq!(port.recv_blocking().unwrap().payload(), b"bind");
        (port, to)
    }

    /// Plain messages are taken straight from the ring, in order, after
    /// those the inbox held already; a burst's rest goes to the inbox; a
    /// call is answered.
    #[test]
    fn a_blocked_port_takes_plain_messages_straight_from_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let (sender, receiver) = teams(dir.path());
        let port = receiver.open_raw_port().unwrap();
        let to = sender.raw_sender(port.id());
        // One at a time, as a ping-pong sends: each taken directly (but
        // every 17th wait, which drains the channels instead).
        let before = super::DIRECT.get();
        for i in 0..50u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(port.recv_blocking().unwrap().payload(), [i]);
        }
        let direct = super::DIRECT.get() - before;
        assert!(direct >= 45, "{direct} of 50 taken directly");
        // Three drained into the inbox by a timed wait (no direct receive), then a burst.
        for i in 0..3u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
        }
        assert_eq!(port.recv_timeout(Duration::from_secs(10)).unwrap().payload(), [0]);
        for i in 3..200u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
        }
        for i in 1..200u8 {
            assert_eq!(port.recv_blocking().unwrap().payload(), [i], "out of order");
        }
        // A call is answered.
        let caller = std::thread::spawn(move || to.send(b"q", Checkpoint::OnReturn).unwrap());
        let m = port.recv_blocking().unwrap();
        m.reply(b"a").unwrap();
        assert_eq!(caller.join().unwrap(), b"a");
    }

    /// A receive reaches the ring without its consumer's lock: the
    /// channel's receive lock, which it holds, is the only one (issue 21:
    /// "one lock or none"; the consumer's cost two locked instructions a
    /// message).
    #[test]
    fn a_receive_takes_one_lock_not_the_rings_own() {
        use crate::transport::shm::CONSUMER_LOCKS;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let (port_b, to_b) = bound_port(&a, &b);
        let (port_a, to_a) = bound_port(&b, &a);
        let before = CONSUMER_LOCKS.get();
        for i in 0..50u8 {
            to_b.send(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(port_b.recv_blocking().unwrap().payload(), [i]);
            to_a.send(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(port_a.recv_blocking().unwrap().payload(), [i]);
        }
        // A burst, drained by the progress loop.
        for i in 0..100u8 {
            to_b.send(&[i], Checkpoint::Immediate).unwrap();
        }
        for i in 0..100u8 {
            assert_eq!(port_b.recv_blocking().unwrap().payload(), [i]);
        }
        assert_eq!(CONSUMER_LOCKS.get() - before, 0, "receives locked the ring's consumer");
    }

    /// Messages that ask for a checkpoint or a reply are taken straight
    /// from the ring too, and answered as the progress loop's would be.
    #[test]
    fn a_blocked_port_takes_calls_straight_from_the_ring() {
        use crate::runtime::out::Out;
        let dir = tempfile::tempdir().unwrap();
        let (caller, server) = teams(dir.path());
        let (port, to) = bound_port(&caller, &server);
        let (sent, wait) = std::sync::mpsc::channel();
        const CHECKPOINTS: [Checkpoint; 3] = [Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn];
        let calling = std::thread::spawn(move || {
            for i in 0..15u8 {
                let d = to.start(Out::from(&[i][..]), CHECKPOINTS[usize::from(i % 3)], true);
                sent.send(()).unwrap();
                let got = d.wait_here(&to.team).unwrap().into_vec();
                assert_eq!(got, if i % 3 == 2 { vec![i, i] } else { vec![] });
            }
        });
        let before = super::DIRECT.get();
        for i in 0..15u8 {
            // The message waits at the head of the channel when the wait begins.
            wait.recv().unwrap();
            let m = port.recv_blocking().unwrap();
            assert_eq!(m.payload(), [i]);
            if i % 3 == 2 {
                m.reply(&[i, i]).unwrap();
            }
        }
        calling.join().unwrap();
        // (Every one, but the 17th catch in a row would take a full turn.)
        let direct = super::DIRECT.get() - before;
        assert!(direct >= 14, "{direct} of 15 taken directly");
    }

    /// An explicit service's blocking accept takes each call straight from
    /// the ring, as a blocked port does (it went through the inbox and a
    /// waker: ~1.25 × an implicitly served call's time).
    #[test]
    fn a_blocking_accept_takes_calls_straight_from_the_ring() {
        use crate::rpc::{Client, MethodDescriptor, Never, ServiceDescriptor, ServiceEndpoint, CODEC};
        let dir = tempfile::tempdir().unwrap();
        let (caller, server) = teams(dir.path());
        let method =
            MethodDescriptor { name: "twice".into(), args: vec![("n".into(), "u32".into())], ret: "u32".into() };
        let descriptor = ServiceDescriptor { name: "Twice".into(), codec: CODEC.into(), methods: vec![method] };
        let endpoint = ServiceEndpoint::open_unnamed(&server, descriptor.clone()).unwrap();
        let id = endpoint.id();
        let serving = std::thread::spawn(move || {
            // The bind is answered inside the first accept.
            let before = super::DIRECT.get();
            for i in 0..20u32 {
                let mut call = endpoint.accept_blocking().unwrap();
                assert_eq!(call.take_args::<(u32,)>().unwrap(), (i,));
                call.reply_ok(&(2 * i)).unwrap();
            }
            super::DIRECT.get() - before
        });
        let client = Client::bind_to(&caller, id, descriptor).unwrap();
        for i in 0..20u32 {
            let twice: u32 = client.call_blocking::<_, _, Never>(0, &(i,)).unwrap();
            assert_eq!(twice, 2 * i);
        }
        // Every one, but the 17th catch in a row takes a full turn (and the
        // bind may be drained with the first call).
        let direct = serving.join().unwrap();
        assert!(direct >= 18, "{direct} of 21 requests taken directly");
    }

    /// A caller blocked on its call's answer takes it straight from the
    /// ring (checkpoint acks too), each the answer to its own call.
    #[test]
    fn a_blocked_caller_takes_its_answer_straight_from_the_ring() {
        use crate::runtime::out::Out;
        let dir = tempfile::tempdir().unwrap();
        let (caller, server) = teams(dir.path());
        let (port, to) = bound_port(&caller, &server);
        let (answered, wait) = std::sync::mpsc::channel();
        let serving = std::thread::spawn(move || {
            for i in 0..20u8 {
                let m = port.recv_blocking().unwrap();
                assert_eq!(m.payload(), [i]);
                if i % 2 == 0 {
                    m.reply(&[i, i]).unwrap();
                }
                answered.send(()).unwrap();
            }
        });
        let before = super::DIRECT.get();
        for i in 0..20u8 {
            let checkpoint = [Checkpoint::OnReturn, Checkpoint::OnDelivery][usize::from(i % 2)];
            let d = to.start(Out::from(&[i][..]), checkpoint, true);
            // The answer waits at the head of the channel when the wait begins.
            wait.recv().unwrap();
            let got = d.wait_here(&to.team).unwrap().into_vec();
            assert_eq!(got, if i % 2 == 0 { vec![i, i] } else { vec![] });
        }
        serving.join().unwrap();
        // Every one but the 17th (the 17th catch in a row takes a full turn instead).
        let direct = super::DIRECT.get() - before;
        assert!(direct >= 18, "{direct} of 20 answers taken directly");
    }

    /// A wait with a time limit takes directly too, and ends at its limit.
    #[test]
    fn a_timed_wait_takes_directly_and_ends_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (sender, receiver) = teams(dir.path());
        let port = receiver.open_raw_port().unwrap();
        let to = sender.raw_sender(port.id());
        let before = super::DIRECT.get();
        for i in 0..10u8 {
            to.send(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(port.recv_timeout(Duration::from_secs(10)).unwrap().payload(), [i]);
        }
        assert!(super::DIRECT.get() - before >= 9, "not taken directly");
        let started = std::time::Instant::now();
        let r = port.recv_timeout(Duration::from_millis(50));
        assert!(matches!(r, Err(crate::Error::DeadlineExceeded)), "not a deadline");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited < Duration::from_secs(5), "{waited:?}");
    }

    /// A link end blocked on its next message takes it from the frame at
    /// the head of the channel (its handler runs at once), in order; a
    /// call on the link is answered as usual.
    #[test]
    fn a_blocked_link_end_takes_its_frames_straight_from_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let (here, there) = links(&a, &b, 1).remove(0);
        // (60 messages in all: within the link's window, 64, as `here`'s
        // thread never takes the credit `there` sends back.)
        let caught = || crate::link::CAUGHT.get();
        let (before, own_before, caught_before) = (super::DIRECT.get(), super::OWN.get(), caught());
        for i in 0..30u8 {
            here.send_bytes(&[i], Checkpoint::Immediate).unwrap();
            assert_eq!(there.recv_bytes_blocking().unwrap().value, [i]);
        }
        let (direct, own) = (super::DIRECT.get() - before, super::OWN.get() - own_before);
        assert!(direct >= 25, "{direct} of 30 taken directly");
        // By the end itself, without the links' handler, and each handed
        // to the receive as it was taken (no queue).
        assert_eq!(own, direct);
        assert_eq!(caught() - caught_before, own);
        for i in 0..30u8 {
            here.send_bytes(&[i], Checkpoint::Immediate).unwrap();
        }
        for i in 0..30u8 {
            assert_eq!(there.recv_bytes_blocking().unwrap().value, [i], "out of order");
        }
        let caller = std::thread::spawn(move || here.send_bytes(b"q", Checkpoint::OnReturn).unwrap());
        let m = there.recv_bytes_blocking().unwrap();
        m.reply_bytes(b"a").unwrap();
        assert_eq!(caller.join().unwrap(), b"a");
    }

    /// Once each router of a link has had a full frame from the other
    /// (which names its handle), small `Immediate` messages go as short
    /// frames (one ring cell for 8 bytes): taken in order with the full
    /// frames of larger messages, and their acknowledgements carried by
    /// `Credit`s (a one-way stream of many windows does not stall).
    #[test]
    fn small_messages_go_in_short_frames_once_the_routers_know_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        // (Every receive with a deadline: a lost frame fails the test.)
        let limit = |(x, y): (crate::link::Link, crate::link::Link)| {
            (x.with_timeout(Duration::from_secs(30)), y.with_timeout(Duration::from_secs(30)))
        };
        let (here, there) = limit(links(&a, &b, 1).remove(0));
        let shorts = || crate::link::SHORTS.get();
        let before = shorts();
        for i in 0..20u64 {
            here.send_bytes(&i.to_le_bytes(), Checkpoint::Immediate).unwrap();
            let m = there.recv_bytes_blocking().unwrap();
            assert_eq!(m.value, i.to_le_bytes());
            there.send_bytes(&m.value, Checkpoint::Immediate).unwrap();
            assert_eq!(here.recv_bytes_blocking().unwrap().value, i.to_le_bytes());
        }
        // The first frame each way is a full one, and so may the second be.
        assert!(shorts() - before >= 36, "{} of 40 frames short", shorts() - before);
        // Larger messages go in full frames, in order with short ones.
        let before = shorts();
        let sizes = [8, 65, 1, 4000, 64, 0];
        for (i, &n) in sizes.iter().enumerate() {
            here.send_bytes(&vec![i as u8; n], Checkpoint::Immediate).unwrap();
        }
        for (i, &n) in sizes.iter().enumerate() {
            assert_eq!(there.recv_bytes_blocking().unwrap().value, vec![i as u8; n], "out of order");
        }
        assert_eq!(shorts() - before, 4, "the messages of at most 64 bytes");
        // Many windows (64 messages) one way, between teams whose
        // processors take the credits as they come: the sender finds room.
        let start = || Team::builder().runtime_dir(dir.path()).processors(1).start().unwrap();
        let (a, b) = (start(), start());
        let (here, there) = limit(links(&a, &b, 1).remove(0));
        std::thread::scope(|s| {
            s.spawn(|| {
                let give_up = std::time::Instant::now() + Duration::from_secs(30);
                for i in 0..1000u32 {
                    while let Err(e) = here.send_bytes(&i.to_le_bytes(), Checkpoint::Immediate) {
                        assert!(matches!(e, crate::Error::WouldBlock { .. }), "{e}");
                        assert!(std::time::Instant::now() < give_up, "no credit came back for message {i}");
                        std::thread::yield_now();
                    }
                }
            });
            for i in 0..1000u32 {
                assert_eq!(there.recv_bytes_blocking().unwrap().value, i.to_le_bytes());
            }
        });
    }

    /// A thread blocked on one link end that meets another end's frame at
    /// the head of the channel hands it to the links' handler, which
    /// queues it at that end, in order; its own frames it takes itself.
    #[test]
    fn a_blocked_link_end_leaves_other_ends_frames_to_their_handler() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let mut pairs = links(&a, &b, 2);
        let (first, second) = (pairs.remove(0), pairs.remove(0));
        for i in 0..4u8 {
            first.0.send_bytes(&[i], Checkpoint::Immediate).unwrap();
        }
        second.0.send_bytes(b"second", Checkpoint::Immediate).unwrap();
        let own_before = super::OWN.get();
        // The four frames of the first link come first: the handler takes them.
        assert_eq!(second.1.recv_bytes_blocking().unwrap().value, b"second");
        assert!(super::OWN.get() - own_before <= 1, "only its own frame may be the end's own take");
        for i in 0..4u8 {
            assert_eq!(first.1.recv_bytes_blocking().unwrap().value, [i]);
        }
        // Alone at the head, its own frame is its own take.
        let own_before = super::OWN.get();
        second.0.send_bytes(b"again", Checkpoint::Immediate).unwrap();
        assert_eq!(second.1.recv_bytes_blocking().unwrap().value, b"again");
        assert_eq!(super::OWN.get() - own_before, 1);
    }

    /// A turn's sweep offers a waiting thread's catch each channel's head
    /// frame before it drains the channel (`Sweep::progress_catching`): a frame
    /// that came during the turn still goes the catch's way.
    #[test]
    fn a_sweep_offers_the_head_frame_to_a_waiting_catch_first() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let (here, there) = links(&a, &b, 1).remove(0);
        here.send_bytes(b"x", Checkpoint::Immediate).unwrap();
        let team = &b.inner;
        let channels = team.channels.snapshot();
        let (mut offered, before) = (0, super::DIRECT.get());
        let mut catch = |ch: &std::sync::Arc<super::Channel>| {
            offered += 1;
            // Declined by the taker: the links' handler queues it at its end.
            team.serve_direct(ch, &crate::link::KINDS, &mut |_, _, _| false)
        };
        assert!(crate::runtime::readiness::Sweep::new().progress_catching(team, &channels, &mut catch));
        assert_eq!((offered, super::DIRECT.get() - before), (1, 1), "the frame was drained past the catch");
        assert_eq!(there.recv_bytes_blocking().unwrap().value, b"x");
    }

    /// A blocked port takes its message straight from the ring when its
    /// turn's sweep finds it too, not only at the turn's start: with the
    /// catches in a row used up (the start offers nothing), the message
    /// still skips the inbox. (Drained there instead, and the turn gone on
    /// over the other channels, a port's round trip took 1 / 0.92 × as
    /// long.)
    #[test]
    fn a_blocked_port_catches_its_message_in_the_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let (port, to) = bound_port(&a, &b);
        to.send(b"x", Checkpoint::Immediate).unwrap();
        crate::runtime::idle::CAUGHT.set(crate::runtime::idle::CATCH_STREAK);
        let before = super::DIRECT.get();
        assert_eq!(port.recv_blocking().unwrap().payload(), b"x");
        assert_eq!(super::DIRECT.get() - before, 1, "drained into the inbox past the waiting receiver");
    }

    /// A catch in the sweep ends the turn at once: the waiting thread goes
    /// back to its caller with what it caught, and the channels' other
    /// work (this channel's release, other channels' frames) waits for its
    /// next turn or another thread. (Driving them first put that work on
    /// every link message's path: 0.944 × the link round trip without it.)
    #[test]
    fn a_catch_in_the_sweep_ends_the_turn() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = teams(dir.path());
        let c = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
        // A frame on each of two channels.
        let bound = [bound_port(&a, &b), bound_port(&c, &b)];
        for (_, to) in &bound {
            to.send(b"x", Checkpoint::Immediate).unwrap();
        }
        let team = &b.inner;
        let channels = team.channels.snapshot();
        let waiting = |channels: &crate::runtime::channel_list::Snapshot| {
            channels.iter().filter(|ch| ch.transport.has_frame()).count()
        };
        assert_eq!(waiting(&channels), 2);
        let mut offered = 0;
        // Says it took the first frame offered (and leaves it where it is).
        let mut catch = |_: &std::sync::Arc<super::Channel>| {
            offered += 1;
            true
        };
        assert!(crate::runtime::readiness::Sweep::new().progress_catching(team, &channels, &mut catch));
        assert_eq!(offered, 1);
        assert_eq!(waiting(&channels), 2, "the sweep went on after its catch");
    }

    /// Messages to one blocked port arriving one at a time on one channel
    /// leave no other port's message waiting in another: every few
    /// catches the thread drains every channel. (Without that, 64 catches
    /// never looked at the other channel.)
    #[test]
    fn a_stream_on_one_channel_does_not_starve_another() {
        let dir = tempfile::tempdir().unwrap();
        let (streaming, receiver) = teams(dir.path());
        let quiet = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
        let (busy, other) = (receiver.open_raw_port().unwrap(), receiver.open_raw_port().unwrap());
        let to_busy = streaming.raw_sender(busy.id());
        to_busy.send(b"bind", Checkpoint::Immediate).unwrap();
        assert_eq!(busy.recv_blocking().unwrap().payload(), b"bind");
        // Bound (and in the receiver's list of channels) first.
        let to_other = quiet.raw_sender(other.id());
        to_other.send(b"bind", Checkpoint::Immediate).unwrap();
        assert_eq!(other.recv_timeout(Duration::from_secs(10)).unwrap().payload(), b"bind");
        to_other.send(b"here", Checkpoint::Immediate).unwrap();
        // This thread is the only one that drains the receiver's channels.
        for _ in 0..64 {
            to_busy.send(b"x", Checkpoint::Immediate).unwrap();
            assert_eq!(busy.recv_blocking().unwrap().payload(), b"x");
        }
        let got = other.try_recv().expect("the other channel's message was never taken");
        assert_eq!(got.payload(), b"here");
    }
}
