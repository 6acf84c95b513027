//! `ferry bench scale` (issue 17): how a server team copes with many peers.
//!
//! - `ferry.shm.null.idleN` (N = 0, 16, 128, 512): one active client's
//!   null call, timed call by call, while N idle client teams (one process,
//!   teams without processors, each bound to the server by one call) sit
//!   beside it. The sample is a call; the figures: p50, p99, the server's
//!   CPU while everything is quiet (% of one core) and its resident memory
//!   per idle peer.
//! - `ferry.shm.fanin.C` (C = 1, 2, 4, 8, 16): C client processes making
//!   blocking null calls to one server team for a while. The sample is ns
//!   per call of all of them together (1e9 / calls per s); the figures:
//!   calls per s, and the smallest client's share against an equal share.
//!
//! Every process is separate, teams at default settings; the idle cases
//! pin the server and the timer to two CPUs, the rest is unpinned. A
//! pass runs each case once; targets are taken per pass, their median over
//! passes reported (met or MISSED: never a failure exit).

mod cases;

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::{Params, Report};
use cases::Outcome;

/// Arguments of `ferry bench scale`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Times the whole suite runs; targets are taken within a pass.
    #[arg(long, default_value_t = 3)]
    pub passes: usize,
    /// Only the cases whose name starts with this (or with one of these, comma-separated).
    #[arg(long, default_value = "")]
    pub only: String,
    /// Null calls timed one by one per idle case and pass (after a tenth as many untimed).
    #[arg(long, default_value_t = 20_000)]
    pub calls: usize,
    /// Seconds a fan-in case counts calls (after a tenth of that uncounted).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Seconds over which the server's idle CPU is measured.
    #[arg(long, default_value_t = 2.0)]
    pub idle_seconds: f64,
}

impl Default for ScaleArgs {
    fn default() -> Self {
        ScaleArgs { json: false, passes: 3, only: String::new(), calls: 20_000, seconds: 2.0, idle_seconds: 2.0 }
    }
}

/// Idle peers of the `idle` cases, client processes of the `fanin` ones.
const IDLE: [usize; 4] = [0, 16, 128, 512];
const FANIN: [usize; 5] = [1, 2, 4, 8, 16];

#[derive(Clone, Copy)]
enum Kind {
    Idle(usize),
    Fanin(usize),
}

/// The cases whose name starts with one of `only`'s comma-separated prefixes.
fn chosen(only: &str) -> Vec<(String, Kind)> {
    let idle = IDLE.iter().map(|&n| (format!("ferry.shm.null.idle{n}"), Kind::Idle(n)));
    let all = idle.chain(FANIN.iter().map(|&c| (format!("ferry.shm.fanin.{c}"), Kind::Fanin(c))));
    all.filter(|(n, _)| only.split(',').any(|o| n.starts_with(o))).collect()
}

