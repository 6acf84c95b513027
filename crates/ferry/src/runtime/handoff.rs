//! Hand-off for a blocked processor, as Go's scheduler hands a thread
//! stuck in a system call's processor to another thread (`sysmon`,
//! `handoffp`). A handler that blocks (`std::thread::sleep`, a synchronous
//! read) holds its processor; without this, every other call to the team
//! waited for it.
//!
//! 1. A processor counts its entries into and exits from user code (a task,
//!    a batch of handlers) in its [`Slot`]: an odd count means inside. Only
//!    it writes its slot's count, with plain stores: nothing on the hot
//!    path but two of them.
//! 2. A watcher thread per team looks at the counts every
//!    `handoff_after` while a processor is inside user code, and
//!    [`QUIET`] times as seldom while all awake ones are outside it: each
//!    look takes a CPU from a spinning thread for a moment (on a machine
//!    whose CPUs all spin, 500 looks a second cost calls 2 %). While all
//!    are parked it sleeps; the first processor to wake pokes it.
//! 3. A processor whose odd count did not move for a whole look, while the
//!    team has work waiting (a frame, a ready task, a corked reply), is
//!    stuck: the watcher marks it and starts a replacement processor, at
//!    most `max_replacements` running at once, and logs it once.
//! 4. The replacement writes the replies corked on the stuck processor,
//!    runs the rest of its batch of direct calls (kept in its slot, not on
//!    its stack, for this), then serves as any processor does.
//! 5. The stuck processor, back from user code, clears its mark; a
//!    replacement that finds itself idle retires while more replacements
//!    run than processors are stuck.

use super::channel::{Direct, Incoming};
use super::TeamInner;
use crate::rpc::Place;
use crate::sync::{fence, fence_after_rmw, Condvar, FOR_GOOD};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How many times `handoff_after` the watcher sleeps after a look that
/// found no processor inside user code: a processor that blocks just after
/// such a look is replaced within `(QUIET + 1) × handoff_after`.
pub(crate) const QUIET: u32 = 4;

/// A direct call waiting in a processor's batch.
pub(crate) type DirectCall = (Direct, Incoming, Place);

/// One processor's state as the watcher sees it.
pub(crate) struct Slot {
    /// Entries into plus exits from user code: odd while inside.
    epoch: AtomicU32,
    /// Marked by the watcher; cleared by the processor when it is back.
    stuck: AtomicBool,
    /// A live processor holds this slot.
    taken: AtomicBool,
    /// The rest of the batch of direct calls it runs (see `dispatch`).
    pub(crate) batch: Mutex<VecDeque<DirectCall>>,
}

pub(crate) struct Handoff {
    after: Duration,
    max: usize,
    /// The team's processors first, then room for `max` replacements.
    slots: Box<[Slot]>,
    /// Processors marked stuck now.
    stuck: AtomicUsize,
    /// Replacements running now.
    running: AtomicUsize,
    /// Replacements ever started (`Team::handoffs`).
    started: AtomicU64,
    /// The watcher's looks so far.
    looks: AtomicU64,
    /// How the watcher sleeps and the processors wake it.
    bell: WatcherBell,
    /// The cap was met once (logged once).
    capped: AtomicBool,
}

thread_local! {
    /// This thread's slot, if it is a processor: (team address, slot), and
    /// how deep in user code it is (user code may run user code: a task's
    /// blocking call runs other tasks).
    static MINE: Cell<(usize, *const Slot, u32)> = const { Cell::new((0, std::ptr::null(), 0)) };
}

