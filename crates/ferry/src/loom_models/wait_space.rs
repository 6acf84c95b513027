//! Waiting for ring space: a writer finds the ring full, asks to be woken
//! (`want_space`), retries, parks; the reader frees space and wakes it.
//! And the same for a frame an async send left in the channel's outbox,
//! which the progress loop sends once the request was taken.

use super::{check, frame, pair, Pair};
use crate::transport::{Recv, SendError, Transport};
use loom::thread;
use std::sync::Arc;
use std::time::Duration;

/// One-cell frames in a four-cell ring.
const CAP: usize = 4 * crate::transport::shm::ring::CELL;

/// Fills `a → b` with frames 0.. and returns how many went in.
fn fill(p: &Pair) -> u64 {
    let mut n = 0;
    while p.a.try_send(&frame(n), &[n as u8]).is_ok() {
        n += 1;
    }
    n
}

/// One writer of team A sending frame `id` the way runtime/mod.rs
/// `push_frame` does: try; else count as sleeping, ask for space, try
/// once more, and park.
fn send_waiting(p: &Pair, id: u64) {
    let (a, bell) = (&p.a, &p.bell_a);
    bell.enter_polling();
    loop {
        match a.try_send(&frame(id), &[id as u8]) {
            Ok(()) => break,
            Err(e) => assert_eq!(e, SendError::Full),
        }
        bell.prepare_park();
        a.want_space();
        if a.try_send(&frame(id), &[id as u8]).is_ok() {
            bell.cancel_park();
            break;
        }
        bell.park(Duration::from_secs(1));
    }
    bell.leave_polling();
}

/// Team A's progress loop with frame `id` queued by an async send (see
/// `runtime/outbox.rs`): the send found the ring full, asked for space and
/// tried once more; the loop tries again only once the request was taken
/// (`wants_space` false: `Channel::outbox_due`), at a turn or at the last
/// look before parking (`Idle::step`), asking again before each retry.
fn progress_loop_sends_queued(p: &Pair, id: u64) {
    let (a, bell) = (&p.a, &p.bell_a);
    let flush = || match a.try_send(&frame(id), &[id as u8]) {
        Ok(()) => true,
        Err(_) => {
            a.want_space();
            a.try_send(&frame(id), &[id as u8]).is_ok()
        }
    };
    bell.enter_polling();
    a.want_space();
    if a.try_send(&frame(id), &[id as u8]).is_err() {
        loop {
            if !a.wants_space() && flush() {
                break;
            }
            bell.prepare_park();
            if !a.wants_space() && flush() {
                bell.cancel_park();
                break;
            }
            bell.park(Duration::from_secs(1));
        }
    }
    bell.leave_polling();
}

/// The reader takes one frame and, as its idle loop does when nothing else
/// waits, tidies: the space returns to the writer and wakes it if it waits.
/// Returns the frame's call id.
fn take_one(p: &Pair) -> u64 {
    let mut got = None;
    let r = p.b.try_recv(&mut |h, _| {
        got = Some(h.call_id);
        true
    });
    assert_eq!(r, Ok(Recv::Consumed));
    p.b.tidy();
    got.unwrap()
}

/// Everything left arrives in order after the threads are done.
fn drain(p: &Pair, from: u64, to: u64) {
    for i in from..to {
        assert_eq!(take_one(p), i);
    }
    assert_eq!(p.b.try_recv(&mut |_, _| panic!("a frame too many")), Ok(Recv::Empty));
}

#[test]
fn loom_wait_space_writer_is_woken_when_space_is_freed() {
    check(None, || {
        let p = Arc::new(pair(CAP));
        let n = fill(&p);
        let w = p.clone();
        let writer = thread::spawn(move || send_waiting(&w, n));
        assert_eq!(take_one(&p), 0);
        writer.join().unwrap();
        drain(&p, 1, n + 1);
    });
}

/// Defect 6: two writers on one channel. One asks for space and parks;
/// the other's successful send must not erase that request, or the
/// reader's next release finds none and the first writer sleeps on.
#[test]
fn loom_wait_space_two_writers_neither_loses_its_wake_up() {
    // Three threads: every interleaving would take minutes.
    check(Some(3), || {
        let p = Arc::new(pair(CAP));
        let n = fill(&p);
        let writers: Vec<_> = (0..2)
            .map(|i| {
                let w = p.clone();
                thread::spawn(move || send_waiting(&w, n + i))
            })
            .collect();
        assert_eq!(take_one(&p), 0);
        assert_eq!(take_one(&p), 1);
        for w in writers {
            w.join().unwrap();
        }
        // The two writers' frames may have gone in either order.
        for i in 2..n {
            assert_eq!(take_one(&p), i);
        }
        let mut last = [take_one(&p), take_one(&p)];
        last.sort();
        assert_eq!(last, [n, n + 1]);
    });
}

/// A frame waiting in the outbox goes out once the reader frees space: the
/// progress loop that looks only after its request was taken never sleeps
/// through the reader's wake-up.
#[test]
fn loom_wait_space_progress_loop_sends_a_queued_frame() {
    check(None, || {
        let p = Arc::new(pair(CAP));
        let n = fill(&p);
        let w = p.clone();
        let progress = thread::spawn(move || progress_loop_sends_queued(&w, n));
        assert_eq!(take_one(&p), 0);
        progress.join().unwrap();
        drain(&p, 1, n + 1);
    });
}