/// `ferry bench scale`.
pub fn run(args: &ScaleArgs) -> ferry::Result<()> {
    let report = measure(args);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// Runs the chosen cases `passes` times; the report's results are the
/// samples (ns per call), its `extra` the figures and the targets. A case
/// that fails is reported in `errors` and not run again.
pub fn measure(args: &ScaleArgs) -> Report {
    let chosen = chosen(&args.only);
    let params = Params { passes: args.passes.max(1), rounds: 1, iters: args.calls, warmup: 0 };
    let mut report = Report::new("scale", &params);
    // Per case: each pass's outcome, or why it failed.
    let mut outcomes: Vec<Result<Vec<Outcome>, String>> = chosen.iter().map(|_| Ok(Vec::new())).collect();
    for _ in 0..params.passes {
        for ((name, kind), outcome) in chosen.iter().zip(&mut outcomes) {
            let Ok(passes) = outcome else { continue };
            let one = match *kind {
                Kind::Idle(n) => cases::idle(n, args),
                Kind::Fanin(c) => cases::fanin(c, args),
            };
            match one {
                Ok(o) => passes.push(o),
                Err(msg) => {
                    eprintln!("ferry-bench: {name} failed: {msg}");
                    *outcome = Err(msg);
                }
            }
        }
    }
    let mut figures = Figures::default();
    for ((name, _), outcome) in chosen.iter().zip(outcomes) {
        match outcome {
            Ok(passes) => {
                figures.0.push((name.clone(), passes.iter().map(|o| o.figures.clone()).collect()));
                report.push_passes(name, passes.into_iter().map(|o| o.samples).collect());
            }
            Err(msg) => report.fail(name, msg),
        }
    }
    report.extra.insert("figures".into(), figures.to_json());
    report.extra.insert("targets".into(), Value::Array(targets(&figures).iter().map(Target::to_json).collect()));
    report.extra.insert(
        "settings".into(),
        json!({"calls": args.calls, "seconds": args.seconds, "idle_seconds": args.idle_seconds,
               "idle_peers": "teams with processors(0) in one process, each bound by one null call",
               "pinned": "idle cases: the server and the timer on two CPUs; fan-in: none"}),
    );
    report
}

/// Each case's figures, pass by pass.
#[derive(Default)]
struct Figures(Vec<(String, Vec<BTreeMap<&'static str, f64>>)>);

impl Figures {
    fn per_pass(&self, case: &str, field: &str) -> Option<Vec<f64>> {
        let (_, passes) = self.0.iter().find(|(n, _)| n == case)?;
        passes.iter().map(|p| p.get(field).copied()).collect()
    }

    /// `{case: {field: median over passes, ..., "per_pass": {field: [...]}}}`.
    fn to_json(&self) -> Value {
        let mut out = Map::new();
        for (case, passes) in &self.0 {
            let mut medians = Map::new();
            let mut per_pass = Map::new();
            for field in passes.first().map(|p| p.keys().copied().collect::<Vec<_>>()).unwrap_or_default() {
                let v = self.per_pass(case, field).unwrap_or_default();
                medians.insert(field.into(), json!(median(&v).map(round3)));
                per_pass.insert(field.into(), json!(v.iter().copied().map(round3).collect::<Vec<_>>()));
            }
            medians.insert("per_pass".into(), Value::Object(per_pass));
            out.insert(case.clone(), Value::Object(medians));
        }
        Value::Object(out)
    }
}

/// A target: a value per pass (a ratio, a share), its median against a bound.
struct Target {
    what: String,
    per_pass: Vec<f64>,
    bound: f64,
    /// `≤ bound` (else `≥`).
    at_most: bool,
}

impl Target {
    fn value(&self) -> f64 {
        median(&self.per_pass).unwrap_or(f64::NAN)
    }

    fn met(&self) -> bool {
        if self.at_most {
            self.value() <= self.bound
        } else {
            self.value() >= self.bound
        }
    }

    fn to_json(&self) -> Value {
        json!({"target": self.what, "value": round3(self.value()),
               "per_pass": self.per_pass.iter().copied().map(round3).collect::<Vec<_>>(),
               "bound": self.bound, "at_most": self.at_most, "met": self.met()})
    }
}

/// The targets, for the cases that ran (a ratio within each pass).
fn targets(f: &Figures) -> Vec<Target> {
    let ratio = |case: &str, base: &str, field: &str| -> Option<Vec<f64>> {
        let (x, b) = (f.per_pass(case, field)?, f.per_pass(base, field)?);
        let r: Vec<f64> = x.iter().zip(&b).filter(|(_, &b)| b > 0.0).map(|(x, b)| x / b).collect();
        (!r.is_empty()).then_some(r)
    };
    let mut t = Vec::new();
    let (n, z) = ("ferry.shm.null.idle512", "ferry.shm.null.idle0");
    if let Some(r) = ratio(n, z, "p50_ns") {
        t.push(Target { what: "idle512 p50 / idle0 p50".into(), per_pass: r, bound: 1.2, at_most: true });
    }
    if let Some(r) = ratio(n, z, "idle_cpu_pct_schedstat") {
        t.push(Target { what: "server idle CPU: 512 peers / none".into(), per_pass: r, bound: 1.2, at_most: true });
    }
    // Fan-in at 16 against the peak over C of the same pass.
    let fanin: Vec<Vec<f64>> =
        FANIN.iter().filter_map(|c| f.per_pass(&format!("ferry.shm.fanin.{c}"), "calls_per_s")).collect();
    if let Some(at16) = f.per_pass("ferry.shm.fanin.16", "calls_per_s") {
        let peak = |pass: usize| fanin.iter().filter_map(|c| c.get(pass)).copied().fold(0.0, f64::max);
        let r = at16.iter().enumerate().map(|(i, x)| x / peak(i)).collect();
        t.push(Target { what: "fanin.16 calls/s / peak over C".into(), per_pass: r, bound: 0.8, at_most: false });
    }
    for c in FANIN.iter().filter(|&&c| c > 1) {
        if let Some(s) = f.per_pass(&format!("ferry.shm.fanin.{c}"), "min_share") {
            t.push(Target {
                what: format!("fanin.{c} smallest share / equal share"),
                per_pass: s,
                bound: 0.5,
                at_most: false,
            });
        }
    }
    t
}

/// The human table: per case the median over passes of its figures, then the targets.
fn table(report: &Report) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let fig = |case: &str, field: &str| report.extra["figures"][case][field].as_f64();
    let _ = writeln!(
        t,
        "scale: median of {} passes; idle cases: one client's null call with N idle peers bound to the server,\n\
         the server's CPU when all are quiet and its memory per peer; fan-in: C clients calling one server",
        report.params.passes
    );
    let _ = writeln!(t, "{:<24}  {:>10}  {:>10}  {:>13}  {:>13}", "case", "p50", "p99", "idle CPU", "RSS per peer");
    for r in report.results.iter().filter(|r| r.name.contains(".idle")) {
        let _ = writeln!(
            t,
            "{:<24}  {:>10}  {:>10}  {:>13}  {:>13}",
            r.name,
            fmt_ns(fig(&r.name, "p50_ns")),
            fmt_ns(fig(&r.name, "p99_ns")),
            match (fig(&r.name, "idle_cpu_pct_schedstat"), fig(&r.name, "idle_cpu_pct")) {
                (Some(ns), Some(tick)) => format!("{ns:.3}% ({tick:.1}%)"),
                _ => "-".into(),
            },
            fig(&r.name, "rss_per_peer_kib").map_or("-".into(), |k| format!("{k:.1} KiB")),
        );
    }
    let _ = writeln!(t, "{:<24}  {:>10}  {:>10}  {:>13}  {:>13}", "case", "per call", "calls/s", "smallest share", "");
    for r in report.results.iter().filter(|r| r.name.contains(".fanin")) {
        let _ = writeln!(
            t,
            "{:<24}  {:>10}  {:>10}  {:>13}",
            r.name,
            fmt_ns(Some(r.stats.median)),
            fig(&r.name, "calls_per_s").map_or("-".into(), |c| format!("{:.3} M", c / 1e6)),
            fig(&r.name, "min_share").map_or("-".into(), |s| format!("{s:.3}")),
        );
    }
    for (name, why) in &report.errors {
        let _ = writeln!(t, "{name:<24}  FAILED: {why}");
    }
    let _ = writeln!(
        t,
        "(idle CPU: % of one core from the threads' schedstat; in brackets from /proc/PID/stat, in 10 ms ticks)"
    );
    let _ = writeln!(t, "\ntargets:");
    for c in report.extra["targets"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "  {:40} = {:7.3}  (target {} {:.2})  {:6}  per pass {}",
            c["target"].as_str().unwrap_or(""),
            c["value"].as_f64().unwrap_or(f64::NAN),
            if c["at_most"].as_bool() == Some(true) { "≤" } else { "≥" },
            c["bound"].as_f64().unwrap_or(f64::NAN),
            if c["met"].as_bool() == Some(true) { "met" } else { "MISSED" },
            c["per_pass"]
        );
    }
    t
}

fn fmt_ns(ns: Option<f64>) -> String {
    match ns {
        Some(ns) if ns < 1e3 => format!("{ns:.0} ns"),
        Some(ns) if ns < 1e6 => format!("{:.2} µs", ns / 1e3),
        Some(ns) => format!("{:.2} ms", ns / 1e6),
        None => "-".into(),
    }
}

fn median(v: &[f64]) -> Option<f64> {
    Some(crate::Stats::of(v)?.median)
}

fn round3(x: f64) -> f64 {
    crate::report::round3(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(cases: &[(&str, &[(&'static str, f64)])]) -> Figures {
        // One pass per case.
        Figures(cases.iter().map(|(n, f)| (n.to_string(), vec![f.iter().copied().collect()])).collect())
    }

    #[test]
    fn targets_for_the_cases_that_ran() {
        let f = figures(&[
            ("ferry.shm.null.idle0", &[("p50_ns", 700.0), ("idle_cpu_pct_schedstat", 0.01)]),
            ("ferry.shm.null.idle512", &[("p50_ns", 5250.0), ("idle_cpu_pct_schedstat", 1.2)]),
            ("ferry.shm.fanin.1", &[("calls_per_s", 1.5e6), ("min_share", 1.0)]),
            ("ferry.shm.fanin.2", &[("calls_per_s", 1.6e6), ("min_share", 17.0 * 2.0 / 763.0)]),
            ("ferry.shm.fanin.16", &[("calls_per_s", 0.24e6), ("min_share", 0.6)]),
        ]);
        let t = targets(&f);
        let by = |w: &str| t.iter().find(|t| t.what.starts_with(w)).unwrap();
        assert_eq!(t.len(), 5);
        assert_eq!(by("idle512 p50").value(), 7.5);
        assert!(!by("idle512 p50").met());
        assert!(!by("server idle CPU").met());
        assert_eq!(by("fanin.16 calls/s").value(), 0.15);
        assert!(!by("fanin.16 calls/s").met());
        assert!(!by("fanin.2 smallest").met());
        assert!(by("fanin.16 smallest").met());
        assert!(targets(&figures(&[("ferry.shm.fanin.4", &[("min_share", 0.9)])]))[0].met());
    }

    #[test]
    fn a_zero_base_gives_no_ratio() {
        let f =
            figures(&[("ferry.shm.null.idle0", &[("p50_ns", 0.0)]), ("ferry.shm.null.idle512", &[("p50_ns", 5.0)])]);
        assert!(targets(&f).is_empty());
    }

    #[test]
    fn only_filters_cases_by_prefix() {
        let names = |only| chosen(only).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names("").len(), 9);
        assert_eq!(names("ferry.shm.null.idle1"), ["ferry.shm.null.idle16", "ferry.shm.null.idle128"]);
        assert_eq!(
            names("ferry.shm.fanin.1,ferry.shm.null.idle0"),
            ["ferry.shm.null.idle0", "ferry.shm.fanin.1", "ferry.shm.fanin.16"]
        );
    }
}
