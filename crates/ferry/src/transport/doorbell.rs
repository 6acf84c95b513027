//! A team's doorbell: how a sender wakes a team whose threads all sleep.
//!
//! One page of shared memory per team, mapped by the team and by every peer
//! that has a channel to it. The team's idle threads count themselves in
//! `pollers` while they spin over their channels and in `sleepers` while they
//! sleep on the futex `seq`. A sender publishes its frame, then (after a full
//! fence) looks: if nobody polls and somebody sleeps, it bumps `seq` and wakes.
//! Both sides do store → fence → load (Dekker), so a frame published just as a
//! thread decides to sleep is seen by one of the two.
//!
//! ## The wake-up protocol, step by step
//!
//! Sender (`Transport::try_send` then [`Doorbell::ring`]):
//!
//! - **S1** publish the frame (the ring's release store of its stamp);
//! - **S2** `fence(SeqCst)`;
//! - **S3** load `sleepers`; if 0, done (nobody to wake);
//! - **S4** load `pollers`; if 0, bump `seq` and wake one sleeper.
//!
//! Receiving thread going to sleep (`Idle::step` with [`Doorbell::prepare_park`]):
//!
//! - **R1** take the ticket (`seq`), count itself in `sleepers` and out of `pollers`;
//! - **R2** `fence(SeqCst)`;
//! - **R3** look at every channel once more (and the caller's own condition);
//!   if anything waits, [`Doorbell::cancel_park`] and handle it;
//! - **R4** [`Doorbell::park`]: futex-wait while `seq` equals the ticket, at
//!   most `park_timeout`.
//!
//! S1–S2–S3/S4 against R1–R2–R3 is Dekker's pattern: either R3 sees the
//! frame, or S3/S4 see the sleeper and no poller and bump `seq` — after
//! R1's ticket, so R4 returns at once. A thread that stops polling without
//! sleeping (the last poller leaving, or one about to run user code:
//! [`Doorbell::leave_polling`], **L1** decrement `pollers`, **L2**
//! `fence(SeqCst)`, **L3** load `sleepers`) looks at the channels once more
//! when it was the last poller while others sleep, and wakes one sleeper if
//! a frame waits, since its senders saw a poller and did not ring.
//!
//! The loom models in `loom_models` check these steps (and fail when the
//! fence of S2, R2 or L2 is removed).
//!
//! A misbehaving peer can scribble on the page: the worst it can do is cause
//! spurious or missed wake-ups of this team. Missed wake-ups are bounded
//! because every park has a timeout (the runtime's `park_timeout`). That is
//! the open part of the defect 8: the page is shared by all peers,
//! so one peer can delay every other peer's wake-ups by up to
//! `park_timeout`; per-channel wake words (waited on with `futex_waitv`)
//! would confine it to its own traffic.

use crate::error::Result;
use crate::sync::{fence, AtomicU32Ops, Ordering};
use crate::sys::{futex, shm::Mapping};
use rustix::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Bytes of a doorbell's page of shared memory.
pub const DOORBELL_LEN: usize = 4096;
// 128 bytes apart: cores fetch cache lines in pairs.
const SEQ: usize = 0;
const POLLERS: usize = 128;
const SLEEPERS: usize = 256;

/// Where a doorbell's three words live and how a thread sleeps on one: a
/// mapped page and the kernel's futex in production ([`DoorbellPage`]),
/// heap words and a loom condition variable in the loom models. The futex
/// belongs here, with the words, because a model's futex needs state of
/// its own (its lock and wait queue) shared by everyone using the words.
pub trait DoorbellMemory: Send + Sync + 'static {
    type Word: AtomicU32Ops;

    fn seq(&self) -> &Self::Word;
    fn pollers(&self) -> &Self::Word;
    fn sleepers(&self) -> &Self::Word;

    /// Sleeps while `*word == expected`, at most `timeout` (a model may wait
    /// for ever: a wake-up that never comes is then a deadlock it reports).
    /// Spurious returns are allowed.
    fn wait(&self, word: &Self::Word, expected: u32, timeout: Duration);

    /// Wakes up to `n` threads sleeping on `word`.
    fn wake(&self, word: &Self::Word, n: i32);
}

/// A doorbell's page of shared memory, mapped by its team and its peers.
pub struct DoorbellPage {
    map: Mapping,
}

impl DoorbellPage {
    fn word(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= DOORBELL_LEN && offset.is_multiple_of(4));
        // SAFETY: the mapping is DOORBELL_LEN bytes, page-aligned, and lives as
        // long as `self`; the offsets are in bounds and 4-aligned. Shared memory
        // is only ever accessed through atomics here.
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU32) }
    }
}

