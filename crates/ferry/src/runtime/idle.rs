//! What a thread does when it has nothing to do: poll the team's channels,
//! fire timers, spin a bounded time, then sleep on the team's doorbell.
//! Both `block_on` (threads outside the runtime) and processors use it.

use super::channel::Channel;
use super::channel_list::Snapshot;
use super::handoff;
use super::readiness::{self, Catch, Sweep};
use super::TeamInner;
use crate::transport::cork;
use crate::transport::doorbell::{self, Doorbell};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

/// Channels a sleeping thread looks at, at each idle wake-up, for a frame
/// whose wake-up was lost: few, as each costs a few cache misses after a
/// sleep (~0.7 µs here), beside ~50 µs of the kernel's for the wake-up.
const LOST_LOOK: usize = 4;
/// How soon after its park timeout a thread must look at its channels for
/// a frame it finds to count as one that waited through the sleep.
const LATE_LOOK: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a thread spins without finding work before it lets other
/// threads of this CPU run (`sched_yield`), once a wait; it yields at each
/// look at the clock only after a yield ran another thread (`CONTENDED`):
/// a yield with nobody else to run costs a system call (~1 µs in a
/// virtual machine), about a round trip. Longer than a quick call's round
/// trip, so the common answer never waits behind it.
const YIELD_AFTER: std::time::Duration = std::time::Duration::from_micros(4);

/// How long an answer wait spins before it first looks at what its peer
/// does (`Idle::peer_off_cpu`): longer than a quick call's round trip, so
/// the common answer never pays for the look (cache lines the peer writes).
const LOOK_AFTER: std::time::Duration = std::time::Duration::from_micros(2);

/// How long a peer's pollers' beat must stand still before an answer wait
/// takes them for off a CPU (`Idle::peer_off_cpu`): longer than another
/// thread of theirs borrowing their CPU for a moment (their hand-off
/// watcher's look: up to ~50 µs in a virtual machine), which sleeping
/// would only turn into a wake-up of ours; far shorter than a scheduler's
/// slice, what a pollers' thread waiting for a CPU waits.
const STALE_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// A `sched_yield` that took longer than this ran another thread.
const YIELD_RAN_ANOTHER: std::time::Duration = std::time::Duration::from_micros(2);

/// Lets other threads of this CPU run, and notes whether one did: then
/// this thread's CPU is contended, and its next spins yield at once.
fn yield_cpu() {
    let t = Instant::now();
    std::thread::yield_now();
    let contended = t.elapsed() >= YIELD_RAN_ANOTHER;
    CONTENDED.set(contended);
    #[cfg(test)]
    YIELDS.with(|y| {
        let (all, ran_another) = y.get();
        y.set((all + 1, ran_another + u64::from(contended)));
    });
}

