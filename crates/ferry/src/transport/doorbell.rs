//! A team's doorbell: how a sender wakes a team whose threads all sleep.
//!
//! The team's idle threads count themselves in `pollers` while they spin
//! over their channels and in `sleepers` while they sleep. A sender
//! publishes its frame, then (after a full fence) looks: if nobody polls
//! and somebody sleeps, it rings. Both sides do store → fence → load
//! (Dekker), so a frame published just as a thread decides to sleep is
//! seen by one of the two.
//!
//! ## What a peer can touch (defect 8 of the core issue)
//!
//! The two counters live on a page of shared memory (the *state page*)
//! that the team maps writable and seals (`F_SEAL_FUTURE_WRITE`): a peer
//! maps it **read-only**, so no peer can make the team look busy or
//! asleep to the others. A peer rings through **lines of its own**: two
//! eventfds the team made for that one channel and handed over in the bind
//! handshake ([`Doorbell::new_line`], [`Bell`]): `one` wakes one sleeping
//! thread (a frame came: any thread can take it), `all` wakes every thread
//! (room came for a writer, which may be any of them). The team's own
//! threads ring its two local lines the same way.
//!
//! Each thread that sleeps has an epoll set of its own for the team,
//! watching every line edge-triggered (a ring is a write, an edge; nobody
//! reads the eventfds): `one` lines with `EPOLLEXCLUSIVE` (an edge wakes
//! one sleeping thread), `all` lines without (each thread's set keeps its
//! own edge, so no thread takes another's wake-up). A ring that comes just
//! before a thread sleeps is not lost: the edge waits in its set, and the
//! sleep returns at once. An exclusive edge wakes the first set, in the
//! order they began to watch the line, whose thread sleeps: a thread rung
//! only to hand another thread of its team the answer it sleeps for steps
//! back to the end ([`Doorbell::step_back`]), so that the next answer wakes
//! the waiting thread itself. A socket (a TCP
//! channel, next) joins the sets the same way and wakes a team as directly
//! as shared memory does.
//!
//! The worst a misbehaving peer can do is to its own lines: ring them
//! without cause (our threads wake for nothing: CPU, not delay), or drain
//! them (it loses its own wake-ups; other channels keep theirs).
//!
//! ## The wake-up protocol, step by step
//!
//! Sender (`Transport::try_send` then [`Bell::ring`]; the team's own threads
//! use [`Doorbell::ring`] the same way, on the local line):
//!
//! - **S1** publish the frame (the ring's release store of its stamp);
//! - **S2** `fence(SeqCst)`;
//! - **S3** load `sleepers`; if 0, done (nobody to wake);
//! - **S4** load `pollers`; if 0, ring the `one` line.
//!
//! Receiving thread going to sleep (`Idle::step` with [`Doorbell::prepare_park`]):
//!
//! - **R1** count itself in `sleepers` and out of `pollers`;
//! - **R2** a full fence (`fence_after_rmw`: on x86 R1's locked
//!   read-modify-writes are one, and only the compiler is held back);
//! - **R3** look at every channel once more (and the caller's own condition);
//!   if anything waits, [`Doorbell::cancel_park`] and handle it;
//! - **R4** [`Doorbell::park`]: sleep until a line rings (take its
//!   wake-up), at most `park_timeout`. A sleep that ends with no ring and
//!   nothing due may sleep again, still counted ([`Doorbell::sleep`]):
//!   nothing sent since R1 went unrung.
//!
//! S1–S2–S3/S4 against R1–R2–R3 is Dekker's pattern: either R3 sees the
//! frame, or S3/S4 see the sleeper and no poller and add a wake-up, which
//! R4 finds whether it comes before or after R4 starts waiting. A thread
//! that stops polling without sleeping (the last poller leaving, or one
//! about to run user code: [`Doorbell::leave_polling`], **L1** decrement
//! `pollers`, **L2** a full fence, as R2's, **L3** load `sleepers`) looks at the
//! channels once more when it was the last poller while others sleep, and
//! wakes one sleeper if a frame waits, since its senders saw a poller and
//! did not ring.
//!
//! The loom models in `loom_models` check these steps (and fail when the
//! fence of S2, R2 or L2 is removed).

