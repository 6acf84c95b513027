//! The call slab (`runtime::call_slab`): its free stack under concurrent
//! starts and ends (the ABA case: a pop that read a top which another
//! thread popped and pushed back meanwhile), and an answer racing the end
//! of its call and the entry's reuse by a new call.

use super::CallSlab;
use crate::loom_models::check;
use crate::runtime::payload::Payload;
use loom::thread;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

fn poll(slab: &CallSlab, id: u64) -> Poll<crate::Result<Payload>> {
    slab.poll(id, &mut Context::from_waker(Waker::noop()))
}

/// Two threads start calls while a third ends one and starts another:
/// no two live calls share an entry, and every entry is free after.
/// (With the free stack's tag taken out, loom finds a pop that hands out
/// an entry another call holds.)
#[test]
fn loom_call_slab_live_calls_never_share_an_entry() {
    check(Some(3), || {
        let slab = Arc::new(CallSlab::new(3));
        // Two free entries on the stack (1 on top of 0), one call live.
        let (a, b, live) = (slab.start(1).unwrap(), slab.start(1).unwrap(), slab.start(1).unwrap());
        slab.forget(a);
        slab.forget(b);
        let s = slab.clone();
        // Pops and pushes back entry 1 around the main thread's pop: its
        // pop must then not take 1's old `next` for the stack's new top.
        let churn = thread::spawn(move || {
            let x = s.start(2).ok();
            let y = s.start(2).ok();
            if let Some(x) = x {
                s.forget(x);
            }
            (y, s.start(2).ok())
        });
        let mine = slab.start(3);
        let (y, z) = churn.join().unwrap();
        let mut held: Vec<u64> = [Some(live), y, z, mine.ok()].into_iter().flatten().collect();
        let mut entries: Vec<u32> = held.iter().map(|&id| id as u32).collect();
        entries.sort_unstable();
        entries.dedup();
        assert_eq!(entries.len(), held.len(), "two live calls share an entry: {held:x?}");
        assert!(held.len() <= 3, "more calls than entries");
        for id in held.drain(..) {
            assert!(slab.forget(id));
        }
        assert_eq!(slab.in_flight(), 0);
    });
}

/// An answer races its caller giving up and the entry's reuse: the new
/// call never gets the old call's answer, and the old call's waiter is
/// woken with it only while it still waits.
#[test]
fn loom_call_slab_a_late_answer_never_reaches_the_next_call() {
    check(None, || {
        let slab = Arc::new(CallSlab::new(1));
        let old = slab.start(7).unwrap();
        let s = slab.clone();
        let answerer = thread::spawn(move || {
            if let Some(a) = s.answer(7, old) {
                a.finish(Ok(Payload::from_slice(b"old")));
            }
        });
        slab.forget(old);
        let new = slab.start(7).unwrap();
        answerer.join().unwrap();
        assert!(poll(&slab, new).is_pending(), "the new call took the old call's answer");
        assert!(slab.forget(new));
    });
}
