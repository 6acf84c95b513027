//! The suites `ferry bench` runs, and their command-line arguments.

use crate::targets::Target;
use crate::{run_suite, Case, Params, Report};
use serde_json::json;

/// Arguments every suite takes.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Times the whole suite runs; ratios are taken within a pass.
    #[arg(long, default_value_t = Params::default().passes)]
    pub passes: usize,
    /// Timed rounds per case and pass (each round gives one sample).
    #[arg(long, default_value_t = Params::default().rounds)]
    pub rounds: usize,
    /// Round trips per round (slow cases divide it); cases timed call by
    /// call make this many calls per pass (the TCP suite's: a quarter).
    #[arg(long, default_value_t = Params::default().iters)]
    pub iters: usize,
    /// Untimed rounds before the timed ones.
    #[arg(long, default_value_t = Params::default().warmup)]
    pub warmup: usize,
    /// Only the cases whose name starts with this (or with one of these, comma-separated).
    #[arg(long, default_value = "")]
    pub only: String,
}

impl BenchArgs {
    fn params(&self) -> Params {
        Params { passes: self.passes, rounds: self.rounds, iters: self.iters, warmup: self.warmup }
    }
}

/// Every case of every suite: what a re-executed child may be asked to run.
pub fn all_cases() -> Vec<Case> {
    let mut v = pingpong_cases();
    v.extend(rpc::cases());
    v.extend(crate::tcp::cases());
    v.extend(memory::cases());
    v.extend(crate::link_bench::cases());
    v
}

pub fn pingpong_cases() -> Vec<Case> {
    let mut v = crate::pingpong_floor_cases();
    v.extend(crate::ferry_pingpong::cases());
    v
}

fn run(suite: &str, cases: Vec<Case>, args: &BenchArgs, baseline: &str, targets: &[Target]) -> Report {
    let chosen: Vec<_> = cases.into_iter().filter(|c| args.only.split(',').any(|o| c.name.starts_with(o))).collect();
    let mut report = run_suite(suite, &chosen, &args.params());
    report.insert_ratios(baseline);
    let checks: Vec<_> = targets.iter().filter_map(|t| t.check(&report)).collect();
    report.extra.insert("targets".into(), json!(checks));
    report
}

/// A throughput target: `case` (ns per `what`) makes at least `min` of
/// them a second; `{"case", "<what>_per_s", "target_<what>_per_s", "met"}`.
fn rate_target(report: &Report, case: &str, what: &str, min: f64) -> Option<serde_json::Value> {
    let rate = 1e9 / report.get(case)?.stats.median;
    let mut t = json!({"case": case, "met": rate >= min});
    t[format!("{what}_per_s")] = json!(rate);
    t[format!("target_{what}_per_s")] = json!(min);
    Some(t)
}

fn print(report: &Report, args: &BenchArgs, baseline: &str) {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap());
        return;
    }
    report.print_table(baseline);
    if let Some(serde_json::Value::Array(t)) = report.extra.get("targets") {
        println!("\ntargets:");
        for c in t {
            let every = if c["in_every_pass"].as_bool() == Some(true) { " in every pass" } else { "" };
            println!(
                "  {:24} / {:22} {} = {:6.3}  (target ≤ {:.3}{every})  {:6}  per pass {}",
                c["case"].as_str().unwrap_or(""),
                c["against"].as_str().unwrap_or(""),
                c["stat"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                c["target"].as_f64().unwrap_or(f64::NAN),
                if c["met"].as_bool() == Some(true) { "met" } else { "MISSED" },
                c["per_pass"]
            );
        }
    }
    for (k, v) in &report.extra {
        if k != "targets" && k != "ratios" && k != "baseline" {
            println!("{k}: {v}");
        }
    }
}

pub mod pingpong {
    use super::*;

    pub const BASELINE: &str = "floor.spin.two_line";

    /// `ferry bench pingpong`.
    pub fn run(args: &BenchArgs) -> ferry::Result<()> {
        // Issue 21's table (the hot path at the hardware's floor).
        let targets = [
            Target::p50("ferry.shm.spin", BASELINE, 1.5).or_plus_ns(150.0),
            Target::p50("ferry.shm.spin", "iceoryx2.pubsub.pingpong", 0.5),
            Target::p50("ferry.shm.parked", "floor.futex", 1.10),
            Target::p50("ferry.shm.oneway", "floor.ring.oneway", 2.0),
        ];
        let mut report = super::run("pingpong", pingpong_cases(), args, BASELINE, &targets);
        if let Some(t) = rate_target(&report, "ferry.shm.oneway", "messages", 20e6) {
            report.extra.insert("oneway_target".into(), t);
        }
        report.extra.insert("memory".into(), crate::memory::report());
        print(&report, args, BASELINE);
        Ok(())
    }
}

