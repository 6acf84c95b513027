//! The doorbell: a sender publishes a frame and rings; the receiving team's
//! thread polls, announces it will sleep, looks once more, and parks.

use super::{check, frame, pair, End, HeapBell};
use crate::transport::doorbell::Doorbell;
use crate::transport::{Body, Recv, Transport};
use loom::thread;
use std::time::Duration;

/// A thread of the receiving team waiting for frame 7 the way the idle loop
/// of runtime/idle.rs does (one channel, no spinning): poll; if nothing,
/// announce the sleep (`prepare_park`), look once more, and park.
fn receive(b: &End, bell: &Doorbell<HeapBell>) {
    assert_eq!(take(b, bell), (7, b"hi".to_vec()));
    bell.leave_polling();
}

/// One frame, waited for as `receive` does (the thread stays a poller).
fn take(b: &End, bell: &Doorbell<HeapBell>) -> (u64, Vec<u8>) {
    let mut got = None;
    while got.is_none() {
        if b.has_frame() {
            let r = b.try_recv(&mut |h, body| match body {
                Body::Inline(body) => {
                    got = Some((h.call_id, body.to_vec()));
                    true
                }
                Body::Detached(_) => panic!("the model sends small frames only"),
            });
            if r == Ok(Recv::Consumed) {
                break;
            }
        }
        bell.prepare_park();
        if b.has_frame() {
            bell.cancel_park();
        } else {
            bell.park(Duration::from_secs(1));
        }
    }
    got.expect("the loop ends with a frame")
}

/// A sender publishes two frames; its second ring, while the thread its
/// first woke has not looked yet, is skipped (`Bell::ring`'s S5): that
/// thread must still take both, parking between them if it likes — no
/// frame is slept through.
#[test]
fn loom_doorbell_a_skipped_ring_strands_no_frame() {
    check(Some(3), || {
        let p = pair(4 * crate::transport::shm::ring::CELL);
        let a = p.a.clone();
        let sender = thread::spawn(move || {
            a.try_send(&frame(7), b"hi").unwrap();
            a.try_send(&frame(8), b"hi").unwrap();
        });
        p.bell_b.enter_polling();
        assert_eq!(take(&p.b, &p.bell_b).0, 7);
        assert_eq!(take(&p.b, &p.bell_b).0, 8);
        p.bell_b.leave_polling();
        sender.join().unwrap();
    });
}

/// The receiver never sleeps through the frame: if it parks, the sender's
/// `ring` sees it sleeping and wakes it (a lost wake-up is a deadlock).
#[test]
fn loom_doorbell_receiver_never_sleeps_through_a_frame() {
    check(None, || {
        let p = pair(4 * crate::transport::shm::ring::CELL);
        let a = p.a.clone();
        let sender = thread::spawn(move || a.try_send(&frame(7), b"hi").unwrap());
        p.bell_b.enter_polling();
        receive(&p.b, &p.bell_b);
        sender.join().unwrap();
    });
}

/// Two threads of the receiving team, both polling from the start
/// (`Idle::new`): one waits for frame 7 and may sleep, the other runs
/// `other` (it stops polling one way or another) while a sender sends.
fn with_a_second_poller(other: fn(&End, &Doorbell<HeapBell>)) {
    check(Some(3), move || {
        let p = pair(4 * crate::transport::shm::ring::CELL);
        p.bell_b.enter_polling();
        p.bell_b.enter_polling();
        let a = p.a.clone();
        let sender = thread::spawn(move || a.try_send(&frame(7), b"hi").unwrap());
        let (b, bell) = (p.b.clone(), p.bell_b.clone());
        let second = thread::spawn(move || other(&b, &bell));
        receive(&p.b, &p.bell_b);
        sender.join().unwrap();
        second.join().unwrap();
    });
}

/// The second poller stops. A sender that saw it polling did not ring, so
/// the last poller to leave looks at the channel and rings (`Idle::drop`).
#[test]
fn loom_doorbell_last_poller_leaving_rings_for_a_frame_it_saw() {
    with_a_second_poller(|b, bell| {
        if bell.leave_polling() && b.has_frame() {
            bell.ring_one();
        }
    });
}

/// The second poller runs user code (a handler), counted as running, not
/// polling (`idle::user_code`), then stops: leaving the pollers for user
/// code is the same Dekker step, so a frame its senders did not ring for
/// is not slept through either.
#[test]
fn loom_doorbell_poller_entering_user_code_rings_for_a_frame_it_saw() {
    with_a_second_poller(|b, bell| {
        if bell.enter_user_code() && b.has_frame() {
            bell.ring_one();
        }
        bell.back_from_user_code();
        // Then it stops polling for good (`Idle::drop`).
        if bell.leave_polling() && b.has_frame() {
            bell.ring_one();
        }
    });
}
