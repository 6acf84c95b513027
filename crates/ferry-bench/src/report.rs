//! The outcome of a suite: a human table and a JSON form.

use std::fmt::Write;

use serde_json::{json, Map, Value};

use crate::harness::Params;
use crate::stats::{Stat, Stats};

/// One case's samples (ns per round trip, one per round, or one per call
/// for a case timed call by call; every pass) and their summary.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    pub name: String,
    pub stats: Stats,
    pub samples: Vec<f64>,
    /// The median of each pass, in order.
    pub pass_medians: Vec<f64>,
    /// The statistics of each pass, in order.
    pub pass_stats: Vec<Stats>,
}

/// Results of a suite, in the order the cases ran.
#[derive(Clone, Debug)]
pub struct Report {
    pub suite: String,
    pub params: Params,
    pub results: Vec<CaseResult>,
    /// Cases that failed: (name, why). They have no entry in `results`.
    pub errors: Vec<(String, String)>,
    /// Extra top-level JSON keys (e.g. "memory"). The keys `suite`,
    /// `results`, `params` and `errors` are the report's own and win.
    pub extra: Map<String, Value>,
}

impl Report {
    pub fn new(suite: &str, params: &Params) -> Self {
        Self {
            suite: suite.to_string(),
            params: params.clone(),
            results: Vec::new(),
            errors: Vec::new(),
            extra: Map::new(),
        }
    }

    /// Adds a result of one pass (for example one measured outside
    /// [`crate::run_suite`]). No samples counts as a failure.
    pub fn push(&mut self, name: &str, samples: Vec<f64>) {
        self.push_passes(name, vec![samples]);
    }

    /// Adds a result measured in several passes. A pass without samples
    /// counts as a failure.
    pub fn push_passes(&mut self, name: &str, passes: Vec<Vec<f64>>) {
        let pass_stats: Option<Vec<Stats>> = passes.iter().map(|p| Stats::of(p)).collect();
        let samples: Vec<f64> = passes.concat();
        match (Stats::of(&samples), pass_stats) {
            (Some(stats), Some(pass_stats)) => {
                let pass_medians = pass_stats.iter().map(|s| s.median).collect();
                self.results.push(CaseResult { name: name.to_string(), stats, samples, pass_medians, pass_stats })
            }
            _ => self.fail(name, "no samples".to_string()),
        }
    }

    /// Records a failed case.
    pub fn fail(&mut self, name: &str, why: String) {
        self.errors.push((name.to_string(), why));
    }

    pub fn get(&self, name: &str) -> Option<&CaseResult> {
        self.results.iter().find(|r| r.name == name)
    }

    /// `name` over `baseline`: the median over passes of the ratio of
    /// their medians in that pass.
    pub fn ratio(&self, name: &str, baseline: &str) -> Option<f64> {
        self.ratio_of(Stat::P50, name, baseline)
    }

    /// As [`Report::ratio`], on `stat` (the median over passes of the
    /// ratio of their `stat` in that pass).
    pub fn ratio_of(&self, stat: Stat, name: &str, baseline: &str) -> Option<f64> {
        Some(Stats::of(&self.pass_ratios_of(stat, name, baseline)?)?.median)
    }

    /// The ratio of `name`'s median to `baseline`'s in each pass (the
    /// overall medians if the two ran a different number of passes).
    pub fn pass_ratios(&self, name: &str, baseline: &str) -> Option<Vec<f64>> {
        self.pass_ratios_of(Stat::P50, name, baseline)
    }

    /// As [`Report::pass_ratios`], on `stat`.
    pub fn pass_ratios_of(&self, stat: Stat, name: &str, baseline: &str) -> Option<Vec<f64>> {
        let (r, b) = (self.get(name)?, self.get(baseline)?);
        let pairs: Vec<(f64, f64)> = if r.pass_stats.len() == b.pass_stats.len() {
            r.pass_stats.iter().zip(&b.pass_stats).map(|(x, base)| (stat.of(x), stat.of(base))).collect()
        } else {
            vec![(stat.of(&r.stats), stat.of(&b.stats))]
        };
        pairs.iter().map(|&(x, base)| (base > 0.0).then_some(x / base)).collect()
    }

