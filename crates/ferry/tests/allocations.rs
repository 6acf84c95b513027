//! A small call allocates nothing on its path, on either side: the
//! client's call slab, the server's handler future (a block its thread
//! reuses) and both sides' small payloads (inline) take no memory from
//! the allocator once warm. Counted with a global allocator of this test
//! binary's own, over every thread of the process.

use ferry::Team;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to `System` unchanged; only counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[ferry::service]
pub trait Small {
    async fn null(&self);
    async fn add(&self, a: u64, b: u64) -> u64;
}

struct SmallImpl;

impl Small for SmallImpl {
    async fn null(&self) {}
    async fn add(&self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b)
    }
}

/// 10,000 null calls and 10,000 calls with two arguments and a result,
/// from this thread to a service on another team's processor: fewer
/// allocations than one call in ten (what a background thread may make
/// meanwhile), where one allocation per call would be 20,000.
#[test]
fn a_small_call_allocates_nothing_once_warm() {
    let dir = tempfile::tempdir().unwrap();
    let server = Team::builder().runtime_dir(dir.path()).processors(1).blocking().start().unwrap();
    let client = Team::builder().runtime_dir(dir.path()).processors(0).blocking().start().unwrap();
    let serving = SmallServer::serve(&server, "small", SmallImpl).unwrap();
    let c = SmallClient::bind(&client, "small").unwrap();
    const CALLS: u64 = 10_000;
    for i in 0..1_000 {
        c.null_blocking().unwrap();
        assert_eq!(c.add_blocking(i, 1).unwrap(), i + 1);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..CALLS {
        c.null_blocking().unwrap();
        assert_eq!(c.add_blocking(i, 2).unwrap(), i + 2);
    }
    let made = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(made < 2 * CALLS / 10, "{made} allocations in {} small calls", 2 * CALLS);
    drop((c, serving));
    client.shutdown();
    server.shutdown();
}
