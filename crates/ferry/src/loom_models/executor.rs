//! `Executor::push` against a processor going to sleep: push stores the
//! task, then looks at `parked`; the processor counts itself in `parked`,
//! then looks at the queue (its idle loop in runtime/idle.rs).

use super::{Executor, Task};
use crate::loom_models::{check, HeapBell};
use loom::thread;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The processor never sleeps with a task ready: either it sees the task,
/// or `push` sees it parked and rings.
#[test]
fn loom_executor_push_wakes_a_parking_processor() {
    check(None, || {
        let exec = Executor::new(Arc::new(HeapBell::new().doorbell()));
        let e = exec.clone();
        let pusher = thread::spawn(move || e.push(Arc::new(Task::finished())));
        // processor_loop: idle steps until a task is ready; `parked(true)`
        // comes before `prepare_park`, `parked(false)` after the park.
        let bell = &exec.doorbell;
        bell.enter_polling();
        while !exec.has_ready() {
            exec.parked.fetch_add(1, Ordering::SeqCst);
            bell.prepare_park();
            if exec.has_ready() {
                bell.cancel_park();
            } else {
                bell.park(Duration::from_secs(1));
            }
            exec.parked.fetch_sub(1, Ordering::SeqCst);
        }
        bell.leave_polling();
        pusher.join().unwrap();
    });
}

/// Wakes racing the end of a poll put the task in the ready queue once:
/// never while it is being polled, never twice, never not at all.
#[test]
fn loom_executor_wakes_during_a_poll_queue_the_task_once() {
    check(None, || {
        let task = Arc::new(Task::<HeapBell>::finished());
        // A processor popped it and is polling it.
        assert!(task.claim());
        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let t = task.clone();
                thread::spawn(move || t.wake_needs_push() as u32)
            })
            .collect();
        let poller = task.end_poll_needs_push() as u32;
        let pushes: u32 = poller + wakers.into_iter().map(|w| w.join().unwrap()).sum::<u32>();
        assert_eq!(pushes, 1);
    });
}

/// RUNNING is the future's lock: a processor claiming a popped task and an
/// abort taking the future never hold it at once, and the task, woken
/// during the abort's hold, ends up queued once at most.
#[test]
fn loom_executor_an_abort_and_a_poll_never_hold_the_future_at_once() {
    check(None, || {
        let task = Arc::new(Task::<HeapBell>::finished());
        let inside = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
        let (t, i) = (task.clone(), inside.clone());
        // The abort: holds the future while a wake comes.
        let abort = thread::spawn(move || {
            let Some(from) = t.hold() else { return 0 };
            assert_eq!(i.fetch_add(1, Ordering::SeqCst), 0);
            let woken = t.wake_needs_push() as u32;
            i.fetch_sub(1, Ordering::SeqCst);
            woken + t.release(from) as u32
        });
        // The processor that popped it (it was queued: SCHEDULED).
        let mut pushes = 0;
        if task.claim() {
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
            inside.fetch_sub(1, Ordering::SeqCst);
            pushes += task.end_poll_needs_push() as u32;
        } else {
            pushes += 1; // put back in the queue
        }
        pushes += abort.join().unwrap();
        // In the queue at most once, and exactly when its state says
        // SCHEDULED: the abort's wake is not lost, nor queued twice.
        let scheduled = task.state.load(Ordering::SeqCst) & super::SCHEDULED != 0;
        assert_eq!(pushes, scheduled as u32);
    });
}
