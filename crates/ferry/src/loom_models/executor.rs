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
        task.begin_poll();
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