pub mod links {
    use super::*;

    pub const BASELINE: &str = "floor.spin.two_line";

    /// `ferry bench links` (see `link_bench.rs`): beside a port round trip,
    /// a null RPC over TCP and the two-line floor.
    pub fn run(args: &BenchArgs) -> ferry::Result<()> {
        let targets = [
            Target::p50("ferry.shm.link.moved", "ferry.shm.link.fresh", 1.10),
            Target::p50("ferry.shm.link.fresh", "ferry.shm.spin", 1.1),
            Target::p50("ferry.tcp.link.moved", "ferry.tcp.link.fresh", 1.10),
            Target::p50("ferry.tcp.link.fresh", "ferry.tcp.busypoll.null", 1.1),
        ];
        let mut cases: Vec<Case> = crate::pingpong_floor_cases().into_iter().filter(|c| c.name == BASELINE).collect();
        cases.extend(crate::ferry_pingpong::cases().into_iter().filter(|c| c.name == "ferry.shm.spin"));
        // Over TCP, beside a null RPC between the same two nodes, both busy-polling.
        cases.extend(crate::tcp::cases().into_iter().filter(|c| c.name == "ferry.tcp.busypoll.null"));
        cases.extend(crate::link_bench::cases());
        let report = super::run("links", cases, args, BASELINE, &targets);
        print(&report, args, BASELINE);
        Ok(())
    }
}

pub mod memory {
    use super::*;

    pub const BASELINE: &str = "floor.load.remote";

    /// The suite's cases: ferry's and their floors, then MPI's (see
    /// `mpi_peer.rs`), whether or not MPI is installed.
    pub fn cases() -> Vec<Case> {
        let mut cases = crate::remote_memory::cases();
        cases.extend(crate::fifo_bench::cases());
        cases.extend(crate::mpi_peer::cases());
        cases
    }

    /// `ferry bench memory`: remote memory on one machine and across two
    /// nodes on loopback, beside its floors and MPI.
    pub fn run(args: &BenchArgs) -> ferry::Result<()> {
        let targets = [
            Target::p50("ferry.shm.get.8", BASELINE, 1.5),
            Target::p50("ferry.shm.fetch_add", "floor.atomic.fetch_add", 1.5),
            // MPI's shape (the line stays in the caller's cache); absent
            // without MPI: a target whose case has no result is not checked.
            Target::p50("ferry.shm.get.8.cached", "mpi.get.8", 1.0),
            Target::p50("ferry.shm.fetch_add.cached", "mpi.fetch_add", 1.0),
            Target::p50("ferry.tcp.get.8", "ferry.tcp.null", 1.1),
            Target::p50("ferry.tcp.get.8", "floor.tcp.spin", 1.3),
            Target::p50("ferry.tcp.path3", "ferry.tcp.get.8", 1.2),
            // Fifos (issue 19): plain memory, no runtime hop.
            Target::p50("ferry.shm.fifo", "ferry.shm.spin", 0.75),
            Target::p50("ferry.shm.fifo", "floor.spin.two_line", 2.0),
            Target::p50("ferry.shm.signal", "ferry.shm.null", 1.2),
        ];
        let mut cases = cases();
        // Without MPI its cases are left out, not failed: a missing peer is no error of ferry's.
        let skipped = crate::mpi_peer::missing();
        if let Some(why) = &skipped {
            eprintln!("ferry bench memory: leaving out the mpi.* cases: {why}");
            cases.retain(|c| !c.name.starts_with("mpi."));
        }
        let mut report = super::run("memory", cases, args, BASELINE, &targets);
        if let Some(why) = skipped {
            report.extra.insert("skipped".into(), json!({ "mpi.*": why }));
        }
        print(&report, args, BASELINE);
        Ok(())
    }
}

pub mod rpc {
    use super::*;

    pub const BASELINE: &str = "floor.spin.two_line";

    /// The RPC suite: the floor, the peers, ferry's cases.
    pub fn cases() -> Vec<Case> {
        let floors = crate::floors::cases();
        let mut v: Vec<Case> = floors.into_iter().filter(|c| c.name == BASELINE).collect();
        #[cfg(feature = "iceoryx2")]
        v.push(crate::iceoryx2_peer::case());
        v.extend(crate::rpc_peers::cases());
        v.extend(crate::ferry_rpc::cases());
        v.extend(crate::oversub::cases());
        v
    }

