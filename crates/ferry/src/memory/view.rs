//! The operations on a region's bytes, as the owner and every importer on
//! its machine make them: loads, stores and atomic instructions on the
//! mapped memory itself, each checked against the region's bounds first.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// `Ok` if `len` bytes at `offset` lie inside a region of `region_len`
/// bytes (an overflowing offset included).
#[inline]
pub(super) fn check(region_len: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfBounds { offset: offset as u64, len: len as u64, region_len: region_len as u64 }),
    }
}

/// `Ok` if the word at `offset` is aligned and inside the region.
#[inline]
pub(super) fn check_word(region_len: usize, offset: usize) -> Result<()> {
    if !offset.is_multiple_of(8) {
        return Err(Error::Misaligned { offset: offset as u64 });
    }
    check(region_len, offset, 8)
}

/// A region's bytes in this process: `len` bytes at `base`, in memory
/// mapped shared with other processes (which write it concurrently).
#[derive(Clone, Copy)]
pub(super) struct View {
    base: *mut u8,
    len: usize,
}

// SAFETY: `View` is an address range; every access through it is a copy
// or an atomic instruction (below), which any thread may make.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// # Safety
    /// `base..base + len` stays mapped, readable and writable, 8-byte
    /// aligned at `base`, while this view (or a copy) is used.
    pub unsafe fn new(base: *mut u8, len: usize) -> View {
        View { base, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The start of `len` bytes at `offset`, if they lie inside the region
    /// (an overflowing offset included).
    #[inline]
    fn at(&self, offset: usize, len: usize) -> Result<*mut u8> {
        check(self.len, offset, len).map(|()| self.base.wrapping_add(offset))
    }

    /// Whether `len` bytes at `offset` lie inside the region.
    pub fn check(&self, offset: usize, len: usize) -> Result<()> {
        self.at(offset, len).map(|_| ())
    }

    /// The aligned word at `offset`.
    #[inline]
    fn word(&self, offset: usize) -> Result<&AtomicU64> {
        check_word(self.len, offset)?;
        let p = self.base.wrapping_add(offset);
        // SAFETY: in bounds (checked), 8-byte aligned (the base is, and the
        // offset is a multiple of 8), mapped while `self` is used; every
        // access to shared words goes through atomics.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Copies `bytes` into the region at `offset`.
    pub fn put(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let p = self.at(offset, bytes.len())?;
        // SAFETY: the range is in bounds and mapped. Other processes may
        // write it at the same time: the copy is the only access, and what
        // it leaves there is whatever bytes won (no word is torn by more
        // than its bytes; regions promise no atomicity beyond words).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        Ok(())
    }

    /// Copies the region's bytes at `offset` into `out`.
    pub fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.at(offset, out.len())?;
        // SAFETY: in bounds and mapped; as for `put`, the copy is the only
        // access to memory others may write meanwhile, and only `out` is read after.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    pub fn swap(&self, offset: usize, value: u64) -> Result<u64> {
        Ok(self.word(offset)?.swap(value, Ordering::SeqCst))
    }

    pub fn fetch_add(&self, offset: usize, value: u64) -> Result<u64> {
        Ok(self.word(offset)?.fetch_add(value, Ordering::SeqCst))
    }

    /// Sets the word to `new` if it is `current`; returns what it was.
    pub fn compare_and_swap(&self, offset: usize, current: u64, new: u64) -> Result<u64> {
        Ok(match self.word(offset)?.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(v) | Err(v) => v,
        })
    }

    pub fn load(&self, offset: usize) -> Result<u64> {
        Ok(self.word(offset)?.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_outside_or_misaligned_are_refused() {
        let mut mem = vec![0u64; 4];
        // SAFETY: 32 bytes of an aligned vector, alive for the test.
        let v = unsafe { View::new(mem.as_mut_ptr().cast(), 32) };
        v.put(24, &[1; 8]).unwrap();
        assert!(matches!(v.put(25, &[1; 8]), Err(Error::OutOfBounds { offset: 25, len: 8, region_len: 32 })));
        assert!(matches!(v.get(usize::MAX, &mut [0; 2]), Err(Error::OutOfBounds { .. })), "an overflowing offset");
        assert!(matches!(v.get(32, &mut []), Ok(())), "nothing at the very end");
        assert!(matches!(v.fetch_add(4, 1), Err(Error::Misaligned { offset: 4 })));
        assert!(matches!(v.fetch_add(32, 1), Err(Error::OutOfBounds { .. })));
        assert_eq!(v.fetch_add(8, 5).unwrap(), 0);
        assert_eq!(v.compare_and_swap(8, 4, 9).unwrap(), 5, "not swapped");
        assert_eq!(v.compare_and_swap(8, 5, 9).unwrap(), 5);
        assert_eq!(v.swap(8, 1).unwrap(), 9);
        let mut out = [0u8; 8];
        v.get(24, &mut out).unwrap();
        assert_eq!(out, [1; 8]);
    }
}
