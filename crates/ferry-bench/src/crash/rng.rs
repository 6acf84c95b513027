//! A small seeded generator (SplitMix64): the matrix's random choices come
//! from `--seed`, so a run can be told apart from another (the scheduling
//! still differs from run to run).

pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for one part of the run (a round, a team, a worker),
    /// derived from the run's seed.
    pub fn derive(seed: u64, parts: &[u64]) -> Rng {
        let mut r = Rng(seed);
        for &p in parts {
            r.0 ^= p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            r.next();
        }
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 for n = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True once in `n` times.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process of the
/// machine shares (network namespaces do not change it): the harness
/// stamps the kill with it, the teams their operations.
pub(crate) fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
