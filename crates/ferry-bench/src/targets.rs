//! A suite's targets: a case's statistic at most so many times another
//! case's, on the median of the per-pass ratios or in every pass. A missed
//! target is reported, not a failure.

use serde_json::{json, Value};

use crate::report::{round3, Report};
use crate::stats::Stat;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Target {
    pub case: &'static str,
    pub against: &'static str,
    pub stat: Stat,
    pub max: f64,
    /// Or at most this many ns more than `against` (whichever allows more:
    /// a floor of a few tens of ns makes a ratio alone meaningless).
    pub plus_ns: f64,
    /// Met only if the ratio is within `max` in every pass (else: the
    /// median over passes is).
    pub every_pass: bool,
}

impl Target {
    /// `case`'s median ≤ `max` × `against`'s, on the median over passes.
    pub const fn p50(case: &'static str, against: &'static str, max: f64) -> Target {
        Target { case, against, stat: Stat::P50, max, plus_ns: 0.0, every_pass: false }
    }

    /// The same target, or `case` at most `ns` more than `against`.
    pub const fn or_plus_ns(self, ns: f64) -> Target {
        Target { plus_ns: ns, ..self }
    }

    /// `case`'s p99 ≤ `max` × `against`'s, on the median over passes.
    pub const fn p99(case: &'static str, against: &'static str, max: f64) -> Target {
        Target { stat: Stat::P99, ..Target::p50(case, against, max) }
    }

    /// The same target, to be met in every pass.
    pub const fn every_pass(self) -> Target {
        Target { every_pass: true, ..self }
    }

    /// `{"case", "against", "stat", "ratio", "per_pass", "target",
    /// "in_every_pass", "met"}`; `None` if either case has no result.
    pub fn check(&self, report: &Report) -> Option<Value> {
        let ratio = report.ratio_of(self.stat, self.case, self.against)?;
        let passes = report.pass_ratios_of(self.stat, self.case, self.against)?;
        // `plus_ns` as a ratio to the other case's statistic (over all passes).
        let against = self.stat.of(&report.get(self.against)?.stats);
        let max = match self.plus_ns > 0.0 && against > 0.0 {
            true => self.max.max(1.0 + self.plus_ns / against),
            false => self.max,
        };
        let met = if self.every_pass { passes.iter().all(|&r| r <= max) } else { ratio <= max };
        let per_pass: Vec<f64> = passes.into_iter().map(round3).collect();
        Some(json!({
            "case": self.case, "against": self.against, "stat": self.stat.name(), "ratio": ratio,
            "per_pass": per_pass, "target": round3(max), "in_every_pass": self.every_pass, "met": met,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;

    fn report() -> Report {
        let mut r = Report::new("x", &Params::default());
        // Per-call samples, 100 a pass: 98 fast, 2 slow.
        let pass = |fast: f64, slow: f64| -> Vec<f64> { (0..100).map(|i| if i < 98 { fast } else { slow }).collect() };
        r.push_passes("base", vec![pass(10.0, 100.0), pass(10.0, 100.0), pass(10.0, 100.0)]);
        r.push_passes("case", vec![pass(9.0, 120.0), pass(11.0, 140.0), pass(9.0, 160.0)]);
        r
    }

    /// A target of a ratio or a few ns more, whichever allows more.
    #[test]
    fn a_target_may_allow_ns_more_instead() {
        let r = report();
        let strict = Target::p50("case", "base", 0.5).check(&r).unwrap();
        assert_eq!((strict["met"].as_bool(), strict["target"].as_f64()), (Some(false), Some(0.5)));
        // The base's median is 10 ns: 5 ns more is 1.5 times it.
        let plus = Target::p50("case", "base", 0.5).or_plus_ns(5.0).check(&r).unwrap();
        assert_eq!((plus["met"].as_bool(), plus["target"].as_f64()), (Some(true), Some(1.5)));
    }

    #[test]
    fn a_target_names_its_statistic() {
        let r = report();
        let p50 = Target::p50("case", "base", 1.0).check(&r).unwrap();
        assert_eq!(
            (p50["stat"].as_str(), p50["ratio"].as_f64(), p50["met"].as_bool()),
            (Some("p50"), Some(0.9), Some(true))
        );
        assert_eq!(p50["per_pass"], json!([0.9, 1.1, 0.9]));
        let p99 = Target::p99("case", "base", 1.5).check(&r).unwrap();
        assert_eq!(
            (p99["stat"].as_str(), p99["ratio"].as_f64(), p99["met"].as_bool()),
            (Some("p99"), Some(1.4), Some(true))
        );
        assert_eq!(p99["in_every_pass"], false);
    }

    #[test]
    fn in_every_pass_fails_on_one_bad_pass() {
        let r = report();
        // The medians meet both; one pass each misses.
        let p50 = Target::p50("case", "base", 1.0).every_pass().check(&r).unwrap();
        assert_eq!((p50["met"].as_bool(), p50["in_every_pass"].as_bool()), (Some(false), Some(true)));
        let p99 = Target::p99("case", "base", 1.5).every_pass().check(&r).unwrap();
        assert_eq!(p99["met"], false);
        assert_eq!(Target::p99("case", "base", 1.6).every_pass().check(&r).unwrap()["met"], true);
    }

    #[test]
    fn a_missing_case_gives_no_check() {
        assert_eq!(Target::p50("case", "nothing", 1.0).check(&report()), None);
    }
}
