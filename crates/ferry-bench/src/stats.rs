//! Summary statistics of a case's per-round samples.

/// Median, minimum and maximum of a set of samples (ns per round trip).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// `None` for no samples. NaN samples are ordered last (`total_cmp`).
    /// With an even count the median is the mean of the two middle samples.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Some(Stats { median, min: s[0], max: s[n - 1] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_median_is_the_middle_sample() {
        let s = Stats::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!(s, Stats { median: 3.0, min: 1.0, max: 5.0 });
    }

    #[test]
    fn even_count_median_is_the_mean_of_the_middle_two() {
        let s = Stats::of(&[4.0, 1.0, 10.0, 2.0]).unwrap();
        assert_eq!(s, Stats { median: 3.0, min: 1.0, max: 10.0 });
    }

    #[test]
    fn single_sample_and_empty() {
        assert_eq!(Stats::of(&[7.5]), Some(Stats { median: 7.5, min: 7.5, max: 7.5 }));
        assert_eq!(Stats::of(&[]), None);
    }
}