use crate::error::{Error, Result};
use crate::sync::{fence, fence_after_rmw, AtomicU32Ops, Ordering};
use crate::sys::shm::Mapping;
use parking_lot::Mutex;
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of a doorbell's state page.
pub const DOORBELL_LEN: usize = 4096;
// 128 bytes apart: cores fetch cache lines in pairs.
const POLLERS: usize = 128;
const SLEEPERS: usize = 256;
const BEAT: usize = 384;
const WAKES: usize = 512;

/// The `pollers` word counts, in its low 16 bits, the threads polling the
/// team's channels and, in its high 16 bits, those that left polling to
/// run user code (a handler, a task) and will come back: both are awake.
/// Moving a thread from one count to the other is one add (`RUNNING - 1`)
/// that borrows nothing while the thread was counted where it leaves.
/// (More than 65,535 threads polling one team at once would spill into
/// the running count: peers would then misjudge it, nothing worse.)
const RUNNING: u32 = 1 << 16;
const POLLING_MASK: u32 = RUNNING - 1;

/// Where a doorbell's two words live, how a ringer wakes a sleeper and how
/// a thread sleeps: a state page, eventfds and epoll sets in production
/// ([`DoorbellPage`]), heap words and a loom condition variable in the loom
/// models.
pub trait DoorbellMemory: Send + Sync + 'static {
    type Word: AtomicU32Ops;
    /// One of the team's lines, as a ringer holds it.
    type Line: Send + Sync;
    /// Where the team's threads sleep, watching every line.
    type Sleep: Send + Sync;

    fn pollers(&self) -> &Self::Word;
    fn sleepers(&self) -> &Self::Word;
    /// A word the team's polling threads bump as they turn (see
    /// [`Activity`]); memories without it (the models) give none.
    fn beat(&self) -> Option<&Self::Word> {
        None
    }
    /// A word the team's threads bump when a ring ends their sleep, before
    /// they look at the channels (see [`Bell::ring`]); memories without it
    /// give none, and their ringers ring every time.
    fn wakes(&self) -> Option<&Self::Word> {
        None
    }

    /// Wakes one sleeping thread of the team (or the next to sleep).
    fn ring_one(line: &Self::Line);

    /// Wakes every thread of the team that sleeps (or is about to:
    /// `sleepers` is what the ringer saw); a thread not sleeping returns
    /// from its next sleep at once.
    fn ring_all(line: &Self::Line, sleepers: u32);

    /// Sleeps until a line rings for this thread, taking the wake-up; at most `timeout`
    /// (a model may wait for ever: a wake-up that never comes is then a
    /// deadlock it reports). Spurious returns are allowed. Returns false
    /// if it slept the whole timeout with no line ringing (as far as it can tell).
    fn wait(sleep: &Self::Sleep, timeout: Duration) -> bool;

    /// Puts this thread last among the sleepers an exclusive ring on the
    /// lines that ended its last sleep wakes (see [`Doorbell::step_back`]).
    fn step_back(_sleep: &Self::Sleep) {}
}

/// A doorbell's state page: writable for its team, read-only for peers.
pub struct DoorbellPage {
    map: Mapping,
}

impl DoorbellPage {
    fn word(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= DOORBELL_LEN && offset.is_multiple_of(4));
        // SAFETY: the mapping is DOORBELL_LEN bytes, page-aligned, and lives as
        // long as `self`; the offsets are in bounds and 4-aligned. Shared memory
        // is only ever accessed through atomics here; a peer's page is mapped
        // read-only and only loaded from (`Bell` never stores).
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU32) }
    }
}

/// A pair of lines to a team, as a ringer holds them: two eventfds that
/// every thread's epoll set watches edge-triggered (each write is an edge;
/// nobody reads them), `one` with `EPOLLEXCLUSIVE` (an edge wakes one
/// sleeping thread), `all` without (an edge wakes every thread: each set
/// keeps its own edge, so no thread can take another's).
pub struct Lines {
    one: Arc<OwnedFd>,
    all: Arc<OwnedFd>,
    /// A peer's lines (a [`Bell`]'s): the peer shares their file
    /// description, flags included.
    peers: bool,
}