impl Handoff {
    pub fn new(processors: usize, after: Duration, max: usize) -> Handoff {
        // With no processors nothing can be handed off.
        let max = if processors == 0 { 0 } else { max };
        let slots = (0..processors + max)
            .map(|_| Slot {
                epoch: AtomicU32::new(0),
                stuck: AtomicBool::new(false),
                taken: AtomicBool::new(false),
                batch: Mutex::new(VecDeque::new()),
            })
            .collect();
        Handoff {
            after,
            max,
            slots,
            stuck: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            looks: AtomicU64::new(0),
            bell: WatcherBell::new(),
            capped: AtomicBool::new(false),
        }
    }

    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Makes this thread a processor of `team` in a free slot; `false` if
    /// none is (a replacement started while a retiring one still held its
    /// slot): it must not run.
    pub fn register(&self, team: &TeamInner) -> bool {
        let Some(slot) = self.slots.iter().find(|s| !s.taken.swap(true, Ordering::AcqRel)) else {
            return false;
        };
        MINE.set((team as *const TeamInner as usize, slot, 0));
        // Awake from the start: a watcher that went to its deep sleep before
        // this thread came must look while it runs.
        self.parked(false);
        true
    }

    /// A replacement that could not run gives its place back.
    pub fn not_started(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }

    /// This thread stops being a processor.
    pub fn unregister(&self) {
        let (_, slot, _) = MINE.replace((0, std::ptr::null(), 0));
        // SAFETY: `slot` points into `self.slots`, set by `register` on
        // this thread, and `self` is alive (borrowed).
        if let Some(slot) = unsafe { slot.as_ref() } {
            leave_slot(self, slot);
            slot.taken.store(false, Ordering::Release);
        }
        self.bell.parked(true);
    }

    /// A processor parks (`true`) or wakes (`false`).
    pub fn parked(&self, parked: bool) {
        self.bell.parked(parked);
    }

    /// A replacement gone idle: whether it retires now (more replacements
    /// run than processors are stuck). Takes its place back if so.
    pub fn retire(&self) -> bool {
        let mut running = self.running.load(Ordering::Acquire);
        while running > self.stuck.load(Ordering::Acquire) {
            match self.running.compare_exchange(running, running - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => running = now,
            }
        }
        false
    }

    /// Wakes the watcher (at shutdown).
    pub fn poke(&self) {
        self.bell.poke_all();
    }

    /// The stuck processors' batches.
    pub fn stuck_batches(&self) -> impl Iterator<Item = &Mutex<VecDeque<DirectCall>>> {
        self.slots.iter().filter(|s| s.stuck.load(Ordering::Acquire)).map(|s| &s.batch)
    }

    /// Whether a processor is marked stuck now.
    pub fn any_stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire) > 0
    }

    /// How long a replacement sleeps at most while a processor is stuck
    /// (it looks for calls queued behind the stuck one).
    pub fn after(&self) -> Duration {
        self.after
    }

    /// Whether a processor's batch has calls waiting.
    pub fn batches_wait(&self) -> bool {
        self.slots.iter().any(|s| !s.batch.lock().is_empty())
    }
}

/// Marks this thread in user code while alive (see [`enter`]).
pub(crate) struct UserCode<'a>(&'a TeamInner);

impl<'a> UserCode<'a> {
    #[inline]
    pub fn enter(team: &'a TeamInner) -> UserCode<'a> {
        enter(team);
        UserCode(team)
    }
}

impl Drop for UserCode<'_> {
    #[inline]
    fn drop(&mut self) {
        leave(self.0);
    }
}

/// This thread's slot, if it is a processor of `team`.
#[inline]
pub(crate) fn my_slot(team: &TeamInner) -> Option<&Slot> {
    let (of, slot, _) = MINE.get();
    // SAFETY: a slot set for `team` points into its `Handoff`, alive while
    // `team` is (borrowed); cleared before the processor lets its team go.
    (of == team as *const TeamInner as usize).then(|| unsafe { &*slot })
}

