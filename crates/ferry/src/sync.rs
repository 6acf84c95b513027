//! The atomics, fence and lock of the code that the loom models check (see
//! `loom_models`), as tokio does in `tokio/src/loom/`.
//!
//! In a normal build these are std's atomics and parking_lot's mutex. Built
//! with `RUSTFLAGS="--cfg loom"` they are loom's, so a model runs the real
//! protocol code while loom explores its interleavings and the values a
//! weak memory model lets each load return. Only code that a model runs
//! uses this module; the rest of the crate keeps std's types.
//!
//! Words shared with another process (ring stamps and head, doorbell words,
//! writer-waiting flags) cannot be loom atomics: they are std atomics cast
//! onto the mapping. The protocol code is generic over where those words
//! live (`RingMemory`, `DoorbellMemory`) and reaches them through
//! [`AtomicU32Ops`]/[`AtomicU64Ops`], implemented for std's atomics and,
//! under `cfg(loom)`, for loom's, so a model can keep them on the heap.
//!
//! A loom build only needs to compile the rest of the crate: `scripts/test.sh`
//! runs just the tests whose names contain `loom`.

pub(crate) use std::sync::atomic::Ordering;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize};

/// The full fence of a Dekker step whose store was a read-modify-write
/// (`fetch_add`, `swap`, ...): the loads after it must not be satisfied
/// before that write is visible to every other CPU.
///
/// On x86-64 the read-modify-write is that fence already: its `lock`
/// prefix drains the store buffer, and no later load passes it (Intel SDM
/// vol. 3, "Memory Ordering in P6 and More Recent Processor Families":
/// "reads or writes cannot be reordered with ... locked instructions";
/// AMD's manual says the same of its locked instructions). A fence after
/// it (a `lock or` on the stack, as LLVM emits one) only adds its own
/// locked instruction, on the path from a caught message to its
/// answer (`Doorbell::leave_polling`: `ferry.shm.spin` 0.97–0.99 × with it
/// left out). So there only the compiler is kept from moving loads above
/// it, as Linux's `smp_mb__after_atomic()` does. Elsewhere, and in the
/// loom models (which check that the steps need a fence here), it is a
/// real `fence(SeqCst)`: the language's memory model promises no more.
#[inline(always)]
pub(crate) fn fence_after_rmw() {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    fence(Ordering::SeqCst);
}

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;

/// loom's mutex with parking_lot's signature (`lock` cannot fail).
#[cfg(loom)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Mutex<T> {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // A model that panics while holding the lock has failed already.
        self.0.lock().unwrap()
    }
}

/// A mutex's value, reached without locking it by a caller whom a lock of
/// its own makes the only one there (a ring's consumer, which the runtime
/// reaches only under its channel's receive lock): the mutex's two locked
/// instructions are saved. Debug builds lock it all the same and panic if
/// it is held, so a broken promise shows in the tests; loom's models lock
/// it, so they see any overlap.
///
/// # Safety
/// While the returned borrow lives nothing else reaches the value: no
/// guard of `mutex` and no other such borrow.
#[inline]
pub(crate) unsafe fn unlocked<T>(mutex: &Mutex<T>) -> Unlocked<'_, T> {
    #[cfg(not(loom))]
    return Unlocked {
        value: mutex.data_ptr(),
        _value: std::marker::PhantomData,
        #[cfg(debug_assertions)]
        _held: mutex.try_lock().expect("a mutex reached unlocked while it was held"),
    };
    #[cfg(loom)]
    return mutex.lock();
}

/// A mutex's value reached without its lock (see [`unlocked`]).
#[cfg(not(loom))]
pub(crate) struct Unlocked<'a, T> {
    value: *mut T,
    /// Borrows the value for `'a`, as a `&mut T` would (and, as the raw
    /// pointer makes it, stays on this thread).
    _value: std::marker::PhantomData<&'a mut T>,
    /// Debug builds hold the lock, to catch an overlap.
    #[cfg(debug_assertions)]
    _held: MutexGuard<'a, T>,
}

#[cfg(loom)]
pub(crate) type Unlocked<'a, T> = MutexGuard<'a, T>;

#[cfg(not(loom))]
impl<T> std::ops::Deref for Unlocked<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the only borrow of the value (`unlocked`'s contract).
        unsafe { &*self.value }
    }
}

#[cfg(not(loom))]
impl<T> std::ops::DerefMut for Unlocked<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only borrow.
        unsafe { &mut *self.value }
    }
}

/// A condition variable whose timed wait takes and gives back the guard.
/// Under loom a wait of [`FOR_GOOD`] or longer is a wait for a notify (a
/// notify that never comes is a deadlock the model reports); a shorter one
/// times out at once (a timed wait may).
pub(crate) struct Condvar(#[cfg(not(loom))] parking_lot::Condvar, #[cfg(loom)] loom::sync::Condvar);

/// See [`Condvar`].
pub(crate) const FOR_GOOD: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(not(loom))]
impl Condvar {
    pub(crate) fn new() -> Condvar {
        Condvar(parking_lot::Condvar::new())
    }

    pub(crate) fn wait_for<'a, T>(
        &self,
        mut g: parking_lot::MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> parking_lot::MutexGuard<'a, T> {
        self.0.wait_for(&mut g, timeout);
        g
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(loom)]
impl Condvar {
    pub(crate) fn new() -> Condvar {
        Condvar(loom::sync::Condvar::new())
    }

    pub(crate) fn wait_for<'a, T>(
        &self,
        g: loom::sync::MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> loom::sync::MutexGuard<'a, T> {
        match timeout >= FOR_GOOD {
            true => self.0.wait(g).unwrap(),
            false => g,
        }
    }

    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// The operations the protocols do on a 64-bit shared word.
pub trait AtomicU64Ops: Send + Sync {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, val: u64, order: Ordering);
}

/// The operations the protocols do on a 32-bit shared word.
pub trait AtomicU32Ops: Send + Sync {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, val: u32, order: Ordering);
    fn swap(&self, val: u32, order: Ordering) -> u32;
    fn fetch_add(&self, val: u32, order: Ordering) -> u32;
    fn fetch_sub(&self, val: u32, order: Ordering) -> u32;
}

macro_rules! impl_u64_ops {
    ($t:ty) => {
        impl AtomicU64Ops for $t {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u64 {
                <$t>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, val: u64, order: Ordering) {
                <$t>::store(self, val, order)
            }
        }
    };
}

macro_rules! impl_u32_ops {
    ($t:ty) => {
        impl AtomicU32Ops for $t {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u32 {
                <$t>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, val: u32, order: Ordering) {
                <$t>::store(self, val, order)
            }
            #[inline(always)]
            fn swap(&self, val: u32, order: Ordering) -> u32 {
                <$t>::swap(self, val, order)
            }
            #[inline(always)]
            fn fetch_add(&self, val: u32, order: Ordering) -> u32 {
                <$t>::fetch_add(self, val, order)
            }
            #[inline(always)]
            fn fetch_sub(&self, val: u32, order: Ordering) -> u32 {
                <$t>::fetch_sub(self, val, order)
            }
        }
    };
}

impl_u64_ops!(std::sync::atomic::AtomicU64);
impl_u32_ops!(std::sync::atomic::AtomicU32);
#[cfg(loom)]
impl_u64_ops!(loom::sync::atomic::AtomicU64);
#[cfg(loom)]
impl_u32_ops!(loom::sync::atomic::AtomicU32);
