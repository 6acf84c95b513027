//! A handler's future, boxed in memory its thread reuses.
//!
//! Every served call makes one: the generated `dispatch` decodes the
//! arguments and returns the handler's future. A `Box` would cost every
//! call an allocation and a free (~130 instructions with glibc, ~5 % of a
//! null call's server side), though most handlers finish at their first
//! poll, on the thread that made the future: the block it lived in is
//! what the next call on that thread needs. So a thread keeps the last
//! block it freed and the next future of the same size class takes it.

use super::server::Response;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// The future a [`Dispatch`](super::Dispatch) gives for one call: like a
/// `Pin<Box<dyn Future<Output = Response> + Send>>`, in a block its thread
/// reuses for the next call (see the module's text).
pub struct HandlerFuture {
    /// The future, in a block from [`Block::take`] (dangling if it has no
    /// size). It never moves until it is dropped.
    future: NonNull<dyn Future<Output = Response> + Send>,
    /// The block's class; `None`: no block (a future of no size).
    class: Option<Layout>,
}

// SAFETY: the future it owns is `Send` (`new` requires it); nothing else is shared.
unsafe impl Send for HandlerFuture {}

impl HandlerFuture {
    /// Boxes `future`.
    pub fn new<F: Future<Output = Response> + Send + 'static>(future: F) -> HandlerFuture {
        // (Constants: the class and the branch are decided at compile time.)
        let class = (size_of::<F>() != 0).then(|| Block::class(Layout::new::<F>()));
        let at: *mut F = match class {
            None => NonNull::<F>::dangling().as_ptr(),
            Some(class) => Block::take(class).cast(),
        };
        // SAFETY: `at` is valid for a write of an `F` and aligned for it: a
        // block of at least its size and alignment, or (a zero-sized `F`)
        // any aligned non-null pointer.
        unsafe { at.write(future) };
        let future: *mut (dyn Future<Output = Response> + Send) = at;
        // SAFETY: `at` is non-null (from `Block::take` or `dangling`).
        HandlerFuture { future: unsafe { NonNull::new_unchecked(future) }, class }
    }
}

impl Future for HandlerFuture {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        // SAFETY: the future is valid until `drop` and never moves while it
        // lives (only the pointer to it does): it is pinned. `&mut self`
        // makes this the only access.
        unsafe { Pin::new_unchecked(&mut *self.future.as_ptr()) }.poll(cx)
    }
}

impl Drop for HandlerFuture {
    fn drop(&mut self) {
        // SAFETY: the future is valid, and dropped only here, once; after
        // this its block holds no value.
        unsafe { std::ptr::drop_in_place(self.future.as_ptr()) };
        if let Some(class) = self.class {
            Block::give(self.future.cast(), class);
        }
    }
}

/// A heap block of a size class: a future's layout, its size rounded up
/// to a multiple of 64 bytes (so a service's methods share blocks).
struct Block;

thread_local! {
    /// The block this thread freed last, and its class.
    static SPARE: Spare = const { Spare(Cell::new(None)) };
}

struct Spare(Cell<Option<(NonNull<u8>, Layout)>>);

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some((block, class)) = self.0.take() {
            // SAFETY: the block was allocated with `class` and is unused.
            unsafe { dealloc(block.as_ptr(), class) };
        }
    }
}

impl Block {
    /// The class of a layout of non-zero size.
    fn class(layout: Layout) -> Layout {
        Layout::from_size_align(layout.size().next_multiple_of(64), layout.align())
            .unwrap_or_else(|_| handle_alloc_error(layout))
    }

    /// A block of `class`: this thread's spare if it is of that class,
    /// else a new one.
    fn take(class: Layout) -> *mut u8 {
        // (`try_with`: a thread's last futures may come after its spare went.)
        if let Ok(Some((block, spare))) = SPARE.try_with(|s| s.0.take()) {
            if spare == class {
                return block.as_ptr();
            }
            // SAFETY: allocated with `spare`, and unused.
            unsafe { dealloc(block.as_ptr(), spare) };
        }
        // SAFETY: `class` has a non-zero size.
        let block = unsafe { alloc(class) };
        if block.is_null() {
            handle_alloc_error(class);
        }
        block
    }

    /// Gives back a block `take` gave for `class`: kept as the thread's
    /// spare (the one it replaces is freed).
    fn give(block: NonNull<u8>, class: Layout) {
        let old = SPARE.try_with(|s| s.0.replace(Some((block, class)))).unwrap_or(Some((block, class)));
        if let Some((old, old_class)) = old {
            // SAFETY: allocated with `old_class`, and unused.
            unsafe { dealloc(old.as_ptr(), old_class) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn ready(f: &mut HandlerFuture) -> Response {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(f).poll(&mut cx) {
            Poll::Ready(r) => r,
            Poll::Pending => panic!("pending"),
        }
    }

    fn bytes(r: Response) -> Vec<u8> {
        match r {
            Response::Bytes(b) => b,
            _ => panic!("not bytes"),
        }
    }

    /// A future of the class of the last one freed takes its block; one
    /// of another class does not, and what each holds is dropped once.
    #[test]
    fn the_next_future_of_a_class_reuses_the_last_block() {
        let drops = Arc::new(AtomicUsize::new(0));
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let make = |n: u8, pad: [u8; 40]| {
            let c = Counted(drops.clone());
            HandlerFuture::new(async move {
                let _c = c;
                Response::Bytes(vec![n, pad[39]])
            })
        };
        let mut a = make(1, [1; 40]);
        let first = a.future.cast::<u8>();
        assert_eq!(bytes(ready(&mut a)), [1, 1]);
        drop(a);
        let mut b = make(2, [2; 40]);
        assert_eq!(b.future.cast::<u8>(), first, "the spare block was not reused");
        assert_eq!(bytes(ready(&mut b)), [2, 2]);
        // Another class (over 64 bytes larger) gets a block of its own.
        let big = [3u8; 200];
        let mut c = HandlerFuture::new(async move { Response::Bytes(big.to_vec()) });
        assert_eq!(bytes(ready(&mut c)).len(), 200);
        drop((b, c));
        // A future never polled is dropped too; a zero-sized one allocates nothing.
        drop(make(4, [4; 40]));
        struct Zero;
        impl Future for Zero {
            type Output = Response;
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Response> {
                Poll::Ready(Response::Bytes(vec![5]))
            }
        }
        let mut z = HandlerFuture::new(Zero);
        assert_eq!(bytes(ready(&mut z)), [5]);
        assert_eq!(drops.load(Ordering::Relaxed), 3);
    }

    /// A future made on one thread may finish and be dropped on another
    /// (a handler that waited, run by its task).
    #[test]
    fn a_future_may_end_on_another_thread() {
        let mut f = HandlerFuture::new(async { Response::Bytes(vec![7; 100]) });
        let r = std::thread::spawn(move || {
            let r = ready(&mut f);
            drop(f);
            r
        })
        .join()
        .unwrap();
        assert_eq!(bytes(r), [7; 100]);
    }
}
