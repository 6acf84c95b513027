//! Anonymous shared memory: a memfd mapped `MAP_SHARED`, handed to a peer as a file descriptor.

use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{fcntl_add_seals, fcntl_get_seals, fstat, ftruncate, memfd_create, MemfdFlags, SealFlags};
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
    /// Creates a new zero-filled memfd of `len` bytes, sealed at that size,
    /// and maps it.
    pub fn create(name: &str, len: usize) -> Result<Mapping> {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| Error::io("memfd_create")(e.into()))?;
        ftruncate(&fd, len as u64).map_err(|e| Error::io("ftruncate memfd")(e.into()))?;
        // Nobody (a peer holding the fd included) may shrink it later: an
        // access past the end of a shrunk file would kill us with SIGBUS.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| Error::io("seal memfd")(e.into()))?;
        Self::map(fd, len, ProtFlags::READ | ProtFlags::WRITE)
    }

    /// Like [`Mapping::create`], but sealed against any further write
    /// mapping once mapped here: this process writes it, peers holding the
    /// fd can only map it read-only ([`Mapping::open_read_only`]).
    pub fn create_published(name: &str, len: usize) -> Result<Mapping> {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| Error::io("memfd_create")(e.into()))?;
        ftruncate(&fd, len as u64).map_err(|e| Error::io("ftruncate memfd")(e.into()))?;
        let map = Self::map(fd, len, ProtFlags::READ | ProtFlags::WRITE)?;
        // FUTURE_WRITE: our mapping stays writable, no new one (nor write(2)) can be.
        fcntl_add_seals(&map.fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL)
            .map_err(|e| Error::io("seal memfd")(e.into()))?;
        Ok(map)
    }

    /// Maps a peer's memfd read-only, checked as [`Mapping::open`] does.
    /// Only loads may be made through it (a store would fault).
    pub fn open_read_only(fd: OwnedFd, len: usize) -> Result<Mapping> {
        Self::check(&fd, len)?;
        Self::map(fd, len, ProtFlags::READ)
    }

    /// Maps a memfd received from a peer, after checking it is a memfd sealed
    /// against shrinking (else the peer could truncate it under us: SIGBUS)
    /// and exactly `len` bytes long.
    pub fn open(fd: OwnedFd, len: usize) -> Result<Mapping> {
        Self::check(&fd, len)?;
        Self::map(fd, len, ProtFlags::READ | ProtFlags::WRITE)
    }

    fn check(fd: &OwnedFd, len: usize) -> Result<()> {
        let sealed = fcntl_get_seals(fd).is_ok_and(|s| s.contains(SealFlags::SHRINK | SealFlags::SEAL));
        if !sealed {
            return Err(Error::Io {
                context: "peer's shared memory is not a memfd sealed against shrinking",
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "unsealed"),
            });
        }
        let st = fstat(fd).map_err(|e| Error::io("fstat shared memory")(e.into()))?;
        if st.st_size as u64 != len as u64 {
            return Err(Error::Io {
                context: "peer's shared memory has the wrong size",
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} != {len}", st.st_size)),
            });
        }
        Ok(())
    }

    fn map(fd: OwnedFd, len: usize, prot: ProtFlags) -> Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks aliases no Rust object.
        let ptr = unsafe { mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd.as_fd(), 0) }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_memory_cannot_be_shrunk_and_unsealed_memory_is_refused() {
        let m = Mapping::create("test", 8192).unwrap();
        // The holder of the fd cannot truncate it (what would SIGBUS the other side).
        assert!(ftruncate(m.fd(), 0).is_err());
        let dup = rustix::io::dup(m.fd()).unwrap();
        assert!(Mapping::open(dup, 8192).is_ok());
        // A plain memfd without seals is refused.
        let plain = memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&plain, 8192).unwrap();
        assert!(Mapping::open(plain, 8192).is_err());
    }

    #[test]
    fn a_published_page_is_read_only_for_whoever_else_holds_it() {
        let m = Mapping::create_published("test", 4096).unwrap();
        // SAFETY: in bounds; our own mapping is writable.
        unsafe { *m.as_ptr() = 7 };
        let dup = || rustix::io::dup(m.fd()).unwrap();
        assert!(Mapping::open(dup(), 4096).is_err(), "a peer must not map it writable");
        assert!(rustix::io::write(m.fd(), b"x").is_err(), "nor write it");
        let ro = Mapping::open_read_only(dup(), 4096).unwrap();
        // SAFETY: in bounds.
        assert_eq!(unsafe { *ro.as_ptr() }, 7);
    }
}
