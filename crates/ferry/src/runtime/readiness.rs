//! Which channels a spinning thread looks at each turn.
//!
//! With few channels, a turn looks at every one, from another one each
//! turn (the first looked at is served first). With many (a server bound
//! to hundreds of idle clients), that made every turn, and so every call,
//! slower with each idle peer. So a turn looks at the channels that had
//! frames lately — the team's *hot* list, shared by its threads — and at a
//! window of the others that sweeps through them all, each thread from
//! its own place: a turn costs the same with 1,000 peers as with 30, and a
//! frame on a cold channel is found within `channels / SWEEP` turns. The
//! last look before a thread sleeps still covers every channel (the
//! doorbell's Dekker step needs it), so nothing waits past that.
//!
//! The hot list is a hint: threads write it without a lock, a lost or
//! stale entry costs a look or a few turns, never a frame.

use super::channel::Channel;
use super::channel_list::Snapshot;
use super::TeamInner;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Up to this many channels, every turn looks at all of them.
pub(super) const ALL_UP_TO: usize = 32;
/// Channels in the hot list.
const HOT: usize = 16;
/// Cold channels each turn looks at.
const SWEEP: usize = 16;

/// The team's hot channels: indices into its channel list as of `epoch`.
pub(crate) struct Hot {
    /// The list epoch the entries index; entries of another are ignored.
    epoch: AtomicU64,
    /// Index + 1 of a channel that had frames lately; 0: none.
    slots: [AtomicU32; HOT],
    /// Where the next entry goes (the oldest is replaced).
    next: AtomicUsize,
}

impl Hot {
    pub fn new() -> Hot {
        Hot { epoch: AtomicU64::new(u64::MAX), slots: Default::default(), next: AtomicUsize::new(0) }
    }

    /// Marks channel `i` of the list at `epoch` hot.
    fn mark(&self, epoch: u64, i: usize) {
        if self.epoch.load(Ordering::Relaxed) != epoch {
            // The list changed since the entries were written: start over.
            for s in &self.slots {
                s.store(0, Ordering::Relaxed);
            }
            self.epoch.store(epoch, Ordering::Relaxed);
        }
        let tag = i as u32 + 1;
        if self.slots.iter().any(|s| s.load(Ordering::Relaxed) == tag) {
            return;
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed) % HOT;
        self.slots[at].store(tag, Ordering::Relaxed);
    }
}

/// A waiting thread's offer to take a channel's head frame itself:
/// whether it took it (see [`Sweep::progress_catching`]).
pub(crate) type Catch<'c> = &'c mut dyn FnMut(&Arc<Channel>) -> bool;

thread_local! {
    /// This thread's place in the sweep, kept from one wait to the next.
    static CURSOR: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// A spinning thread's place in the sweep (its thread's, while it waits).
pub(crate) struct Sweep {
    cursor: usize,
}

impl Sweep {
    pub fn new() -> Sweep {
        let cursor = match CURSOR.get() {
            // Threads start at different places (from where their own
            // thread-local lives), so they share the sweeping.
            usize::MAX => CURSOR.with(|c| c as *const _ as usize / 64),
            c => c,
        };
        Sweep { cursor }
    }

    /// The cursor's channel among `n` (> 0), and the cursor moved on to
    /// the next: a compare, not a division, on every turn (a division costs
    /// a good part of a spinning turn).
    #[inline]
    fn next(&mut self, n: usize) -> usize {
        if self.cursor >= n {
            // A new wait, or the list shrank.
            self.cursor %= n;
        }
        let i = self.cursor;
        self.cursor = if i + 1 == n { 0 } else { i + 1 };
        i
    }

    /// One turn's look at `channels`: all of them if few, else the hot
    /// ones and the next window of the rest. Returns whether anything was
    /// received.
    pub fn progress(&mut self, team: &TeamInner, channels: &Snapshot) -> bool {
        let n = channels.len();
        if n <= ALL_UP_TO {
            if n == 0 {
                return false;
            }
            // From another channel each turn: the first looked at is served
            // first, and its peer woken first, so a fixed order would favour
            // the same peers turn after turn.
            let (front, back) = channels.split_at(self.next(n));
            return team.progress_on(back) | team.progress_on(front);
        }
        let hot = &team.hot;
        let epoch = channels.epoch();
        let mut did = false;
        let mut looked = [usize::MAX; HOT];
        if hot.epoch.load(Ordering::Relaxed) == epoch {
            for (slot, seen) in hot.slots.iter().zip(looked.iter_mut()) {
                let i = slot.load(Ordering::Relaxed) as usize;
                if (1..=n).contains(&i) {
                    *seen = i - 1;
                    did |= team.progress_one(&channels[i - 1]);
                }
            }
        }
        for _ in 0..SWEEP {
            let i = self.next(n);
            if !looked.contains(&i) && team.progress_one(&channels[i]) {
                hot.mark(epoch, i);
                did = true;
            }
        }
        did
    }

    /// [`Sweep::progress`] for a waiting thread that takes what it waits
    /// for straight from a channel (see `idle::wait_catching`):
    /// with few channels, `catch` is offered each channel's head frame
    /// before the channel is drained, so a frame that came since the
    /// turn's first look is still caught, not drained past its waiting
    /// receiver (a third of a link ping-pong's were). A catch ends the
    /// turn: what the channels still ask (this one's release, the others'
    /// frames) waits for the next turn, off the caught message's way to
    /// its receiver; the start rotates, so every channel is driven within
    /// as many turns as there are channels.
    pub fn progress_catching(&mut self, team: &TeamInner, channels: &Snapshot, catch: Catch<'_>) -> bool {
        let n = channels.len();
        if n > ALL_UP_TO || n == 0 {
            return self.progress(team, channels);
        }
        let (front, back) = channels.split_at(self.next(n));
        let mut did = false;
        for ch in back.iter().chain(front) {
            // (An idle channel costs the one look `progress_one` makes.)
            if ch.needs_attention() {
                if ch.transport.more_at_hand() && catch(ch) {
                    return true;
                }
                did |= team.progress_one(ch);
            }
        }
        did
    }

    /// The next `size` of `channels` (all, if fewer), for a look that
    /// must reach every channel in time but cost the same whatever their
    /// number (a sleeping thread's look for a lost wake-up).
    pub fn window<'c>(&mut self, channels: &'c Snapshot, size: usize) -> impl Iterator<Item = &'c Arc<Channel>> + 'c {
        let n = channels.len();
        let size = size.min(n);
        let start = if n == 0 { 0 } else { self.next(n) };
        self.cursor = start.wrapping_add(size);
        (0..size).map(move |k| &channels[(start + k) % n])
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        CURSOR.set(self.cursor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_list_of_another_epoch_starts_over() {
        let hot = Hot::new();
        for i in 0..HOT + 3 {
            hot.mark(1, i);
        }
        // The oldest three were replaced; a repeat takes no slot.
        hot.mark(1, HOT + 2);
        let tags: Vec<u32> = hot.slots.iter().map(|s| s.load(Ordering::Relaxed)).collect();
        assert!(tags.contains(&(HOT as u32 + 3)) && !tags.contains(&1));
        hot.mark(2, 5);
        let tags: Vec<u32> = hot.slots.iter().map(|s| s.load(Ordering::Relaxed)).filter(|&t| t != 0).collect();
        assert_eq!(tags, vec![6]);
    }
}