impl Lines {
    fn new() -> Result<Lines> {
        let fd =
            || eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| Error::io("eventfd")(e.into()));
        let (one, all) = (fd()?, fd()?);
        Ok(Lines { one: Arc::new(one), all: Arc::new(all), peers: false })
    }

    fn write(&self, fd: &OwnedFd) {
        // Never read, the count only grows: 2^64 - 2 writes fill it. A peer
        // can fill its own lines at once: our write then fails without
        // waiting (non-blocking), and only that peer's wake-ups are lost.
        // It could also clear `O_NONBLOCK` (the flag is the shared file
        // description's): then a write to a full line would wait for good,
        // so a peer's line that blocks is not rung (its wake-ups are lost).
        // Left: a peer that clears the flag between this look and the
        // write, with its line full, holds the ringing thread.
        if self.peers && !rustix::fs::fcntl_getfl(fd).is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK)) {
            static TOLD: std::sync::Once = std::sync::Once::new();
            TOLD.call_once(|| tracing::warn!("a peer made its wake-up line blocking: it is not rung any more"));
            return;
        }
        let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
    }
}

impl DoorbellMemory for DoorbellPage {
    type Word = AtomicU32;
    type Line = Lines;
    type Sleep = SleepSet;

    #[inline(always)]
    fn pollers(&self) -> &AtomicU32 {
        self.word(POLLERS)
    }

    #[inline(always)]
    fn sleepers(&self) -> &AtomicU32 {
        self.word(SLEEPERS)
    }

    #[inline(always)]
    fn beat(&self) -> Option<&AtomicU32> {
        Some(self.word(BEAT))
    }

    #[inline(always)]
    fn wakes(&self) -> Option<&AtomicU32> {
        Some(self.word(WAKES))
    }

    fn ring_one(line: &Lines) {
        line.write(&line.one);
    }

    fn ring_all(line: &Lines, _sleepers: u32) {
        line.write(&line.all);
    }

    fn wait(sleep: &SleepSet, timeout: Duration) -> bool {
        sleep.wait(timeout)
    }

    fn step_back(sleep: &SleepSet) {
        sleep.step_back();
    }
}

/// A team's lines, and the epoll set of each thread that sleeps on them.
/// A line `k` is watched under key `2k` (`one`) and `2k + 1` (`all`); the
/// team's local lines are line 0.
pub struct SleepSet(Arc<Registry>);

#[derive(Default)]
struct Registry {
    state: Mutex<RegistryState>,
    next_line: AtomicU64,
}

#[derive(Default)]
struct RegistryState {
    /// Each line's descriptors and how a thread's set watches them.
    lines: HashMap<u64, Vec<(Arc<OwnedFd>, epoll::EventFlags)>>,
    /// The epoll sets of the threads that slept here (pruned once their thread ended).
    sets: Vec<std::sync::Weak<OwnedFd>>,
}

fn watch(set: &OwnedFd, k: u64, fds: &[(Arc<OwnedFd>, epoll::EventFlags)]) -> Result<()> {
    for (fd, flags) in fds {
        epoll::add(set, &**fd, epoll::EventData::new_u64(k), *flags).map_err(|e| Error::io("epoll_ctl")(e.into()))?;
    }
    Ok(())
}

/// How every thread's set watches a `one` line. With EPOLLEXCLUSIVE an edge
/// goes to the sets it passes on its way until one with a sleeping thread:
/// a thread that was polling finds it at its next sleep (a spurious
/// return), the sleeping one wakes.
const ONE: epoll::EventFlags = epoll::EventFlags::IN.union(epoll::EventFlags::ET).union(epoll::EventFlags::EXCLUSIVE);
const ALL: epoll::EventFlags = epoll::EventFlags::IN.union(epoll::EventFlags::ET);

