//! Timers: deadlines in time order, fired by whichever thread is idle.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

pub(crate) struct Timers {
    epoch: Instant,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Earliest deadline (ns since `epoch`), u64::MAX if none: a lock-free "anything due?" check.
    earliest: AtomicU64,
}

#[derive(Default)]
struct State {
    /// (deadline, id) of every live timer. A cancel removes its entry at
    /// once: a stream of long timers that are cancelled (a call with a long
    /// timeout answered at once) must not pile up behind an earlier one.
    order: BTreeSet<(u64, u64)>,
    /// id → (deadline, waker). Our own ids, so a fast hash (no peer picks them).
    live: FxHashMap<u64, (u64, Waker)>,
}

impl State {
    fn earliest(&self) -> u64 {
        self.order.first().map_or(u64::MAX, |&(at, _)| at)
    }
}

impl Timers {
    pub fn new() -> Timers {
        Timers {
            epoch: Instant::now(),
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            earliest: AtomicU64::new(u64::MAX),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        // Saturating below u64::MAX ("no timer"): a far deadline must not wrap to a near one.
        t.saturating_duration_since(self.epoch).as_nanos().min(u128::from(u64::MAX - 1)) as u64
    }

    /// Registers a wake-up at `at`; returns its id for `cancel`, and whether
    /// it is now the earliest timer (sleepers must then shorten their sleep).
    /// Re-registering an id replaces its waker (and deadline).
    pub fn register(&self, id: Option<u64>, at: Instant, waker: &Waker) -> (u64, bool) {
        let id = id.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed));
        let at = self.ns(at);
        let mut state = self.state.lock();
        let old = state.live.insert(id, (at, waker.clone()));
        let mut earlier = false;
        match &old {
            Some((old_at, _)) if *old_at == at => {}
            _ => {
                if let Some((old_at, _)) = &old {
                    state.order.remove(&(*old_at, id));
                }
                state.order.insert((at, id));
                earlier = self.earliest.fetch_min(at, Ordering::AcqRel) > at;
            }
        }
        drop(state);
        // The old waker is dropped unlocked: it may own a task whose drop cancels a timer.
        drop(old);
        (id, earlier)
    }

    /// Drops every timer (at shutdown): their wakers may hold tasks alive.
    pub fn clear(&self) {
        let mut state = self.state.lock();
        let old = std::mem::take(&mut *state);
        self.earliest.store(u64::MAX, Ordering::Release);
        drop(state);
        drop(old);
    }

    pub fn cancel(&self, id: u64) {
        let mut state = self.state.lock();
        let Some((at, waker)) = state.live.remove(&id) else { return };
        state.order.remove(&(at, id));
        if at <= self.earliest.load(Ordering::Acquire) {
            self.earliest.store(state.earliest(), Ordering::Release);
        }
        drop(state);
        drop(waker);
    }

    /// Wakes every timer that is due; returns whether any was.
    pub fn fire(&self) -> bool {
        if self.earliest.load(Ordering::Acquire) == u64::MAX {
            return false; // no timer: no need to read the clock
        }
        let now = self.ns(Instant::now());
        if self.earliest.load(Ordering::Acquire) > now {
            return false;
        }
        let mut due = Vec::new();
        {
            let mut state = self.state.lock();
            while let Some(&(at, id)) = state.order.first() {
                if at > now {
                    break;
                }
                state.order.pop_first();
                due.extend(state.live.remove(&id).map(|(_, w)| w));
            }
            self.earliest.store(state.earliest(), Ordering::Release);
        }
        let fired = !due.is_empty();
        for w in due {
            w.wake();
        }
        fired
    }

    /// Time until the earliest timer, capped at `max`.
    pub fn until_next(&self, max: Duration) -> Duration {
        let e = self.earliest.load(Ordering::Acquire);
        if e == u64::MAX {
            return max;
        }
        Duration::from_nanos(e.saturating_sub(self.ns(Instant::now()))).min(max)
    }

    /// Timers held (live ones only, once cancels remove theirs).
    #[cfg(test)]
    fn len(&self) -> usize {
        let state = self.state.lock();
        debug_assert_eq!(state.order.len(), state.live.len());
        state.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::counting_waker as counter;

    /// Every call with a 60 s timeout answered at once registers and cancels
    /// a timer; behind a live earlier timer they must not accumulate.
    #[test]
    fn cancelled_timers_do_not_accumulate() {
        let timers = Timers::new();
        let (count, w) = counter();
        let now = Instant::now();
        let (live, _) = timers.register(None, now + Duration::from_secs(30), &w);
        for _ in 0..100_000 {
            let (id, _) = timers.register(None, now + Duration::from_secs(60), &w);
            timers.cancel(id);
        }
        assert_eq!(timers.len(), 1);
        timers.cancel(live);
        assert_eq!(timers.len(), 0);
        assert_eq!(timers.until_next(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    /// A deadline more than 2^64 ns away (a sleep of 600 years) must stay
    /// far, not wrap to a near one that fires at once, again and again.
    #[test]
    fn far_deadlines_do_not_wrap() {
        let timers = Timers::new();
        let (count, w) = counter();
        let far = Instant::now() + Duration::from_nanos(u64::MAX) + Duration::from_secs(1);
        timers.register(None, far, &w);
        assert_eq!(timers.until_next(Duration::from_secs(60)), Duration::from_secs(60));
        assert!(!timers.fire());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn due_timers_fire_once_and_cancelled_ones_never() {
        let timers = Timers::new();
        let (count, w) = counter();
        let now = Instant::now();
        let (_, earlier) = timers.register(None, now, &w);
        assert!(earlier);
        let (gone, _) = timers.register(None, now, &w);
        timers.cancel(gone);
        let (later, _) = timers.register(None, now + Duration::from_secs(60), &w);
        // Re-registering replaces the waker and keeps one entry.
        timers.register(Some(later), now + Duration::from_secs(60), &w);
        assert_eq!(timers.len(), 2);
        assert!(timers.fire());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(!timers.fire());
        assert_eq!(timers.len(), 1);
        // Moved to now: due at once.
        timers.register(Some(later), now, &w);
        assert_eq!(timers.len(), 1);
        assert!(timers.fire());
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(timers.len(), 0);
    }
}
