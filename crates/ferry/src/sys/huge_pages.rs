//! Fresh large buffers, advised to be backed by huge pages.
//!
//! A large message received as a fresh value (a `Vec<u8>`, a `ByteBuf`, a
//! TCP frame's own buffer) lands in memory the allocator has just mapped:
//! untouched pages, each faulted in and cleared by the kernel on its first
//! write. With 4 KiB pages that costs about three quarters of a fresh copy
//! (a 64 MiB copy into fresh memory: 25 ms against 6.5 ms with huge pages on
//! the EPYC guest of `docs/PERFORMANCE.md`). So ferry advises the interior
//! of such a buffer (`MADV_HUGEPAGE`) before its first write. It is advice:
//! with transparent huge pages `never`, or none free, the kernel uses small
//! pages, as without it; the buffer is an ordinary allocation of the global
//! allocator, freed as any other.

/// Buffers of at least this many bytes are advised (two huge pages: below
/// it the aligned interior would be too small to matter).
pub const HUGE_FROM: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// An empty `Vec` with room for `n` bytes, its pages advised when large.
pub fn vec_with_capacity(n: usize) -> Vec<u8> {
    let v = Vec::with_capacity(n);
    advise(&v);
    v
}

/// As [`vec_with_capacity`], `Err` if the memory is not there.
pub fn try_vec_with_capacity(n: usize) -> Result<Vec<u8>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    advise(&v);
    Ok(v)
}

/// `n` zero bytes, their pages advised when large. (The allocator maps a
/// large zeroed block fresh and leaves it untouched: the advice comes
/// before the first write.)
pub fn zeroed(n: usize) -> Vec<u8> {
    let v = vec![0u8; n];
    advise(&v);
    v
}

/// Advises the huge-page-aligned interior of `v`'s allocation, if large.
fn advise(v: &Vec<u8>) {
    if v.capacity() < HUGE_FROM {
        return;
    }
    let start = v.as_ptr() as usize;
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + v.capacity()) & !(HUGE_PAGE - 1);
    if end <= first {
        return;
    }
    // SAFETY: [first, end) lies inside `v`'s allocation, which this process
    // owns and which stays mapped while `v` lives. `MADV_HUGEPAGE` changes
    // no byte and no mapping's validity: it only lets the kernel back the
    // range with huge pages. An error (an old kernel, THP compiled out) just
    // leaves small pages.
    let _ =
        unsafe { rustix::mm::madvise(first as *mut std::ffi::c_void, end - first, rustix::mm::Advice::LinuxHugepage) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_whole_and_usable_at_every_size() {
        for n in [0, 1, HUGE_FROM - 1, HUGE_FROM, HUGE_FROM + 4097, 3 * HUGE_FROM] {
            let mut v = vec_with_capacity(n);
            assert!(v.capacity() >= n);
            v.resize(n, 7);
            assert!(v.iter().all(|&b| b == 7));
            let z = zeroed(n);
            assert!(z.len() == n && z.iter().all(|&b| b == 0));
            assert!(try_vec_with_capacity(n).unwrap().capacity() >= n);
        }
    }

    fn vmstat(field: &str) -> u64 {
        let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        s.lines().find_map(|l| l.strip_prefix(field)?.trim().parse().ok()).unwrap_or(0)
    }

    /// Where the kernel gives huge pages on advice, a large fresh buffer
    /// is backed by them (AnonHugePages of its mapping).
    #[test]
    fn a_large_buffer_is_backed_by_huge_pages_where_the_kernel_allows() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if !mode.contains("[madvise]") && !mode.contains("[always]") {
            return; // THP off here: nothing to see.
        }
        let fallbacks = vmstat("thp_fault_fallback ");
        let mut v = vec_with_capacity(16 << 20);
        v.resize(16 << 20, 1);
        if vmstat("thp_fault_fallback ") != fallbacks {
            return; // The kernel had no huge page free (or another thread's fault fell back).
        }
        let at = v.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut huge = 0u64;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                        inside = a < at + v.len() && at < b;
                        continue;
                    }
                }
            }
            if inside && line.starts_with("AnonHugePages:") {
                huge += line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).unwrap_or(0);
            }
        }
        assert!(huge > 0, "no huge page behind a 16 MiB advised buffer");
    }
}
