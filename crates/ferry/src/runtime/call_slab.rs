//! Our calls in flight: a slab of entries indexed by call id, each holding
//! what one call waits for (its answer, the waker of whoever waits, the
//! descriptors the answer brought).
//!
//! A call id is `generation << 32 | (index + 1)`: the entry's index, and
//! how many calls the entry held before this one. An entry's generation
//! moves on when its call ends, so an answer to an earlier call — a peer's
//! late, repeated or forged call id — finds a generation that does not
//! match and is ignored. Id 0 is no call (`index + 1` is never 0).
//!
//! No lock or map is shared by all calls: each entry has its own lock
//! (taken by the caller and the one thread that answers), and free
//! entries wait on a lock-free stack (a Treiber stack whose head carries a
//! tag against ABA). Entries live in pages allocated on demand, page `k`
//! holding `FIRST_PAGE << k` entries, up to the team's
//! `max_calls_in_flight`; pages are never freed while the slab lives, so a
//! free entry's memory stays valid for a thread that raced to pop it.
//!
//! The life of an entry (every step under its lock, except the free stack):
//!
//! 1. `start` pops a free entry (or takes a fresh one) and makes it
//!    `Waiting` for an answer on a channel.
//! 2. `answer` (only on that channel) or `finish` (a failure, or an
//!    `Immediate` send written) makes it `Answered` and wakes the waiter;
//!    a call not `Waiting` is left as it is (answered once).
//! 3. `poll` takes the answer, or `forget` gives up on it; either frees
//!    the entry: its generation moves on, then it is pushed on the stack.

use super::payload::Payload;
use crate::error::{Error, Limit, Result};
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};
use rustix::fd::OwnedFd;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

/// Entries of the first page (always there); page `k` has `FIRST_PAGE << k`.
const FIRST_PAGE: u32 = 32;
/// Pages enough for any index below 2^32 − 1.
const PAGES: usize = 28;
/// The free stack's "none".
const NONE: u32 = 0;

/// The largest `max_calls_in_flight`.
pub(crate) const MAX_CALLS_IN_FLIGHT: usize = 1 << 30;

pub(crate) struct CallSlab {
    pages: [OnceLock<Box<[Entry]>>; PAGES],
    /// The free stack: its top's index + 1 (or `NONE`) in the low 32 bits,
    /// a tag bumped by every change in the high 32 (a pop that read a
    /// top since popped and pushed back fails its exchange).
    free_top: AtomicU64,
    /// Entries ever used (the next fresh one's index).
    used: AtomicU32,
    max: u32,
}

struct Entry {
    /// While free: the next free entry's index + 1 (or `NONE`).
    next_free: AtomicU32,
    call: Mutex<Call>,
}

#[derive(Default)]
struct Call {
    /// How many calls this entry held before the one it holds.
    generation: u32,
    stage: Stage,
    /// The channel whose peer may answer (see `Channel::key`); 0 while the
    /// send waits for its channel's bind.
    channel: u64,
    /// The answer may bring descriptors (see `Transport::ask_handover`).
    handover: bool,
    waker: Option<Waker>,
    descriptors: Vec<OwnedFd>,
}

#[derive(Default)]
enum Stage {
    #[default]
    Free,
    Waiting,
    Answered(Result<Payload>),
    /// Its answer taken, its descriptors not yet.
    Taken,
}

/// A call being answered, its entry locked (see [`CallSlab::answer`]).
pub(crate) struct Answering<'a> {
    call: crate::sync::MutexGuard<'a, Call>,
}