/// User code starts on this thread (a processor of `team`, or not).
#[inline]
fn enter(team: &TeamInner) {
    let (of, slot, depth) = MINE.get();
    if of != team as *const TeamInner as usize {
        return;
    }
    if depth == 0 {
        // SAFETY: as in `my_slot`.
        let e = unsafe { &(*slot).epoch };
        e.store(e.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }
    MINE.set((of, slot, depth + 1));
}

/// User code ends on this thread.
#[inline]
fn leave(team: &TeamInner) {
    let (of, slot, depth) = MINE.get();
    if of != team as *const TeamInner as usize || depth == 0 {
        return;
    }
    MINE.set((of, slot, depth - 1));
    if depth == 1 {
        // SAFETY: as in `my_slot`.
        leave_slot(&team.handoff, unsafe { &*slot });
    }
}

fn leave_slot(h: &Handoff, slot: &Slot) {
    let e = slot.epoch.load(Ordering::Relaxed);
    if e % 2 == 1 {
        slot.epoch.store(e.wrapping_add(1), Ordering::Relaxed);
    }
    if slot.stuck.load(Ordering::Relaxed) && slot.stuck.swap(false, Ordering::AcqRel) {
        h.stuck.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How the watcher sleeps and the processors wake it: while every
/// processor is parked the watcher sleeps until poked (at most
/// [`FOR_GOOD`]); the first processor to wake pokes it. Dekker: the watcher
/// stores `asleep`, then loads `awake`; a waking processor stores `awake`,
/// then loads `asleep`, each with a full fence between, so one sees the
/// other (the loom model `loom_handoff` checks it, and fails without
/// either fence).
pub(crate) struct WatcherBell {
    // `crate::sync`'s types (loom's in the model), unlike the rest of
    // `Handoff`, which no model runs.
    /// Processors not parked.
    awake: crate::sync::AtomicUsize,
    /// The watcher sleeps until poked.
    asleep: crate::sync::AtomicBool,
    wake: crate::sync::Mutex<()>,
    poke: Condvar,
}

impl WatcherBell {
    pub fn new() -> WatcherBell {
        WatcherBell {
            awake: crate::sync::AtomicUsize::new(0),
            asleep: crate::sync::AtomicBool::new(false),
            wake: crate::sync::Mutex::new(()),
            poke: Condvar::new(),
        }
    }

    /// A processor parks (`true`) or wakes (`false`).
    pub fn parked(&self, parked: bool) {
        if parked {
            self.awake.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        self.awake.fetch_add(1, Ordering::SeqCst);
        fence_after_rmw();
        if self.asleep.load(Ordering::SeqCst) {
            let _g = self.wake.lock();
            self.poke.notify_one();
        }
    }

    /// Wakes the watcher whatever it waits for (shutdown).
    pub fn poke_all(&self) {
        let _g = self.wake.lock();
        self.poke.notify_all();
    }

    /// The watcher's sleep: `look` while a processor is awake, else until
    /// poked; no sleep at all if `stop()` says so.
    pub fn sleep(&self, look: Duration, stop: impl Fn() -> bool) {
        let g = self.wake.lock();
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let idle = self.awake.load(Ordering::SeqCst) == 0;
        if !idle {
            self.asleep.store(false, Ordering::SeqCst);
        }
        let g = match stop() {
            true => g,
            false => self.poke.wait_for(g, if idle { FOR_GOOD } else { look }),
        };
        self.asleep.store(false, Ordering::SeqCst);
        drop(g);
    }
}

/// The loom model of the watcher's sleep (kept with the other models).
#[cfg(all(test, loom))]
#[path = "../loom_models/handoff.rs"]
mod loom_handoff;

/// The watcher: see the module's comment. Returns at shutdown.
pub(crate) fn watch(team: Arc<TeamInner>) {
    let h = &team.handoff;
    let mut last: Vec<u32> = vec![0; h.slots.len()];
    let mut look = h.after;
    while !team.is_shut_down() {
        // 1. Sleep: a look's length while a processor is awake, else until
        //    poked.
        h.bell.sleep(look, || team.is_shut_down());
        if team.is_shut_down() {
            break;
        }
        // 2. Look: who stayed inside one piece of user code since the last
        //    look; the next look comes soon only if someone is inside now.
        h.looks.fetch_add(1, Ordering::Relaxed);
        let mut found = None;
        let mut inside = false;
        for (i, s) in h.slots.iter().enumerate() {
            let e = s.epoch.load(Ordering::Relaxed);
            let taken = s.taken.load(Ordering::Acquire);
            let stayed = e % 2 == 1 && e == last[i] && taken;
            inside |= e % 2 == 1 && taken;
            last[i] = e;
            if stayed && !s.stuck.load(Ordering::Relaxed) && found.is_none() {
                found = Some(i);
            }
        }
        look = if inside { h.after } else { h.after * QUIET };
        // 3. Stuck while work waits: a replacement takes over.
        let Some(i) = found else { continue };
        if !team.work_waits() {
            continue;
        }
        if h.running.load(Ordering::Acquire) >= h.max {
            if !h.capped.swap(true, Ordering::Relaxed) {
                tracing::warn!(team = %team.id, max = h.max, "processors blocked in user code: all {} replacements run (TeamBuilder::max_replacements); work waits", h.max);
            }
            continue;
        }
        h.slots[i].stuck.store(true, Ordering::Release);
        h.stuck.fetch_add(1, Ordering::AcqRel);
        h.running.fetch_add(1, Ordering::AcqRel);
        let n = h.started.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 {
            tracing::warn!(team = %team.id, after = ?h.after, "a processor stayed in one handler or task while work waited: a replacement processor took over (a handler that blocks should use Team::spawn_blocking)");
        } else {
            tracing::debug!(team = %team.id, replacements = n, "a replacement processor took over");
        }
        if let Err(e) = team.start_processor(format!("ferry-proc-r{n}"), true) {
            tracing::warn!(team = %team.id, error = %e, "could not start a replacement processor");
            h.not_started();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_retires_only_while_more_run_than_are_stuck() {
        let h = Handoff::new(1, Duration::from_millis(2), 2);
        assert!(!h.retire(), "none running");
        h.running.store(2, Ordering::Relaxed);
        h.stuck.store(1, Ordering::Relaxed);
        assert!(h.retire());
        assert!(!h.retire(), "one runs for one stuck");
        h.stuck.store(0, Ordering::Relaxed);
        assert!(h.retire());
        assert_eq!(h.running.load(Ordering::Relaxed), 0);
    }

    /// The watcher looks every `handoff_after` while a processor is inside
    /// user code, and `QUIET` times as seldom while the awake ones all
    /// poll: each look takes a spinning thread's CPU for a moment.
    #[test]
    fn the_watcher_looks_seldom_while_no_processor_is_in_user_code() {
        let dir = tempfile::tempdir().unwrap();
        let after = Duration::from_millis(5);
        // Spinning for long: the processor stays awake, polling.
        let team = crate::Team::builder()
            .runtime_dir(dir.path())
            .processors(1)
            .spin(Duration::from_secs(5))
            .handoff_after(after)
            .start()
            .unwrap();
        let looks = || team.inner.handoff.looks.load(Ordering::Relaxed);
        let window = Duration::from_millis(400);
        std::thread::sleep(Duration::from_millis(50));
        let before = looks();
        std::thread::sleep(window);
        let polling = looks() - before;
        // Inside user code (a task that blocks) for the same time.
        let (tx, rx) = std::sync::mpsc::channel();
        team.spawn(async move {
            let _ = tx.send(());
            std::thread::sleep(Duration::from_millis(450));
        });
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let before = looks();
        std::thread::sleep(window);
        let inside = looks() - before;
        team.shutdown();
        let every_after = window.as_millis() as u64 / after.as_millis() as u64;
        // (A loaded machine makes looks late: fewer, never more.)
        assert!(polling <= every_after / 2, "{polling} looks in {window:?} while polling");
        assert!(inside >= every_after / 4, "{inside} looks in {window:?} inside user code");
    }

    #[test]
    fn no_processors_no_handoff() {
        assert!(!Handoff::new(0, Duration::from_millis(2), 4).enabled());
        assert!(!Handoff::new(2, Duration::from_millis(2), 0).enabled());
    }
}