#[cfg(test)]
thread_local! {
    /// This thread's yields, and those of them that ran another thread.
    static YIELDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

thread_local! {
    /// This thread's last yield ran another thread (see `yield_cpu`).
    static CONTENDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The team this thread counts as a poller of right now (its address), or 0.
    static POLLING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The channel this thread last sent a message or call on: the peer an
    /// answer wait of this thread most likely waits on (see `Idle::peer_off_cpu`).
    static SENT_ON: std::cell::RefCell<Weak<Channel>> = const { std::cell::RefCell::new(Weak::new()) };
    /// `SENT_ON`'s address, checked on every send without `SENT_ON`'s
    /// costlier access (it has a destructor to register). `SENT_ON` keeps
    /// the allocation, so the address is no other channel's.
    static SENT_ON_ADDR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Notes that this thread sent a message or call on `ch` (no atomic
/// operation while it keeps sending on the same channel).
#[inline]
pub(crate) fn sent_on(ch: &Arc<Channel>) {
    let addr = Arc::as_ptr(ch) as usize;
    if SENT_ON_ADDR.get() != addr {
        SENT_ON_ADDR.set(addr);
        SENT_ON.with(|s| *s.borrow_mut() = Arc::downgrade(ch));
    }
}

/// Counts this thread as a poller of the team's channels while alive —
/// except while it runs user code (see [`user_code`]).
pub(crate) struct Idle<'a> {
    team: &'a TeamInner,
    /// What `POLLING` said before (a wait nested in user code run by another wait).
    outer: usize,
    /// A blocking call made inside a task: run the processor's other tasks while waiting.
    run_tasks: bool,
    /// The team's channel list, revalidated with one load per turn.
    channels: Snapshot,
    /// Which of them a turn looks at (see `readiness`).
    sweep: Sweep,
    spin_started: Option<Instant>,
    /// This spin yielded for its length already (see `YIELD_AFTER`).
    yielded: bool,
    spins: u32,
    until: Option<Instant>,
    /// Never sleeps longer than this at once.
    park_at_most: Option<std::time::Duration>,
    /// Never park (busy-poll mode, while this thread waits for an answer).
    busy: bool,
    /// Spin only while the peer this thread last sent to has a thread on
    /// a CPU (an answer wait, `TeamBuilder::share_cpu`): `Some` once
    /// looked up, then the channel to it, if still there.
    peer: Option<Option<Arc<Channel>>>,
    watch_peer: bool,
    /// The peer's beat at the last look.
    peer_beat: Option<u32>,
    /// When (into the spin) the peer's beat was first seen standing still.
    stale_since: Option<std::time::Duration>,
    /// Rung awake, and found nothing of its own since: another thread took
    /// what the ring was for, or this one only handed a parked thread its
    /// answer. Spinning on would only take a CPU from the threads that do
    /// the work: this one sleeps again at once.
    rung_for_nothing: bool,
}

impl<'a> Idle<'a> {
    pub fn new(team: &'a TeamInner) -> Idle<'a> {
        Idle::with_channels(team, team.channels.snapshot())
    }

    /// [`Idle::new`] with a snapshot of the team's channels taken already.
    fn with_channels(team: &'a TeamInner, channels: Snapshot) -> Idle<'a> {
        // Frames a corked processor queued must not wait through the wait.
        flush_corked(team);
        team.doorbell.enter_polling();
        Idle {
            team,
            outer: POLLING.replace(team as *const TeamInner as usize),
            // Inside a task, or with no processors at all, a waiting thread
            // runs the team's ready tasks itself.
            run_tasks: super::executor::in_task() || team.cfg.processors == 0,
            channels,
            sweep: Sweep::new(),
            spin_started: None,
            yielded: false,
            spins: 0,
            until: None,
            park_at_most: None,
            busy: false,
            peer: None,
            watch_peer: false,
            peer_beat: None,
            stale_since: None,
            rung_for_nothing: false,
        }
    }

    /// A wait for an answer (a call's reply, a message): in busy-poll mode
    /// (`TeamBuilder::busy_poll`) it never parks; else it spins only while
    /// the peer it waits on is on a CPU (`TeamBuilder::share_cpu`).
    ///
    /// Set in place, as `until` is: an `Idle` is large, and a wait is on
    /// every call's path (a builder that moves it would copy it twice).
    pub fn for_answer(&mut self) -> &mut Self {
        self.busy = self.team.cfg.busy_poll;
        self.watch_peer = self.team.cfg.share_cpu && !self.busy;
        self
    }

    /// [`catch_on`] the team's channels.
    fn catch<T>(&mut self, catch: &mut impl FnMut(&Arc<Channel>) -> Option<T>) -> Option<T> {
        self.team.channels.refresh(&mut self.channels);
        let got = catch_on(&self.channels, catch);
        if got.is_some() {
            self.found_work();
        }
        got
    }

    /// This thread did work of its own: its next spin starts afresh.
    fn found_work(&mut self) {
        self.spin_started = None;
        self.rung_for_nothing = false;
    }

    /// Never sleeps past `deadline`.
    pub fn until(&mut self, deadline: Option<Instant>) -> &mut Self {
        self.until = deadline;
        self
    }

    /// One step of waiting: returns after doing some work, after a spin, or
    /// after sleeping. `ready()` must be true when the caller can go on; it
    /// is checked again after this thread has announced it will sleep, and
    /// `parked(true)`/`parked(false)` bracket the sleep, so wakers know to ring.
    pub fn step(&mut self, ready: &dyn Fn() -> bool, parked: &dyn Fn(bool)) {
        self.step_catching(ready, parked, None)
    }

    /// [`Idle::step`] for a thread that can take what it waits for straight
    /// from a channel: its turn's sweep offers `catch` each channel's head
    /// frame first (see `Sweep::progress_catching`).
    pub fn step_catching(&mut self, ready: &dyn Fn() -> bool, parked: &dyn Fn(bool), catch: Option<Catch<'_>>) {
        let team = self.team;
        // `has_ready` first: with no task ready, `user_code`'s leaving and
        // re-entering the pollers (two locked instructions) would buy nothing.
        if self.run_tasks && team.exec.has_ready() && user_code(team, || team.exec.run_one()) {
            self.found_work();
            return;
        }
        self.spins = self.spins.wrapping_add(1);
        // Peers waiting on this team see it turn (see `Activity::beat`).
        team.doorbell.beat(self.spins);
        // Timers are looked at every 16th turn, busy or not: reading the clock
        // costs as much as a poll, and a busy channel must not starve them.
        let fired = self.spins.is_multiple_of(16) && team.timers.fire();
        team.channels.refresh(&mut self.channels);
        let received = match catch {
            None => self.sweep.progress(team, &self.channels),
            Some(catch) => self.sweep.progress_catching(team, &self.channels, catch),
        };
        if received || fired {
            if self.rung_for_nothing && HANDED.replace(false) {
                // Rung awake only to hand a parked thread of this team its
                // answer: that thread's work, not this one's. It earns no
                // spin, and the next ring for it should wake it directly.
                team.doorbell.step_back();
                return;
            }
            self.found_work();
            return;
        }
        let spin = team.cfg.spin;
        if !spin.is_zero() && !self.rung_for_nothing {
            // Read the clock only every 64 spins: it costs as much as a few polls.
            // No PAUSE hint: on this hardware it costs ~40 ns, a good part of a
            // round trip, and the poll itself already paces the loop.
            let started = *self.spin_started.get_or_insert_with(|| {
                self.yielded = false;
                self.stale_since = None;
                Instant::now()
            });
            let share = team.cfg.share_cpu;
            if !self.spins.is_multiple_of(64) {
                // A thread we just woke may be queued for this very CPU: let
                // it run now.
                if share && doorbell::woke_a_sleeper() {
                    yield_cpu();
                }
                return;
            }
            let spun = started.elapsed();
            if spun < spin && (spun < LOOK_AFTER || !self.peer_off_cpu(spun)) {
                // Whoever would send us work may wait for this CPU: once a
                // spin, then while yields show other threads want CPUs.
                let long = spun >= YIELD_AFTER && !self.yielded;
                if share && (long || CONTENDED.get() || doorbell::woke_a_sleeper()) {
                    self.yielded |= long;
                    yield_cpu();
                }
                return;
            }
        }
        if self.busy {
            // Busy-poll mode: spin on, the answer is worth a core.
            self.spin_started = None;
            return;
        }
        parked(true);
        if self.run_tasks {
            // Count as a parked processor too, so a task made ready rings.
            team.exec.parked.fetch_add(1, Ordering::SeqCst);
        }
        team.doorbell.prepare_park();
        // Counted as a sleeper now, not a poller: user code the last look
        // runs (a direct call) must not move this thread out of the pollers.
        let me = POLLING.replace(0);
        // A channel added since the turn began (its ring came before we
        // counted as sleeping) may already carry a frame whose sender saw us polling and
        // did not ring: the last look before sleeping must include it.
        team.channels.refresh(&mut self.channels);
        let work = ready()
            || team.progress_on(&self.channels)
            || team.is_shut_down()
            || (self.run_tasks && team.exec.has_runnable());
        POLLING.set(me);
        self.rung_for_nothing = false;
        if work {
            team.doorbell.cancel_park();
        } else {
            self.rung_for_nothing = self.sleep(ready);
            HANDED.set(false);
        }
        parked(false);
        if self.run_tasks {
            team.exec.parked.fetch_sub(1, Ordering::SeqCst);
        }
        self.spin_started = None;
    }

    /// R4: sleeps (counted a sleeper since R1) until a line rings, a
    /// timer or the deadline is due, or the caller is ready; then counts as
    /// a poller again. Returns whether a ring ended the sleep.
    ///
    /// A park timeout with no ring and nothing due is an *idle* wake-up: the
    /// thread sleeps again at once, still counted a sleeper. Every frame
    /// sent since R1 found it so and rang (or found another thread polling,
    /// which takes it), so nothing new is this thread's to find: it looks
    /// only at the next window of channels for a wake-up that was lost
    /// (`Team::late_wakeups`), and an idle wake-up costs the same with 1,000
    /// peers as with none. A lost wake-up is still found, within
    /// `park_timeout` × channels / `LOST_LOOK`.
    fn sleep(&mut self, ready: &dyn Fn() -> bool) -> bool {
        let team = self.team;
        // Counted asleep for the hand-off watcher only now (the last look
        // may have run a handler, a direct call, which may block), and
        // through idle wake-ups, which run no user code (an awake
        // processor would wake the watcher too).
        let processor = is_processor_of(team);
        if processor {
            team.handoff.parked(true);
        }
        let mut rung;
        loop {
            let mut timeout = team.timers.until_next(team.cfg.park_timeout);
            if let Some(d) = self.until {
                timeout = timeout.min(d.saturating_duration_since(Instant::now()));
            }
            if let Some(d) = self.park_at_most {
                timeout = timeout.min(d);
            }
            let slept = Instant::now();
            rung = team.doorbell.sleep(timeout);
            if rung || timeout < team.cfg.park_timeout || ready() || team.is_shut_down() {
                break;
            }
            // A frame waits (not one held for a full inbox) that nobody
            // else polls for: its wake-up was lost (`Team::late_wakeups`).
            // Not counted: a frame a polling thread is about to take, one
            // in a channel somebody holds (the reactor's liveness look
            // rings for what it read once it lets go), and a look made long
            // after the timeout (this thread was descheduled: the frame may
            // have come meanwhile and woken another).
            team.channels.refresh(&mut self.channels);
            let lost = !team.doorbell.anyone_polling()
                && self
                    .sweep
                    .window(&self.channels, LOST_LOOK)
                    .any(|c| !c.held.load(Ordering::Relaxed) && !c.rx.is_locked() && c.transport.has_frame());
            if lost {
                if slept.elapsed() < timeout + LATE_LOOK {
                    team.late_wakeups.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(team = %team.id, "a thread slept to its park timeout while a channel had work");
                }
                break;
            }
        }
        if processor {
            team.handoff.parked(false);
        }
        team.doorbell.cancel_park();
        rung
    }

    /// Whether the peer this answer wait most likely waits on (the one
    /// this thread last sent to) has no thread on a CPU: all asleep while
    /// CPUs are short (the thread our message woke needs one), or pollers
    /// whose beat has stood still for `STALE_FOR` (they wait for one —
    /// perhaps the one this thread spins on). Spinning then only delays
    /// the answer: the caller sleeps instead. A peer running user code
    /// (our handler, likely) is on a CPU. Looked at every 64 turns once
    /// `LOOK_AFTER` passed; `spun` is how long this wait has spun.
    fn peer_off_cpu(&mut self, spun: std::time::Duration) -> bool {
        if !self.watch_peer {
            return false;
        }
        let peer = self.peer.get_or_insert_with(|| SENT_ON.with(|s| s.borrow().upgrade()));
        let Some(now) = peer.as_ref().and_then(|ch| ch.transport.peer_activity()) else {
            return false;
        };
        let last = std::mem::replace(&mut self.peer_beat, now.beat);
        off_cpu(&now, last, &mut self.stale_since, spun, CONTENDED.get())
    }
}

/// `Idle::peer_off_cpu`'s verdict on what the peer's state page says
/// (`now`; `last`: its beat at the previous look; `stale_since`: when this
/// wait first saw the beat stand still; `contended`: this thread's CPU is).
fn off_cpu(
    now: &doorbell::Activity,
    last: Option<u32>,
    stale_since: &mut Option<std::time::Duration>,
    spun: std::time::Duration,
    contended: bool,
) -> bool {
    match (now.running, now.polling) {
        // Every thread it counts sleeps (a thread of its own between two
        // waits counts nowhere: then it is on a CPU, as far as we know),
        // and a thread woke needs a CPU: ours, if others wait for it.
        // (With a CPU to spare, the woken thread gets it: we spin on, else
        // two teams would wake each other for good.)
        (0, 0) => now.sleeping > 0 && contended,
        // A beat that stopped only a moment ago is a thread of theirs that
        // borrowed the CPU (their watcher): it comes back at once.
        (0, _) if now.beat.is_some() && now.beat == last => {
            spun.saturating_sub(*stale_since.get_or_insert(spun)) >= STALE_FOR
        }
        (0, _) => {
            *stale_since = None;
            false
        }
        _ => false,
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        POLLING.set(self.outer);
        // The last poller leaving must not strand a frame that arrived while
        // it polled (its sender saw a poller and did not ring), nor a
        // channel's deferred work (slots of frames taken, which a writer
        // short of room waits for): it does that work itself, as waking a
        // sleeper for it would cost a wake-up per call.
        self.team.channels.refresh(&mut self.channels);
        if self.team.doorbell.leave_polling() {
            let mut wake = false;
            for c in self.channels.iter() {
                // Under the receive lock, as every receive-side call (see
                // `Transport::try_recv_serialized`): a thread that holds it
                // tidies as it drains.
                if c.transport.needs_tidy() {
                    if let Some(_rx) = c.rx.try_lock() {
                        // SAFETY: under `c.rx`, as every receive-side call.
                        unsafe { c.transport.tidy_serialized() };
                    }
                }
                wake |= c.needs_attention();
            }
            if wake {
                self.team.doorbell.ring_one();
            }
        }
    }
}

/// Runs user code (a handler, a task, a future given to `block_on`) on
/// this thread. While it runs, a thread that was polling the team's
/// channels does not count as a poller: senders then ring for what arrives
/// meanwhile, so a parked processor takes it instead of it waiting for the
/// handler to end. Leaving is the Dekker step of `Idle::drop`: if this was
/// the last poller while others sleep, a frame that came while it polled
/// (its sender did not ring) wakes a sleeper now.
pub(crate) fn user_code<R>(team: &TeamInner, f: impl FnOnce() -> R) -> R {
    // A processor inside user code too long while work waits is replaced.
    let _mark = handoff::UserCode::enter(team);
    let me = team as *const TeamInner as usize;
    if POLLING.get() != me {
        return f();
    }
    struct Resume<'a>(&'a TeamInner, usize);
    impl Drop for Resume<'_> {
        fn drop(&mut self) {
            self.0.doorbell.back_from_user_code();
            POLLING.set(self.1);
        }
    }
    POLLING.set(0);
    // Only frames need a poller: deferred tidying can wait for this thread.
    if team.doorbell.enter_user_code() && team.channels.snapshot().iter().any(|c| c.has_frame_or_held()) {
        team.doorbell.ring_one();
    }
    let _resume = Resume(team, me);
    f()
}

/// Wakes a thread blocked in `block_on`.
struct ThreadWaker {
    woken: AtomicBool,
    parked: AtomicBool,
    /// Held by a wait on this thread; a nested wait (a blocking call in a
    /// task run by an outer wait) takes another waker, so it cannot consume
    /// the outer wait's wake-up.
    in_use: AtomicBool,
    /// Weak: the thread's cache outlives teams, and must not keep a dropped
    /// team's doorbell (its fds and a mapped page) alive.
    doorbell: Weak<Doorbell>,
}

/// A thread waker and the `Waker` made of it, as this thread keeps them.
type Cached = std::rc::Rc<(Arc<ThreadWaker>, Waker)>;

/// Releases a thread waker for the next wait on this thread. (An `Rc` of
/// the cached pair: a wait takes no atomic reference count.)
struct WakerLease(Cached);

impl WakerLease {
    fn waker(&self) -> (&Arc<ThreadWaker>, &Waker) {
        (&self.0 .0, &self.0 .1)
    }
}

impl Drop for WakerLease {
    fn drop(&mut self) {
        self.0 .0.in_use.store(false, Ordering::Relaxed);
    }
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            if let Some(doorbell) = self.doorbell.upgrade() {
                doorbell.ring_now();
                HANDED.set(true);
            }
        }
    }
}