thread_local! {
    /// The line whose edge ended this thread's last sleep, if one did: its
    /// registry's address and its key there.
    static WOKEN_BY: std::cell::Cell<Option<(usize, u64)>> = const { std::cell::Cell::new(None) };
    /// This thread's epoll set for each team it slept on (the last few).
    static THREAD_SETS: std::cell::RefCell<Vec<(std::sync::Weak<Registry>, Arc<OwnedFd>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl SleepSet {
    /// Adds a line (its descriptors, each with how to watch it); every
    /// thread's set watches it.
    fn add(&self, fds: Vec<(Arc<OwnedFd>, epoll::EventFlags)>) -> Result<u64> {
        let k = self.0.next_line.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut st = self.0.state.lock();
        st.sets.retain(|s| s.strong_count() > 0);
        for set in st.sets.iter().filter_map(|s| s.upgrade()) {
            watch(&set, k, &fds)?;
        }
        st.lines.insert(k, fds);
        Ok(k)
    }

    fn remove(&self, k: u64) {
        let mut st = self.0.state.lock();
        if let Some(fds) = st.lines.remove(&k) {
            for set in st.sets.iter().filter_map(|s| s.upgrade()) {
                for (fd, _) in &fds {
                    let _ = epoll::delete(&*set, &**fd);
                }
            }
        }
    }

    /// This thread's epoll set for this team, made (watching every line) on first use.
    fn thread_set(&self) -> Result<Arc<OwnedFd>> {
        THREAD_SETS.with(|cell| {
            let mut sets = cell.borrow_mut();
            if let Some((_, set)) = sets.iter().find(|(r, _)| std::ptr::eq(r.as_ptr(), Arc::as_ptr(&self.0))) {
                return Ok(set.clone());
            }
            sets.retain(|(r, _)| r.strong_count() > 0);
            let set =
                Arc::new(epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| Error::io("epoll_create")(e.into()))?);
            let mut st = self.0.state.lock();
            for (k, fds) in &st.lines {
                watch(&set, *k, fds)?;
            }
            st.sets.retain(|s| s.strong_count() > 0);
            st.sets.push(Arc::downgrade(&set));
            drop(st);
            sets.push((Arc::downgrade(&self.0), set.clone()));
            Ok(set)
        })
    }

    fn wait(&self, timeout: Duration) -> bool {
        let set = match self.thread_set() {
            Ok(set) => set,
            Err(e) => {
                // No epoll set (out of descriptors): sleep the timeout out rather than spin.
                tracing::warn!(error = %e, "cannot sleep on the team's lines; sleeping the park timeout");
                std::thread::sleep(timeout);
                return false;
            }
        };
        let mut events = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 8];
        let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
        // The edges taken here are this thread's own (its set's): any one
        // wakes it; taking several at once saves spurious returns later.
        // An error (EINTR) counts as a ring: only a timeout says nobody rang.
        let got = epoll::wait(&*set, &mut events[..], Some(&timeout));
        WOKEN_BY.set(match got {
            Ok(n) if n > 0 => Some((Arc::as_ptr(&self.0) as usize, events[0].data.u64())),
            _ => None,
        });
        !matches!(got, Ok(0))
    }

    /// Moves this thread's set to the end of the queue of the `one` line
    /// that ended its last sleep (an exclusive edge wakes the first set in
    /// it with a sleeping thread, in the order they began to watch): the
    /// next edge wakes another sleeper first. (Watching anew an eventfd
    /// that was ever written reports one edge at once: the next sleep may
    /// return once for nothing.)
    fn step_back(&self) {
        // (A sleep on another team since, in user code run meanwhile, is not ours.)
        let Some((_, k)) = WOKEN_BY.take().filter(|(r, _)| *r == Arc::as_ptr(&self.0) as usize) else { return };
        let Ok(set) = self.thread_set() else { return };
        let st = self.0.state.lock();
        // A line removed meanwhile stays removed.
        for (fd, flags) in st.lines.get(&k).into_iter().flatten() {
            if flags.contains(epoll::EventFlags::EXCLUSIVE) && epoll::delete(&*set, &**fd).is_ok() {
                let _ = epoll::add(&*set, &**fd, epoll::EventData::new_u64(k), *flags);
            }
        }
    }
}

/// Descriptors the team's sleeping threads watch, until dropped (a peer
/// holding copies of them cannot keep them there).
pub struct Watch {
    key: u64,
    set: SleepSet,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.set.remove(self.key);
    }
}

/// A channel's lines as its team holds them, watched while it lives.
pub struct Line {
    lines: Lines,
    _watch: Watch,
}