impl Answering<'_> {
    /// Whether the call asked for descriptors with its answer.
    pub fn asked_handover(&self) -> bool {
        self.call.handover
    }

    /// Keeps the descriptors the answer brought, for the caller, if it
    /// asked for them (else they are closed).
    pub fn hand(&mut self, fds: Vec<OwnedFd>) {
        if self.call.handover {
            self.call.descriptors = fds;
        }
    }

    /// Answers the call and wakes its waiter.
    pub fn finish(mut self, r: Result<Payload>) {
        self.call.stage = Stage::Answered(r);
        let waker = self.call.waker.take();
        drop(self);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl CallSlab {
    /// A slab for at most `max` calls at once (1..=[`MAX_CALLS_IN_FLIGHT`]).
    pub fn new(max: usize) -> CallSlab {
        let slab = CallSlab {
            pages: Default::default(),
            free_top: AtomicU64::new(0),
            used: AtomicU32::new(0),
            max: max.clamp(1, MAX_CALLS_IN_FLIGHT) as u32,
        };
        slab.pages[0].get_or_init(|| page(0));
        slab
    }

    /// Starts a call that waits for an answer on channel `channel` (0: not
    /// bound yet); returns its id.
    pub fn start(&self, channel: u64) -> Result<u64> {
        let index = match self.pop_free() {
            Some(i) => i,
            None => self.fresh()?,
        };
        let mut call = self.entry(index).call.lock();
        call.stage = Stage::Waiting;
        call.channel = channel;
        call.handover = false;
        Ok(id(call.generation, index))
    }

    /// The call `id` goes out on channel `key` (it waited for the bind).
    pub fn bind(&self, id: u64, key: u64) {
        if let Some(mut call) = self.lock(id) {
            call.channel = key;
        }
    }

    /// The call `id` asks for descriptors with its answer.
    pub fn ask_handover(&self, id: u64) {
        if let Some(mut call) = self.lock(id) {
            call.handover = true;
        }
    }

    /// The call `id`, locked, if it waits for an answer from channel `key`.
    pub fn answer(&self, key: u64, id: u64) -> Option<Answering<'_>> {
        let call = self.lock(id)?;
        (matches!(call.stage, Stage::Waiting) && call.channel == key).then_some(Answering { call })
    }

    /// Ends the call `id` with `r` if it still waits (a failure, or an
    /// `Immediate` send written); whether it did.
    pub fn finish(&self, id: u64, r: Result<Payload>) -> bool {
        match self.lock(id) {
            Some(call) if matches!(call.stage, Stage::Waiting) => {
                Answering { call }.finish(r);
                true
            }
            _ => false,
        }
    }

    /// The answer of call `id`, which frees its entry (unless the call
    /// asked for descriptors: see [`CallSlab::take_descriptors`]); or
    /// `Pending`, with `cx`'s waker kept to be woken. A call that is not
    /// there (given up) is `Cancelled`.
    pub fn poll(&self, id: u64, cx: &mut Context<'_>) -> Poll<Result<Payload>> {
        let Some(mut call) = self.lock(id) else {
            return Poll::Ready(Err(Error::Cancelled));
        };
        if let Stage::Waiting = call.stage {
            if !call.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                call.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let Stage::Answered(r) = std::mem::replace(&mut call.stage, Stage::Taken) else {
            return Poll::Ready(Err(Error::Cancelled));
        };
        if !call.handover {
            let waker = call.waker.take();
            self.free(id, &mut call);
            drop(call);
            drop(waker);
        }
        Poll::Ready(r)
    }

    /// The descriptors the answer of call `id` brought (it asked for them,
    /// see `Transport::ask_handover`; taken after its answer); frees its entry.
    pub fn take_descriptors(&self, id: u64) -> Vec<OwnedFd> {
        let Some(mut call) = self.lock(id) else { return Vec::new() };
        let ended = self.end(id, &mut call);
        drop(call);
        ended.descriptors
    }

    /// Gives up on call `id` (its answer, if it comes, is ignored) and
    /// frees its entry; whether it still waited for an answer.
    pub fn forget(&self, id: u64) -> bool {
        let Some(mut call) = self.lock(id) else { return false };
        let ended = self.end(id, &mut call);
        drop(call); // (What it held is dropped after the lock.)
        matches!(ended.stage, Stage::Waiting)
    }

    /// Ends with `err()` every call waiting for an answer on channel `key`
    /// (every call, if `None`).
    pub fn fail_waiting(&self, key: Option<u64>, err: impl Fn() -> Error) {
        for index in 0..self.used.load(Ordering::Acquire) {
            let Some(entry) = self.try_entry(index) else { continue };
            let call = entry.call.lock();
            if matches!(call.stage, Stage::Waiting) && key.is_none_or(|k| call.channel == k) {
                Answering { call }.finish(Err(err()));
            }
        }
    }

    /// Calls not ended yet (waiting, or answered and not taken).
    #[cfg(any(test, feature = "testing"))]
    pub fn in_flight(&self) -> usize {
        let used = self.used.load(Ordering::Acquire);
        (0..used).filter(|&i| self.try_entry(i).is_some_and(|e| !matches!(e.call.lock().stage, Stage::Free))).count()
    }

    /// Call `id`'s entry, locked, if it holds that call.
    fn lock(&self, id: u64) -> Option<crate::sync::MutexGuard<'_, Call>> {
        let index = (id as u32).checked_sub(1)?;
        if index >= self.used.load(Ordering::Acquire) {
            return None; // Never used: a forged id.
        }
        let call = self.try_entry(index)?.call.lock();
        (call.generation == (id >> 32) as u32 && !matches!(call.stage, Stage::Free)).then_some(call)
    }

    /// Frees the locked entry of call `id`, whose call ended and left
    /// nothing in it (see `end`): the generation moves on, then the entry
    /// goes on the free stack (it may be popped at once; the popper then
    /// waits for this lock).
    fn free(&self, id: u64, call: &mut Call) {
        call.stage = Stage::Free;
        call.generation = call.generation.wrapping_add(1);
        self.push_free(id as u32 - 1);
    }

    /// Ends the call `id` in its locked entry and frees it; returns what it
    /// held, to be dropped after the lock.
    fn end(&self, id: u64, call: &mut Call) -> Ended {
        let ended = Ended {
            stage: std::mem::take(&mut call.stage),
            descriptors: std::mem::take(&mut call.descriptors),
            _waker: call.waker.take(),
        };
        self.free(id, call);
        ended
    }

    /// Entry `index`, if its page is made (every entry a call has is).
    fn try_entry(&self, index: u32) -> Option<&Entry> {
        let (page, offset) = place(index);
        Some(&self.pages[page].get()?[offset])
    }

    /// Entry `index`, which a call has or had.
    fn entry(&self, index: u32) -> &Entry {
        self.try_entry(index).expect("an entry a call had has its page")
    }

    /// A never used entry, its page made if it is the page's first.
    fn fresh(&self) -> Result<u32> {
        let full = || Error::LimitReached { limit: Limit::CallsInFlight, max: u64::from(self.max) };
        let index = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .map_err(|_| full())?;
        // `used` counts the entry before its page is made: `lock` finds no
        // page for an id of it meanwhile (no call has that id yet).
        let (page_no, _) = place(index);
        self.pages[page_no].get_or_init(|| page(page_no));
        Ok(index)
    }

    fn pop_free(&self) -> Option<u32> {
        let mut top = self.free_top.load(Ordering::Acquire);
        loop {
            let index = (top as u32).checked_sub(1)?;
            // May be stale (the entry popped and pushed again since we
            // read `top`): then the tag moved and the exchange fails.
            let next = self.entry(index).next_free.load(Ordering::Relaxed);
            let new = tagged(top, next);
            match self.free_top.compare_exchange_weak(top, new, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(index),
                Err(now) => top = now,
            }
        }
    }

    fn push_free(&self, index: u32) {
        let entry = self.entry(index);
        let mut top = self.free_top.load(Ordering::Relaxed);
        loop {
            entry.next_free.store(top as u32, Ordering::Relaxed);
            // Release: a popper that reads this top reads `next_free` too.
            match self.free_top.compare_exchange_weak(top, tagged(top, index + 1), Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => top = now,
            }
        }
    }
}

