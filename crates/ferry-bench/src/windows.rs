//! Throughput of several processes at once: every caller counts the calls
//! it completes in the same slices of time, given on the monotonic clock
//! (one clock for every process of the machine), so the counts of all of
//! them add up over exactly the same interval.

use rustix::time::{clock_gettime, ClockId};

/// The monotonic clock in ns (`Instant`'s clock, readable as a number).
pub(crate) fn now_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `slices` back-to-back slices of `slice_ns`, the first starting at `start_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    pub start_ns: u64,
    pub slice_ns: u64,
    pub slices: usize,
}

impl Windows {
    /// Slices that start `lead_ns` from now: time for the order to reach
    /// every caller and for the callers to warm up.
    pub fn after(lead_ns: u64, slice_ns: u64, slices: usize) -> Windows {
        Windows { start_ns: now_ns() + lead_ns, slice_ns: slice_ns.max(1), slices: slices.max(1) }
    }

    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.slice_ns * self.slices as u64
    }

    /// The order a caller gets: `go START SLICE SLICES`.
    pub fn to_line(self) -> String {
        format!("go {} {} {}", self.start_ns, self.slice_ns, self.slices)
    }

    pub fn parse(line: &str) -> Result<Windows, String> {
        let mut w = line.split_whitespace();
        let mut num = || w.next().and_then(|x| x.parse::<u64>().ok());
        match (line.starts_with("go "), num(), num(), num(), num()) {
            (true, _, Some(start_ns), Some(slice_ns), Some(slices)) if slice_ns > 0 && slices > 0 => {
                Ok(Windows { start_ns, slice_ns, slices: slices as usize })
            }
            _ => Err(format!("bad order {line:?}")),
        }
    }

    /// Makes `call` back to back (from now, the warm-up, until the last
    /// slice ends) and counts the calls that ended in each slice.
    pub fn count(&self, mut call: impl FnMut() -> Result<(), String>) -> Result<Vec<u64>, String> {
        let mut counts = vec![0u64; self.slices];
        let end = self.end_ns();
        loop {
            call()?;
            let t = now_ns();
            if t >= end {
                return Ok(counts);
            }
            if t >= self.start_ns {
                counts[((t - self.start_ns) / self.slice_ns) as usize] += 1;
            }
        }
    }
}

/// A caller's answer: `counts C1 C2 ...`, one count per slice.
pub(crate) fn counts_line(counts: &[u64]) -> String {
    let mut s = "counts".to_string();
    for c in counts {
        s.push_str(&format!(" {c}"));
    }
    s
}

pub(crate) fn parse_counts(line: &str, slices: usize) -> Result<Vec<u64>, String> {
    let counts: Option<Vec<u64>> =
        line.strip_prefix("counts").and_then(|r| r.split_whitespace().map(|c| c.parse().ok()).collect());
    counts.filter(|c| c.len() == slices).ok_or_else(|| format!("bad counts {line:?}"))
}

/// Per slice, ns per call of all callers together (`counts[caller][slice]`):
/// the inverse of their total throughput. Fails on a slice without calls.
pub(crate) fn ns_per_call(w: &Windows, counts: &[Vec<u64>]) -> Result<Vec<f64>, String> {
    (0..w.slices)
        .map(|s| match counts.iter().map(|c| c[s]).sum::<u64>() {
            0 => Err(format!("no call completed in slice {s} of {} ns", w.slice_ns)),
            total => Ok(w.slice_ns as f64 / total as f64),
        })
        .collect()
}

/// The smallest caller's share of the calls relative to an equal share:
/// `min / (total / callers)`; 1 when all got the same, 0 when one starved.
/// `None` without calls.
pub(crate) fn min_share(per_caller: &[u64]) -> Option<f64> {
    let total: u64 = per_caller.iter().sum();
    let min = *per_caller.iter().min()?;
    (total > 0).then(|| min as f64 * per_caller.len() as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_round_trips_and_bad_ones_fail() {
        let w = Windows { start_ns: 123, slice_ns: 1000, slices: 7 };
        assert_eq!(Windows::parse(&w.to_line()), Ok(w));
        assert_eq!(w.end_ns(), 7123);
        assert!(Windows::parse("go 1 0 3").is_err());
        assert!(Windows::parse("go 1 2").is_err());
        assert!(Windows::parse("stop 1 2 3").is_err());
    }

    #[test]
    fn counts_round_trip_and_are_checked() {
        assert_eq!(parse_counts(&counts_line(&[3, 0, 5]), 3), Ok(vec![3, 0, 5]));
        assert!(parse_counts("counts 3 0", 3).is_err());
        assert!(parse_counts("counts 3 x 1", 3).is_err());
        assert!(parse_counts("ready", 0).is_err());
    }

    #[test]
    fn count_fills_the_slices_and_ends_with_the_last() {
        let w = Windows::after(2_000_000, 2_000_000, 3);
        let mut calls = 0u64;
        let counts = w
            .count(|| {
                calls += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
                Ok(())
            })
            .unwrap();
        assert!(now_ns() >= w.end_ns());
        assert_eq!(counts.len(), 3);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert!(counts.iter().sum::<u64>() < calls, "the warm-up's calls are not counted");
        assert_eq!(w.count(|| Err("gone".into())), Err("gone".to_string()));
    }

    #[test]
    fn throughput_adds_the_callers_per_slice() {
        let w = Windows { start_ns: 0, slice_ns: 1_000_000, slices: 2 };
        let per_slice = ns_per_call(&w, &[vec![100, 300], vec![400, 200]]).unwrap();
        assert_eq!(per_slice, vec![2000.0, 2000.0]);
        assert!(ns_per_call(&w, &[vec![1, 0], vec![1, 0]]).is_err());
    }

    #[test]
    fn share_of_the_smallest_caller() {
        assert_eq!(min_share(&[100, 100, 100, 100]), Some(1.0));
        assert_eq!(min_share(&[17, 746]), Some(17.0 * 2.0 / 763.0));
        assert_eq!(min_share(&[0, 50]), Some(0.0));
        assert_eq!(min_share(&[5]), Some(1.0));
        assert_eq!(min_share(&[0, 0]), None);
        assert_eq!(min_share(&[]), None);
    }
}
