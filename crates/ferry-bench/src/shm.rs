//! A shared memory region: a memfd mapped read-write and shared, so the
//! parent and the child of a case see the same bytes.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// Bytes in every case's region. The memfd is sparse: pages cost nothing
/// until touched.
pub(crate) const SHM_BYTES: usize = 1 << 20;

/// A memfd and its shared mapping. The mapping starts zeroed (a fresh memfd)
/// and is page-aligned, so every offset that is a multiple of 64 starts a
/// cache line.
pub struct ShmRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain shared memory; all access from safe code goes
// through atomics (`atomic_u64`, `atomic_u32`), which are Sync.
unsafe impl Send for ShmRegion {}
// SAFETY: see above.
unsafe impl Sync for ShmRegion {}

impl ShmRegion {
    /// Creates a zeroed region of `len` bytes. The memfd is created without
    /// CLOEXEC, so the child started next inherits it (the harness sets
    /// CLOEXEC right after that spawn).
    pub(crate) fn create(len: usize) -> io::Result<Self> {
        let fd = memfd_create("ferry-bench", MemfdFlags::empty())?;
        ftruncate(&fd, len as u64)?;
        Self::map(fd, len)
    }

    /// Maps an inherited memfd of `len` bytes.
    pub(crate) fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping (null hint, no MAP_FIXED) cannot overlap any
        // existing Rust object; `fd` is a memfd at least `len` bytes long.
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)? };
        let ptr = NonNull::new(ptr.cast::<u8>()).expect("mmap returned null");
        Ok(Self { fd, ptr, len })
    }

    /// The memfd, for cases that map it themselves (or pass it on).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Base address of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false; here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `AtomicU64` at byte `offset` (a multiple of 8, within the region).
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        // SAFETY: `check` proved the 8 bytes are inside the live mapping and
        // 8-aligned (the base is page-aligned); any bit pattern is a valid
        // AtomicU64, and other processes touch these bytes only atomically.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The `AtomicU32` at byte `offset` (a multiple of 4, within the region),
    /// e.g. a futex word.
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4);
        // SAFETY: as in `atomic_u64`, with 4 bytes and 4-byte alignment.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn check(&self, offset: usize, size: usize) {
        assert!(offset.is_multiple_of(size), "offset {offset} not {size}-aligned");
        assert!(offset + size <= self.len, "offset {offset} outside region");
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, and every
        // reference handed out borrows `self`, so none outlives this call.
        unsafe {
            let _ = munmap(self.ptr.as_ptr().cast::<c_void>(), self.len);
        }
    }
}
