//! Calls in flight, both ways: our sends waiting for their checkpoint
//! (`ours`, see `call_slab`), and the hooks that stop work on a peer's
//! call when it cancels (`cancels`).

use super::call_slab::CallSlab;
use super::channel::Channel;
use super::team::TeamInner;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// What runs when a peer cancels a call it made to this team.
pub(crate) type OnCancel = Box<dyn FnOnce() + Send>;

/// Names a peer's call: (the channel it came on, its call id).
type CallKey = (u64, u64);

/// Cancels remembered per channel for calls whose hook is not registered yet.
const EARLY_CANCELS: usize = 1024;

pub(crate) struct Calls {
    /// Our sends waiting for their checkpoint, by call id.
    pub ours: CallSlab,
    cancels: Mutex<FxHashMap<CallKey, OnCancel>>,
    /// Cancels that came before their call registered a hook (the call was
    /// still queued): applied when it does.
    early_cancels: Mutex<EarlyCancels>,
}

/// Early cancels, looked up by key; at most `EARLY_CANCELS` per channel,
/// that channel's oldest forgotten first: one peer's cancels (of calls
/// that ended, or never were) cannot push out another's.
#[derive(Default)]
struct EarlyCancels {
    /// Each key with the number its latest insertion got.
    keys: FxHashMap<CallKey, u64>,
    /// Per channel, the call ids in the order their cancels came, each
    /// with its insertion's number (ids taken since stay until their turn:
    /// removing them would be a scan). An id taken and cancelled again is
    /// here twice: the older copy's number no longer matches its key's, so
    /// its eviction leaves the live key alone.
    order: FxHashMap<u64, VecDeque<(u64, u64)>>,
    next: u64,
}

impl EarlyCancels {
    fn insert(&mut self, key: CallKey) {
        let seq = self.next;
        match self.keys.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => return,
            std::collections::hash_map::Entry::Vacant(v) => v.insert(seq),
        };
        self.next += 1;
        let order = self.order.entry(key.0).or_default();
        if order.len() == EARLY_CANCELS {
            if let Some((old, old_seq)) = order.pop_front() {
                if self.keys.get(&(key.0, old)) == Some(&old_seq) {
                    self.keys.remove(&(key.0, old));
                }
            }
        }
        order.push_back((key.1, seq));
    }

    /// Whether `key` was cancelled early (forgotten if so).
    fn take(&mut self, key: CallKey) -> bool {
        self.keys.remove(&key).is_some()
    }

    /// Forgets channel `ch`'s.
    fn forget_channel(&mut self, ch: u64) {
        for (id, _) in self.order.remove(&ch).unwrap_or_default() {
            self.keys.remove(&(ch, id));
        }
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.order.clear();
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.order.is_empty()
    }
}

impl Calls {
    /// Cancel hooks registered.
    #[cfg(test)]
    pub(crate) fn hooks(&self) -> usize {
        self.cancels.lock().len()
    }

    /// Calls for a team that has at most `max` of its own in flight.
    pub fn new(max: usize) -> Calls {
        Calls { ours: CallSlab::new(max), cancels: Default::default(), early_cancels: Default::default() }
    }

    /// A peer cancelled its call `call_id` on `ch`: run its hook, or
    /// remember the cancel for a hook not registered yet.
    pub fn cancel_arrived(&self, ch: &Channel, call_id: u64) {
        let key = (ch.key(), call_id);
        // `cancels` is held while `early_cancels` is looked at, here and in
        // `on_cancel`: a cancel and its hook never miss each other.
        let mut cancels = self.cancels.lock();
        match cancels.remove(&key) {
            Some(f) => {
                drop(cancels);
                f();
            }
            None => self.early_cancels.lock().insert(key),
        }
    }

    /// Registers the hook for the peer's call `call_id` on `ch`; hands it
    /// back to run at once if that call was cancelled already, or is an
    /// orphan (its channel finished: the caller is gone).
    fn register_cancel(&self, ch: &Channel, call_id: u64, on_cancel: OnCancel) -> Option<OnCancel> {
        let key = (ch.key(), call_id);
        let mut cancels = self.cancels.lock();
        // Read under `cancels`, which `orphan_channel` takes after `finished`
        // is set: a hook is either seen here or found there.
        if ch.finished.load(Ordering::Acquire) {
            return Some(on_cancel);
        }
        if self.early_cancels.lock().take(key) {
            return Some(on_cancel);
        }
        cancels.insert(key, on_cancel);
        None
    }