impl Line {
    /// The two eventfds (`one`, `all`), handed to the peer in the bind handshake.
    pub fn fds(&self) -> (&OwnedFd, &OwnedFd) {
        (&self.lines.one, &self.lines.all)
    }
}

/// A team's doorbell (see the module's documentation), on `M`'s memory.
pub struct Doorbell<M: DoorbellMemory = DoorbellPage> {
    mem: M,
    /// The line the team's own threads ring.
    local: M::Line,
    sleep: M::Sleep,
}

impl Doorbell {
    /// A fresh doorbell: its state page (nobody polling or sleeping) and its local lines.
    pub fn create() -> Result<Doorbell> {
        let map = Mapping::create_published("ferry-doorbell", DOORBELL_LEN)?;
        let sleep = SleepSet(Arc::default());
        let local = Lines::new()?;
        sleep.add(vec![(local.one.clone(), ONE), (local.all.clone(), ALL)])?;
        Ok(Doorbell { mem: DoorbellPage { map }, local, sleep })
    }

    /// The state page's memfd, handed to peers at bind time (they can map
    /// it read-only only).
    pub fn page_fd(&self) -> &OwnedFd {
        self.mem.map.fd()
    }

    /// New lines for one channel: its peer rings the team through them.
    pub fn new_line(&self) -> Result<Line> {
        let lines = Lines::new()?;
        let watch = self.watch(vec![(lines.one.clone(), ONE), (lines.all.clone(), ALL)])?;
        Ok(Line { lines, _watch: watch })
    }

    /// Has the team's sleeping threads watch a socket: data (or a hang-up,
    /// which reads as data) wakes one of them, edge-triggered like a `one`
    /// line; with `room`, room to write in it instead (watched only while
    /// bytes wait for it: a writable socket would wake a thread at once).
    pub fn watch_socket(&self, socket: &impl AsFd, room: bool) -> Result<Watch> {
        use epoll::EventFlags as F;
        let fd = rustix::io::dup(socket).map_err(|e| Error::io("dup")(e.into()))?;
        let flags = if room { F::OUT | F::ET | F::EXCLUSIVE } else { ONE };
        self.watch(vec![(Arc::new(fd), flags)])
    }

    fn watch(&self, fds: Vec<(Arc<OwnedFd>, epoll::EventFlags)>) -> Result<Watch> {
        let key = self.sleep.add(fds)?;
        Ok(Watch { key, set: SleepSet(self.sleep.0.clone()) })
    }
}

impl<M: DoorbellMemory> Doorbell<M> {
    /// A doorbell on other memory (the loom models' heap words).
    #[cfg(all(test, loom))]
    pub(crate) fn on(mem: M, local: M::Line, sleep: M::Sleep) -> Doorbell<M> {
        Doorbell { mem, local, sleep }
    }

    /// One of the team's own threads, after publishing work for the team
    /// (S2–S4 on the local line): wakes a sleeper if nobody polls.
    #[inline]
    pub fn ring(&self) {
        ring_if_idle(&self.mem, &self.local, None);
    }

    /// Wakes every sleeper unconditionally (a waker whose thread sleeps
    /// here, shutdown, a channel's end).
    pub fn ring_now(&self) {
        WOKE.set(true);
        M::ring_all(&self.local, self.mem.sleepers().load(Ordering::SeqCst));
    }

    /// Wakes one sleeper.
    pub fn ring_one(&self) {
        WOKE.set(true);
        M::ring_one(&self.local);
    }

    /// Threads asleep now (for tests that watch a team park).
    #[cfg(test)]
    pub(crate) fn sleepers(&self) -> u32 {
        self.mem.sleepers().load(Ordering::SeqCst)
    }

    /// A thread starts polling (spinning over channels).
    #[inline]
    pub fn enter_polling(&self) {
        self.mem.pollers().fetch_add(1, Ordering::SeqCst);
    }

    /// A thread stops polling. Returns true if it was the last poller while
    /// others sleep: a sender that saw it polling did not ring, so the
    /// caller must look at the channels once more and `ring_one` if
    /// anything waits (Dekker with `ring`).
    #[inline]
    pub fn leave_polling(&self) -> bool {
        self.stop_polling(false)
    }