/// What a call held when it ended (dropped after its entry's lock).
struct Ended {
    stage: Stage,
    descriptors: Vec<OwnedFd>,
    _waker: Option<Waker>,
}

fn id(generation: u32, index: u32) -> u64 {
    u64::from(generation) << 32 | u64::from(index + 1)
}

/// The free stack's word with top `top1` (index + 1) and the next tag.
fn tagged(old: u64, top1: u32) -> u64 {
    ((old >> 32) + 1) << 32 | u64::from(top1)
}

/// The page of entry `index` and its place there.
fn place(index: u32) -> (usize, usize) {
    let n = u64::from(index) + u64::from(FIRST_PAGE);
    let page = (63 - n.leading_zeros()) - FIRST_PAGE.trailing_zeros();
    (page as usize, (n - (u64::from(FIRST_PAGE) << page)) as usize)
}

fn page(k: usize) -> Box<[Entry]> {
    (0..FIRST_PAGE << k).map(|_| Entry { next_free: AtomicU32::new(NONE), call: Mutex::new(Call::default()) }).collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::task::Waker;

    fn poll(slab: &CallSlab, id: u64) -> Poll<Result<Payload>> {
        slab.poll(id, &mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn pages_hold_consecutive_indices() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(31), (0, 31));
        assert_eq!(place(32), (1, 0));
        assert_eq!(place(95), (1, 63));
        assert_eq!(place(96), (2, 0));
        let (last, offset) = place(u32::MAX - 1);
        assert!(last < PAGES && offset < (FIRST_PAGE as usize) << last);
    }

    #[test]
    fn an_answer_reaches_its_call_once() {
        let slab = CallSlab::new(16);
        let id = slab.start(7).unwrap();
        assert!(poll(&slab, id).is_pending());
        assert!(slab.answer(8, id).is_none(), "only the call's channel answers it");
        slab.answer(7, id).unwrap().finish(Ok(Payload::from_slice(b"hi")));
        assert!(slab.answer(7, id).is_none(), "answered once");
        match poll(&slab, id) {
            Poll::Ready(Ok(p)) => assert_eq!(p.into_vec(), b"hi"),
            _ => panic!("no answer"),
        }
        assert_eq!(slab.in_flight(), 0, "taking the answer frees the entry");
    }

    /// A peer's stale or forged call id reaches no call.
    #[test]
    fn a_stale_or_forged_id_is_ignored() {
        let slab = CallSlab::new(16);
        let old = slab.start(7).unwrap();
        assert!(slab.forget(old));
        let new = slab.start(7).unwrap();
        assert_eq!(new as u32, old as u32, "the entry is reused");
        assert_ne!(new, old, "under a new generation");
        assert!(slab.answer(7, old).is_none());
        for forged in [0, u64::MAX, 5, new + 1, new ^ (1 << 40)] {
            assert!(slab.answer(7, forged).is_none(), "{forged:#x}");
            assert!(!slab.finish(forged, Err(Error::Cancelled)));
            assert!(!slab.forget(forged));
        }
        assert!(slab.answer(7, new).is_some());
    }

    #[test]
    fn calls_past_the_bound_are_refused_until_one_ends() {
        let slab = CallSlab::new(100);
        let ids: Vec<u64> = (0..100).map(|_| slab.start(1).unwrap()).collect();
        assert!(matches!(slab.start(1), Err(Error::LimitReached { limit: Limit::CallsInFlight, max: 100 })));
        assert!(slab.forget(ids[60]));
        let again = slab.start(1).unwrap();
        assert_eq!(again as u32, ids[60] as u32);
        assert_eq!(slab.in_flight(), 100);
    }

    #[test]
    fn failing_a_channel_ends_only_its_waiting_calls() {
        let slab = CallSlab::new(16);
        let (a, b, answered) = (slab.start(1).unwrap(), slab.start(2).unwrap(), slab.start(1).unwrap());
        slab.answer(1, answered).unwrap().finish(Ok(Payload::from_slice(b"ok")));
        slab.fail_waiting(Some(1), || Error::Shutdown);
        assert!(matches!(poll(&slab, a), Poll::Ready(Err(Error::Shutdown))));
        assert!(poll(&slab, b).is_pending());
        assert!(matches!(poll(&slab, answered), Poll::Ready(Ok(_))), "its answer stands");
        slab.fail_waiting(None, || Error::Shutdown);
        assert!(matches!(poll(&slab, b), Poll::Ready(Err(Error::Shutdown))));
        assert_eq!(slab.in_flight(), 0);
    }

    /// Many threads starting and ending calls at once get distinct ids and
    /// leave every entry free.
    #[test]
    fn threads_share_the_slab() {
        let slab = std::sync::Arc::new(CallSlab::new(1 << 12));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let slab = slab.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let ids: Vec<u64> = (0..(i % 7 + 1)).map(|_| slab.start(t).unwrap()).collect();
                        for id in ids {
                            slab.answer(t, id).unwrap().finish(Ok(Payload::from_slice(&[])));
                            assert!(poll(&slab, id).is_ready());
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(slab.in_flight(), 0);
        // At most 7 calls per thread live at once, and one entry per thread
        // between its call's end and the free stack (a start then finds
        // the stack empty and takes a fresh entry).
        assert!(slab.used.load(Ordering::Relaxed) <= 4 * 7 + 4, "entries are reused");
    }
}

/// The loom models of the free stack and of answers racing a call's end
/// (kept with the other models, in `loom_models/`).
#[cfg(all(test, loom))]
#[path = "../loom_models/call_slab.rs"]
mod loom_model;