    /// The peer on `ch` is gone (`finished` is set): its calls are orphans,
    /// so every hook of theirs runs (their handlers stop), hooks registered
    /// later run at once, and its early cancels are moot.
    pub fn orphan_channel(&self, ch: &Channel) {
        let hooks: Vec<OnCancel> = {
            let mut cancels = self.cancels.lock();
            let keys: Vec<CallKey> = cancels.keys().filter(|k| k.0 == ch.key()).copied().collect();
            let hooks = keys.iter().filter_map(|k| cancels.remove(k)).collect();
            self.early_cancels.lock().forget_channel(ch.key());
            hooks
        };
        for f in hooks {
            f();
        }
    }

    /// Drops every hook (at shutdown): they may hold tasks alive.
    pub fn clear_cancels(&self) {
        self.cancels.lock().clear();
        self.early_cancels.lock().clear();
    }
}

impl TeamInner {
    /// Runs `on_cancel` if the peer on `ch` cancels its call `call_id`
    /// (at once if it already did), until the returned guard is dropped.
    pub fn on_cancel(self: &Arc<Self>, ch: &Arc<Channel>, call_id: u64, on_cancel: OnCancel) -> CancelGuard {
        if let Some(now) = self.calls.register_cancel(ch, call_id, on_cancel) {
            now();
        }
        CancelGuard { team: Arc::downgrade(self), key: (ch.key(), call_id) }
    }
}

