//! Tasks: futures run by the team's processors.

use crate::error::{Error, Result};
use crate::sync::{fence_after_rmw, AtomicUsize};
use crate::transport::doorbell::{Doorbell, DoorbellMemory, DoorbellPage};
use futures_task::ArcWake;
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// How long `clear` waits for a task that some thread is polling.
const CLEAR_PATIENCE: std::time::Duration = std::time::Duration::from_millis(100);

/// The ready queue shared by the team's processors. Generic over the
/// doorbell's memory only so that a loom model (`loom_executor`, below)
/// runs the real `push`.
pub(crate) struct Executor<M: DoorbellMemory = DoorbellPage> {
    ready: Mutex<VecDeque<Arc<Task<M>>>>,
    /// Length of `ready`, readable without the lock (idle loops look often).
    queued: AtomicUsize,
    /// Processors asleep on the doorbell; a new ready task must wake one.
    pub parked: AtomicUsize,
    pub doorbell: Arc<Doorbell<M>>,
}

pub(crate) struct Task<M: DoorbellMemory = DoorbellPage> {
    /// Touched only by the thread that holds [`RUNNING`] (see [`Task::hold`]).
    future: UnsafeCell<Option<BoxFuture>>,
    /// [`SCHEDULED`] and [`RUNNING`] bits: see [`Task::wake_needs_push`].
    state: AtomicUsize,
    aborted: AtomicBool,
    exec: Weak<Executor<M>>,
}

// SAFETY: the future (which is `Send`) is reached only by the one thread
// that holds the task's RUNNING bit, taken with Acquire and given back with
// Release ([`Task::claim`], [`Task::hold`], [`Task::release`]).
unsafe impl<M: DoorbellMemory> Sync for Task<M> where Weak<Executor<M>>: Sync {}

/// The task is in the ready queue, or will be put there when its poll ends.
const SCHEDULED: usize = 1;
/// A thread holds the task's future: it is polling it (and may be blocked
/// inside that poll, in a blocking call further up its stack, for a long
/// time), or an abort or `clear` is taking it.
const RUNNING: usize = 2;

/// A task's life, in `state`, so that a task is in the ready queue at most
/// once and never while it is being polled (a processor would find it
/// there, unable to run it, and spin on it):
///
/// 1. A wake sets SCHEDULED; it pushes the task only if neither bit was set.
/// 2. A processor pops it and, in one step, takes RUNNING and clears
///    SCHEDULED (the wake that queued it is consumed; wakes from now on set
///    SCHEDULED only). If RUNNING was taken (an abort holds the future for a
///    moment), it puts the task back instead.
/// 3. The poll over, it clears RUNNING; if a wake set SCHEDULED meanwhile,
///    the poller pushes it (one push, whichever of 1 and 3 came last).
///
/// RUNNING is also the future's lock: an abort or `clear` takes it
/// ([`Task::hold`]) to drop the future of a task that nobody polls.
impl<M: DoorbellMemory> Task<M> {
    /// Step 1: whether this wake must push the task.
    fn wake_needs_push(&self) -> bool {
        self.state.fetch_or(SCHEDULED, Ordering::AcqRel) & (SCHEDULED | RUNNING) == 0
    }