    /// A polling thread leaves polling to run user code: as
    /// [`Doorbell::leave_polling`], but it counts as running (awake) until
    /// [`Doorbell::back_from_user_code`].
    #[inline]
    pub fn enter_user_code(&self) -> bool {
        self.stop_polling(true)
    }

    /// Back from user code: polling again.
    #[inline]
    pub fn back_from_user_code(&self) {
        self.mem.pollers().fetch_sub(RUNNING - 1, Ordering::SeqCst);
    }

    /// L1 (out of the polling count, and into the running one if
    /// `to_user_code`), L2; L3 below.
    #[inline]
    fn stop_polling(&self, to_user_code: bool) -> bool {
        let old = match to_user_code {
            true => self.mem.pollers().fetch_add(RUNNING - 1, Ordering::SeqCst),
            false => self.mem.pollers().fetch_sub(1, Ordering::SeqCst),
        };
        let last = old & POLLING_MASK == 1;
        fence_after_rmw();
        last && self.mem.sleepers().load(Ordering::Relaxed) != 0
    }

    /// A polling thread's turn: peers watching [`Activity::beat`] see
    /// the team's pollers are on a CPU.
    #[inline]
    pub fn beat(&self, turn: u32) {
        if let Some(b) = self.mem.beat() {
            b.store(turn, Ordering::Relaxed);
        }
    }

    /// What the team's threads are doing (for a waiting thread of its own
    /// team's peers in the same process, see [`Bell::activity`]).
    pub fn activity(&self) -> Activity {
        Activity::of(&self.mem)
    }

    /// First half of parking: the caller stops counting as a poller and
    /// counts as a sleeper; it then checks once more that there is nothing
    /// to do before [`Doorbell::park`].
    pub fn prepare_park(&self) {
        // R1.
        self.mem.sleepers().fetch_add(1, Ordering::SeqCst);
        self.mem.pollers().fetch_sub(1, Ordering::SeqCst);
        // R2: the caller's re-check (R3: plain loads) must not move before
        // these stores; the Dekker pattern needs a full fence, not only
        // SeqCst RMWs (they are one on x86: see `fence_after_rmw`).
        fence_after_rmw();
    }

    /// Sleeps until a wake-up comes (one added since `prepare_park` is
    /// never missed), at most `timeout`; then counts as a poller again.
    /// Returns false if it slept the whole timeout without a ring.
    #[cfg(any(test, feature = "testing"))]
    pub fn park(&self, timeout: Duration) -> bool {
        let rung = self.sleep(timeout);
        self.cancel_park();
        rung
    }

    /// As [`Doorbell::park`], but still counted a sleeper afterwards: the
    /// caller may sleep again, or must [`Doorbell::cancel_park`].
    pub fn sleep(&self, timeout: Duration) -> bool {
        let rung = M::wait(&self.sleep, timeout);
        if let Some(wakes) = self.mem.wakes().filter(|_| rung) {
            // W1: counted before this thread looks at any channel (W2: the
            // fence keeps its loads after), so a ringer that still sees the
            // old count knows a thread it rang has yet to look.
            wakes.fetch_add(1, Ordering::SeqCst);
            fence_after_rmw();
        }
        rung
    }

    /// This thread, rung awake, found only what another thread of its team
    /// sleeps for (an answer it waits on, handed over): it goes last among
    /// those the line that woke it wakes, so that the next such ring wakes
    /// the waiting thread itself, not this one to hand it over.
    pub fn step_back(&self) {
        M::step_back(&self.sleep);
    }

    /// Whether any thread polls now (asked by a sleeper).
    pub fn anyone_polling(&self) -> bool {
        self.mem.pollers().load(Ordering::SeqCst) & POLLING_MASK != 0
    }