/// Keeps a cancellation hook registered (see `TeamInner::on_cancel`).
pub(crate) struct CancelGuard {
    team: Weak<TeamInner>,
    key: CallKey,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(t) = self.team.upgrade() {
            t.calls.cancels.lock().remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::TeamId;
    use crate::transport::{doorbell::Doorbell, inproc};
    use std::sync::atomic::AtomicUsize;

    fn channel(doorbell: &Arc<Doorbell>) -> Arc<Channel> {
        let end = inproc::loopback(4096, 0, doorbell.clone());
        Arc::new(Channel::new(TeamId { node: 0, team: 1, incarnation: 1 }, Box::new(end)))
    }

    fn counting_hook(n: &Arc<AtomicUsize>) -> OnCancel {
        let n = n.clone();
        Box::new(move || {
            n.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Regression: cancels were keyed by the channel's address, which a new
    /// channel can reuse once the old one is freed (glibc hands the same
    /// block back at once), so the new peer's call 7 was cancelled by the
    /// old peer's cancel of its own call 7.
    #[test]
    fn a_dead_channels_cancel_never_reaches_a_new_channels_call() {
        let doorbell = Arc::new(Doorbell::create().unwrap());
        let calls = Calls::new(16);
        let old = channel(&doorbell);
        let old_addr = Arc::as_ptr(&old) as usize;
        calls.cancel_arrived(&old, 7); // before its hook: remembered
        drop(old);
        let new = channel(&doorbell);
        let fired = Arc::new(AtomicUsize::new(0));
        assert!(calls.register_cancel(&new, 7, counting_hook(&fired)).is_none(), "cancelled by another channel");
        // Not a precondition, but what made the old keying fail:
        eprintln!("address reused: {}", Arc::as_ptr(&new) as usize == old_addr);
        calls.cancel_arrived(&new, 7);
        assert_eq!(fired.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_finished_channels_calls_are_orphans_and_their_hooks_run() {
        let doorbell = Arc::new(Doorbell::create().unwrap());
        let calls = Calls::new(16);
        let (gone, other) = (channel(&doorbell), channel(&doorbell));
        let fired = Arc::new(AtomicUsize::new(0));
        for id in 1..=3 {
            assert!(calls.register_cancel(&gone, id, counting_hook(&fired)).is_none());
        }
        assert!(calls.register_cancel(&other, 1, counting_hook(&fired)).is_none());
        calls.cancel_arrived(&gone, 9); // an early cancel of the gone peer: moot with it
        gone.finished.store(true, Ordering::Release);
        calls.orphan_channel(&gone);
        assert_eq!(fired.load(Ordering::Relaxed), 3, "every hook of the gone peer's calls, no other");
        assert!(calls.early_cancels.lock().is_empty());
        assert_eq!(calls.cancels.lock().len(), 1);
        // A call of the gone peer still queued when it left is cancelled when it registers.
        assert!(calls.register_cancel(&gone, 4, counting_hook(&fired)).is_some());
    }

    /// Regression (issue 15, defect 7): early cancels were one FIFO of 1024
    /// for every channel, so one peer's cancels of calls that do not exist
    /// pushed out another's, and that call ran on although cancelled.
    #[test]
    fn one_channels_cancels_do_not_evict_anothers() {
        let doorbell = Arc::new(Doorbell::create().unwrap());
        let calls = Calls::new(16);
        let (honest, noisy) = (channel(&doorbell), channel(&doorbell));
        calls.cancel_arrived(&honest, 5);
        for id in 1..=2000 {
            calls.cancel_arrived(&noisy, 1_000_000 + id);
        }
        let fired = Arc::new(AtomicUsize::new(0));
        assert!(calls.register_cancel(&honest, 5, counting_hook(&fired)).is_some(), "the early cancel was lost");
        // The noisy channel keeps its newest 1024 only.
        {
            let early = calls.early_cancels.lock();
            assert_eq!(early.keys.len(), EARLY_CANCELS);
            assert!(early.keys.contains_key(&(noisy.key(), 1_002_000)));
            assert!(!early.keys.contains_key(&(noisy.key(), 1_000_001)));
        }
        for ch in [&noisy, &honest] {
            ch.finished.store(true, Ordering::Release);
            calls.orphan_channel(ch);
        }
        assert!(calls.early_cancels.lock().is_empty(), "a finished channel's are forgotten");
    }

    /// Regression (review of issue 15, defect 7): a call id cancelled
    /// early, taken by its hook, and cancelled early again was queued twice;
    /// evicting the older copy removed the live newer cancel.
    #[test]
    fn evicting_a_taken_ids_old_copy_keeps_its_new_cancel() {
        let mut early = EarlyCancels::default();
        early.insert((1, 7));
        assert!(early.take((1, 7)));
        early.insert((1, 7));
        // Fill the channel's order up to its bound, then one more: the first copy of 7 goes.
        for id in 100..100 + EARLY_CANCELS as u64 - 1 {
            early.insert((1, id));
        }
        assert!(early.keys.contains_key(&(1, 7)), "the live cancel was evicted with the taken one's copy");
        assert_eq!(early.keys.len(), EARLY_CANCELS, "the channel's bound");
        assert!(early.take((1, 7)));
    }

    /// An accepted call registers its cancel hook (a boxed closure in the
    /// team's map) only when its token is asked for: most are answered
    /// without (`ferry.shm.explicit.null` 0.94 × without the hook). (A
    /// cancel that came first still reaches the token: the `rpc` tests'
    /// `cancel_before_accept_is_not_lost`.)
    #[test]
    fn an_accepted_call_hooks_its_cancel_only_when_its_token_is_asked_for() {
        use crate::rpc::{Client, MethodDescriptor, Never, ServiceDescriptor, ServiceEndpoint, CODEC};
        use crate::Team;
        let dir = tempfile::tempdir().unwrap();
        let team = || Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
        let (caller, server) = (team(), team());
        let method = MethodDescriptor { name: "one".into(), args: Vec::new(), ret: "u32".into() };
        let descriptor = ServiceDescriptor { name: "One".into(), codec: CODEC.into(), methods: vec![method] };
        let endpoint = ServiceEndpoint::open_unnamed(&server, descriptor.clone()).unwrap();
        let id = endpoint.id();
        std::thread::scope(|s| {
            let serving = s.spawn(|| {
                // The bind is answered inside the first accept.
                let call = endpoint.accept_blocking().unwrap();
                assert_eq!(server.inner.calls.hooks(), 0, "hooked at accept");
                call.reply_ok(&1u32).unwrap();
                let call = endpoint.accept_blocking().unwrap();
                let token = call.cancel_token().expect("an accepted call has a token").clone();
                assert_eq!(server.inner.calls.hooks(), 1);
                assert!(!token.is_cancelled());
                call.reply_ok(&1u32).unwrap();
                assert_eq!(server.inner.calls.hooks(), 0, "the hook outlived its call");
            });
            let client = Client::bind_to(&caller, id, descriptor).unwrap();
            for _ in 0..2 {
                assert_eq!(client.call_blocking::<_, u32, Never>(0, &()).unwrap(), 1);
            }
            serving.join().unwrap();
        });
    }
}
