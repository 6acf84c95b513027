//! The scheduler's choices, measured in CPU time: a processor with nothing
//! it can run parks. A binary of its own, so no spinning test shares the
//! CPU it measures.

use ferry::{Checkpoint, Team};
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// CPU time this process has used so far.
fn cpu() -> Duration {
    // SAFETY: `getrusage` fills the struct we pass; RUSAGE_SELF is always valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// A task woken while it waits in a blocking call further up its own
/// processor's stack cannot run anywhere until that call returns. The
/// team's other processor must park meanwhile, not spin on it (it took a
/// whole CPU: the ready queue was never empty, and the loop waited for an
/// empty one).
#[test]
fn a_task_woken_inside_its_own_blocking_call_does_not_keep_a_processor_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(2).start().unwrap();
    let wake = team.open_port::<u32>().unwrap();
    let release = team.open_port::<u32>().unwrap();
    let (to_wake, to_release) = (team.sender::<u32>(wake.id()), team.sender::<u32>(release.id()));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let task = team.spawn(async move {
        // Leave our waker with `wake`'s inbox, then block on `release`.
        let mut first = pin!(wake.recv());
        poll_fn(|cx| {
            assert!(first.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        entered_tx.send(()).unwrap();
        release.recv_blocking().map(|m| m.value)
    });
    entered.recv_timeout(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Readies the task, which is still inside `recv_blocking`.
    to_wake.send(&1, Checkpoint::Immediate).unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let (wall, used) = (Instant::now(), cpu());
    std::thread::sleep(Duration::from_secs(2));
    let share = (cpu() - used).as_secs_f64() / wall.elapsed().as_secs_f64();

    to_release.send(&2, Checkpoint::Immediate).unwrap();
    assert_eq!(team.block_on(task).unwrap().unwrap(), 2);
    assert!(share < 0.05, "the team used {:.0} % of a CPU with nothing to run", share * 100.0);
}