    /// `ferry bench rpc`.
    pub fn run(args: &BenchArgs, breakdown: bool) -> ferry::Result<()> {
        if breakdown {
            let b = crate::ferry_rpc::breakdown(20_000)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&b).unwrap());
            } else {
                println!("where a null call's time goes (ferry.shm, 20000 calls, means):\n{}", b.table());
            }
            return Ok(());
        }
        let targets = [
            // Issue 21's table.
            Target::p50("ferry.shm.null", BASELINE, 2.5).or_plus_ns(350.0),
            Target::p50("ferry.shm.null", "iceoryx2.req_resp", 0.33),
            Target::p50("ferry.shm.null", "tonic.uds.null", 1.0 / 50.0),
            Target::p50("ferry.shm.null", "zmq.ipc.null", 1.0 / 20.0),
            // Free to move (issue 17): the median near the pinned one's; p99 is reported.
            Target::p50("ferry.shm.null.unpinned", "ferry.shm.null", 1.3),
            // Oversubscribed (ns per call): at least the throughput of
            // spinning off, and twice the old default's.
            Target::p50("ferry.shm.oversub", "ferry.shm.oversub.nospin", 1.0),
            Target::p50("ferry.shm.oversub", "ferry.shm.oversub.spinall", 0.5),
        ];
        let mut report = super::run("rpc", cases(), args, BASELINE, &targets);
        let throughput: serde_json::Map<String, serde_json::Value> = report
            .results
            .iter()
            .filter(|r| r.name.starts_with("ferry.shm.tasks"))
            .map(|r| {
                let tasks: f64 = r.name.trim_start_matches("ferry.shm.tasks").parse().unwrap_or(1.0);
                // Each task has one call in flight: a call's latency is T times the time per call.
                (r.name.clone(), json!({"calls_per_s": 1e9 / r.stats.median, "latency_ns": tasks * r.stats.median}))
            })
            .collect();
        if let Some(t) = rate_target(&report, "ferry.shm.tasks8", "calls", 5e6) {
            report.extra.insert("throughput_target".into(), t);
        }
        report.extra.insert("throughput".into(), serde_json::Value::Object(throughput));
        report.extra.insert("oversub".into(), crate::oversub::throughput(&report));
        print(&report, args, BASELINE);
        Ok(())
    }
}

pub mod tcp_suite {
    use super::*;

    pub const BASELINE: &str = "floor.tcp";

    /// `ferry bench tcp` (see [`crate::tcp`]).
    pub fn run(args: &BenchArgs) -> ferry::Result<()> {
        let targets = [
            Target::p50("ferry.tcp.null", BASELINE, 1.2),
            Target::p50("ferry.tcp.busypoll.null", BASELINE, 1.0),
            // Issue 17: against both ends busy-polling, and unpinned against unpinned.
            Target::p50("ferry.tcp.busypoll.null", "floor.tcp.spin", 1.2),
            Target::p50("ferry.tcp.null.unpinned", "floor.tcp.unpinned", 1.0).every_pass(),
            Target::p99("ferry.tcp.null.unpinned", "floor.tcp.unpinned", 1.5).every_pass(),
            Target::p50("ferry.tcp.null", "zmq.tcp.null", 1.0),
            Target::p50("ferry.tcp.busypoll.null", "zmq.tcp.null", 0.5),
            Target::p50("ferry.tcp.null", "tonic.tcp.null", 1.0),
            Target::p50("ferry.tcp.busypoll.null", "tonic.tcp.null", 1.0 / 3.0),
            Target::p50("ferry.tcp.null", "tarpc.tcp.null", 1.0),
            Target::p50("ferry.tcp.busypoll.null", "tarpc.tcp.null", 1.0 / 1.5),
        ];
        let mut report = super::run("tcp", crate::tcp::cases(), args, BASELINE, &targets);
        if let Some(p) = report.get("ferry.tcp.pipelined") {
            let calls = 1e9 / p.stats.median;
            let t = json!({"case": "ferry.tcp.pipelined", "calls_per_s": calls, "target_calls_per_s": 1e6, "met": calls >= 1e6});
            report.extra.insert("throughput_target".into(), t);
        }
        if let Some(large) = crate::tcp::large_echo_report(&report) {
            report.extra.insert("large_echo".into(), large);
        }
        print(&report, args, BASELINE);
        Ok(())
    }
}