    /// Undoes `prepare_park` without sleeping.
    pub fn cancel_park(&self) {
        self.mem.pollers().fetch_add(1, Ordering::SeqCst);
        self.mem.sleepers().fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a peer wakes a team: the team's state page (read-only) and the line
/// of the one channel between them.
pub struct Bell<M: DoorbellMemory = DoorbellPage> {
    mem: M,
    line: M::Line,
    /// The team's `wakes` count when this bell last rang (`u64::MAX`:
    /// never): while it has not moved, the thread rung has yet to look at
    /// the channels, and will find what was published since.
    rang_at: AtomicU64,
}

impl Bell {
    /// The bell of a peer, from the state page and lines its bind handshake
    /// carried. Refused (`Io`) if the page is not a sealed memfd of
    /// [`DOORBELL_LEN`] bytes or a line not an eventfd.
    pub fn open(page: OwnedFd, one: OwnedFd, all: OwnedFd) -> Result<Bell> {
        let map = Mapping::open_read_only(page, DOORBELL_LEN)?;
        for line in [&one, &all] {
            if !is_eventfd(line) {
                return Err(Error::Io {
                    context: "peer's doorbell line is not an eventfd",
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not an eventfd"),
                });
            }
            // The line must not block our sender: a blocking one could, once
            // full, hold a ringing thread for good.
            rustix::fs::fcntl_setfl(line, rustix::fs::OFlags::NONBLOCK).map_err(|e| Error::io("fcntl")(e.into()))?;
        }
        let line = Lines { one: Arc::new(one), all: Arc::new(all), peers: true };
        Ok(Bell { mem: DoorbellPage { map }, line, rang_at: AtomicU64::new(u64::MAX) })
    }

    /// The state page's and the lines' fds.
    #[cfg(any(test, feature = "testing"))]
    pub fn fds(&self) -> [&OwnedFd; 3] {
        [self.mem.map.fd(), &self.line.one, &self.line.all]
    }
}

fn is_eventfd(fd: &OwnedFd) -> bool {
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()));
    std::fs::read_link(path).is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

impl<M: DoorbellMemory> Bell<M> {
    /// A bell on other memory (the loom models' and the fuzz harnesses' heap words).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn on(mem: M, line: M::Line) -> Bell<M> {
        Bell { mem, line, rang_at: AtomicU64::new(u64::MAX) }
    }

    /// Sender side: call after publishing. Wakes the team if nobody is polling.
    #[inline]
    pub fn ring(&self) {
        ring_if_idle(&self.mem, &self.line, Some(&self.rang_at));
    }

    /// Wakes every sleeper of the team (a writer of it that waits for room
    /// may be any of them).
    pub fn ring_now(&self) {
        WOKE.set(true);
        M::ring_all(&self.line, self.mem.sleepers().load(Ordering::SeqCst));
    }

    /// What the team's threads are doing, as its state page says.
    pub fn activity(&self) -> Activity {
        Activity::of(&self.mem)
    }
}

/// What a team's threads are doing, read from its state page (URPC's
/// processor reallocation: a thread waiting for a team's answer spins only
/// while that team has a thread on a CPU; else it sleeps at once and so
/// gives the CPU to the thread it woke). A peer may write anything on its
/// own page: the worst it gets is a waiting thread that spins or sleeps
/// when it should not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activity {
    /// Threads spinning over the team's channels.
    pub polling: u32,
    /// Threads that left polling to run user code (handlers, tasks).
    pub running: u32,
    /// Threads asleep.
    pub sleeping: u32,
    /// Bumped by polling threads as they turn: a value that stays put
    /// while `polling > 0` means they are not on a CPU (preempted, or
    /// waiting for the very CPU the reader spins on).
    pub beat: Option<u32>,
}

impl Activity {
    fn of<M: DoorbellMemory>(mem: &M) -> Activity {
        let word = mem.pollers().load(Ordering::Relaxed);
        Activity {
            polling: word & POLLING_MASK,
            running: word >> 16,
            sleeping: mem.sleepers().load(Ordering::Relaxed),
            beat: mem.beat().map(|b| b.load(Ordering::Relaxed)),
        }
    }
}

