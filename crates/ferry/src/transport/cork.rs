//! Corking: while a thread is corked, its sends put their frames on the
//! channel without telling the peer — no socket write (TCP), no wake-up
//! check in a `Team::batch` (shared memory: a full fence and a read of the
//! peer's state page) — and the thread tells every channel at once later, with
//! `Transport::flush_pending` (a processor between bursts of tasks and
//! before it waits, `Team::batch` when it ends). A burst of frames then
//! costs one write or one wake-up per channel instead of one each.
//!
//! A frame held back is never stranded: the channel's `needs_tidy` says so,
//! and any thread's idle turn over it (`tidy`) sends it on.
//!
//! Shared memory defers its wake-up only in a `Team::batch` (see
//! [`batched`]): a processor's burst of replies goes to many peers, one
//! reply each (fan-in), where a deferred ring saves nothing and a parked
//! caller's wake would wait for the burst's end (~20 % of fan-in's time:
//! docs/PERFORMANCE.md, twenty-eighth session); the peer's bell rings at
//! most once per wake anyway (`PeerBell`).

use std::cell::Cell;

thread_local! {
    /// Sends on this thread hold back their frames until it flushes.
    static CORKED: Cell<bool> = const { Cell::new(false) };
    /// A corked send held back a frame that waits for `flush_pending`.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
    /// This thread is in a `Team::batch` (corked by its user, not by a processor's burst).
    static BATCHED: Cell<bool> = const { Cell::new(false) };
}

/// Marks (or unmarks) this thread as in a `Team::batch`; returns whether it was.
pub(crate) fn set_batched(on: bool) -> bool {
    BATCHED.replace(on)
}

/// Whether this thread is in a `Team::batch`: shared memory defers its
/// wake-ups to the batch's end only then.
#[inline]
pub(crate) fn batched() -> bool {
    BATCHED.get()
}

/// Corks (or uncorks) this thread's sends; returns whether they were
/// corked. What they held back stays to be flushed ([`take_deferred`]).
pub(crate) fn set_corked(on: bool) -> bool {
    CORKED.replace(on)
}

/// Whether sends held frames back since the last call, which the caller
/// must then flush (`Transport::flush_pending` on every channel).
pub(crate) fn take_deferred() -> bool {
    DEFERRED.replace(false)
}

/// Whether this thread's sends hold back their frames now.
#[inline]
pub(crate) fn corked() -> bool {
    CORKED.get()
}

/// A send held a frame back (this thread is corked): it waits for the
/// thread's next flush.
#[inline]
pub(crate) fn held_back() {
    DEFERRED.set(true);
}