    /// Inserts `"baseline": name` and `"ratios": {case: median / baseline
    /// median}` into [`Report::extra`] (nothing if the baseline is missing).
    pub fn insert_ratios(&mut self, baseline: &str) {
        if self.get(baseline).is_none() {
            return;
        }
        let ratios: Map<String, Value> = self
            .results
            .iter()
            .filter_map(|r| Some((r.name.clone(), json!(round3(self.ratio(&r.name, baseline)?)))))
            .collect();
        self.extra.insert("baseline".into(), json!(baseline));
        self.extra.insert("ratios".into(), Value::Object(ratios));
    }

    /// `{"suite": ..., "results": [{"name", "median_ns", "p99_ns", "min_ns",
    /// "max_ns", "samples"}, ...], "params": {...}}` (`median_ns` is the p50;
    /// `samples` tells per-round figures from per-call ones), plus `"errors": {name: why}` if any case failed,
    /// plus [`Report::extra`].
    pub fn to_json(&self) -> Value {
        let results: Vec<Value> = self
            .results
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "median_ns": round1(r.stats.median),
                    "p99_ns": round1(r.stats.p99),
                    "min_ns": round1(r.stats.min),
                    "max_ns": round1(r.stats.max),
                    "samples": r.samples.len(),
                })
            })
            .collect();
        let mut out = self.extra.clone();
        out.insert("suite".into(), json!(self.suite));
        out.insert("results".into(), Value::Array(results));
        out.insert(
            "params".into(),
            json!({"passes": self.params.passes, "rounds": self.params.rounds, "iters": self.params.iters, "warmup": self.params.warmup}),
        );
        if self.errors.is_empty() {
            out.remove("errors");
        } else {
            let errors: Map<String, Value> = self.errors.iter().map(|(n, why)| (n.clone(), json!(why))).collect();
            out.insert("errors".into(), Value::Object(errors));
        }
        Value::Object(out)
    }

    /// The human table: name, p50 (the median), p99, min–max, the number of
    /// samples, and the ratio of each median to the `baseline` case's median
    /// ("-" if there is no such case).
    pub fn table(&self, baseline: &str) -> String {
        let width = self
            .results
            .iter()
            .map(|r| r.name.len())
            .chain(self.errors.iter().map(|(n, _)| n.len()))
            .chain([4])
            .max()
            .unwrap_or(4);
        let mut t = String::new();
        let p = &self.params;
        let _ = writeln!(
            t,
            "{}: round-trip time over {} passes; p50 (median) and p99 of the samples: one per call for cases\n\
             timed call by call (n = calls), else the mean of each round ({} rounds (+{} warm-up) of up to {} round trips);\n\
             ratios are the median over passes of the ratio within a pass",
            self.suite, p.passes, p.rounds, p.warmup, p.iters
        );
        let _ = writeln!(
            t,
            "{:<width$}  {:>10}  {:>10}  {:>21}  {:>6}  x {baseline}",
            "case", "p50", "p99", "min – max", "n"
        );
        for r in &self.results {
            let ratio = match self.ratio(&r.name, baseline) {
                Some(x) => format!("{x:.2}"),
                None => "-".into(),
            };
            let range = format!("{} – {}", fmt_ns(r.stats.min), fmt_ns(r.stats.max));
            let _ = writeln!(
                t,
                "{:<width$}  {:>10}  {:>10}  {range:>21}  {:>6}  {ratio}",
                r.name,
                fmt_ns(r.stats.median),
                fmt_ns(r.stats.p99),
                r.samples.len()
            );
        }
        for (name, why) in &self.errors {
            let _ = writeln!(t, "{name:<width$}  FAILED: {why}");
        }
        t
    }

    /// Prints [`Report::table`] to stdout.
    pub fn print_table(&self, baseline: &str) {
        print!("{}", self.table(baseline));
    }
}

