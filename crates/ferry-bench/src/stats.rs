//! Summary statistics of a case's samples (per round, or per call for a
//! case timed call by call).

/// Median (p50), 99th percentile, minimum and maximum of a set of samples
/// (ns per round trip).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

/// Which statistic a comparison is made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// The median.
    P50,
    P99,
}

impl Stat {
    pub fn of(self, s: &Stats) -> f64 {
        match self {
            Stat::P50 => s.median,
            Stat::P99 => s.p99,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Stat::P50 => "p50",
            Stat::P99 => "p99",
        }
    }
}

impl Stats {
    /// `None` for no samples. NaN samples are ordered last (`total_cmp`).
    /// With an even count the median is the mean of the two middle samples;
    /// p99 is the nearest rank: the smallest sample that at least 99 % of
    /// the samples do not exceed.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Some(Stats { median, p99: nearest_rank(&s, 0.99), min: s[0], max: s[n - 1] })
    }

    /// All NaN: the stand-in for no samples.
    pub const NAN: Stats = Stats { median: f64::NAN, p99: f64::NAN, min: f64::NAN, max: f64::NAN };
}

/// The `q` quantile of sorted, non-empty `s` by nearest rank: `s[⌈q·n⌉ − 1]`.
fn nearest_rank(s: &[f64], q: f64) -> f64 {
    let rank = (q * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_median_is_the_middle_sample() {
        let s = Stats::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(s, Stats { median: 3.0, p99: 5.0, min: 1.0, max: 5.0 });
    }

    #[test]
    fn even_count_median_is_the_mean_of_the_middle_two() {
        let s = Stats::of(&[4.0, 1.0, 10.0, 2.0]).unwrap();
        assert_eq!(s, Stats { median: 3.0, p99: 10.0, min: 1.0, max: 10.0 });
    }

    #[test]
    fn single_sample_and_empty() {
        assert_eq!(Stats::of(&[7.5]), Some(Stats { median: 7.5, p99: 7.5, min: 7.5, max: 7.5 }));
        assert_eq!(Stats::of(&[]), None);
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        // 1..=1000 shuffled: the 990th smallest is 990.
        let v: Vec<f64> = (1..=1000).map(|i| ((i * 7919) % 1000 + 1) as f64).collect();
        let s = Stats::of(&v).unwrap();
        assert_eq!((s.median, s.p99, s.min, s.max), (500.5, 990.0, 1.0, 1000.0));
        // 100 samples: p99 is the 99th; 101: the 100th (⌈99.99⌉); the slowest 1 % above it.
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(Stats::of(&v).unwrap().p99, 99.0);
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(Stats::of(&v).unwrap().p99, 100.0);
    }

    #[test]
    fn p99_sees_a_tail_the_median_hides() {
        // 98 % fast calls, 2 % slow ones (the shape of an unpinned case).
        let v: Vec<f64> = (0..5000).map(|i| if i % 50 == 0 { 49_000.0 } else { 670.0 }).collect();
        let s = Stats::of(&v).unwrap();
        assert_eq!((s.median, s.p99), (670.0, 49_000.0));
    }

    #[test]
    fn stat_picks_its_figure() {
        let s = Stats { median: 1.0, p99: 2.0, min: 0.5, max: 3.0 };
        assert_eq!((Stat::P50.of(&s), Stat::P99.of(&s)), (1.0, 2.0));
        assert_eq!((Stat::P50.name(), Stat::P99.name()), ("p50", "p99"));
    }
}
