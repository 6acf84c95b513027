//! The running-calls gate's wake-up (`rpc/gate.rs`): the serving task,
//! finding no place free, stores its waker, sets `waiting`, and looks for
//! a place again; `leave` frees places, then looks at `waiting`.

use crate::loom_models::check;
use crate::rpc::gate::Gate;
use loom::sync::atomic::AtomicUsize;
use loom::thread;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Counts its wakes.
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Polls for a place once with a counting waker, while `leavers` threads
/// each drop one of the gate's places (all of them taken): the task either
/// gets a place or is woken, and once woken, finds one.
fn waiter_races(leavers: usize) {
    let gate = Gate::new(leavers);
    let threads: Vec<_> = (0..leavers)
        .map(|_| {
            let place = gate.try_enter(1).expect("a free place");
            thread::spawn(move || drop(place))
        })
        .collect();
    let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let got = gate.poll_enter(&mut cx);
    for t in threads {
        t.join().unwrap();
    }
    if let Poll::Pending = got {
        assert!(wakes.0.load(SeqCst) >= 1, "a place freed as the task went to wait did not wake it");
        assert!(gate.poll_enter(&mut cx).is_ready(), "woken, with no place free");
    }
}

/// A place freed as the serving task goes to wait wakes it.
#[test]
fn loom_gate_a_freed_place_wakes_the_waiting_task() {
    check(None, || waiter_races(1));
}

/// Two places freed at once: neither leave's wake is lost to the other's.
#[test]
fn loom_gate_two_freed_places_wake_the_waiting_task() {
    check(Some(3), || waiter_races(2));
}
