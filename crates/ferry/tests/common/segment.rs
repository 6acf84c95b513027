//! A channel's shared segment as a peer holding its memfd sees it: the
//! hostile-peer tests map it from this process's descriptors and write
//! over it.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Our own writable mapping of a channel segment.
pub struct Segment {
    ptr: *mut u8,
    len: usize,
}

impl Segment {
    /// Maps each channel segment (`ferry-channel` memfd) of `len` bytes this
    /// process holds, in turn, and returns the first that `is_it` accepts.
    pub fn find(len: usize, is_it: impl Fn(&Segment) -> bool) -> Option<Segment> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(target) = std::fs::read_link(entry.path()) else { continue };
            if !target.to_string_lossy().contains("ferry-channel") {
                continue;
            }
            let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(entry.path()) else { continue };
            if file.metadata().map(|m| m.len()).ok() != Some(len as u64) {
                continue;
            }
            // SAFETY: a fresh shared mapping of the whole file, at an address
            // the kernel picks; only accessed through `Segment`.
            let Ok(ptr) = (unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    len,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::SHARED,
                    file.as_fd(),
                    0,
                )
            }) else {
                continue;
            };
            let seg = Segment { ptr: ptr.cast(), len };
            if is_it(&seg) {
                return Some(seg);
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The 8-byte word at `off`.
    pub fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (the mapping is page-aligned); the
        // words of the shared memory are only ever accessed atomically or
        // copied, here and in the peer.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    pub fn write_u64(&self, off: usize, v: u64) {
        self.word(off).store(v, Ordering::SeqCst)
    }

    pub fn read_u64(&self, off: usize) -> u64 {
        self.word(off).load(Ordering::SeqCst)
    }

    /// Writes `bytes` at `off`, byte by byte.
    pub fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: in bounds; volatile because others read the memory.
            unsafe { std::ptr::write_volatile(self.ptr.add(off + i), *b) }
        }
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        // SAFETY: in bounds; a copy of memory that may change underneath.
        (0..len).map(|i| unsafe { std::ptr::read_volatile(self.ptr.add(off + i)) }).collect()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: our own mapping, not referenced after this.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}