thread_local! {
    /// This thread woke a thread of its team parked in `block_on` (see `Idle::step`).
    static HANDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This thread's wakers, one per team it blocked on (the last few), kept between calls.
    static THREAD_WAKERS: std::cell::RefCell<Vec<Cached>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn thread_waker(team: &TeamInner) -> WakerLease {
    THREAD_WAKERS.with(|cell| {
        let mut wakers = cell.borrow_mut();
        // The address cannot be another doorbell's: our `Weak` keeps the allocation.
        let free = |tw: &Arc<ThreadWaker>| {
            std::ptr::eq(tw.doorbell.as_ptr(), Arc::as_ptr(&team.doorbell)) && !tw.in_use.load(Ordering::Relaxed)
        };
        let cached = match wakers.iter().find(|c| free(&c.0)) {
            Some(c) => c.clone(),
            None => {
                let tw = Arc::new(ThreadWaker {
                    woken: AtomicBool::new(false),
                    parked: AtomicBool::new(false),
                    in_use: AtomicBool::new(false),
                    doorbell: Arc::downgrade(&team.doorbell),
                });
                let w = Waker::from(tw.clone());
                // Entries of dropped teams are of no use to anyone.
                wakers.retain(|c| c.0.doorbell.strong_count() > 0);
                if wakers.len() == 8 {
                    wakers.remove(0);
                }
                let c = std::rc::Rc::new((tw, w));
                wakers.push(c.clone());
                c
            }
        };
        cached.0.in_use.store(true, Ordering::Relaxed);
        WakerLease(cached)
    })
}

/// Runs `fut` to completion on this thread, driving the team's channels
/// while it waits (spin, then park).
pub(crate) fn block_on<F: Future>(team: &TeamInner, fut: F) -> F::Output {
    block_on_until(team, fut, None)
}

/// [`block_on`] of a future that ends itself at `until` (a send's
/// deadline, which it checks when polled): the wait polls it again once
/// `until` has passed, and never sleeps past it, so the future needs no
/// timer of its own.
pub(crate) fn block_on_until<F: Future>(team: &TeamInner, fut: F, until: Option<Instant>) -> F::Output {
    let lease = thread_waker(team);
    let (tw, waker) = lease.waker();
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(waker);
    // Fast path: ready at once (an Immediate send), no polling bookkeeping.
    if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
        return v;
    }
    let mut idle = Idle::new(team);
    idle.for_answer().until(until);
    let due = |until: Option<Instant>| until.is_some_and(|at| Instant::now() >= at);
    // An answer at the head of a channel goes straight to its call (see
    // `direct_receive`); if it was ours, the waker says so.
    let mut answer = |ch: &Arc<Channel>| team.answer_direct(ch).then_some(());
    loop {
        // Polled again only once woken (or at `until`). A load first: a
        // locked swap on every spinning turn costs more than the rest of
        // the turn's look.
        let until = idle.until;
        while !(tw.woken.load(Ordering::Relaxed) && tw.woken.swap(false, Ordering::AcqRel)) {
            if due(until) {
                break;
            }
            if idle.catch(&mut answer).is_some() {
                continue;
            }
            CAUGHT.set(0);
            idle.step(&|| tw.woken.load(Ordering::SeqCst) || due(until), &|p| tw.parked.store(p, Ordering::SeqCst));
        }
        if let Poll::Ready(v) = user_code(team, || fut.as_mut().poll(&mut cx)) {
            return v;
        }
        if due(idle.until) {
            // Polled past `until` and not done (a call sent again, with a
            // deadline and a timer of its own): its waker says when.
            idle.until = None;
        }
    }
}