/// A duration in ns, in the unit that suits it: "131 ns", "8.21 µs", "1.50 ms".
fn fmt_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_report() -> Report {
        let mut r = Report::new("pingpong", &Params::default());
        r.push("floor.spin.two_line", vec![300.0, 320.0, 310.0]);
        r.push("floor.futex", vec![8000.0, 8200.0, 9000.0, 8100.0]);
        r
    }

    #[test]
    fn json_has_the_agreed_shape() {
        let mut r = sample_report();
        r.extra.insert("memory".into(), json!({"rss_kib": 1}));
        r.extra.insert("suite".into(), json!("clobbered?"));
        let v = r.to_json();
        assert_eq!(v["suite"], "pingpong");
        assert_eq!(
            v["results"],
            json!([
                {"name": "floor.spin.two_line", "median_ns": 310.0, "p99_ns": 320.0, "min_ns": 300.0, "max_ns": 320.0, "samples": 3},
                {"name": "floor.futex", "median_ns": 8150.0, "p99_ns": 9000.0, "min_ns": 8000.0, "max_ns": 9000.0, "samples": 4},
            ])
        );
        assert_eq!(v["memory"], json!({"rss_kib": 1}));
        assert_eq!(v["params"], json!({"passes": 3, "rounds": 11, "iters": 20000, "warmup": 2}));
        assert!(v.get("errors").is_none());
    }

    #[test]
    fn ratios_and_errors_go_into_json() {
        let mut r = sample_report();
        r.fail("iceoryx2.req_resp", "boom".into());
        r.insert_ratios("floor.spin.two_line");
        let v = r.to_json();
        assert_eq!(v["baseline"], "floor.spin.two_line");
        assert_eq!(v["ratios"]["floor.spin.two_line"], 1.0);
        assert_eq!(v["ratios"]["floor.futex"], 26.29);
        assert_eq!(v["errors"], json!({"iceoryx2.req_resp": "boom"}));
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn table_shows_ratio_to_baseline_and_failures() {
        let mut r = sample_report();
        r.fail("x.y.z", "boom".into());
        let t = r.table("floor.spin.two_line");
        assert!(t.contains("x floor.spin.two_line"), "{t}");
        assert!(t.contains("8.15 µs"), "{t}");
        assert!(t.contains("26.29"), "{t}");
        assert!(t.contains("x.y.z") && t.contains("FAILED: boom"), "{t}");
        let t = r.table("no.such.case");
        assert!(t.lines().find(|l| l.starts_with("floor.futex")).unwrap().ends_with(" -"), "{t}");
    }

    #[test]
    fn ratios_are_taken_within_each_pass() {
        let mut r = Report::new("x", &Params::default());
        // The machine got twice as slow between the passes: both cases show it.
        r.push_passes("base", vec![vec![100.0], vec![200.0], vec![100.0]]);
        r.push_passes("case", vec![vec![150.0], vec![300.0], vec![160.0]]);
        assert_eq!(r.pass_ratios("case", "base"), Some(vec![1.5, 1.5, 1.6]));
        assert_eq!(r.ratio("case", "base"), Some(1.5));
        // Pooled medians would say 160 / 100.
        assert_eq!(r.get("case").unwrap().stats.median, 160.0);
        r.push("single", vec![300.0]);
        assert_eq!(r.ratio("single", "base"), Some(3.0));
    }

    #[test]
    fn p99_ratios_are_taken_within_each_pass() {
        let mut r = Report::new("x", &Params::default());
        // Per-call samples: 100 calls a pass, the slowest two the tail.
        let pass = |fast: f64, slow: f64| -> Vec<f64> { (0..100).map(|i| if i < 98 { fast } else { slow }).collect() };
        r.push_passes("base", vec![pass(10.0, 100.0), pass(20.0, 200.0)]);
        r.push_passes("tail", vec![pass(10.0, 150.0), pass(20.0, 100.0)]);
        assert_eq!(r.get("tail").unwrap().pass_stats[0].p99, 150.0);
        assert_eq!(r.pass_ratios_of(Stat::P99, "tail", "base"), Some(vec![1.5, 0.5]));
        assert_eq!(r.ratio_of(Stat::P99, "tail", "base"), Some(1.0));
        assert_eq!(r.pass_ratios_of(Stat::P50, "tail", "base"), Some(vec![1.0, 1.0]));
        let v = r.to_json();
        // Pooled over the passes: 196 fast calls, then 100, 100, 150, 150.
        assert_eq!(v["results"][1]["p99_ns"], 100.0);
        assert_eq!(v["results"][1]["samples"], 200);
        let t = r.table("base");
        let row = t.lines().find(|l| l.starts_with("tail ")).unwrap();
        assert!(row.contains("100 ns") && row.contains("200"), "{t}");
    }

    #[test]
    fn pushing_no_samples_is_a_failure() {
        let mut r = sample_report();
        r.push("a.b.c", vec![]);
        assert!(r.get("a.b.c").is_none());
        assert_eq!(r.errors, vec![("a.b.c".to_string(), "no samples".to_string())]);
    }
}