    /// Step 2: whether the popped task is now this thread's to poll.
    fn claim(&self) -> bool {
        self.state.compare_exchange(SCHEDULED, RUNNING, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Step 3: whether the poller must push the task again.
    fn end_poll_needs_push(&self) -> bool {
        self.state.fetch_and(!RUNNING, Ordering::AcqRel) & SCHEDULED != 0
    }

    /// Takes RUNNING outside a poll (an abort, `clear`): the state before,
    /// or `None` if a thread holds it already.
    fn hold(&self) -> Option<usize> {
        let before = self.state.fetch_or(RUNNING, Ordering::Acquire);
        (before & RUNNING == 0).then_some(before)
    }

    /// Gives back what [`Task::hold`] took; whether the task must be pushed:
    /// a wake came meanwhile (it set SCHEDULED, but did not push, seeing
    /// RUNNING) and the task was not queued already.
    fn release(&self, held_from: usize) -> bool {
        let before = self.state.fetch_and(!RUNNING, Ordering::AcqRel);
        before & SCHEDULED != 0 && held_from & SCHEDULED == 0
    }

    /// The future, taken out by a thread that is not polling it, if no
    /// thread is; pushes the task if a wake came meanwhile.
    fn take_future(self: &Arc<Self>) -> Option<BoxFuture> {
        let held_from = self.hold()?;
        // SAFETY: this thread holds RUNNING.
        let fut = unsafe { (*self.future.get()).take() };
        if self.release(held_from) {
            self.clone().push_to_exec();
        }
        fut
    }

    /// Whether a thread holds the future (see [`Executor::has_runnable`]).
    fn is_held(&self) -> bool {
        self.state.load(Ordering::Relaxed) & RUNNING != 0
    }
}

impl<M: DoorbellMemory> Task<M> {
    /// A task that is already done (its future dropped): what a model pushes.
    #[cfg(all(test, loom))]
    pub(crate) fn finished() -> Task<M> {
        Task {
            future: UnsafeCell::new(None),
            state: AtomicUsize::new(SCHEDULED),
            aborted: AtomicBool::new(false),
            exec: Weak::new(),
        }
    }
}

// futures-task's `ArcWake` rather than std's `Wake`: its `waker_ref` lends
// a poll the task's waker without a reference count taken and dropped.
impl<M: DoorbellMemory> ArcWake for Task<M> {
    /// A waker given up (most are: a reply's, a message's) is what the
    /// ready queue keeps, not a clone of it.
    fn wake(self: Arc<Self>) {
        if self.wake_needs_push() {
            self.push_to_exec();
        }
    }

    fn wake_by_ref(task: &Arc<Self>) {
        if task.wake_needs_push() {
            task.clone().push_to_exec();
        }
    }
}

impl<M: DoorbellMemory> Task<M> {
    /// Puts the task in its executor's ready queue, if the executor lives.
    fn push_to_exec(self: Arc<Self>) {
        match processor_exec(Weak::as_ptr(&self.exec)) {
            Some(exec) => exec.push(self),
            None => {
                if let Some(exec) = self.exec.upgrade() {
                    exec.push(self);
                }
            }
        }
    }
}

thread_local! {
    /// The executor this thread is a processor of (see [`ProcessorOf`]).
    static PROCESSOR_EXEC: std::cell::Cell<*const ()> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// `exec` itself if this thread is one of its processors: a wake made there
/// (the common case: a reply or a message drained by the processor) pushes
/// without upgrading the task's `Weak` and dropping the `Arc` (two locked
/// instructions).
fn processor_exec<'a, M: DoorbellMemory>(exec: *const Executor<M>) -> Option<&'a Executor<M>> {
    // SAFETY: the thread's mark is set only while its processor loop holds
    // an `Arc` of that executor (`ProcessorOf`), so the executor is alive for
    // the whole of the wake. Equal addresses are the same executor: a task's
    // `Weak` keeps its executor's allocation, so no other can take it.
    (PROCESSOR_EXEC.get() == exec.cast()).then(|| unsafe { &*exec })
}

/// Marks this thread as a processor of one executor while alive (for
/// [`processor_exec`]); the processor loop keeps it for as long as it holds
/// its `Arc` of the executor.
pub(crate) struct ProcessorOf<'a>(std::marker::PhantomData<&'a Executor>);

impl<'a> ProcessorOf<'a> {
    pub(crate) fn enter(exec: &'a Arc<Executor>) -> ProcessorOf<'a> {
        PROCESSOR_EXEC.set(Arc::as_ptr(exec).cast());
        ProcessorOf(std::marker::PhantomData)
    }
}

impl Drop for ProcessorOf<'_> {
    fn drop(&mut self) {
        PROCESSOR_EXEC.set(std::ptr::null());
    }
}

impl<M: DoorbellMemory> Executor<M> {
    pub fn new(doorbell: Arc<Doorbell<M>>) -> Arc<Executor<M>> {
        Arc::new(Executor {
            ready: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            doorbell,
        })
    }

    fn push(&self, task: Arc<Task<M>>) {
        {
            let mut ready = self.ready.lock();
            ready.push_back(task);
            self.queued.store(ready.len(), Ordering::Release);
        }
        // Dekker with a parking processor (parked += 1 → fence in
        // `prepare_park` → `has_ready`): the store above must not pass the
        // load below. The unlock is a read-modify-write (parking_lot's
        // release is a compare-exchange), though only a release: a full
        // barrier on x86, not on other CPUs or in the memory model.
        fence_after_rmw();
        if self.parked.load(Ordering::Relaxed) != 0 {
            self.doorbell.ring_now();
        }
    }

    pub fn has_ready(&self) -> bool {
        self.queued.load(Ordering::Acquire) != 0
    }

    /// Whether a ready task could run here now (not one being polled further
    /// up this thread's stack).
    pub fn has_runnable(&self) -> bool {
        self.has_ready() && self.ready.lock().iter().any(|t| !t.is_held())
    }

    fn pop(&self) -> Option<Arc<Task<M>>> {
        if !self.has_ready() {
            return None;
        }
        let mut ready = self.ready.lock();
        let t = ready.pop_front();
        self.queued.store(ready.len(), Ordering::Release);
        t
    }

    /// Runs one ready task if there is one. A task is never queued while
    /// it is being polled (see [`Task::wake_needs_push`]); one whose future
    /// another thread holds for a moment (an abort taking it) is put back.
    pub fn run_one(&self) -> bool {
        let Some(task) = self.pop() else { return false };
        if !task.claim() {
            self.push(task);
            return false;
        }
        let poll = Polling { exec: self, task: &task };
        // SAFETY: this thread holds RUNNING (`claim`) until `poll` drops.
        let slot = unsafe { &mut *task.future.get() };
        let waker = futures_task::waker_ref(&task);
        let mut cx = Context::from_waker(&waker);
        let _in_task = InTask::enter();
        if task.aborted.load(Ordering::Acquire) {
            // Dropping the future is the cancellation: it stops at its last await.
            *slot = None;
        } else if let Some(fut) = slot.as_mut() {
            if fut.as_mut().poll(&mut cx).is_ready() {
                *slot = None;
            }
        }
        drop(poll);
        true
    }

    /// Drops every ready task (at shutdown). Run after inboxes, pending
    /// sends and timers were failed or cleared, which wakes (readies) the
    /// tasks that waited on them, so none is kept alive by a cycle.
    pub fn clear(&self) {
        let tasks: Vec<_> = {
            let mut ready = self.ready.lock();
            self.queued.store(0, Ordering::Release);
            ready.drain(..).collect()
        };
        for t in tasks {
            // A task being polled is not waited for long: its poll may never
            // end (user code stuck on a thread that shutdown left behind).
            let since = std::time::Instant::now();
            while t.is_held() && since.elapsed() < CLEAR_PATIENCE {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            drop(t.take_future());
        }
    }
}

/// The end of a poll (step 3), also if the poll unwinds: RUNNING given
/// back, the task pushed again if it was woken meanwhile.
struct Polling<'a, M: DoorbellMemory> {
    exec: &'a Executor<M>,
    task: &'a Arc<Task<M>>,
}

impl<M: DoorbellMemory> Drop for Polling<'_, M> {
    fn drop(&mut self) {
        if self.task.end_poll_needs_push() {
            self.exec.push(self.task.clone());
        }
    }
}

impl Executor {
    pub fn spawn<F>(self: &Arc<Self>, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let slot = Arc::new(Mutex::new(JoinSlot { result: None, waker: None }));
        let out = slot.clone();
        let wrapped = async move {
            let result = CatchUnwind(AssertUnwindSafe(Box::pin(fut))).await;
            out.lock().finish(result.map_err(|p| Error::Panicked(panic_message(&*p))));
        };
        let task = Arc::new(Task {
            future: UnsafeCell::new(Some(Box::pin(wrapped))),
            state: AtomicUsize::new(SCHEDULED),
            aborted: AtomicBool::new(false),
            exec: Arc::downgrade(self),
        });
        let abort = AbortHandle { task: Arc::downgrade(&task), slot: slot.clone() };
        self.push(task);
        JoinHandle { slot, abort }
    }
}

thread_local! {
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as polling a task (restores the previous mark on drop).
/// Marks this thread as running on behalf of a task while alive.
pub(crate) struct InTask(bool);

impl InTask {
    pub(crate) fn enter() -> InTask {
        InTask(IN_TASK.with(|t| t.replace(true)))
    }
}

impl Drop for InTask {
    fn drop(&mut self) {
        IN_TASK.with(|t| t.set(self.0));
    }
}

/// Whether this thread is inside a task's poll (a blocking call made there
/// should keep the processor's other tasks running).
pub(crate) fn in_task() -> bool {
    IN_TASK.with(|t| t.get())
}

struct JoinSlot<T> {
    result: Option<Result<T>>,
    waker: Option<Waker>,
}

impl<T> JoinSlot<T> {
    /// Records the outcome unless one is there already (an abort races the end).
    fn finish(&mut self, r: Result<T>) {
        if self.result.is_none() {
            self.result = Some(r);
        }
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// Awaits a spawned task's output. A task that panicked yields
/// `Error::Panicked`, an aborted one `Error::Cancelled`.
pub struct JoinHandle<T> {
    slot: Arc<Mutex<JoinSlot<T>>>,
    abort: AbortHandle<T>,
}

impl<T> JoinHandle<T> {
    /// Cancels the task (see [`AbortHandle::abort`]).
    pub fn abort(&self) {
        self.abort.abort()
    }
    /// A handle that can cancel the task without owning its outcome.
    pub fn abort_handle(&self) -> AbortHandle<T> {
        self.abort.clone()
    }
}

/// A handle whose outcome another thread delivers (a blocking job, see
/// `blocking`). It has no task: aborting it changes nothing.
pub(crate) fn external<T>() -> (JoinHandle<T>, Completion<T>) {
    let slot = Arc::new(Mutex::new(JoinSlot { result: None, waker: None }));
    let abort = AbortHandle { task: Weak::new(), slot: slot.clone() };
    (JoinHandle { slot: slot.clone(), abort }, Completion(Some(slot)))
}

/// Delivers an outcome to an [`external`] handle. Dropped undelivered (the
/// job was dropped unrun: its team left), it delivers `Shutdown`.
pub(crate) struct Completion<T>(Option<Arc<Mutex<JoinSlot<T>>>>);

impl<T> Completion<T> {
    pub fn finish(mut self, r: Result<T>) {
        if let Some(slot) = self.0.take() {
            slot.lock().finish(r);
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.lock().finish(Err(Error::Shutdown));
        }
    }
}

/// Cancels a task from anywhere; a no-op once it has finished.
pub struct AbortHandle<T> {
    task: Weak<Task>,
    slot: Arc<Mutex<JoinSlot<T>>>,
}

impl<T> Clone for AbortHandle<T> {
    fn clone(&self) -> Self {
        AbortHandle { task: self.task.clone(), slot: self.slot.clone() }
    }
}

impl<T> AbortHandle<T> {
    /// Cancels the task. Its future is dropped here and now unless a thread
    /// is polling it at this moment (then by the next thread to run the
    /// task), so an aborted task stops owning what its future owned, a
    /// `Team` included, without waiting for a processor.
    pub fn abort(&self) {
        if let Some(task) = self.task.upgrade() {
            task.aborted.store(true, Ordering::Release);
            self.slot.lock().finish(Err(Error::Cancelled));
            // Dropped after RUNNING is given back: its drop may shut the team
            // down, which clears tasks.
            drop(task.take_future());
            ArcWake::wake_by_ref(&task);
        }
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut s = self.slot.lock();
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Polls the inner future, turning a panic into `Err`.
pub(crate) struct CatchUnwind<F>(pub AssertUnwindSafe<F>);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut **inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}

/// The loom model of `push` (kept with the other models, in `loom_models/`).
#[cfg(all(test, loom))]
#[path = "../loom_models/executor.rs"]
mod loom_executor;