/// Offers `catch` each of `channels` with a frame at hand, while they
/// are few (with many, the sweep finds the frame: a look at every channel
/// would make each turn dearer with each idle peer), and at most
/// `CATCH_STREAK` times in a row: then the wait takes a turn over every
/// channel, so the rest of the team's frames, its timers and the
/// channels' deferred work are not starved by a steady stream. "At hand"
/// asks no system call: a socket's frames are the ones the sweep read
/// already (its probe is a read: one more per turn would only slow the
/// turn down).
fn catch_on<T>(channels: &Snapshot, catch: &mut impl FnMut(&Arc<Channel>) -> Option<T>) -> Option<T> {
    if channels.len() > readiness::ALL_UP_TO || CAUGHT.get() >= CATCH_STREAK {
        return None;
    }
    let got = channels.iter().filter(|ch| ch.transport.more_at_hand()).find_map(catch);
    if got.is_some() {
        CAUGHT.set(CAUGHT.get() + 1);
    }
    got
}

/// Most waits in a row a thread ends by a catch (see [`wait_catching`]).
pub(super) const CATCH_STREAK: u32 = 16;

thread_local! {
    /// Waits this thread ended by a catch since its last full turn.
    pub(super) static CAUGHT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// [`wait_until`] for a thread that can take what it waits for straight
/// from a channel (see `direct_receive`): each turn first offers `catch`
/// every channel with a frame (if the team has few), then drives them
/// all, offering `catch` each channel's head frame again before it drains
/// the channel (`Sweep::progress_catching`): a frame that came during the
/// turn is caught too, and the turn ends there. (Drained, a port's
/// message goes through its inbox and a link's through the links'
/// handler, and the turn goes on over the other channels first: 0.92 × a
/// port's round trip, 0.94 × a link's, when caught.) `None` once `until`
/// has passed.
pub(crate) fn wait_catching<T>(
    team: &TeamInner,
    attempt: impl FnMut(Option<&mut Context<'_>>) -> Poll<T>,
    catch: impl FnMut(&Arc<Channel>) -> Option<T>,
    until: Option<Instant>,
) -> Option<T> {
    wait(team, attempt, Some(catch), until)
}

/// Waits on this thread for `attempt` to be ready, driving the team's
/// channels meanwhile. While spinning, `attempt(None)` just looks; only
/// before sleeping is it called with a context, to register this thread's
/// waker (taken only then). So a message that arrives while the thread
/// spins costs no waker traffic at all.
pub(crate) fn wait_until<T>(team: &TeamInner, attempt: impl FnMut(Option<&mut Context<'_>>) -> Poll<T>) -> T {
    match wait(team, attempt, None::<fn(&Arc<Channel>) -> Option<T>>, None) {
        Some(v) => v,
        None => unreachable!("a wait with no deadline ends only when ready"),
    }
}

fn wait<T>(
    team: &TeamInner,
    attempt: impl FnMut(Option<&mut Context<'_>>) -> Poll<T>,
    mut catch: Option<impl FnMut(&Arc<Channel>) -> Option<T>>,
    until: Option<Instant>,
) -> Option<T> {
    let attempt = std::cell::RefCell::new(attempt);
    if let Poll::Ready(v) = (attempt.borrow_mut())(None) {
        return Some(v);
    }
    let sleeper = std::cell::OnceCell::new();
    let sleeper = || sleeper.get_or_init(|| thread_waker(team));
    let got = std::cell::Cell::new(None);
    let channels = team.channels.snapshot();
    // What is in a channel already is taken before the wait even begins.
    if let Some(v) = catch.as_mut().and_then(|c| catch_on(&channels, c)) {
        return Some(v);
    }
    let mut idle = Idle::with_channels(team, channels);
    idle.for_answer().until(until);
    loop {
        if let Some(v) = catch.as_mut().and_then(|c| idle.catch(c)) {
            return Some(v);
        }
        CAUGHT.set(0);
        let ready = || {
            let (tw, waker) = sleeper().waker();
            // Only a wake after this registration may stop the park.
            tw.woken.store(false, Ordering::SeqCst);
            let mut cx = Context::from_waker(waker);
            match (attempt.borrow_mut())(Some(&mut cx)) {
                Poll::Ready(v) => {
                    got.set(Some(v));
                    true
                }
                Poll::Pending => tw.woken.load(Ordering::SeqCst),
            }
        };
        let parked = |p| sleeper().waker().0.parked.store(p, Ordering::SeqCst);
        match catch.as_mut() {
            None => idle.step(&ready, &parked),
            Some(c) => {
                let mut caught = None;
                idle.step_catching(&ready, &parked, Some(&mut |ch| c(ch).map(|v| caught = Some(v)).is_some()));
                if caught.is_some() {
                    return caught;
                }
            }
        }
        if let Some(v) = got.take() {
            return Some(v);
        }
        if let Poll::Ready(v) = (attempt.borrow_mut())(None) {
            return Some(v);
        }
        if until.is_some_and(|at| Instant::now() >= at) {
            return None;
        }
    }
}

thread_local! {
    /// The team this thread is a processor of (its address), or 0.
    static PROCESSOR_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

pub(crate) fn is_processor_of(team: &TeamInner) -> bool {
    PROCESSOR_OF.get() == team as *const TeamInner as usize
}

/// Tells every channel what this thread's corked sends held back (frames
/// on TCP, wake-ups on shared memory in a batch: see `transport::cork`),
/// keeping it corked.
fn flush_corked(team: &TeamInner) {
    if cork::take_deferred() {
        for ch in team.channels.snapshot().iter() {
            ch.transport.flush_pending();
        }
    }
}

/// Runs `f` with this thread's sends corked, then flushes them (see `Team::batch`).
/// (A batch inside a corked thread — a processor's task, another batch —
/// flushes what the thread held back before it too.)
pub(crate) fn batch<R>(team: &TeamInner, f: impl FnOnce() -> R) -> R {
    struct Uncork<'a>(&'a TeamInner, bool, bool);
    impl Drop for Uncork<'_> {
        fn drop(&mut self) {
            cork::set_corked(self.1);
            cork::set_batched(self.2);
            flush_corked(self.0);
        }
    }
    let _uncork = Uncork(team, cork::set_corked(true), cork::set_batched(true));
    f()
}

/// Most tasks a processor runs before it writes what their sends queued.
const BURST: u32 = 32;

/// A processor: runs ready tasks; when there are none, idles. Its sends
/// are corked while it runs a burst of tasks (the replies to a burst of
/// requests go out in one write on TCP; on shared memory each wakes its
/// peer at once, at most once per wake: see `transport::cork`), and
/// flushed after at most [`BURST`]
/// tasks, when it runs out of tasks, and before any wait. A `replacement`
/// (see `handoff`) first takes over what a stuck processor held, and ends
/// once idle while no more processors are stuck than replacements run.
pub(crate) fn processor_loop(team: Arc<TeamInner>, replacement: bool) {
    if !team.handoff.register(&team) {
        team.handoff.not_started();
        return;
    }
    // Compared by address only while `team` (and so its address) is alive.
    PROCESSOR_OF.set(Arc::as_ptr(&team) as usize);
    cork::set_corked(true);
    if replacement {
        team.take_over();
    }
    let exec = team.exec.clone();
    let _processor = super::executor::ProcessorOf::enter(&exec);
    let mut ran: u32 = 0;
    'serve: while !team.is_shut_down() {
        let task = {
            let _mark = handoff::UserCode::enter(&team);
            exec.run_one()
        };
        if task {
            // Busy with tasks: still fire due timers now and then.
            ran = ran.wrapping_add(1);
            if ran.is_multiple_of(16) {
                team.timers.fire();
            }
            if ran.is_multiple_of(BURST) {
                flush_corked(&team);
            }
            continue;
        }
        // (Idle::new writes what the burst's sends held back.)
        let mut idle = Idle::new(&team);
        while !exec.has_ready() && !team.is_shut_down() {
            if replacement {
                if team.handoff.retire() {
                    break 'serve;
                }
                // Calls queued behind a stuck serving task: looked for at
                // least every `handoff_after` while a processor is stuck.
                if team.handoff.any_stuck() {
                    team.take_queued_calls();
                    idle.park_at_most = Some(team.handoff.after());
                } else {
                    idle.park_at_most = None;
                }
            }
            idle.step(&|| exec.has_ready(), &|p| {
                if p {
                    exec.parked.fetch_add(1, Ordering::SeqCst);
                } else {
                    exec.parked.fetch_sub(1, Ordering::SeqCst);
                }
            });
        }
    }
    flush_corked(&team);
    cork::set_corked(false);
    PROCESSOR_OF.set(0);
    team.handoff.unregister();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Team;
    use std::time::Duration;

    /// A long spin yields for its length once; it yields again only after
    /// a yield ran another thread. It yielded at every look at the clock
    /// (every few microseconds), and a `sched_yield` with nobody else to
    /// run costs about a round trip in a virtual machine: 1,300-1,900
    /// system calls in one `ferry bench rpc --only ferry.shm.arg4`.
    #[test]
    fn a_spin_yields_for_its_length_once_unless_others_want_the_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).spin(Duration::from_secs(5)).start().unwrap();
        let port = team.open_raw_port().unwrap();
        YIELDS.set((0, 0));
        // Nothing comes: the receive spins to its deadline (shorter than the spin).
        assert!(port.recv_timeout(Duration::from_millis(30)).is_err());
        let (all, ran_another) = YIELDS.get();
        assert!(all >= 1, "a 30 ms spin did not yield once");
        assert!(all <= 1 + ran_another, "{all} yields, {ran_another} of them ran another thread");
    }

    /// A served frame's reply, corked by the thread that served it (a
    /// processor corks its TCP sends), leaves at the end of the pass that
    /// took the frame. It waited for the channel's next pass (after a
    /// look at every other channel and another read of this one): 0.8 µs
    /// of every remote-memory operation across machines (`ferry.tcp.get.8`
    /// 1.09 × `ferry.tcp.null`, now 1.0), or until a heartbeat went. Here
    /// the server is driven by hand, corked, and not one pass more once it
    /// served the frame.
    #[test]
    fn a_served_reply_leaves_with_the_pass_that_took_its_frame() {
        use crate::runtime::served::{FrameHandler, ServedFrame};
        use std::sync::atomic::AtomicBool;
        struct Echo(AtomicBool);
        impl FrameHandler for Echo {
            fn serve(&self, frame: ServedFrame<'_>) {
                let bytes = frame.with_payload(<[u8]>::to_vec);
                frame.reply(&bytes).unwrap();
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let node = |cluster: crate::Cluster, dir: &tempfile::TempDir, processors: usize| {
            // Heartbeats (which flush what waits) far apart: 15 s.
            let b =
                Team::builder().runtime_dir(dir.path()).processors(processors).peer_timeout(Duration::from_secs(60));
            b.cluster(cluster).start().unwrap()
        };
        // The server has no processor: only this thread drains it.
        let [one, two] = super::super::cluster::loopback_pair();
        let (client, server) = (node(one, &dirs[0], 1), node(two, &dirs[1], 0));
        let echo = Arc::new(Echo(AtomicBool::new(false)));
        let _serving = server.serve_frames(200..=200, echo.clone()).unwrap();
        let to = server.reserve_endpoint().unwrap();
        let sender = client.frame_sender(to, 200).unwrap().with_timeout(Duration::from_secs(5));
        let call = std::thread::spawn(move || sender.call(b"ping"));
        batch(&server.inner, || {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while !echo.0.load(Ordering::SeqCst) {
                assert!(std::time::Instant::now() < until, "the frame never came");
                server.inner.progress_on(&server.inner.channels.snapshot());
                std::thread::yield_now();
            }
            // Still corked, and no more passes: the reply must be out.
            assert_eq!(call.join().unwrap().expect("the reply did not leave").as_slice(), b"ping");
        });
    }

    /// A batch's sends on shared memory wake the peer with one check (a
    /// full fence and a look at its state page) when the batch ends, not
    /// one per frame; every frame still arrives, in order, also at a peer
    /// that sleeps through the batch.
    #[test]
    fn a_batch_checks_the_peers_wake_up_once() {
        use crate::transport::doorbell::WAKE_CHECKS;
        let dir = tempfile::tempdir().unwrap();
        let b = || Team::builder().runtime_dir(dir.path()).processors(0).blocking();
        let (sender, receiver) = (b().start().unwrap(), b().start().unwrap());
        let port = receiver.open_raw_port().unwrap();
        let to = sender.raw_sender(port.id());
        to.send(b"bind", crate::Checkpoint::Immediate).unwrap();
        assert_eq!(port.recv_blocking().unwrap().payload(), b"bind");
        // The receiver sleeps in its wait while the batch runs.
        let taker = std::thread::spawn(move || {
            (0..50u8).map(|_| port.recv_timeout(Duration::from_secs(10)).unwrap().payload()[0]).collect::<Vec<_>>()
        });
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while receiver.inner.doorbell.sleepers() == 0 {
            assert!(std::time::Instant::now() < until, "the receiver does not sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        let checks = |f: &dyn Fn()| {
            let before = WAKE_CHECKS.get();
            f();
            WAKE_CHECKS.get() - before
        };
        let sent = checks(&|| {
            sender.batch(|| {
                for i in 0..50u8 {
                    to.send(&[i], crate::Checkpoint::Immediate).unwrap();
                }
            })
        });
        assert_eq!(sent, 1, "{sent} wake-up checks for a batch of 50 frames");
        assert_eq!(taker.join().unwrap(), (0..50).collect::<Vec<_>>());
        // Uncorked, each send checks.
        assert_eq!(checks(&|| drop(to.send(b"x", crate::Checkpoint::Immediate).unwrap())), 1);
    }

    /// A batch inside a batch (or inside a processor's task) keeps what the
    /// outer one held back: it wakes the peer when it ends. Before, it
    /// cleared the outer's note of held-back frames, so neither woke the
    /// sleeping receiver, which slept to its park timeout.
    #[test]
    fn a_nested_batch_keeps_what_the_outer_held_back() {
        let dir = tempfile::tempdir().unwrap();
        let b = || Team::builder().runtime_dir(dir.path()).processors(0).blocking();
        let sender = b().start().unwrap();
        let receiver = b().park_timeout(Duration::from_secs(60)).start().unwrap();
        let port = receiver.open_raw_port().unwrap();
        let to = sender.raw_sender(port.id());
        to.send(b"bind", crate::Checkpoint::Immediate).unwrap();
        assert_eq!(port.recv_blocking().unwrap().payload(), b"bind");
        let taker = std::thread::spawn(move || {
            let m = port.recv_timeout(Duration::from_secs(10)).map(|m| m.into_payload());
            (m, std::time::Instant::now())
        });
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while receiver.inner.doorbell.sleepers() == 0 {
            assert!(std::time::Instant::now() < until, "the receiver does not sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
        sender.batch(|| {
            to.send(b"held", crate::Checkpoint::Immediate).unwrap();
            sender.batch(|| {});
        });
        let ended = std::time::Instant::now();
        let (m, taken) = taker.join().unwrap();
        assert_eq!(m.unwrap(), b"held");
        let late = taken.saturating_duration_since(ended);
        assert!(late < Duration::from_secs(2), "the receiver was not woken: it took the message {late:?} late");
    }

    /// Busy-poll mode: a thread waiting for an answer never parks (the
    /// team's doorbell never counts it asleep); by default it parks once
    /// its spin is over.
    #[test]
    fn busy_poll_waits_spin_instead_of_parking() {
        let dir = tempfile::tempdir().unwrap();
        for busy in [false, true] {
            let b = Team::builder().runtime_dir(dir.path()).processors(0).park_timeout(Duration::from_secs(1));
            let team = if busy { b.busy_poll() } else { b }.start().unwrap();
            let port = team.open_raw_port().unwrap();
            let waiter = std::thread::spawn(move || port.recv_timeout(Duration::from_millis(400)));
            let mut slept = false;
            let until = std::time::Instant::now() + Duration::from_millis(300);
            while std::time::Instant::now() < until {
                slept |= team.inner.doorbell.sleepers() != 0;
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(matches!(waiter.join().unwrap(), Err(crate::Error::DeadlineExceeded)));
            assert_eq!(slept, !busy, "busy-poll {busy}: the waiting thread slept: {slept}");
        }
    }

    /// A peer's pollers whose beat stands still for a moment (another
    /// thread of theirs borrowed their CPU: their hand-off watcher's look)
    /// are not taken for off a CPU: only a beat still for `STALE_FOR` is.
    /// (Before, one look that found the beat still sent the caller to
    /// sleep, and the answer then waited for a wake-up: 20-50 µs, ~500
    /// times a second while the peer's watcher looked every 2 ms.)
    #[test]
    fn a_peer_beat_still_for_a_moment_is_not_off_cpu() {
        let polling = |beat| doorbell::Activity { polling: 1, running: 0, sleeping: 0, beat: Some(beat) };
        let us = Duration::from_micros;
        let mut since = None;
        assert!(!off_cpu(&polling(7), Some(6), &mut since, us(3), false), "the beat moved");
        assert!(!off_cpu(&polling(7), Some(7), &mut since, us(4), false), "still for a moment");
        assert!(!off_cpu(&polling(7), Some(7), &mut since, us(40), false), "still for 36 µs");
        assert!(off_cpu(&polling(7), Some(7), &mut since, us(60), false), "still for 56 µs");
        assert!(!off_cpu(&polling(8), Some(7), &mut since, us(61), false), "moving again");
        assert!(!off_cpu(&polling(8), Some(8), &mut since, us(100), false), "still again, for a moment");
        // Running user code, it is on a CPU; all asleep, it needs one only if CPUs are short.
        let running = doorbell::Activity { polling: 0, running: 1, sleeping: 0, beat: Some(8) };
        assert!(!off_cpu(&running, Some(8), &mut None, us(1000), true));
        let asleep = doorbell::Activity { polling: 0, running: 0, sleeping: 1, beat: Some(8) };
        assert!(!off_cpu(&asleep, Some(8), &mut None, us(3), false));
        assert!(off_cpu(&asleep, Some(8), &mut None, us(3), true));
    }

    /// An idle wake-up (a park timeout with nothing rung) sleeps again at
    /// once, still counted asleep: no turn over the channels (the beat a
    /// turn bumps stays still), so it costs the same with any number of
    /// peers. Before, each one spun and looked at every channel again.
    #[test]
    fn an_idle_wake_up_sleeps_again_without_a_turn() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).processors(0).park_timeout(Duration::from_millis(1));
        let team = team.start().unwrap();
        let port = team.open_raw_port().unwrap();
        let waiter = std::thread::spawn(move || port.recv_timeout(Duration::from_millis(500)));
        std::thread::sleep(Duration::from_millis(100));
        let before = team.inner.doorbell.activity();
        std::thread::sleep(Duration::from_millis(200));
        let after = team.inner.doorbell.activity();
        assert!(matches!(waiter.join().unwrap(), Err(crate::Error::DeadlineExceeded)));
        assert_eq!((before.sleeping, after.sleeping), (1, 1));
        assert_eq!(before.beat, after.beat, "~200 idle wake-ups turned over the channels");
    }

    /// A processor rung awake that finds nothing to do (another thread
    /// took the frame) sleeps again after one turn: it does not spin. Before,
    /// each such ring cost its full spin (here 2 ms: hundreds of turns), the
    /// CPU a fan-in's callers and server needed.
    #[test]
    fn a_ring_for_nothing_earns_no_spin() {
        let dir = tempfile::tempdir().unwrap();
        let b = Team::builder().runtime_dir(dir.path()).processors(1).spin(Duration::from_millis(2));
        let team = b.park_timeout(Duration::from_secs(5)).start().unwrap();
        let bell = &team.inner.doorbell;
        let asleep = || {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while bell.activity().sleeping != 1 {
                assert!(std::time::Instant::now() < until, "the processor does not sleep");
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        asleep();
        let before = bell.activity().beat.unwrap();
        const RINGS: u32 = 20;
        for _ in 0..RINGS {
            bell.ring_one();
            std::thread::sleep(Duration::from_millis(1));
            asleep();
        }
        let turns = bell.activity().beat.unwrap().wrapping_sub(before);
        assert!(turns <= 3 * RINGS, "{turns} turns for {RINGS} rings");
    }

    /// A thread that once blocked on a team caches a waker for it; once the
    /// team is dropped, its doorbell (an fd and a mapped page) must go.
    #[test]
    fn thread_waker_cache_does_not_keep_a_dropped_teams_doorbell() {
        let dir = tempfile::tempdir().unwrap();
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        let port = team.open_raw_port().unwrap();
        assert!(matches!(port.recv_timeout(Duration::from_millis(5)), Err(crate::Error::DeadlineExceeded)));
        let doorbell = Arc::downgrade(&team.inner.doorbell);
        let cached = |d: &Weak<Doorbell>| THREAD_WAKERS.with(|w| w.borrow().iter().any(|c| c.0.doorbell.ptr_eq(d)));
        assert!(cached(&doorbell));
        drop((port, team));
        assert_eq!(doorbell.strong_count(), 0);
        // The next team's wait clears the dead entry.
        let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
        team.block_on(async {});
        assert!(!cached(&doorbell));
    }
}
