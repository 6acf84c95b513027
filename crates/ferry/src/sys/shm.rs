//! Anonymous shared memory: a memfd mapped `MAP_SHARED`, handed to a peer as a file descriptor.

use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{fstat, ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use std::ptr::NonNull;

/// A shared mapping of a whole memfd. Unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory shared with other processes; all access
// to it goes through atomics or copies made by code that treats its contents
// as untrusted. Moving or sharing the handle between threads is fine.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a new zero-filled memfd of `len` bytes and maps it.
    pub fn create(name: &str, len: usize) -> Result<Mapping> {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC).map_err(|e| Error::io("memfd_create")(e.into()))?;
        ftruncate(&fd, len as u64).map_err(|e| Error::io("ftruncate memfd")(e.into()))?;
        Self::map(fd, len)
    }

    /// Maps a memfd received from a peer, after checking it is exactly `len` bytes long
    /// (a shorter file would fault on access; a longer one means a confused peer).
    pub fn open(fd: OwnedFd, len: usize) -> Result<Mapping> {
        let st = fstat(&fd).map_err(|e| Error::io("fstat shared memory")(e.into()))?;
        if st.st_size as u64 != len as u64 {
            return Err(Error::Io {
                context: "peer's shared memory has the wrong size",
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} != {len}", st.st_size)),
            });
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks aliases no Rust object.
        let ptr = unsafe {
            mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd.as_fd(), 0)
        }
        .map_err(|e| Error::io("mmap shared memory")(e.into()))?;
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).expect("mmap returned null"), len, fd })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping; every reference into it is tied to `&self`.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