impl DoorbellMemory for DoorbellPage {
    type Word = AtomicU32;

    #[inline(always)]
    fn seq(&self) -> &AtomicU32 {
        self.word(SEQ)
    }

    #[inline(always)]
    fn pollers(&self) -> &AtomicU32 {
        self.word(POLLERS)
    }

    #[inline(always)]
    fn sleepers(&self) -> &AtomicU32 {
        self.word(SLEEPERS)
    }

    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        futex::wait(word, expected, Some(timeout));
    }

    fn wake(&self, word: &AtomicU32, n: i32) {
        futex::wake(word, n);
    }
}

/// A team's doorbell (see the module's documentation), on `M`'s memory.
pub struct Doorbell<M: DoorbellMemory = DoorbellPage> {
    mem: M,
}

impl Doorbell {
    /// A fresh doorbell on a page of its own, nobody polling or sleeping.
    pub fn create() -> Result<Doorbell> {
        Ok(Doorbell { mem: DoorbellPage { map: Mapping::create("ferry-doorbell", DOORBELL_LEN)? } })
    }

    /// Maps a peer's doorbell received at bind time.
    pub fn open(fd: OwnedFd) -> Result<Doorbell> {
        Ok(Doorbell { mem: DoorbellPage { map: Mapping::open(fd, DOORBELL_LEN)? } })
    }

    /// The page's memfd, handed to peers at bind time.
    pub fn fd(&self) -> &OwnedFd {
        self.mem.map.fd()
    }
}

impl<M: DoorbellMemory> Doorbell<M> {
    /// A doorbell on other memory (the loom models' heap words).
    #[cfg(all(test, loom))]
    pub(crate) fn on(mem: M) -> Doorbell<M> {
        Doorbell { mem }
    }

    /// Sender side: call after publishing. Wakes the team if nobody is polling.
    #[inline]
    pub fn ring(&self) {
        // S2 (the caller did S1).
        fence(Ordering::SeqCst);
        // `sleepers` first: while nobody sleeps (the spinning case) the
        // `pollers` line, which the team writes often, is never pulled over.
        if self.mem.sleepers().load(Ordering::Relaxed) != 0 && self.mem.pollers().load(Ordering::Relaxed) == 0 {
            // One thread is enough to drain the channels; it wakes whoever
            // the messages are for. Waking all would make every idle thread
            // of the team spin again for nothing, stealing the cores.
            self.ring_one();
        }
    }

    /// Wakes every sleeper unconditionally (a waker whose thread sleeps
    /// here, shutdown, a channel's end).
    pub fn ring_now(&self) {
        self.mem.seq().fetch_add(1, Ordering::SeqCst);
        self.mem.wake(self.mem.seq(), i32::MAX);
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
        // L1, L2; L3 below.
        let last = self.mem.pollers().fetch_sub(1, Ordering::SeqCst) == 1;
        fence(Ordering::SeqCst);
        last && self.mem.sleepers().load(Ordering::Relaxed) != 0
    }

    /// Wakes one sleeper.
    pub fn ring_one(&self) {
        self.mem.seq().fetch_add(1, Ordering::SeqCst);
        self.mem.wake(self.mem.seq(), 1);
    }

    /// First half of parking: the caller stops counting as a poller and as a
    /// sleeper, and gets the ticket to pass to [`Doorbell::park`] after it has
    /// checked once more that there is nothing to do.
    pub fn prepare_park(&self) -> u32 {
        // R1.
        let ticket = self.mem.seq().load(Ordering::SeqCst);
        self.mem.sleepers().fetch_add(1, Ordering::SeqCst);
        self.mem.pollers().fetch_sub(1, Ordering::SeqCst);
        // R2: the caller's re-check (R3: plain loads) must not move before
        // these stores; the Dekker pattern needs a full fence, not only SeqCst RMWs.
        fence(Ordering::SeqCst);
        ticket
    }

    /// Sleeps unless the doorbell rang since `ticket`; then counts as a poller again.
    pub fn park(&self, ticket: u32, timeout: Duration) {
        self.mem.wait(self.mem.seq(), ticket, timeout);
        self.cancel_park();
    }

    /// Undoes `prepare_park` without sleeping.
    pub fn cancel_park(&self) {
        self.mem.pollers().fetch_add(1, Ordering::SeqCst);
        self.mem.sleepers().fetch_sub(1, Ordering::SeqCst);
    }
}