thread_local! {
    /// Whether this thread's last ring woke a sleeping team (see [`woke_a_sleeper`]).
    static WOKE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Wake-up checks (S2–S4) this thread made, for tests of corking.
    #[cfg(test)]
    pub(crate) static WAKE_CHECKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether this thread's last ring woke a thread (a frame it published
/// found the whole team asleep, or it rang a sleeper directly): the thread it
/// woke needs a CPU, maybe this one, so this thread should not spin it
/// away (it sleeps, or yields). Reading clears it.
pub fn woke_a_sleeper() -> bool {
    WOKE.replace(false)
}

/// S2–S4.
#[inline]
fn ring_if_idle<M: DoorbellMemory>(mem: &M, line: &M::Line, rang_at: Option<&AtomicU64>) {
    #[cfg(test)]
    WAKE_CHECKS.set(WAKE_CHECKS.get() + 1);
    // S2 (the caller did S1).
    fence(Ordering::SeqCst);
    // `sleepers` first: while nobody sleeps (the spinning case) the
    // `pollers` line, which the team writes often, is never pulled over.
    let (sleepers, pollers) = match mem.sleepers().load(Ordering::Relaxed) {
        0 => (0, 0),
        n => (n, mem.pollers().load(Ordering::Relaxed)),
    };
    let idle = sleepers != 0 && pollers & POLLING_MASK == 0;
    // Nobody running user code either: the whole team slept.
    WOKE.set(idle && pollers == 0);
    if idle {
        // S5: this bell rang already and no ring has ended a sleep since
        // (the team's `wakes` has not moved, W1): the thread it rang has
        // yet to look at the channels, and will find this frame (W2 orders
        // its look after W1, S2 this load after the frame). Ringing again
        // would cost a system call per frame while it is being scheduled,
        // and wake a second thread for the same work.
        if let (Some(rang_at), Some(wakes)) = (rang_at, mem.wakes()) {
            let now = u64::from(wakes.load(Ordering::Relaxed));
            if rang_at.swap(now, Ordering::Relaxed) == now {
                return;
            }
        }
        // One thread is enough to drain the channels; it wakes whoever
        // the messages are for. Waking all would make every idle thread
        // of the team spin again for nothing, stealing the cores.
        M::ring_one(line);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A new line of `team`'s, and the bell a peer opens from what the bind
    /// hands it (copies of the page's and the line's descriptors).
    fn line_and_bell(team: &Doorbell) -> (Line, Bell) {
        let line = team.new_line().unwrap();
        let dup = |fd: &OwnedFd| rustix::io::dup(fd).unwrap();
        let (one, all) = line.fds();
        let bell = Bell::open(dup(team.page_fd()), dup(one), dup(all)).unwrap();
        (line, bell)
    }

    /// A peer reads on the state page how many of the team's threads
    /// poll, run user code and sleep, and its pollers' beat; a frame that
    /// finds a thread in user code while the rest sleep rings, but does
    /// not count as waking a sleeping team (the thread is on a CPU).
    #[test]
    fn the_state_page_tells_peers_who_polls_runs_and_sleeps() {
        let team = Doorbell::create().unwrap();
        let (_line, bell) = line_and_bell(&team);
        team.enter_polling();
        team.enter_polling();
        assert!(!team.enter_user_code(), "another thread still polls");
        team.beat(7);
        assert_eq!(bell.activity(), Activity { polling: 1, running: 1, sleeping: 0, beat: Some(7) });
        team.prepare_park();
        assert_eq!(bell.activity(), Activity { polling: 0, running: 1, sleeping: 1, beat: Some(7) });
        woke_a_sleeper();
        bell.ring();
        assert!(!woke_a_sleeper(), "a thread runs user code: the team was not all asleep");
        team.back_from_user_code();
        assert_eq!(bell.activity(), Activity { polling: 1, running: 0, sleeping: 1, beat: Some(7) });
        assert!(team.leave_polling(), "the last poller leaves while one sleeps");
        bell.ring();
        assert!(woke_a_sleeper(), "the whole team slept");
    }

    /// A peer that makes its line blocking and fills it must not hold the
    /// thread that rings it: the line is passed over (its wake-ups lost).
    #[test]
    fn a_peers_line_made_blocking_is_not_rung() {
        let peer = Doorbell::create().unwrap();
        let (line, bell) = line_and_bell(&peer);
        let (one, all) = line.fds();
        // The peer, on its side of the shared file descriptions.
        for fd in [one, all] {
            rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::empty()).unwrap();
            rustix::io::write(fd, &(u64::MAX - 1).to_ne_bytes()).unwrap();
        }
        let (done, rung) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            bell.ring_now();
            let _ = done.send(());
        });
        assert!(rung.recv_timeout(Duration::from_secs(2)).is_ok(), "ringing a peer's blocking, full line hung");
    }
}
